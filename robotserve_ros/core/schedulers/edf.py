"""Earliest deadline first. A request's deadline is the time its robot needs the next chunk:
given by the client, or the end of the running execution phase (exec info), or its arrival
when the robot is idle."""
from __future__ import annotations

from .base import Scheduler, top


class EdfScheduler(Scheduler):
    name = "edf"

    def select(self, pending, ctx, limit=None):
        return top(pending, lambda p: (p.deadline, p.seq), limit)
