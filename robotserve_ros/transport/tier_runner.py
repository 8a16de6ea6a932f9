"""The live serving loop over several tiers: batches of every tier run at once.

One dispatcher thread asks the core for batches (scheduler + placement) whenever work
arrives or a slot frees; each tier slot has its own thread that refreshes stale
observations, runs its tier's engine and completes the batch. A batch whose engine fails
(a remote server down, a deadline passed) goes back to the queue (ServingCore.requeue) and
its slot cools down for retry_pause_s (held busy, so the placement sends nothing there).
A reply for a batch that is no longer in flight -- requeued meanwhile and served
elsewhere -- is discarded and counted: no request is lost, none answered twice.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from typing import Callable, Mapping, Optional

log = logging.getLogger("robotserve.tier_runner")


class TierRunner:
    def __init__(
        self,
        core,
        engines: Mapping[str, object],
        lock: threading.Lock,
        on_replies: Callable[[list], None],
        *,
        on_error: Optional[Callable[[object, Exception], None]] = None,
        retry_pause_s: float = 0.1,
        run_batch: Optional[Callable[[object], None]] = None,
    ) -> None:
        missing = [t.name for t in core.tiers if t.name not in engines]
        if missing:
            raise ValueError(f"no engine for tier(s) {missing}")
        self.core, self.engines, self.lock = core, dict(engines), lock
        self.on_replies, self.on_error, self.retry_pause_s = on_replies, on_error, retry_pause_s
        self._run_batch = run_batch or self.run_batch  # a node may wrap it (instrumentation)
        self.busy_s: Counter = Counter()
        self.failures: Counter = Counter()
        self.late_replies = 0
        self._work = threading.Event()
        self._stop = threading.Event()
        self._queues = {t.name: queue.SimpleQueue() for t in core.tiers}
        self._threads = [threading.Thread(target=self._dispatch_loop, name="dispatcher", daemon=True)]
        for t in core.tiers:
            for k in range(t.slots):
                self._threads.append(threading.Thread(target=self._slot_loop, args=(t.name,), name=f"tier-{t.name}-{k}", daemon=True))
        for th in self._threads:
            th.start()

    def kick(self) -> None:
        """Work arrived or a slot freed: dispatch again."""
        self._work.set()

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            self._work.wait(0.05)
            self._work.clear()
            if self._stop.is_set():
                break
            with self.lock:
                ds = self.core.dispatch()
            for d in ds:
                self._queues[d.tier].put(d)

    def _slot_loop(self, tier: str) -> None:
        q = self._queues[tier]
        while True:
            d = q.get()
            if d is None:
                return
            try:
                self._run_batch(d)
            except Exception as e:  # the slot must outlive any one batch
                log.exception("serving a batch on %s failed", tier)
                with self.lock:
                    self.core.stats.errors["internal"] += 1
                    if d.id in self.core.inflight:
                        self.core.requeue(d.id)
                if self.on_error:
                    self.on_error(d, e)
            self.kick()

    def run_batch(self, d) -> None:
        self.core.refresh_stale(d)  # outside the lock: a refresh is a round trip to the robot
        t = time.monotonic()
        try:
            results = self.engines[d.tier].infer([p.request for p in d.requests])
        except Exception as e:
            self._failed(d, e)
            return
        self.busy_s[d.tier] += time.monotonic() - t
        self.deliver(d.id, results)

    def deliver(self, dispatch_id: int, results) -> bool:
        """Complete a batch and hand its replies on; False (and counted) when the batch
        was requeued meanwhile, so its requests are someone else's to answer now."""
        with self.lock:
            if dispatch_id not in self.core.inflight:
                self.late_replies += 1
                return False
            try:
                replies = self.core.complete(dispatch_id, results)
            except ValueError as e:  # wrong result count: the core requeued the batch
                log.error("%s", e)
                return False
            self.on_replies(replies)
        return True

    def _failed(self, d, e: Exception) -> None:
        tier = self.core._tier(d.tier)
        with self.lock:
            self.failures[d.tier] += 1
            self.core.stats.errors["engine_failure"] += 1
            if d.id in self.core.inflight:
                self.core.requeue(d.id)
            tier.busy += 1  # cool-down: the slot counts as busy, the placement looks elsewhere
        log.warning("tier %s failed a batch of %d (%s); requeued", d.tier, len(d.requests), e)
        if self.on_error:
            self.on_error(d, e)
        self.kick()
        time.sleep(self.retry_pause_s)
        with self.lock:
            tier.busy -= 1

    def close(self) -> None:
        self._stop.set()
        self._work.set()
        for q in self._queues.values():
            for _ in range(len(self._threads)):
                q.put(None)
        for th in self._threads:
            th.join(timeout=2.0)
