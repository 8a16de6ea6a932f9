"""The robot side's action queue: chunks placed at their timestep, overlap blended.

A chunk generated from the observation of timestep t holds the actions for t, t+1, ...
By the time it arrives the robot has moved on: actions for timesteps already executed are
dropped (seed 000 Figure 2b), actions for timesteps still queued are blended with the
queued ones by an aggregate function (LeRobot async inference's names), the rest appended.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

import numpy as np

AGGREGATES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "latest_only": lambda old, new: new,
    "weighted_average": lambda old, new: 0.3 * old + 0.7 * new,
    "average": lambda old, new: 0.5 * old + 0.5 * new,
    "conservative": lambda old, new: 0.7 * old + 0.3 * new,
}


class ActionQueue:
    def __init__(self, aggregate: str = "weighted_average") -> None:
        if aggregate not in AGGREGATES:
            raise ValueError(f"unknown aggregate '{aggregate}'; known: {', '.join(AGGREGATES)}")
        self._agg = AGGREGATES[aggregate]
        self._q: deque = deque()
        self.timestep = 0  # timestep of the next action to execute

    def __len__(self) -> int:
        return len(self._q)

    def merge(self, first_timestep: int, actions: np.ndarray) -> tuple[int, int]:
        """Place a chunk whose row 0 belongs to `first_timestep`.
        Returns (dropped as already past, blended with queued actions)."""
        skip = max(0, self.timestep - first_timestep)
        fresh = actions[skip:]
        overlap = min(len(self._q), len(fresh))
        for i in range(overlap):
            self._q[i] = self._agg(self._q[i], fresh[i])
        self._q.extend(fresh[overlap:])
        return min(skip, len(actions)), overlap

    def splice(self, first_timestep: int, actions: np.ndarray, frozen: int) -> tuple[int, int]:
        """Place a real-time-chunked chunk (RTC, arXiv 2506.07339 §4): its first `frozen` (= d)
        rows were inpainted to the leftover the robot executes while waiting, so the queued
        actions up to timestep first_timestep + d are kept as they are and every queued action
        after is replaced by the chunk's (it already agrees with them: nothing to blend).
        Returns (the chunk's row execution resumes at, queued actions kept)."""
        start = max(first_timestep + max(0, frozen), self.timestep)
        keep = min(start - self.timestep, len(self._q))
        start = self.timestep + keep  # (the queue ran out first: the robot held, resume there)
        kept = [self._q[i] for i in range(keep)]
        self._q = deque(kept)
        self._q.extend(actions[start - first_timestep:])
        return start - first_timestep, keep

    def queued(self) -> list:
        """The actions still to execute, in order (a trajectory of them goes to a controller)."""
        return list(self._q)

    def pop(self) -> Optional[np.ndarray]:
        """The next action, or None when the queue ran dry (the robot must hold position)."""
        if not self._q:
            return None
        self.timestep += 1
        return self._q.popleft()

    def reset(self) -> None:
        self._q.clear()
        self.timestep = 0
