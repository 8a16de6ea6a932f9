"""Autellix-style least attained service: the task with the least accumulated generation
time goes first (seed 000 §5.1 baseline; Autellix [37] in its single-queue form)."""
from __future__ import annotations

from .base import Scheduler, top


class AutellixScheduler(Scheduler):
    name = "autellix"

    def select(self, pending, ctx, limit=None):
        tasks = ctx.ledger.tasks
        return top(pending, lambda p: (tasks[p.task_id].attained, p.seq), limit)
