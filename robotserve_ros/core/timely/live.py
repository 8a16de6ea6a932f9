"""The LLM planner's live serving loop: the segment serving core (core/timely) and an LLM
engine (engines/llm's, passed in) on core/loop.py's LiveDriver, one engine slot. Pure
Python beside the core, like every live adapter (core/runner.py, core/nova/live.py,
core/slo/workers.py): the engine and its stop checker class are passed in, times are read
on the core's clock.

`dispatch()` asks the core for the next item (a prefill of one admitted plan, or one batched
decode step); `run()` calls the engine, feeds each new token to the plan's stop checker and
hands the core what came out; the core's events (segments for robots, plans done) go to
`on_event` (the ROS service's feedback/result, or the bench's robots). A plan that ends
frees its KV. A failing engine call ends only the plans of that item (`engine_failure`).
Used by the `planner` service (nodes/services/planner.py) and `robotserve bench timely`.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Hashable, Optional, Sequence

from ..errors import BadPrompt
from ..loop import LiveDriver
from .plan import Plan
from .serving import Event, SegmentOutcome, TimelyCore, WorkItem

log = logging.getLogger("robotserve.timely")


class LiveTimely:
    def __init__(self, engine, core: TimelyCore, on_event: Callable[[Event], None], *, stop_checker: Callable,
                 delimiter: str = "\n", max_segment_tokens: int = 32, max_prompt_tokens: Optional[int] = None) -> None:
        """stop_checker(decode_text, eos_ids, delimiter=, max_tokens=): one per plan
        (engines/llm/stop.py's StopChecker), seed 002 §4.1's segmentation."""
        self.engine, self.core, self.on_event, self.stop_checker = engine, core, on_event, stop_checker
        self.delimiter, self.max_segment_tokens = delimiter, int(max_segment_tokens)
        self.max_prompt_tokens = int(max_prompt_tokens or engine.max_context // 2)
        self._stops: dict[Hashable, object] = {}   # plan id -> its stop checker
        self._pending: dict[Hashable, tuple] = {}   # plan id -> (prompt ids, constraint) until prefilled
        self.stop_check_s = 0.0
        self.engine_s = 0.0
        self.failures = 0
        self._to_free: set = set()
        self._lock = threading.Lock()
        self.driver = LiveDriver(core.slots, self._dispatch, self._run, on_crash=self._crash, name="planner")

    def start(self) -> "LiveTimely":
        self.driver.start()
        return self

    def close(self) -> None:
        self.driver.close()

    def submit(self, plan: Plan, prompt_ids: Sequence[int], constraint=None) -> None:
        """Queue a plan; raises BadPrompt / BadDeadline / DuplicatePlan to the sender only."""
        ids = list(prompt_ids)
        if not ids:
            raise BadPrompt("empty prompt")
        if len(ids) > self.max_prompt_tokens:
            raise BadPrompt(f"prompt of {len(ids)} tokens, over the limit of {self.max_prompt_tokens}")
        plan.prompt_tokens = plan.context = len(ids)
        plan.prefill_tokens = len(ids) - self.engine.cached_prefix_len(ids)
        with self._lock:
            self.core.submit(plan)
            self._pending[plan.id] = (ids, constraint)
            self._stops[plan.id] = self.stop_checker(self.engine.decode_text, self.engine.eos_ids,
                                                     delimiter=self.delimiter, max_tokens=self.max_segment_tokens)
        self.driver.kick()

    def progress(self, plan_id: Hashable, k: int, t: float, expected_exec_s: float = 0.0) -> None:
        self.core.segment_started(plan_id, k, t, expected_exec_s)
        self.driver.kick()

    def cancel(self, plan_id: Hashable) -> None:
        """The robot left: drop the plan and free its KV (after the item using it, if any)."""
        with self._lock:
            self.core.cancel(plan_id)
            self._pending.pop(plan_id, None)
            self._stops.pop(plan_id, None)
            if self.core.busy:  # the engine is inside an item: free after it
                self._to_free.add(plan_id)
            else:
                self.engine.free(plan_id)

    # ---- LiveDriver ----
    def _dispatch(self) -> list:
        with self._lock:  # a plan's prompt is registered with it (submit): never one without the other
            return self.core.dispatch()

    def _run(self, slot, item: WorkItem) -> None:
        t0 = self.core.clock.now()
        if item.kind == "prefill":
            pid = item.plan_ids[0]
            ids, constraint = self._pending.pop(pid)
            toks = self.engine.prefill([(pid, ids)], constraints={pid: constraint} if constraint else None)
            toks = {pid: [toks[pid]]}
        else:
            toks = self.engine.decode(item.plan_ids, item.steps)
        engine_s = self.core.clock.now() - t0
        t1 = self.core.clock.now()
        outcomes = {}
        with self._lock:
            for pid, new in toks.items():
                stop = self._stops.get(pid)
                if stop is None:
                    continue
                text, reason = None, None
                for tok in new:
                    reason = stop.feed(tok)
                    if reason:
                        _, text, reason = stop.take()
                        break
                outcomes[pid] = SegmentOutcome(len(new), text, plan_done=reason == "eos")
            self.stop_check_s += self.core.clock.now() - t1
            self.engine_s += engine_s
            events = self.core.complete(item, outcomes, engine_s)
            self._cleanup(events, item)
        self._emit(events)

    def _crash(self, slot, item: WorkItem, exc: Exception) -> None:
        self.failures += 1
        with self._lock:
            events = self.core.fail(item, "engine_failure")
            self._cleanup(events, item)
        self._emit(events)

    def _cleanup(self, events: list, item: WorkItem) -> None:
        for e in events:
            if e.kind == "done":
                self.engine.free(e.plan_id)
                self._stops.pop(e.plan_id, None)
                self._pending.pop(e.plan_id, None)
        for pid in self._to_free:  # cancelled while an item ran
            self.engine.free(pid)
        self._to_free.clear()

    def _emit(self, events: list) -> None:
        for e in events:
            try:
                self.on_event(e)
            except Exception:  # one sender's broken callback must not stop serving the others
                log.exception("planner: delivering %s for %s failed", e.kind, e.plan_id)
