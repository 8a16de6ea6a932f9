"""Shortest remaining rounds first, from the client's `remaining_rounds` hint.

Beyond the papers: SRPT is the classic order for mean completion time when remaining work is
known. A request without a hint counts as `unknown_rounds`. Aging keeps it starvation-free:
every A skipped dispatch rounds take one round off a request's effective remaining work.
In trace replay the hint is exact, so this scheduler bounds what remaining-work-aware
ordering can gain over the others.
"""
from __future__ import annotations

from .base import Scheduler, top


class SrptScheduler(Scheduler):
    name = "srpt"

    def __init__(self, aging: int = 4, unknown_rounds: int = 1000) -> None:
        if aging < 1 or unknown_rounds < 1:
            raise ValueError("aging and unknown_rounds must be >= 1")
        self.aging, self.unknown = int(aging), int(unknown_rounds)

    def select(self, pending, ctx, limit=None):
        epoch, aging, unknown = ctx.epoch, self.aging, self.unknown

        def key(p):
            rr = p.request.remaining_rounds
            return ((unknown if rr is None else rr) - (epoch - p.epoch) // aging, p.seq)

        return top(pending, key, limit)
