"""Scheduler registry: config name -> implementation. A new scheduler is a file plus a line."""
from __future__ import annotations

from ..registry import Registry
from .autellix import AutellixScheduler
from .base import Scheduler, SchedulingContext
from .edf import EdfScheduler
from .fifo import FifoScheduler
from .kairos import KairosScheduler
from .remaining import RemainingScheduler
from .srpt import SrptScheduler

SCHEDULERS: Registry[Scheduler] = Registry("scheduler", {
    "fifo": FifoScheduler, "autellix": AutellixScheduler, "kairos": KairosScheduler, "edf": EdfScheduler,
    "srpt": SrptScheduler, "remaining": RemainingScheduler,
})


def make_scheduler(name: str, **params) -> Scheduler:
    return SCHEDULERS.create(name, **params)


__all__ = ["SCHEDULERS", "Scheduler", "SchedulingContext", "make_scheduler"]
