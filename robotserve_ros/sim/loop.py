"""The one virtual-clock loop: a discrete-event loop driving any serving core (core/contract.py).

Every simulator is this loop plus two things of its paper: the engine model (how long an
item takes on the virtual clock: an engine profile's latency, a stage profile, a measured
LUT) and the world around the core (task arrivals, robots executing chunks or segments).
The core's own steps run unchanged, as they do live on core/loop.py's LiveDriver:

- events (`at(t, fn, *args)`) run in time order, ties by priority, then by when they were
  scheduled;
- after an event the loop dispatches: each item gets its engine time from `engine(item)`
  -> (seconds, outcome), and `finish(item, outcome)` runs when that time has passed (it
  calls the core's complete or fail, and tells the world);
- `settle_instant`: dispatch only once every event of the same instant has run (a batch
  then sees every request that arrived at that instant);
- `wake()`: the next time the core can start work without any event (e.g. a KV handover
  ending, seed 004); the loop schedules an event then.
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable, Iterable, Optional

from ..core.clock import VirtualClock

WAKE_PRIO = 2  # a wake-up runs after the arrivals and completions of its instant


class VirtualLoop:
    def __init__(self, clock: VirtualClock, dispatch: Callable[[], Iterable], engine: Callable[[object], tuple],
                 finish: Callable[[object, object], None], *, settle_instant: bool = False, done_prio: int = 0,
                 wake: Optional[Callable[[], Optional[float]]] = None, until: float = math.inf) -> None:
        self.clock, self.dispatch, self.engine, self.finish = clock, dispatch, engine, finish
        self.settle_instant, self.done_prio, self.wake, self.until = settle_instant, done_prio, wake, until
        self._events: list = []
        self._seq = itertools.count()
        self._wake_at: Optional[float] = None

    @classmethod
    def for_core(cls, core, engine_time: Callable[[object], float], **kw) -> "VirtualLoop":
        """Drive a contract core whose engine only takes time: complete(item) when it ends."""
        return cls(core.clock, core.dispatch, lambda item: (engine_time(item), None),
                   lambda item, _outcome: core.complete(item, None), **kw)

    def at(self, t: float, fn: Callable, *args, prio: int = 0) -> None:
        heapq.heappush(self._events, (t, prio, next(self._seq), fn, args))

    def run(self) -> None:
        ev = self._events
        while ev:
            t, _prio, _seq, fn, args = heapq.heappop(ev)
            if t > self.until:
                break
            self.clock.advance_to(t)
            fn(*args)
            if self.settle_instant and ev and ev[0][0] <= t:
                continue  # take every event of this instant before dispatching
            self._dispatch(t)

    def _dispatch(self, t: float) -> None:
        for item in self.dispatch():
            seconds, outcome = self.engine(item)
            self.at(t + seconds, self.finish, item, outcome, prio=self.done_prio)
        nxt = self.wake() if self.wake is not None else None
        if nxt is not None and nxt > t and (self._wake_at is None or nxt < self._wake_at):
            self._wake_at = nxt
            self.at(nxt, self._woken, prio=WAKE_PRIO)

    def _woken(self) -> None:
        self._wake_at = None
