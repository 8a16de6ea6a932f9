"""The stage observer's vocabulary: the steps of a round that `Runner` reports, and
`StageTrace`, an observer that keeps when each round reached each step (benchmarks and
diagnostics watch the loop this way, never by patching it)."""
from __future__ import annotations

import threading
from typing import Callable, Sequence

STAGES = ("submit", "dispatch", "engine_start", "engine_end", "reply")
Rounds = Sequence[tuple]  # (task_id, round_id) pairs
StageObserver = Callable[[str, Rounds], None]



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
