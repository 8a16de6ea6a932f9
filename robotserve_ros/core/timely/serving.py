"""The segment serving core of the LLM planner (seed 002 §3-4): plans in, segments out.

One engine slot ("llm") runs one work item at a time: a prefill of one newly admitted plan, or
one batched decode step of the running set. Before each, `dispatch()` updates every waiting
segment's priority (§4.3), lets the scheduler admit waiting segments into the running batch
(§4.4), and picks the item. `complete()` takes what the engine produced (per plan: the
tokens of this call, and the segment the stop checker ended, if any) and returns the
events: segments to hand to robots, plans finished (their KV to free). The calls are
core/contract.py's.

Live, `core/loop.py`'s LiveDriver calls `dispatch` / the engine / `complete` (see
core/timely/live.py); the simulator calls the same two steps on its virtual clock with engine
times from the measured profile (timely/sim.py). The clock is injected; `timer` (a
perf_counter) only measures the decision overhead.
"""
from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional

from ..errors import RequestError
from ..llm_profile import LLMProfile
from .plan import DONE, RUNNING, WAITING, Plan
from .schedulers import Context, SegmentScheduler
from .skill_time import SkillTimeModel


class DuplicatePlan(RequestError):
    code = "duplicate_request"


SLOT = "llm"  # the one engine slot


@dataclass
class WorkItem:
    slot = SLOT
    kind: str                 # "prefill" | "decode"
    plan_ids: list
    steps: int = 1
    batch_changed: bool = False   # the running set differs from the last decode's


@dataclass
class SegmentOutcome:
    """What one engine call produced for one plan."""
    tokens: int = 1
    segment_text: Optional[str] = None   # set when the stop checker ended the segment
    plan_done: bool = False              # the segment ended the plan (end of sequence)


@dataclass
class Event:
    kind: str                  # "segment" | "done"
    plan_id: Hashable
    t: float
    k: int = 0
    text: str = ""
    last: bool = False
    expected_exec_s: float = 0.0


@dataclass
class TimelyStats:
    decisions_ms: list = field(default_factory=list)       # (plans in the system, ms)
    items: int = 0
    segments: int = 0
    plans_done: int = 0


class TimelyCore:
    def __init__(self, scheduler: SegmentScheduler, profile: LLMProfile, skill_time: SkillTimeModel, clock, *,
                 max_batch: int = 16, seg_tokens_est: float = 6.0, seg_tokens_max: int = 12,
                 timer: Optional[Callable[[], float]] = None) -> None:
        if max_batch < 1 or seg_tokens_max < 1 or seg_tokens_est <= 0:
            raise ValueError("max_batch, seg_tokens_max and seg_tokens_est must be positive")
        self.scheduler, self.skill_time, self.clock, self.timer = scheduler, skill_time, clock, timer
        self.ctx = Context(profile, float(seg_tokens_est), int(seg_tokens_max), int(max_batch))
        self.plans: dict[Hashable, Plan] = {}
        self.running: list[Plan] = []
        self.busy = False
        self.lock = threading.RLock()
        self.stats = TimelyStats()
        self._last_decode: tuple = ()

    slots = {SLOT: 1}

    # ---- requests ----
    def submit(self, plan: Plan) -> None:
        with self.lock:
            if plan.id in self.plans:
                raise DuplicatePlan(f"plan {plan.id!r} is already being served")
            plan.state = WAITING
            self.plans[plan.id] = plan

    def cancel(self, plan_id: Hashable, reason: str = "cancelled") -> bool:
        """Drop a plan (its robot left); True if it was held. Its KV is the runner's to free."""
        with self.lock:
            p = self.plans.pop(plan_id, None)
            if p is None:
                return False
            if p in self.running:
                self.running.remove(p)
            p.state, p.reason = DONE, reason
            return True

    def segment_started(self, plan_id: Hashable, k: int, t: float, expected_exec_s: float = 0.0) -> None:
        """The robot started executing segment k at t (PlanProgress): the next segment's
        deadline is that start plus the skill's execution time (§4.3)."""
        with self.lock:
            p = self.plans.get(plan_id)
            if p is None or k != p.k - 1 or p.state == DONE:
                return
            text = next((s[1] for s in p.delivered if s[0] == k), "")
            e = expected_exec_s if expected_exec_s > 0 else self.skill_time.estimate(p.kind, text)
            p.exec_end_est = t + e

    # ---- the two serving steps ----
    def dispatch(self) -> list[WorkItem]:
        """The engine is idle: the next item, in a list (empty: nothing to run)."""
        with self.lock:
            if self.busy:
                return []
            t0 = self.timer() if self.timer else 0.0
            now = self.clock.now()
            waiting = [p for p in self.plans.values() if p.state == WAITING]
            if waiting:
                ordered = self.scheduler.order(waiting, now, self.ctx)
                for p in self.scheduler.admit(self.running, ordered, now, self.ctx):
                    p.state = RUNNING
                    self.running.append(p)
            item = None
            todo = [p for p in self.running if not p.prefilled]
            if todo:
                item = WorkItem("prefill", [todo[0].id])
            elif self.running:
                ids = [p.id for p in self.running]
                key = tuple(sorted(map(str, ids)))
                item = WorkItem("decode", ids, 1, batch_changed=key != self._last_decode)
                self._last_decode = key
            if self.timer:
                self.stats.decisions_ms.append((len(self.plans), (self.timer() - t0) * 1000))
            if item is None:
                return []
            self.busy = True
            self.stats.items += 1
            return [item]

    def complete(self, item: WorkItem, result: dict, engine_s: float = 0.0) -> list[Event]:
        """The engine ran `item`; `result[plan_id]` is a SegmentOutcome (a plan missing from
        it, e.g. cancelled meanwhile, is skipped); `engine_s` its time, shared by its plans."""
        outcomes = result
        with self.lock:
            self.busy = False
            now = self.clock.now()
            events: list[Event] = []
            share = engine_s / max(len(item.plan_ids), 1)
            for pid in item.plan_ids:
                p = self.plans.get(pid)
                out = outcomes.get(pid)
                if p is None or out is None or p.state != RUNNING:
                    continue
                p.generation_s += share
                if item.kind == "prefill":
                    p.prefilled = True
                p.seg_tokens += out.tokens
                p.context += out.tokens if item.kind == "decode" else 0
                if out.segment_text is not None:
                    events += self._segment_done(p, out.segment_text, out.plan_done, now)
            return events

    def fail(self, item: WorkItem, reason: str) -> list[Event]:
        """The engine call raised: its plans end (their senders get an error), others go on."""
        with self.lock:
            self.busy = False
            events = []
            for pid in item.plan_ids:
                p = self.plans.get(pid)
                if p is not None and p.state != DONE:
                    self._finish(p, self.clock.now(), reason)
                    events.append(Event("done", pid, self.clock.now(), p.k, reason, True))
            return events

    def snapshot(self) -> dict:
        with self.lock:
            s = self.stats
            return {"plans": len(self.plans), "running": len(self.running), "busy": self.busy,
                    "items": s.items, "segments": s.segments, "plans_done": s.plans_done,
                    "decision_ms_median": self.decision_ms_median()}

    # ---- internals ----
    def _segment_done(self, p: Plan, text: str, plan_done: bool, now: float) -> list[Event]:
        k = p.k
        p.segments.append((k, text, now))
        self.stats.segments += 1
        last = plan_done or k + 1 >= p.max_segments
        est = self.skill_time.estimate(p.kind, text)
        events = []
        if self.scheduler.stream:
            events.append(self._deliver(p, k, text, last, now, est))
        else:
            p.held.append((k, text, last, est))
            if last:  # the whole plan at once (vLLM returns one response)
                events += [self._deliver(p, *h[:3], now, h[3]) for h in p.held]
                p.held = []
        p.k, p.seg_tokens = k + 1, 0
        if last:
            self._finish(p, now, "eos" if plan_done else "max_segments")
            events.append(Event("done", p.id, now, k, "", True))
        elif self.scheduler.segmented:  # suspend: KV kept, the next segment queued (§4.1)
            self.running.remove(p)
            p.state, p.wait_since = WAITING, now
        return events

    def _deliver(self, p: Plan, k: int, text: str, last: bool, now: float, est: float) -> Event:
        if p.response_time is None:
            p.response_time = now - p.arrival
        p.delivered.append((k, text, now))
        # until the robot reports the start, it is assumed to start now or when the previous
        # segment's expected execution ends, whichever is later
        start = max(now, p.exec_end_est or now)
        p.exec_end_est = start + est
        return Event("segment", p.id, now, k, text, last, est)

    def _finish(self, p: Plan, now: float, reason: str) -> None:
        if p in self.running:
            self.running.remove(p)
        p.state, p.done_at, p.reason = DONE, now, reason
        self.plans.pop(p.id, None)
        self.stats.plans_done += 1

    def decision_ms_median(self, at_plans: Optional[int] = None) -> Optional[float]:
        xs = [ms for n, ms in self.stats.decisions_ms if at_plans is None or n == at_plans]
        return statistics.median(xs) if xs else None
