"""`robotserve bench regime`: where can execution-aware ordering pay? (reports/fleet/regime.md)

The fleet benchmark finds every order within ~1 % of FIFO with static horizons, while seed
000 Table 2 reports 10.9-39.3 % for "Kairos w/o dynamic horizon". This sweep varies, one
knob at a time around a base point, what the paper's setting may have and ours lacks, and
runs FIFO, Kairos, the exact-remaining-rounds oracle (srpt) and the learned `remaining`
scheduler, static horizons, Poisson arrivals unless the knob says otherwise:
- max batch (queue depth vs what one batch absorbs), x task-length spread, x load: the
  heat map. Spread "low": one task type (LIBERO-like phases 3-7); "high": the
  libero-mixed-edge suite (spatial/object/goal/long types). Engine: diffusion_arm's profile
  of record, capped at the tier's max batch;
- trigger slack (requests sent k x earlier than just in time), arrival burstiness (squared
  CV of inter-arrival times), engine instances (slots), and the three regime workloads.
Load = fraction of peak, peak as in `bench fleet` but at the tier's batch limit: FIFO-static
requests 90 % of max_batch x slots worth of engine throughput.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..machine import machine_info
from ..sim.runner import pooled, run_many
from ..sim.simulator import SimTier, Simulator
from ..sim.workloads import REGIME_SHAPES, builtin_workload, shape_workload

SCHEDULERS = ("fifo", "kairos", "srpt", "remaining")
LABELS = {"fifo": "FIFO", "kairos": "Kairos", "srpt": "SRPT oracle", "remaining": "remaining"}
BASE_SHAPE = "libero-mixed-edge"
MAX_BATCHES = (1, 2, 4, 16)
SPREADS = ("low", "high")
LOADS = (1.0, 1.2)
SLACKS = (1.0, 2.0, 4.0, 8.0)
BURSTS = (1.0, 4.0)
SLOTS = (1, 4)
GAIN = 10.0  # % over FIFO that counts as "pays"


@dataclass(frozen=True)
class Point:
    """One simulated setting; `workload` set: a built-in as it is (its own engine)."""

    spread: str = "high"
    max_batch: int = 1
    load: float = 1.2
    slack: float = 1.0
    burst: float = 1.0
    slots: int = 1
    workload: str = ""


@dataclass(frozen=True)
class Spec:
    point: Point
    scheduler: str
    params: tuple
    seed: int
    tasks: int


@lru_cache(maxsize=None)
def workload_of(point_key: tuple):
    spread, name = point_key
    if name:
        return builtin_workload(name)
    s = dataclasses.replace(REGIME_SHAPES[BASE_SHAPE], batching="profile")
    if spread == "low":
        s = dataclasses.replace(s, task_types=())
    return shape_workload(s)


def rate_of(pt: Point) -> float:
    w = workload_of((pt.spread, pt.workload))
    rounds = np.mean([len(t.rounds["static"]) for t in w.tasks])
    mb = pt.max_batch if not pt.workload else w.profile.saturation_batch
    return pt.load * 0.9 * w.profile.throughput(mb) * pt.slots / rounds


def run_spec(spec: Spec):
    pt = spec.point
    w = workload_of((pt.spread, pt.workload))
    tier = SimTier("edge", slots=pt.slots, max_batch=None if pt.workload else pt.max_batch)
    sim = Simulator(w, spec.scheduler, "static", spec.seed, dict(spec.params), tiers=[tier],
                    trigger_slack=pt.slack, burstiness=pt.burst)
    return sim.run_online(rate_of(pt), spec.tasks)


def points() -> dict:
    """Sweep name -> the points it runs (the heat map, then one knob at a time)."""
    base = Point()
    return {
        "heatmap": [Point(spread=s, max_batch=b, load=l) for s in SPREADS for b in MAX_BATCHES for l in LOADS],
        "trigger slack": [dataclasses.replace(base, slack=x) for x in SLACKS],
        "burstiness": [dataclasses.replace(base, burst=x) for x in BURSTS],
        "engine instances": [dataclasses.replace(base, slots=x) for x in SLOTS],
        "regime workloads": [Point(workload=n, load=l) for n in REGIME_SHAPES for l in LOADS],
    }


def run_regime(out_dir: Path, seeds=(0, 1), tasks: int = 300, workers=None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    sweeps = points()
    uniq = list(dict.fromkeys(p for ps in sweeps.values() for p in ps))
    specs = [Spec(p, s, (), seed, tasks) for p in uniq for s in SCHEDULERS for seed in seeds]
    res = run_many(specs, workers, desc="regime sweep", fn=run_spec)
    rows = {}
    for p in uniq:
        summ = {s: pooled([res[Spec(p, s, (), seed, tasks)] for seed in seeds]).summary() for s in SCHEDULERS}
        f = summ["fifo"]
        gains = {s: 100 * (1 - summ[s]["avg_latency_s"] / f["avg_latency_s"]) for s in SCHEDULERS}
        p95 = {s: 100 * (summ[s]["p95_latency_s"] / f["p95_latency_s"] - 1) for s in SCHEDULERS}
        rows[p] = {"point": dataclasses.asdict(p), "rate": rate_of(p), "gain_vs_fifo_pct": gains,
                   "p95_vs_fifo_pct": p95, "fifo_x_lb": f["slowdown_vs_lower_bound"],
                   "fifo_mean_batch": f["mean_batch"], "fifo_util": f["engine_utilization"],
                   "runs": summ}
    m = machine_info()
    data = {
        "meta": {"command": "robotserve bench regime " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else "robotserve bench regime",
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seeds": list(seeds), "tasks": tasks,
                 "machine": f"{m['cores']} cores, {m['cpu']}, Python {m['python']}", "wall_s": round(time.time() - t0, 1)},
        "sweeps": {name: [rows[p] for p in ps] for name, ps in sweeps.items()},
    }
    (out_dir / "regime.json").write_text(json.dumps(data, indent=1) + "\n")
    from .fleet_report import write_regime_report

    write_regime_report(data, out_dir)
    return data
