"""Clocks. Core never reads the time itself: a Clock is injected (docs/architecture.md)."""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line shared by the ledger and the scheduler."""
        ...


class WallClock:
    """The live server's clock (monotonic, so NTP steps cannot reorder rounds)."""

    def now(self) -> float:
        return time.monotonic()


class VirtualClock:
    """The simulator's clock: time moves only when the event loop sets it."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"virtual clock cannot go back from {self._t} to {t}")
        self._t = float(t)
