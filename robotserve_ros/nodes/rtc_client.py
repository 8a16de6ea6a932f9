"""robot_client's side of real-time chunking served remotely (issue 28 item 2; RTC, arXiv
2506.07339 §4): the unexecuted leftover goes with each request, and a reply's chunk is placed
from action d on, the d actions of the leftover executed while waiting standing for its first
d rows. A reply the server generated unguided (d = -1) is blended as before. robot_client
calls these two functions and keeps the account of the delays it was served with."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..core.action_queue import ActionQueue


def fill_leftover(request, queued: list) -> None:
    """srv/Infer's rtc_leftover: the queued actions, next first, row-major; empty: none left."""
    if queued:
        request.rtc_leftover = np.ascontiguousarray(queued, dtype=np.float32).ravel().tolist()
    request.rtc_leftover_actions = len(queued)


class RtcAccount:
    """What the server said about RTC: rounds served guided, their d, and where each chunk's
    execution resumed (d, later when the reply came after the robot had passed action d)."""

    def __init__(self) -> None:
        self.guided = self.unguided = 0
        self.delays: Counter = Counter()
        self.late_by: Counter = Counter()  # resumed row - d: the chunk came later than predicted
        self.horizons: list = []  # (d, s, H) of every guided chunk

    def place(self, queue: ActionQueue, chunk, actions: np.ndarray) -> None:
        """The chunk into the queue: spliced at d under RTC, else merged as without it."""
        d = int(chunk.rtc_delay_steps)
        if d < 0:
            self.unguided += 1
            queue.merge(chunk.first_timestep, actions)
            return
        self.guided += 1
        self.delays[d] += 1
        start, _ = queue.splice(chunk.first_timestep, actions, d)
        self.late_by[start - d] += 1
        if len(self.horizons) < 10_000:
            self.horizons.append((d, int(chunk.horizon), int(chunk.chunk_len)))

    def snapshot(self) -> dict:
        return {"guided": self.guided, "unguided": self.unguided,
                "delays": {str(k): v for k, v in sorted(self.delays.items())},
                "late_by": {str(k): v for k, v in sorted(self.late_by.items())}, "horizons": self.horizons}
