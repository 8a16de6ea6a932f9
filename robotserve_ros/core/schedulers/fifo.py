"""FIFO: arrival order of individual requests, the vLLM default (seed 000 §5.1 baseline)."""
from __future__ import annotations

from .base import Scheduler, top


class FifoScheduler(Scheduler):
    name = "fifo"

    def select(self, pending, ctx, limit=None):
        return top(pending, lambda p: p.seq, limit)
