"""The Scheduler role: order pending inference requests, highest priority first."""
from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..ledger import TaskLedger
from ..types import PendingRequest


@dataclass
class SchedulingContext:
    now: float
    ledger: TaskLedger
    epoch: int  # dispatch rounds so far; a request's skipped count is epoch - its epoch


class Scheduler(ABC):
    name = "?"

    @abstractmethod
    def select(
        self, pending: Sequence[PendingRequest], ctx: SchedulingContext, limit: Optional[int] = None
    ) -> list[PendingRequest]:
        """Pending requests in priority order; only the first `limit` when given."""

    def task_finished(self, record, kind: Optional[str]) -> None:
        """A task ended (its ledger record, its type or None); schedulers that learn override."""


def top(pending: Sequence[PendingRequest], key: Callable, limit: Optional[int]) -> list[PendingRequest]:
    """The `limit` smallest by key (all, sorted, when limit is None): O(n log limit)."""
    if limit is None or limit >= len(pending):
        return sorted(pending, key=key)
    return heapq.nsmallest(limit, pending, key=key)
