"""The one serving loop around ServingCore, for every live path and the simulator.

A round goes submit -> dispatch (scheduler orders, placement assigns tiers) -> refresh of
stale observations (Algorithm 1 lines 20-21 of seed 000) -> engine -> complete (horizon
policy, trim) -> reply. `Runner` holds each step once:

- `submit`, `dispatch`, `begin`, `finish`, `fail`, `end_cooldown` are the steps. The
  simulator calls them on its virtual clock, with the engine's time taken from the tier's
  engine profile (so hybrid placement and a failing tier are simulated with this code too);
- `start()` adds the live driver (core/loop.py, shared with the language cores): one
  dispatcher thread that asks the core for batches whenever work arrives or a slot frees,
  and one thread per tier slot that runs its batch (`run_batch`). The ROS inference server, the LeRobot endpoint and the GPU server use it.

A batch whose engine fails (a remote server down, a deadline passed) goes back to the queue
(ServingCore.requeue) and its slot cools down for retry_pause_s: it is held busy, so the
placement sends nothing there meanwhile. One request cannot fail its batch-mates: when an
engine raises on a batch of several for any reason but its tier being down (`tier_failure`),
the batch is run again in halves until the rows that fail alone are found; those rows' senders
get the error (the engine's own code when it raised a RequestError) and the others are served. A reply for a batch that is no longer in flight
(requeued and served elsewhere meanwhile) is discarded and counted: no request is lost,
none is answered twice.

Benchmarks and diagnostics watch the loop through a stage observer, never by patching it:
`observer(stage, rounds)` is called with one of STAGES and the (task_id, round_id) pairs it
concerns, right after the step; the observer reads whatever clock it wants (core/stages.py).
"""
from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from typing import Callable, Mapping, Optional

from .errors import RequestError, StaleObservation
from .loop import LiveDriver
from .refresh_ahead import RefreshAhead
from .serving import Dispatch, ServingCore
from .stages import STAGES, Rounds, StageObserver, StageTrace  # noqa: F401  (imported from here)
from .types import ChunkReply, InferenceRequest, PendingRequest

log = logging.getLogger("robotserve.runner")

def _rounds(d: Dispatch) -> list:
    return [(p.task_id, p.request.round_id) for p in d.requests]


def tier_failure(e: BaseException) -> bool:
    """The tier failed the batch (unreachable, past its deadline, a replica gone), not one of
    its rows: engines' tier errors say so with a true `tier_failure` attribute."""
    return bool(getattr(e, "tier_failure", False))


class _RowFailed:
    """In a batch's results: this row failed alone (its batch-mates did not)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class Runner(RefreshAhead):
    """Drives one ServingCore over its tiers' engines (see the module docstring).

    on_replies(replies, dispatch, results) runs under the lock for every completed batch:
    the replies are the trimmed chunks of the still-live requests, results the engine's
    full output in the batch's order (a GPU server sends those back untrimmed).
    on_given_up(pending_requests, exc) runs under the lock for requests that were in
    max_attempts failed batches: they are not requeued again, their senders get an error.
    """

    def __init__(
        self,
        core: ServingCore,
        engines: Mapping[str, object],
        on_replies: Callable[[list, Dispatch, list], None],
        *,
        lock: Optional[threading.Lock] = None,
        observer: Optional[StageObserver] = None,
        on_error: Optional[Callable[[Dispatch, Exception], None]] = None,
        on_given_up: Optional[Callable[[list, Exception], None]] = None,
        retry_pause_s: float = 0.1,
        max_attempts: int = 3,
        prefresh_lead_s: Optional[float] = None,
    ) -> None:
        missing = [t.name for t in core.tiers if t.name not in engines]
        if missing:
            raise ValueError(f"no engine for tier(s) {missing}")
        self.core, self.engines = core, dict(engines)
        self.lock = lock or threading.Lock()  # guards the core; callers may share it for their own state
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.on_replies, self.on_error, self.retry_pause_s = on_replies, on_error, retry_pause_s
        self.on_given_up, self.max_attempts = on_given_up, max_attempts
        self.observers: list = [observer] if observer is not None else []
        self.reply_listeners: list = []  # more on_replies-like callbacks (other client protocols)
        self.given_up_listeners: list = []  # and on_given_up-like ones
        self.rows_failed = 0  # requests an engine failed on alone while their batch-mates were served
        self.busy_s: Counter = Counter()  # engine time per tier, on the core's clock
        self.failures: Counter = Counter()
        self.late_replies = 0
        # Load accounting (read under the lock; the node's diagnostics and benches use it):
        # the core is backlogged while more requests wait than one full batch of every tier
        # slot; backlogged_s integrates that time, busy_backlogged_s[tier] the slot-seconds
        # the tier's engine ran meanwhile (a well-fed engine is busy all of it).
        self.backlog_threshold = sum(t.batch_limit * t.slots for t in core.tiers)
        self.backlogged_s = 0.0
        self.busy_backlogged_s: Counter = Counter()
        self.running: Counter = Counter()  # tier -> slots inside engine.infer now
        self._acct_at: Optional[float] = None
        # The last samples (seconds, core clock) of: a dispatch step that made batches; a slot
        # freed while backlogged -> its next batch dispatched (gap_dispatch) -> the engine
        # starting after the refresh (gap_refresh).
        self.dispatch_s: deque = deque(maxlen=1024)
        self.gap_dispatch_s: deque = deque(maxlen=1024)
        self.gap_refresh_s: deque = deque(maxlen=1024)
        self.gap_handoff_s: deque = deque(maxlen=1024)  # dispatched -> its slot thread begins
        self._freed_at: dict = {}  # tier -> when a slot freed while backlogged
        self._dispatched_at: dict = {}  # dispatch id -> when, for batches dispatched so
        # Refresh ahead (live driver only): prefresh_lead_s before a batch is expected to end
        # (its tier's engine profile), the requests the scheduler would run next get their
        # stale observations fetched, so the engine does not wait on robots between batches.
        self.prefresh_lead_s = prefresh_lead_s
        self.prefreshes = Counter()  # ok / failed / skipped (taken meanwhile)
        self._prefresh_at: dict = {}  # tier -> when to refresh its next batch ahead
        self._prefresh_wake = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self._driver: Optional[LiveDriver] = None
        self._threads: list = []  # the refresh-ahead thread

    # --- observers ------------------------------------------------------------------------
    def observe(self, observer: StageObserver) -> None:
        self.observers.append(observer)

    def listen(self, on_replies: Callable[[list, Dispatch, list], None],
               on_given_up: Optional[Callable[[list, Exception], None]] = None) -> None:
        """Another front end on the same fleet (an openpi endpoint beside the ROS service):
        called like on_replies (and on_given_up), under the lock, after it, with every batch's
        replies (every round given up); each front end picks its own tasks' out."""
        self.reply_listeners.append(on_replies)
        if on_given_up is not None:
            self.given_up_listeners.append(on_given_up)

    def _emit(self, stage: str, rounds: Rounds) -> None:
        for ob in self.observers:
            try:
                ob(stage, rounds)
            except Exception:  # a diagnostics fault must never cost a robot its round
                log.exception("stage observer failed at %s", stage)

    def account(self) -> None:
        """Under the lock, before any change of the queue or of the running slots (and before
        reading the load figures): the time since the last change goes to the backlog integrals."""
        now = self.core.clock.now()
        if self._acct_at is not None and len(self.core.pending) > self.backlog_threshold:
            dt = max(0.0, now - self._acct_at)
            self.backlogged_s += dt
            for tier, n in self.running.items():
                self.busy_backlogged_s[tier] += n * dt
        self._acct_at = now

    def backlogged(self) -> bool:
        return len(self.core.pending) > self.backlog_threshold

    # --- the steps ------------------------------------------------------------------------
    def submit(self, req: InferenceRequest, then: Optional[Callable[[PendingRequest], None]] = None) -> PendingRequest:
        """Validate and queue a request (RequestError if refused, counted by the core).
        `then(pending)` runs under the same lock, before any batch can take the request: a
        caller registers its waiter there so no reply can come before it."""
        with self.lock:
            self.account()
            p = self.core.submit(req)
            if then is not None:
                then(p)
        self._emit("submit", [(req.task_id, req.round_id)])
        self.kick()
        return p

    def count_error(self, err: RequestError) -> None:
        """A request refused before it reached the core (malformed message): count it there."""
        with self.lock:
            self.core.stats.errors[err.code] += 1
            self.core.stats.last_error[err.code] = str(err)

    def dispatch(self) -> list[Dispatch]:
        with self.lock:
            self.account()
            backlogged = self.backlogged()
            t0 = self.core.clock.now()
            ds = self.core.dispatch()
            if ds:
                t1 = self.core.clock.now()
                self.dispatch_s.append(t1 - t0)
                for d in ds:
                    freed = self._freed_at.pop(d.tier, None)
                    if freed is not None:
                        self.gap_dispatch_s.append(t0 - freed)
                    if freed is not None or backlogged:
                        self._dispatched_at[d.id] = t1
        for d in ds:
            self._emit("dispatch", _rounds(d))
        return ds

    def begin(self, d: Dispatch) -> float:
        """Refresh stale observations (outside the lock: a refresh is a round trip to the
        robot), then mark the engine's start; returns it on the core's clock."""
        frm = self._dispatched_at.get(d.id)
        if frm is not None:
            self.gap_handoff_s.append(self.core.clock.now() - frm)
        self.core.refresh_stale(d)
        self._carve_too_old(d)
        self._emit("engine_start", _rounds(d))
        with self.lock:
            self.account()
            started = self.core.clock.now()
            self.running[d.tier] += 1
            frm = self._dispatched_at.pop(d.id, None)
            if frm is not None:
                self.gap_refresh_s.append(started - frm)
        if self.prefresh_lead_s is not None and self._driver is not None:
            expected = self.core.tier(d.tier).profile.latency_s(len(d.requests))
            with self._prefresh_wake:
                self._prefresh_at[d.tier] = started + max(0.0, expected - self.prefresh_lead_s)
                self._prefresh_wake.notify()
        return started

    def finish(self, d: Dispatch, results: list, started: float) -> bool:
        """Complete a batch and hand its replies on; False (and counted) when the batch was
        requeued meanwhile, so its requests are someone else's to answer now."""
        rounds = _rounds(d)
        self._emit("engine_end", rounds)
        with self.lock:
            self._engine_done(d.tier, started)
            if d.id not in self.core.inflight:
                self.late_replies += 1
                return False
            try:
                replies: list[ChunkReply] = self.core.complete(d, results)
            except ValueError as e:  # wrong result count: the core requeued the batch
                self.core.stats.errors["engine_failure"] += 1
                log.error("%s", e)
                return False
            # Before they are handed on: a node may answer its caller inside on_replies
            # (deferred replies), and its own "answered" stage must come after this one.
            self._emit("reply", [(r.task_id, r.round_id) for r in replies])
            self.on_replies(replies, d, list(results))
            for listener in self.reply_listeners:
                listener(replies, d, results)
        return True

    def fail(self, d: Dispatch, e: Exception, started: Optional[float] = None) -> None:
        """The engine failed the batch: requeue it and cool its slot down (held busy until
        end_cooldown, so the placement looks elsewhere)."""
        tier = self.core.tier(d.tier)
        with self.lock:
            if started is not None:
                self._engine_done(d.tier, started)
            self.failures[d.tier] += 1
            self.core.stats.errors["engine_failure"] += 1
            self.core.stats.last_error["engine_failure"] = f"tier {d.tier}: {e!r}"
            if d.id in self.core.inflight:
                self._requeue(d, e)
            tier.busy += 1
        log.warning("tier %s failed a batch of %d (%r); requeued", d.tier, len(d.requests), e)
        if self.on_error is not None:
            self.on_error(d, e)

    def _engine_done(self, tier: str, started: float) -> None:
        """Under the lock: the tier's engine finished (or failed) a batch begun at `started`."""
        self.account()
        now = self.core.clock.now()
        self.busy_s[tier] += now - started
        self.running[tier] = max(0, self.running[tier] - 1)
        if self.backlogged():
            self._freed_at[tier] = now

    def _requeue(self, d: Dispatch, e: Exception, max_attempts: Optional[int] = None) -> None:
        """Under the lock: the batch's requests wait again, up to max_attempts failures each
        (1: answered with the error now)."""
        gave_up = self.core.fail(d, str(e), self.max_attempts if max_attempts is None else max_attempts)
        if gave_up:
            log.error("%d request(s) failed %d batches; answered with an error: %r", len(gave_up), gave_up[0].failures, e)
            for cb in ([self.on_given_up] if self.on_given_up is not None else []) + self.given_up_listeners:
                cb(gave_up, e)

    def _infer_rows(self, engine, reqs: list, top: bool = True) -> list:
        """The engine's results for `reqs`; a batch it fails on (not as a tier) is run again in
        halves, so a row that fails alone comes back as _RowFailed and its batch-mates are
        served. At the top a failure of every row raises, as the engine did."""
        try:
            return list(engine.infer(reqs))
        except Exception as e:
            if len(reqs) == 1 or tier_failure(e):
                if top:
                    raise
                return [_RowFailed(e)] * len(reqs)
            first = e
        mid = len(reqs) // 2
        out = self._infer_rows(engine, reqs[:mid], False) + self._infer_rows(engine, reqs[mid:], False)
        if top and all(isinstance(r, _RowFailed) for r in out):
            raise first
        return out

    def _fail_rows(self, d: Dispatch, results: list) -> list:
        """Under no lock: the rows that failed alone leave the batch, their senders answered
        with the error now (retrying them would fail their next batch-mates again); returns the
        results of the rows left."""
        bad = [i for i, r in enumerate(results) if isinstance(r, _RowFailed)]
        if not bad:
            return results
        with self.lock:
            if d.id not in self.core.inflight:
                return [r for r in results if not isinstance(r, _RowFailed)]
            carved = self.core.split(d, bad)
            self.rows_failed += len(bad)
            e = results[bad[0]].error
            self.core.stats.errors[e.code if isinstance(e, RequestError) else "engine_failure"] += len(bad)
            self._requeue(carved, e, max_attempts=1)
        log.warning("tier %s: %d of %d request(s) failed alone (%r); their batch-mates are served",
                    d.tier, len(bad), len(results), results[bad[0]].error)
        if self.on_error is not None:
            self.on_error(carved, results[bad[0]].error)
        return [r for r in results if not isinstance(r, _RowFailed)]

    def _carve_too_old(self, d: Dispatch) -> None:
        """Rows whose observation is still older than its maximum age after the refresh leave
        the batch ungenerated; their senders are told now (stale_observation) and may send the
        round again with a fresh observation."""
        old = self.core.too_old(d)
        if not old:
            return
        with self.lock:
            if d.id not in self.core.inflight:
                return
            carved = self.core.split(d, [i for i, _, _ in old])
            _, age, lim = old[0]
            e = StaleObservation(f"observation {age:.3f} s old when its batch began, over its maximum {lim:g} s, and "
                                 "no fresher one came: send the round again with a fresh observation")
            self.core.stats.errors[e.code] += len(old)
            self.core.stats.last_error[e.code] = str(e)
            self._requeue(carved, e, max_attempts=1)

    def end_cooldown(self, tier_name: str) -> None:
        with self.lock:
            self.core.tier(tier_name).busy -= 1
        self.kick()

    def run_batch(self, d: Dispatch) -> None:
        """One batch on its tier's engine, start to reply (a live slot thread's work)."""
        started = self.begin(d)
        if not d.requests:  # every row's observation too old: nothing to generate
            self.finish(d, [], started)
            return
        try:
            results = self._infer_rows(self.engines[d.tier], [p.request for p in d.requests])
        except Exception as e:
            if isinstance(e, RequestError) and len(d.requests) == 1:  # the engine refused this row: no retry
                self._refused_alone(d, e, started)
                return
            self.fail(d, e, started)
            self._stop.wait(self.retry_pause_s)
            self.end_cooldown(d.tier)
            return
        self.finish(d, self._fail_rows(d, results), started)

    def _refused_alone(self, d: Dispatch, e: RequestError, started: float) -> None:
        """A batch of one the engine refused as a bad request: its sender gets the engine's
        code now; the slot is not cooled down (the tier is fine)."""
        with self.lock:
            self._engine_done(d.tier, started)
            self.core.stats.errors[e.code] += 1
            if d.id in self.core.inflight:
                self._requeue(d, e, max_attempts=1)
        log.warning("tier %s refused a request: %s", d.tier, e)
        if self.on_error is not None:
            self.on_error(d, e)
        self.kick()

    # --- the live driver --------------------------------------------------------------------
    def start(self) -> "Runner":
        """Start the dispatcher and one thread per tier slot (core/loop.py), and the refresh-ahead thread."""
        if self._driver is not None:
            return self
        self._driver = LiveDriver(self.core.slots, self.dispatch, lambda _tier, d: self.run_batch(d),
                                  on_crash=self._crashed)
        if self.prefresh_lead_s is not None:
            self._threads.append(threading.Thread(target=self._prefresh_loop, name="prefresh", daemon=True))
        self._driver.start()
        for th in self._threads:
            th.start()
        return self

    def set_slots(self, tier_name: str, n: int) -> bool:
        """A tier's slot count follows what serves it (a Ray pool's running replicas); True if changed."""
        with self.lock:
            t = self.core.tier(tier_name)
            changed, t.slots = t.slots != n, n
        if changed:
            self.kick()
        return changed

    def kick(self) -> None:
        """Work arrived or a slot freed: dispatch again."""
        if self._driver is not None:
            self._driver.kick()

    def _crashed(self, tier: str, d: Dispatch, e: Exception) -> None:
        """run_batch raised past its own handling (a bug): requeue the batch, count it."""
        with self.lock:
            self.core.stats.errors["internal"] += 1
            if d.id in self.core.inflight:
                self._requeue(d, e)
        if self.on_error is not None:
            self.on_error(d, e)

    def close(self) -> None:
        self._stop.set()
        with self._prefresh_wake:
            self._prefresh_wake.notify()
        if self._driver is not None:
            self._driver.close()
        for th in self._threads:
            th.join(timeout=2.0)
