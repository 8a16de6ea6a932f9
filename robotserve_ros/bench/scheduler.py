"""`robotserve bench scheduler`: time of one scheduling decision at 10/100/1000 pending.

A decision is what the dispatcher asks of the scheduler each round: the priority order's
first `batch` requests out of everything pending, wait ratios and buckets included. The
ledger behind it holds real histories, built by driving ServingCore through a few rounds.
All schedulers are timed side by side in one run, interleaved, so machine noise hits all.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from ..core.clock import VirtualClock
from ..core.profile import EngineProfile
from ..core.schedulers import SCHEDULERS, SchedulingContext, make_scheduler
from ..core.serving import ServingCore, Tier
from ..core.types import ChunkResult, ExecInfo, InferenceRequest


def build_pending(n: int, seed: int = 0, history: int = 4):
    """A ServingCore with n tasks, each with `history` finished rounds and one pending."""
    rng = np.random.default_rng(seed)
    clock = VirtualClock()
    core = ServingCore(make_scheduler("fifo"), [Tier("edge", EngineProfile({1: 50.0}), max_batch=n)], clock)
    dummy = ChunkResult(np.zeros((50, 6), np.float32))
    starts = {}
    for r in range(history + 1):
        for i in range(n):
            tid = f"task{i}"
            info = None
            if r > 0:
                info = ExecInfo(starts[tid], int(rng.integers(0, 20)), 30.0)
            core.submit(InferenceRequest(tid, r, info))
            clock.advance_to(clock.now() + float(rng.exponential(0.002)))
        if r == history:
            break
        for d in core.dispatch():
            clock.advance_to(clock.now() + float(rng.uniform(0.05, 0.3)))
            core.complete(d, [dummy] * len(d.requests))
        for i in range(n):
            starts[f"task{i}"] = clock.now() + float(rng.uniform(0.0, 0.5))
        clock.advance_to(clock.now() + float(rng.uniform(0.3, 1.6)))
    pending = list(core.pending.values())
    for p in pending:  # varied skip counts so aging and buckets do real work
        p.epoch -= int(rng.integers(0, 40))
    return core, pending


def run_bench(out: Path, sizes=(10, 100, 1000), repeats: int = 300, batch: int = 16) -> dict:
    names = SCHEDULERS.names()
    scheds = {n: make_scheduler(n) for n in names}
    result = {"batch": batch, "repeats": repeats, "sizes": {}}
    for size in sizes:
        core, pending = build_pending(size)
        ctx = SchedulingContext(core.clock.now(), core.ledger, core.epoch + 40)
        samples = {n: [] for n in names}
        for _ in range(repeats):
            for n in names:  # interleaved: the same noise lands on every scheduler
                t = time.perf_counter()
                scheds[n].select(pending, ctx, batch)
                samples[n].append((time.perf_counter() - t) * 1e3)
        row = {}
        for n in names:
            s = sorted(samples[n])
            row[n] = {"median_ms": statistics.median(s), "p99_ms": s[int(0.99 * (len(s) - 1))]}
        fifo = row["fifo"]["median_ms"]
        for n in names:
            row[n]["x_fifo"] = row[n]["median_ms"] / fifo
        result["sizes"][str(size)] = row
    result["kairos_1000_under_1ms"] = result["sizes"].get("1000", {}).get("kairos", {}).get("median_ms", 1e9) < 1.0
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def format_table(result: dict) -> str:
    names = list(next(iter(result["sizes"].values())))
    lines = ["pending | " + " | ".join(f"{n} median/p99 ms (x fifo)" for n in names)]
    for size, row in result["sizes"].items():
        lines.append(
            f"{size:>7} | "
            + " | ".join(f"{row[n]['median_ms']:.4f}/{row[n]['p99_ms']:.4f} ({row[n]['x_fifo']:.1f}x)" for n in names)
        )
    return "\n".join(lines)
