"""The serving loop shared by the simulator, the ROS server and the remote GPU server.

submit -> dispatch (scheduler orders, placement assigns tiers) -> refresh_stale (stale
observations fetched again) -> engine runs -> complete (horizon policy picks H, action
manager trims). Algorithm 1 of seed 000: phases 1-2 are the Scheduler, phase 3 the
Placement, lines 20-21 refresh_stale, lines 23-25 the dispatch epoch (skipped = epochs
since arrival). refresh_stale is its own step because fetching from a robot is a round
trip: a live server runs it outside the lock that guards submit and dispatch.
"""
from __future__ import annotations

import itertools
import math
from typing import Mapping, Optional, Sequence

from .clock import Clock
from .contract import plain
from .errors import (
    BadExecInfo,
    BadPolicyParam,
    BadRtc,
    DuplicateRequest,
    RequestError,
    RoundInFlight,
    RoundOutOfOrder,
    UnknownPolicy,
    UnknownTask,
)
from .horizon import HORIZON_POLICIES, HorizonPolicy, respect_rtc_delay
from .observation import check_stamp
from .ledger import TaskLedger
from .rtc_delay import follow_refresh, set_rtc_delays
from .schedulers import Scheduler, SchedulingContext
from .serving_types import (  # noqa: F401  (imported from here)
    Dispatch,
    FillInOrder,
    Placement,
    RefreshGate,
    Refresher,
    ServingStats,
    Tier,
)
from .types import ChunkReply, ChunkResult, InferenceRequest, PendingRequest


class ServingCore:
    def __init__(
        self,
        scheduler: Scheduler,
        tiers: Sequence[Tier],
        clock: Clock,
        *,
        horizon_params: Optional[Mapping[str, Mapping]] = None,
        placement: Optional[Placement] = None,
        refresher: Optional[Refresher] = None,
        stale_obs_s: Optional[float] = None,
        ledger: Optional[TaskLedger] = None,
        max_failures: int = 3,
        rtc_shape: Optional[tuple] = None,
    ) -> None:
        if not tiers:
            raise ValueError("at least one tier is needed")
        self.scheduler = scheduler
        self.tiers = list(tiers)
        self.clock = clock
        self.placement = placement or FillInOrder()
        self.refresher = refresher
        self.stale_obs_s = stale_obs_s
        self.ledger = ledger or TaskLedger()
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        self.max_failures = max_failures
        # (action_dim, chunk length) of the engine, where known: an RTC leftover is checked against it.
        self.rtc_shape = rtc_shape
        self._horizon_params = {k: dict(v) for k, v in (horizon_params or {}).items()}
        for name, knobs in self._horizon_params.items():  # a wrong knob fails at start, not at a robot's round
            if name in HORIZON_POLICIES:  # (a policy registered later is checked when first asked for)
                HORIZON_POLICIES.check(name, knobs)
        self._horizons: dict[str, HorizonPolicy] = {}
        self.pending: dict[str, PendingRequest] = {}  # one per task
        self._kinds: dict[str, Optional[str]] = {}  # task -> its type, told to the scheduler at finish
        self.inflight: dict[int, Dispatch] = {}
        self.last_reply: dict[str, ChunkReply] = {}  # per task: a reply lost on the way is asked for again
        self.epoch = 0
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.stats = ServingStats()
        self.refresh_gate = RefreshGate()

    @property
    def slots(self) -> dict:
        return {t.name: t.slots for t in self.tiers}

    # --- requests in ----------------------------------------------------------------
    def submit(self, req: InferenceRequest) -> PendingRequest:
        """Validate and queue a request; a bad one raises RequestError (and is counted)."""
        try:
            return self._submit(req)
        except RequestError as e:
            self.stats.errors[e.code] += 1
            self.stats.last_error[e.code] = str(e)
            raise

    def _submit(self, req: InferenceRequest) -> PendingRequest:
        now = self.clock.now()
        if not isinstance(req.task_id, str) or not req.task_id:
            raise RequestError("task_id must be a non-empty string")
        if not isinstance(req.round_id, int) or req.round_id < 0:
            raise RoundOutOfOrder(f"round_id must be an integer >= 0, got {req.round_id!r}")
        rec = self.ledger.tasks.get(req.task_id)
        if rec is None:
            if req.round_id != 0:
                raise UnknownTask(
                    f"task '{req.task_id}' is not known (finished, reaped or never started); "
                    f"a task starts with round 0, got round {req.round_id}"
                )
        elif rec.finished_at is not None:
            raise UnknownTask(f"task '{req.task_id}' has finished; start a new task id")
        elif rec.round_ids:  # (none left when its first round was given up: it starts again)
            last = rec.round_ids[-1]
            if req.round_id == last:
                return self._resent(req, rec, now)
            if req.round_id < last:
                raise RoundOutOfOrder(
                    f"task '{req.task_id}' round {req.round_id} arrived after round {last}; round ids must increase"
                )
            if self.generating(req.task_id):
                raise RoundInFlight(
                    f"task '{req.task_id}' round {last} is being generated; send round {req.round_id} after its chunk"
                )
            if req.exec_info is None:
                raise BadExecInfo(
                    f"task '{req.task_id}' round {req.round_id}: rounds after the first must carry the last execution info"
                )
        rr = req.remaining_rounds
        if rr is not None and (isinstance(rr, bool) or not isinstance(rr, int) or rr < 1):
            raise RequestError(f"remaining_rounds must be a whole number >= 1 or absent, got {rr!r}")
        if req.obs_stamp is not None:
            check_stamp(req.obs_stamp)  # a NaN capture time would poison every observation age
        if req.exec_info is not None:
            problems = req.exec_info.problems()
            if problems:
                raise BadExecInfo(f"task '{req.task_id}' round {req.round_id}: " + "; ".join(problems))
        if req.rtc is not None:
            self._check_rtc(req)
        self._horizon_for(req)  # unknown policy or bad knob: refuse now, not after generating

        if rec is None:
            self.ledger.open_task(req.task_id, now)
            self._kinds[req.task_id] = req.kind
        old = self.pending.pop(req.task_id, None)
        if old is not None:  # the robot moved on: its newer round replaces the queued one
            self.ledger.cancel_last_round(req.task_id)
            self.stats.superseded += 1
        k = self.ledger.record_request(req.task_id, req.round_id, now, req.exec_info)
        if req.deadline is not None and math.isfinite(req.deadline):
            deadline = req.deadline
        elif req.exec_info is not None:
            deadline = req.exec_info.end(now)
        else:
            deadline = now  # robot idle: needed at once
        p = PendingRequest(req, now, next(self._seq), self.epoch, deadline, k, self.ledger.tasks[req.task_id])
        self.pending[req.task_id] = p
        self.stats.submitted += 1
        return p

    def _resent(self, req: InferenceRequest, rec, now: float) -> PendingRequest:
        """The robot asks again for its latest round (its reply was lost, or it timed out):
        the queued or generating round answers it when done, a served one from the reply
        cache; the engine never runs a round twice."""
        p = self.pending.get(req.task_id)
        if p is None:
            p = next((q for d in self.inflight.values() for q in d.requests
                      if q.task_id == req.task_id and q.record is rec), None)
        if p is not None and p.request.round_id == req.round_id:
            self.stats.resent_requests += 1
            return p
        reply = self.last_reply.get(req.task_id)
        if reply is not None and reply.round_id == req.round_id:
            self.stats.replies_replayed += 1
            return PendingRequest(req, now, next(self._seq), self.epoch, now, len(rec.round_ids) - 1, rec, replay=reply)
        raise DuplicateRequest(f"task '{req.task_id}' round {req.round_id} was already received and its reply is gone")

    # --- dispatch (Algorithm 1) ------------------------------------------------------
    def dispatch(self) -> list[Dispatch]:
        """One scheduling round: order pending requests, fill the free tiers."""
        free = [t for t in self.tiers if t.free]
        if not free or not self.pending:
            return []
        now = self.clock.now()
        limit = sum(t.batch_limit for t in free)
        ctx = SchedulingContext(now, self.ledger, self.epoch)
        ordered = self.scheduler.select(list(self.pending.values()), ctx, limit)
        out = []
        for tier, batch in self.placement.place(ordered, free, now):
            if not batch:
                continue
            for p in batch:
                del self.pending[p.task_id]
                self.ledger.record_dispatch(p.task_id, p.round_index, now)
            set_rtc_delays(batch, tier.profile.latency_s(len(batch)), now)  # RTC's d: this batch's place and size
            tier.busy += 1
            d = Dispatch(next(self._ids), tier.name, batch, now)
            self.inflight[d.id] = d
            out.append(d)
            self.stats.dispatched += len(batch)
            self.stats.batches += 1
        if out:
            self.epoch += 1  # everyone left pending has now skipped one more round
        return out

    def refresh_stale(self, d: Dispatch) -> None:
        """Algorithm 1 lines 20-21: fetch a fresh observation for each dispatched request whose
        observation aged past stale_obs_s while queued (one refresher call for the batch); a
        request whose refresh does not come back keeps the observation it has (counted), and
        so does every one while the refresh gate is closed (robots not answering in time).
        Records every observation's age at dispatch."""
        now = self.clock.now()
        s = self.stats
        stamped = [p for p in d.requests if p.request.obs_stamp is not None]
        stale = [p for p in stamped if self.stale_obs_s is not None and now - p.request.obs_stamp > self.stale_obs_s]
        if stale and self.refresher is not None and not self.refresh_gate.open():
            s.refresh_skipped += len(stale)
        elif stale and self.refresher is not None:
            fresh = list(self.refresher([p.request for p in stale]))
            if len(fresh) != len(stale):  # a broken refresher costs the freshness, never the round
                fresh = [None] * len(stale)
            for p, f in zip(stale, fresh):
                self.refresh_gate.record(f is not None)
                if f is None:
                    s.refresh_failures += 1
                else:
                    old = getattr(p.request.observation, "timestep", 0)
                    p.request.observation, p.request.obs_stamp = f
                    follow_refresh(p.request, old)  # RTC: the leftover and d from the fresh timestep on
                    s.refreshes += 1
        for p in stamped:
            age = now - p.request.obs_stamp
            s.obs_age_sum += age
            s.obs_age_n += 1
            s.obs_age_max = max(s.obs_age_max, age)

    # --- results back ----------------------------------------------------------------
    def complete(self, item: Dispatch, result: Sequence[ChunkResult]) -> list[ChunkReply]:
        """Horizon policy + action manager: one trimmed chunk per still-live request."""
        d, results, dispatch_id = item, result, item.id
        if len(results) != len(d.requests):
            self.requeue(dispatch_id)  # an engine fault must not cost the robots their requests
            raise ValueError(
                f"engine returned {len(results)} results for a batch of {len(d.requests)}; the batch was requeued"
            )
        del self.inflight[dispatch_id]
        self.tier(d.tier).busy -= 1
        now = self.clock.now()
        replies = []
        for p, res in zip(d.requests, results):
            if not self._live(p):
                self.stats.dropped_replies += 1  # task dropped (or restarted) while generating
                continue
            self.ledger.record_complete(p.task_id, p.round_index, now)
            req = p.request
            decision = self._horizon_for(req).choose(res, req.horizon.param)
            decision = respect_rtc_delay(decision, res.rtc_delay_steps, len(res.actions))
            replies.append(
                ChunkReply(
                    req.task_id,
                    req.round_id,
                    res.actions[: decision.horizon],
                    decision.horizon,
                    decision.reason,
                    len(res.actions),
                    d.tier,
                    now,
                    res.rtc_delay_steps,
                )
            )
        for r in replies:
            self.last_reply[r.task_id] = r
        self.stats.completed += len(replies)
        return replies

    def split(self, item: Dispatch, rows: Sequence[int]) -> Dispatch:
        """Carve `rows` of an in-flight batch out into a batch of their own on the same slot
        (held once more, so the two complete or fail apart): the engine failed on those rows
        alone, and the rest of the batch must still be answered."""
        d = self.inflight[item.id]
        take = set(rows)
        carved = Dispatch(next(self._ids), d.tier, [p for i, p in enumerate(d.requests) if i in take], d.started)
        d.requests = [p for i, p in enumerate(d.requests) if i not in take]
        self.inflight[carved.id] = carved
        self.tier(d.tier).busy += 1
        return carved

    def requeue(self, dispatch_id: int) -> int:
        """A batch failed or timed out: its requests wait again, none lost, none twice."""
        d = self.inflight.pop(dispatch_id)
        self.tier(d.tier).busy -= 1
        back = 0
        for p in d.requests:
            if not self._live(p):
                continue  # dropped (or restarted) meanwhile
            self.ledger.record_requeue(p.task_id, p.round_index)
            self.pending[p.task_id] = p
            back += 1
        self.stats.requeued += back
        return back

    def fail(self, item: Dispatch, reason: str = "engine_failure", max_failures: Optional[int] = None
             ) -> list[PendingRequest]:
        """A batch failed: its requests wait again, except those in `max_failures` (default:
        the core's) failed batches (one that breaks the engine, or that a tier refuses, must
        not cycle forever): their round is withdrawn and they are returned, for the caller to
        answer with an error (the robot may send it again). The caller counts `reason`."""
        d = item
        max_failures = self.max_failures if max_failures is None else max_failures
        for p in d.requests:
            p.failures += 1
        self.requeue(d.id)
        gave_up = []
        for p in d.requests:
            if p.failures >= max_failures and self._live(p) and self.pending.get(p.task_id) is p:
                del self.pending[p.task_id]
                self.ledger.cancel_last_round(p.task_id)
                gave_up.append(p)
        self.stats.requeued -= len(gave_up)
        self.stats.given_up += len(gave_up)
        return gave_up

    # --- task lifecycle --------------------------------------------------------------
    def finish_task(self, task_id: str, exec_info=None):
        """The robot reports its last execution done; returns the task's ledger record."""
        if task_id not in self.ledger.tasks:
            raise UnknownTask(f"task '{task_id}' is not known")
        rec = self.ledger.tasks[task_id]
        first = rec.finished_at is None
        self.ledger.record_finish(task_id, self.clock.now(), exec_info)
        if first:  # a repeated final report must not count the task twice
            self.scheduler.task_finished(rec, self._kinds.get(task_id))  # learns how long tasks run
        return rec

    def generating(self, task_id: str) -> bool:
        """True while the task's latest round is being generated (dispatched, not complete)."""
        rec = self.ledger.tasks.get(task_id)
        g = rec.gens[-1] if rec is not None and rec.gens else None
        return g is not None and g.end is None

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        """Forget a task (robot gone): its queued request goes, replies in flight are dropped."""
        self.pending.pop(request_id, None)
        self.last_reply.pop(request_id, None)
        self._kinds.pop(request_id, None)
        return self.ledger.remove(request_id) is not None


    def snapshot(self) -> dict:
        return {"pending": len(self.pending), "inflight": len(self.inflight), "epoch": self.epoch,
                **plain(self.stats)}

    # --- helpers -----------------------------------------------------------------------
    def _live(self, p: PendingRequest) -> bool:
        return self.ledger.tasks.get(p.task_id) is p.record

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def _check_rtc(self, req: InferenceRequest) -> None:
        """An RTC leftover the engine can inpaint (core/rtc.py), and the control rate its d needs."""
        dim, chunk = self.rtc_shape or (None, None)
        problems = req.rtc.sent_problems(dim) if hasattr(req.rtc, "sent_problems") else ["rtc must be an RtcGuide"]
        k = len(req.rtc.leftover) if not problems else 0
        if chunk is not None and k > chunk:
            problems.append(f"rtc leftover has {k} actions, more than a chunk of {chunk}")
        if k and req.exec_info is None:
            problems.append("an rtc leftover needs the execution info (its control rate sets the delay)")
        if problems:
            raise BadRtc(f"task '{req.task_id}' round {req.round_id}: " + "; ".join(problems))

    def _horizon_for(self, req: InferenceRequest) -> HorizonPolicy:
        name = req.horizon.policy
        pol = self._horizons.get(name)
        if pol is None:
            if name not in HORIZON_POLICIES:
                raise UnknownPolicy(
                    f"unknown horizon policy '{name}'; known: {', '.join(HORIZON_POLICIES.names())}"
                )
            pol = self._horizons[name] = HORIZON_POLICIES.create(name, **self._horizon_params.get(name, {}))
        problem = pol.check_param(req.horizon.param)
        if problem:
            raise BadPolicyParam(problem)
        return pol
