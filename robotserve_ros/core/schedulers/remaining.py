"""Shortest expected remaining work within wait-ratio buckets, learned online (beyond seed 000).

Where the engine cannot batch the queue away, ordering pays by remaining work
(reports/fleet/regime.md), which the wait ratio (§3.2.2) does not carry. This scheduler
estimates it from what the server sees, with no client hint (`remaining_rounds` is ignored):
- a task's own history: the rounds it has requested so far (its ledger position k);
- its type (InferenceRequest.kind: the task type, else the instruction);
- the rounds of finished tasks of that type (ServingCore.finish_task -> task_finished):
  expected remaining = mean(R | R > k) - k over them, the mean residual life at age k.
A type with no finished task yet falls back to all finished tasks, then to a constant (no
knowledge: ties go by arrival, as FIFO). A task already past every finished length of its
table is taken as nearly done (one round): ranking it last would starve exactly the longest
tasks until aging caught up. Engine work is rounds x batch
latency whatever a round's execution length, so rounds, not execution time, are the work.

Order: Kairos' phase 1 (B wait-ratio buckets, one bucket up every A skipped rounds), then
within a bucket the smallest (expected remaining - skipped / A): aging takes one round off
the estimate every A skipped rounds, so with the estimate capped nothing starves
(test/test_starvation.py derives the bound). Equal estimates (same type, same round) go
by higher wait ratio, then arrival. B defaults to 1: in the regime sweep every extra
wait-ratio bucket gave back part of the gain and bought no P95 (reports/fleet/regime.md).
"""
from __future__ import annotations

from collections import OrderedDict, deque

from ..ledger import wait_ratio
from .base import Scheduler, top


class _Lengths:
    """Total rounds of the last `window` finished tasks of one type; mean residual by age."""

    __slots__ = ("rounds", "residual")

    def __init__(self, window: int) -> None:
        self.rounds: deque = deque(maxlen=window)
        self.residual: list = []  # residual[k] = mean(R - k | R > k), for k < max R

    def add(self, r: int) -> None:
        self.rounds.append(r)
        top_r = max(self.rounds)
        count = [0] * (top_r + 1)
        for x in self.rounds:
            count[x] += 1
        res = [0.0] * top_r
        n, total = 0, 0  # tasks with R > k and the sum of their R, from the top down
        for k in range(top_r - 1, -1, -1):
            n += count[k + 1]
            total += (k + 1) * count[k + 1]
            res[k] = total / n - k
        self.residual = res


class RemainingScheduler(Scheduler):
    name = "remaining"

    def __init__(self, buckets: int = 1, aging: int = 4, window: int = 200, unknown_rounds: float = 1000.0,
                 max_estimate_rounds: float = 1000.0, max_kinds: int = 1024) -> None:
        if buckets < 1 or aging < 1 or window < 1 or max_kinds < 1:
            raise ValueError("buckets, aging, window and max_kinds must be >= 1")
        if not (unknown_rounds >= 1 and max_estimate_rounds >= 1):
            raise ValueError("unknown_rounds and max_estimate_rounds must be >= 1")
        self.buckets, self.aging, self.window = int(buckets), int(aging), int(window)
        # The cap bounds every estimate, and with it how long aging needs (starvation bound).
        self.cap = float(max_estimate_rounds)
        self.unknown = min(float(unknown_rounds), self.cap)
        # One table per task type, at most max_kinds (clients name the types: a fleet sending a
        # new instruction per task must not grow the server): the type finished longest ago goes.
        self.max_kinds = int(max_kinds)
        self._by_kind: OrderedDict = OrderedDict()
        self._all = _Lengths(window)

    def task_finished(self, record, kind) -> None:
        r = record.rounds
        if r < 1:
            return
        self._all.add(r)
        if kind is not None:
            lengths = self._by_kind.get(kind)
            if lengths is None:
                lengths = self._by_kind[kind] = _Lengths(self.window)
                if len(self._by_kind) > self.max_kinds:
                    self._by_kind.popitem(last=False)
            else:
                self._by_kind.move_to_end(kind)
            lengths.add(r)

    def expected_remaining(self, kind, k: int) -> float:
        """Rounds a task of this type that has requested k rounds is expected to still need."""
        lengths = self._by_kind.get(kind)
        table = lengths.residual if lengths is not None else self._all.residual
        if not table:
            return self.unknown
        return min(table[k], self.cap) if k < len(table) else 1.0

    def select(self, pending, ctx, limit=None):
        # Plain locals in one loop: a decision over 1000 pending requests must stay < 1 ms.
        now, epoch, tasks = ctx.now, ctx.epoch, ctx.ledger.tasks
        nb, aging, cap, unknown = self.buckets, self.aging, self.cap, self.unknown
        by_kind, every = self._by_kind, self._all.residual
        top_b = nb - 1
        keyed = []
        for p in pending:
            skipped = epoch - p.epoch
            wr = wait_ratio(tasks[p.task_id], now)
            b = int(wr * nb) + skipped // aging
            if b > top_b:
                b = top_b
            k = p.round_index
            r = p.request
            kind = r.task_type
            lengths = by_kind.get(kind if kind is not None else r.kind)
            table = lengths.residual if lengths is not None else every
            if k < len(table):
                est = table[k]
            elif table:
                est = 1.0  # past every finished length: nearly done
            else:
                est = unknown
            if est > cap:
                est = cap
            keyed.append((-b, est - skipped / aging, -wr, p.seq, p))
        return [t[4] for t in top(keyed, None, limit)]
