"""Which robots have gone silent: the inference server reaps a task whose robot sent neither
a request nor progress for `timeout_s` (its queued round is dropped, its waiting call answered)."""
from __future__ import annotations

from typing import Callable


class LastHeard:
    """Task id -> when its robot was last heard, on an injected monotonic clock. Not locked:
    its owner calls it under the lock that guards the core."""

    def __init__(self, timeout_s: float, now: Callable[[], float]) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s, self.now = float(timeout_s), now
        self.seen: dict = {}

    def heard(self, task_id: str) -> None:
        self.seen[task_id] = self.now()

    def forget(self, task_id: str) -> None:
        self.seen.pop(task_id, None)

    def silent(self) -> list:
        """The tasks not heard from for timeout_s, oldest first."""
        cutoff = self.now() - self.timeout_s
        return [t for t, at in sorted(self.seen.items(), key=lambda kv: kv[1]) if at < cutoff]
