"""Admission: tasks (robots) are admitted up to the server's capacity; past it a new task is
refused `overloaded` with the reason, instead of every admitted round waiting seconds in a
queue that only grows (at 300 light robots a round waited 3.1 s p50 inside the server).

What is admitted is a robot (its id; an anonymous client: its task), so a robot that
finishes a task and starts the next keeps its place; one silent for `idle_s` loses it.
Two capacities, either or both: a fixed `max_tasks`, and the measured one: the rounds per
second the tiers serve at their batch limits (their engine profiles, which are measured)
against the rounds per second the admitted tasks ask for (each task's interval between its
rounds, smoothed). A task with no interval yet is counted at the mean of the others. Rounds of
an admitted task are never refused here: admission decides who is served, not which round.
Pure Python; the caller gives `now`."""
from __future__ import annotations

from typing import Optional, Sequence

from .serving_types import Tier


def tier_rounds_per_s(tiers: Sequence[Tier]) -> float:
    """Rounds per second the tiers serve when every slot runs full batches (their profiles)."""
    return sum(t.slots * t.profile.throughput(t.batch_limit) for t in tiers)


class Admission:
    """Which robots the server takes (module docstring). `refuse(key, now)` is asked for a
    task's first round: None admits its robot, else the reason it is refused. `round(key, now)`
    is told each new round of an admitted robot; `forget(key)` when it is gone (reaped)."""

    def __init__(self, max_tasks: int = 0, capacity_rps: Optional[float] = None, headroom: float = 1.0,
                 alpha: float = 0.2, idle_s: float = 10.0) -> None:
        if max_tasks < 0 or (capacity_rps is not None and not capacity_rps > 0) or not headroom > 0:
            raise ValueError(f"max_tasks must be >= 0, capacity_rps and headroom > 0; got {max_tasks}, "
                             f"{capacity_rps}, {headroom}")
        self.max_tasks, self.capacity_rps, self.headroom, self.alpha = max_tasks, capacity_rps, headroom, alpha
        self.idle_s, self._swept = idle_s, float("-inf")
        self._last: dict = {}  # task -> when its newest round came
        self._interval: dict = {}  # task -> smoothed seconds between its rounds
        self.refused = 0

    @property
    def active(self) -> bool:
        return bool(self.max_tasks) or self.capacity_rps is not None

    def demand_rps(self) -> float:
        """Rounds per second the admitted tasks ask for (a task without an interval: the mean)."""
        if not self._interval:
            return 0.0
        known = sum(1.0 / max(i, 1e-3) for i in self._interval.values())
        return known * len(self._last) / len(self._interval)

    def refuse(self, key: str, now: float) -> Optional[str]:
        if key in self._last:
            return None
        self._sweep(now)
        n = len(self._last)
        why = None
        if self.max_tasks and n >= self.max_tasks:
            why = f"{n} robots admitted, the most this server takes (admission.max_tasks)"
        elif self.capacity_rps is not None and self._interval:
            demand, each = self.demand_rps(), self.demand_rps() / max(n, 1)
            room = self.headroom * self.capacity_rps
            if demand + each > room:
                why = (f"{n} robots admitted ask {demand:.1f} rounds/s; one more would pass the {room:.1f} rounds/s "
                       "this server serves (admission.by_capacity)")
        if why is None:
            self._last[key] = now
            return None
        self.refused += 1
        return why + "; ask again later or another server"

    def round(self, key: str, now: float) -> None:
        """A new round of an admitted robot (a re-send is not one)."""
        last = self._last.get(key)
        self._last[key] = now
        if last is None or now <= last:
            return
        dt, old = now - last, self._interval.get(key)
        self._interval[key] = dt if old is None else old + self.alpha * (dt - old)

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
        self._interval.pop(key, None)

    def _sweep(self, now: float) -> None:
        """Robots silent for idle_s are no longer admitted (at most one scan a second)."""
        if now - self._swept < 1.0:
            return
        self._swept = now
        for key in [k for k, t in self._last.items() if now - t > self.idle_s]:
            self.forget(key)

    def admitted(self) -> int:
        return len(self._last)
