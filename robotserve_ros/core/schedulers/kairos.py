"""Kairos execution-aware scheduling, Algorithm 1 phases 1-2 (seed 000 §3.2.2).

Phase 1: bin each request by its task's wait ratio into B equal-width buckets; promote by
one bucket every A skipped rounds. Phase 2: buckets high to low; within a bucket, longest
estimated execution first, estimate = last execution duration x (1 + skipped).
Phase 3 (placement) is the dispatcher's job, so it works the same for every scheduler.
"""
from __future__ import annotations

from ..ledger import wait_ratio
from .base import Scheduler, top


class KairosScheduler(Scheduler):
    name = "kairos"

    def __init__(self, buckets: int = 10, aging: int = 4, min_exec_estimate_s: float = 1.0 / 30) -> None:
        if buckets < 1:
            raise ValueError("buckets must be >= 1")
        if aging < 1:
            raise ValueError("aging must be >= 1")
        if min_exec_estimate_s <= 0:
            raise ValueError("min_exec_estimate_s must be > 0")
        self.buckets = int(buckets)
        self.aging = int(aging)
        # A task with no execution on record would estimate 0 and never win a bucket even
        # with aging (0 x (1+skipped) = 0); one action at 30 Hz keeps aging effective.
        self.min_exec = float(min_exec_estimate_s)

    def select(self, pending, ctx, limit=None):
        # Plain locals in one loop: a decision over 1000 pending requests must stay < 1 ms.
        now, epoch, tasks = ctx.now, ctx.epoch, ctx.ledger.tasks
        nb, aging, min_exec = self.buckets, self.aging, self.min_exec
        top_b = nb - 1
        keyed = []
        for p in pending:
            rec = tasks[p.task_id]
            skipped = epoch - p.epoch
            # Promote by one bucket every A skipped rounds (the text of §3.2.2; Alg. 1 writes ceil).
            b = int(wait_ratio(rec, now) * nb) + skipped // aging
            if b > top_b:
                b = top_b
            est = rec.last_exec_len
            if est < min_exec:
                est = min_exec
            keyed.append((-b, -est * (1 + skipped), p.seq, p))
        return [k[3] for k in top(keyed, None, limit)]

