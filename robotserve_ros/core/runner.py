"""The one serving loop around ServingCore, for every live path and the simulator.

A round goes submit -> dispatch (scheduler orders, placement assigns tiers) -> refresh of
stale observations (Algorithm 1 lines 20-21 of seed 000) -> engine -> complete (horizon
policy, trim) -> reply. `Runner` holds each step once:

- `submit`, `dispatch`, `begin`, `finish`, `fail`, `end_cooldown` are the steps. The
  simulator calls them on its virtual clock, with the engine's time taken from the tier's
  engine profile (so hybrid placement and a failing tier are simulated with this code too);
- `start()` adds the live driver: one dispatcher thread that asks the core for batches
  whenever work arrives or a slot frees, and one thread per tier slot that runs its batch
  (`run_batch`). The ROS inference server, the LeRobot endpoint and the GPU server use it.

A batch whose engine fails (a remote server down, a deadline passed) goes back to the queue
(ServingCore.requeue) and its slot cools down for retry_pause_s: it is held busy, so the
placement sends nothing there meanwhile. A reply for a batch that is no longer in flight
(requeued and served elsewhere meanwhile) is discarded and counted: no request is lost,
none is answered twice.

Benchmarks and diagnostics watch the loop through a stage observer, never by patching it:
`observer(stage, rounds)` is called with one of STAGES and the (task_id, round_id) pairs it
concerns, right after the step; the observer reads whatever clock it wants.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from typing import Callable, Mapping, Optional, Sequence

from .errors import RequestError
from .serving import Dispatch, ServingCore
from .types import ChunkReply, InferenceRequest, PendingRequest

log = logging.getLogger("robotserve.runner")

STAGES = ("submit", "dispatch", "engine_start", "engine_end", "reply")
Rounds = Sequence[tuple]  # (task_id, round_id) pairs
StageObserver = Callable[[str, Rounds], None]


def _rounds(d: Dispatch) -> list:
    return [(p.task_id, p.request.round_id) for p in d.requests]


class Runner:
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
        self.busy_s: Counter = Counter()  # engine time per tier, on the core's clock
        self.failures: Counter = Counter()
        self.late_replies = 0
        self._work = threading.Event()
        self._stop = threading.Event()
        self._queues: dict = {}
        self._threads: list = []

    # --- observers ------------------------------------------------------------------------
    def observe(self, observer: StageObserver) -> None:
        self.observers.append(observer)

    def _emit(self, stage: str, rounds: Rounds) -> None:
        for ob in self.observers:
            try:
                ob(stage, rounds)
            except Exception:  # a diagnostics fault must never cost a robot its round
                log.exception("stage observer failed at %s", stage)

    # --- the steps ------------------------------------------------------------------------
    def submit(self, req: InferenceRequest, then: Optional[Callable[[PendingRequest], None]] = None) -> PendingRequest:
        """Validate and queue a request (RequestError if refused, counted by the core).
        `then(pending)` runs under the same lock, before any batch can take the request: a
        caller registers its waiter there so no reply can come before it."""
        with self.lock:
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

    def dispatch(self) -> list[Dispatch]:
        with self.lock:
            ds = self.core.dispatch()
        for d in ds:
            self._emit("dispatch", _rounds(d))
        return ds

    def begin(self, d: Dispatch) -> float:
        """Refresh stale observations (outside the lock: a refresh is a round trip to the
        robot), then mark the engine's start; returns it on the core's clock."""
        self.core.refresh_stale(d)
        self._emit("engine_start", _rounds(d))
        return self.core.clock.now()

    def finish(self, d: Dispatch, results: list, started: float) -> bool:
        """Complete a batch and hand its replies on; False (and counted) when the batch was
        requeued meanwhile, so its requests are someone else's to answer now."""
        rounds = _rounds(d)
        self._emit("engine_end", rounds)
        with self.lock:
            self.busy_s[d.tier] += self.core.clock.now() - started
            if d.id not in self.core.inflight:
                self.late_replies += 1
                return False
            try:
                replies: list[ChunkReply] = self.core.complete(d.id, results)
            except ValueError as e:  # wrong result count: the core requeued the batch
                self.core.stats.errors["engine_failure"] += 1
                log.error("%s", e)
                return False
            self.on_replies(replies, d, list(results))
        self._emit("reply", [(r.task_id, r.round_id) for r in replies])
        return True

    def fail(self, d: Dispatch, e: Exception, started: Optional[float] = None) -> None:
        """The engine failed the batch: requeue it and cool its slot down (held busy until
        end_cooldown, so the placement looks elsewhere)."""
        tier = self.core.tier(d.tier)
        with self.lock:
            if started is not None:
                self.busy_s[d.tier] += self.core.clock.now() - started
            self.failures[d.tier] += 1
            self.core.stats.errors["engine_failure"] += 1
            if d.id in self.core.inflight:
                self._requeue(d, e)
            tier.busy += 1
        log.warning("tier %s failed a batch of %d (%r); requeued", d.tier, len(d.requests), e)
        if self.on_error is not None:
            self.on_error(d, e)

    def _requeue(self, d: Dispatch, e: Exception) -> None:
        """Under the lock: the batch's requests wait again, up to max_attempts failures each."""
        gave_up = self.core.fail(d.id, self.max_attempts)
        if gave_up:
            log.error("%d request(s) failed %d batches; answered with an error: %r", len(gave_up), self.max_attempts, e)
            if self.on_given_up is not None:
                self.on_given_up(gave_up, e)

    def end_cooldown(self, tier_name: str) -> None:
        with self.lock:
            self.core.tier(tier_name).busy -= 1
        self.kick()

    def run_batch(self, d: Dispatch) -> None:
        """One batch on its tier's engine, start to reply (a live slot thread's work)."""
        started = self.begin(d)
        try:
            results = self.engines[d.tier].infer([p.request for p in d.requests])
        except Exception as e:
            self.fail(d, e, started)
            self._stop.wait(self.retry_pause_s)
            self.end_cooldown(d.tier)
            return
        self.finish(d, results, started)

    # --- the live driver --------------------------------------------------------------------
    def start(self) -> "Runner":
        """Start the dispatcher and one thread per tier slot."""
        if self._threads:
            return self
        self._queues = {t.name: queue.SimpleQueue() for t in self.core.tiers}
        self._threads = [threading.Thread(target=self._dispatch_loop, name="dispatcher", daemon=True)]
        for t in self.core.tiers:
            for k in range(t.slots):
                self._threads.append(threading.Thread(target=self._slot_loop, args=(t.name,), name=f"tier-{t.name}-{k}", daemon=True))
        for th in self._threads:
            th.start()
        return self

    def kick(self) -> None:
        """Work arrived or a slot freed: dispatch again."""
        self._work.set()

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            self._work.wait(0.05)
            self._work.clear()
            if self._stop.is_set():
                break
            for d in self.dispatch():
                self._queues[d.tier].put(d)

    def _slot_loop(self, tier: str) -> None:
        q = self._queues[tier]
        while True:
            d = q.get()
            if d is None:
                return
            try:
                self.run_batch(d)
            except Exception as e:  # the slot must outlive any one batch
                log.exception("serving a batch on %s failed", tier)
                with self.lock:
                    self.core.stats.errors["internal"] += 1
                    if d.id in self.core.inflight:
                        self._requeue(d, e)
                if self.on_error is not None:
                    self.on_error(d, e)
            self.kick()

    def close(self) -> None:
        self._stop.set()
        self._work.set()
        for q in self._queues.values():
            for _ in range(len(self._threads)):
                q.put(None)
        for th in self._threads:
            th.join(timeout=2.0)


class StageTrace:
    """A stage observer that keeps, per round, the time each stage was reached, read from
    `now_ns` (e.g. time.monotonic_ns: comparable across processes on one machine). Callers
    may mark their own stages too (a node: request received, reply sent). Bounded: the
    oldest rounds go first once `max_rounds` are kept."""

    def __init__(self, now_ns: Callable[[], int], max_rounds: int = 100_000) -> None:
        self.now_ns, self.max_rounds = now_ns, max_rounds
        self.marks: dict = {}
        self._lock = threading.Lock()

    def __call__(self, stage: str, rounds: Rounds) -> None:
        t = self.now_ns()
        with self._lock:
            for task, rnd in rounds:
                self.marks.setdefault(f"{task}#{rnd}", {})[stage] = t
            while len(self.marks) > self.max_rounds:
                self.marks.pop(next(iter(self.marks)))

    def snapshot(self) -> dict:
        with self._lock:
            return {k: dict(v) for k, v in self.marks.items()}
