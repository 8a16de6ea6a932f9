"""Shared helpers for the pure-core tests (no ROS, no torch, no network).

Helpers are handed out as fixtures so test modules need no imports from this file.
"""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core import (
    ChunkResult,
    EngineProfile,
    ExecInfo,
    ServingCore,
    TaskLedger,
    Tier,
    VirtualClock,
    make_scheduler,
)


def zeros_chunk(h: int = 4, dim: int = 2) -> ChunkResult:
    """An action chunk of `h` actions with no denoising updates (what a non-diffusion engine returns)."""
    return ChunkResult(np.zeros((h, dim), np.float32))


def build_core(
    scheduler: str = "fifo",
    *,
    batch_latency_ms=None,
    max_batch: int | None = 1,
    ledger: TaskLedger | None = None,
    horizon_params=None,
    **scheduler_params,
):
    """A ServingCore on a VirtualClock with one edge tier; returns (core, clock).

    The default profile is 1000 ms at every batch size, so latency_s(b) == 1.0: one "time unit"
    of generation, as in seed 000's Figure 5.
    """
    if batch_latency_ms is None:
        batch_latency_ms = {1: 1000.0}
    clock = VirtualClock()
    tier = Tier("edge", EngineProfile(batch_latency_ms), max_batch=max_batch)
    core = ServingCore(
        make_scheduler(scheduler, **scheduler_params),
        [tier],
        clock,
        ledger=ledger,
        horizon_params=horizon_params,
    )
    return core, clock


def seed_round(ledger: TaskLedger, tid: str, *, t_start: float, dispatch: float, gen: float, exec_len: float, hz=4.0):
    """Put a task on the ledger with round 0 generated and round 1 requested.

    Round 0 arrives at t_start, is dispatched at `dispatch` (initial wait dispatch - t_start) and
    generates for `gen`; the robot asks for round 1 the moment the chunk arrives, with all
    `exec_len * hz` actions still to run, so E_0 = [chunk, chunk + exec_len] is known.
    Returns the time round 1 was requested.
    """
    ledger.open_task(tid, t_start)
    ledger.record_request(tid, 0, t_start, None)
    ledger.record_dispatch(tid, 0, dispatch)
    ready = dispatch + gen
    ledger.record_complete(tid, 0, ready)
    n = exec_len * hz
    assert n == int(n), "pick exec_len so that exec_len * hz is a whole number of actions"
    ledger.record_request(tid, 1, ready, ExecInfo(ready, int(n), hz))
    return ready


@pytest.fixture
def make_core():
    return build_core


@pytest.fixture
def chunk():
    return zeros_chunk


@pytest.fixture
def seeded_round():
    return seed_round
