"""Fault injection on the robots' side of a light fleet (`bench fleet-live --light --fault-drop P`,
issue 38): a fraction P of requests is never sent and a fraction P of replies is received and
discarded, as if lost on the wire; the server runs unchanged. Plain Python, no rclpy.

Each decision is a hash of (seed, robot, n) for the robot's n-th request and the reply to it,
not a draw from a shared stream: the same seed drops the same messages of each robot however
the robots' calls interleave (which messages a live run sends still depends on its timing)."""
from __future__ import annotations

import hashlib


class FaultDrop:
    """Whether a robot's n-th request, or the reply to it, is lost (see the module docstring)."""

    __slots__ = ("p", "seed", "_limit")

    def __init__(self, p: float, seed: int = 0) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"fault drop must be in [0, 1), got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self._limit = int(self.p * 2 ** 64)

    def drops(self, kind: str, robot: str, n: int) -> bool:
        """kind 'request' or 'reply' of the robot's n-th request."""
        if not self._limit:
            return False
        h = hashlib.blake2b(f"{self.seed}|{kind}|{robot}|{n}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") < self._limit
