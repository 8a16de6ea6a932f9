"""A robot's account of real-time chunking served remotely (RTC, arXiv 2506.07339 §4; issue 28
item 2): its chunks placed from action d on, and the d values the server chose. Every robot
driver keeps one: ROS robot_client (nodes/rtc_client.py) and the closed-loop virtual fleet
(sim/closed_loop.py). A chunk is anything with first_timestep, rtc_delay_steps (-1: unguided),
horizon and chunk_len (msg/ActionChunk's names)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .action_queue import ActionQueue


class RtcAccount:
    """What the server said about RTC: rounds served guided and unguided, the d of each, and
    how far the prediction was off: d_error = the actions the robot had executed since sending
    when the chunk came, minus d (> 0: it came after the robot passed action d, so the chunk
    resumes at a row the inpainting did not freeze; < 0: earlier, the robot runs on through
    the leftover to row d). A chunk that came after the leftover ran out counts as held (the
    robot stood still, and d, at most the leftover, was as long as it could be)."""

    def __init__(self) -> None:
        self.guided = self.unguided = 0
        self.held = 0  # guided chunks that came after the leftover ran out (the robot was holding)
        self.delays: Counter = Counter()
        self.d_error: Counter = Counter()
        self.horizons: list = []  # (d, s, H) of guided chunks, the first 10,000

    def place(self, queue: ActionQueue, chunk, actions: np.ndarray) -> None:
        """The chunk into the queue: spliced at d under RTC, else merged as without it."""
        d = int(chunk.rtc_delay_steps)
        if d < 0:
            self.unguided += 1
            queue.merge(chunk.first_timestep, actions)
            return
        self.guided += 1
        self.held += not len(queue)
        self.delays[d] += 1
        self.d_error[queue.timestep - chunk.first_timestep - d] += 1
        queue.splice(chunk.first_timestep, actions, d)
        if len(self.horizons) < 10_000:
            self.horizons.append((d, int(chunk.horizon), int(chunk.chunk_len)))

    def snapshot(self) -> dict:
        return {"guided": self.guided, "unguided": self.unguided, "held": self.held,
                "delays": {str(k): v for k, v in sorted(self.delays.items())},
                "d_error": {str(k): v for k, v in sorted(self.d_error.items())}, "horizons": self.horizons}


def merge_rtc(snapshots: list) -> dict:
    """Fleet totals of the robots' RtcAccount snapshots (those with rtc on)."""
    out = {"robots": 0, "guided": 0, "unguided": 0, "held": 0, "delays": Counter(), "d_error": Counter(), "clamp_held": 0}
    for s in snapshots:
        out["robots"] += 1
        out["guided"] += s["guided"]
        out["unguided"] += s["unguided"]
        out["held"] += s["held"]
        out["delays"].update({int(k): v for k, v in s["delays"].items()})
        out["d_error"].update({int(k): v for k, v in s["d_error"].items()})
        out["clamp_held"] += sum(1 for d, h, n in s["horizons"] if d <= h and (h <= n - d or h == d))
    out["delays"] = dict(sorted(out["delays"].items()))
    out["d_error"] = dict(sorted(out["d_error"].items()))
    return out
