"""`robotserve bench fleet`: seed 000 §5.3 in simulation, on every built-in workload: the
generated shapes and the workloads measured on a real policy (workloads.MEASURED).

For each workload: FIFO, Autellix and Kairos with static horizons, Kairos with the dynamic
horizon, and the Table 2 ablations (baseline schedulers with the dynamic horizon), over
an online rate sweep up to peak load and a fleet sweep. Writes JSON, a Markdown report
and PNG plots.

Peak load: the arrival rate at which FIFO with static horizons offers the engine `peak_load`
(0.9) of its maximum request throughput, the throughput at the profile's saturation batch.
Busy time is no measure of load for a batching engine: FIFO-static keeps it 90% busy while
batches are still small and most of the capacity unused (the report shows the utilisation
at every sweep point). The engine profile is the workload's own engine block, so a measured
workload's peak comes from its measured batch latencies. One point past peak,
OVERLOAD_FRACTION, shows the overloaded regime where static horizons are unstable; targets
are read at peak.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..machine import machine_info
from ..sim.runner import RunSpec, pooled, run_many
from ..sim.workloads import REGIME_SHAPES, SHAPES, builtin_workload, measured_names, regime_names


@dataclass(frozen=True)
class Config:
    label: str
    scheduler: str
    horizon: str


CONFIGS = (
    Config("FIFO", "fifo", "static"),
    Config("Autellix", "autellix", "static"),
    Config("Kairos static", "kairos", "static"),  # Table 2: Kairos w/o dynamic horizon
    Config("Kairos", "kairos", "dynamic"),
    Config("FIFO dynamic", "fifo", "dynamic"),  # Table 2(a): Kairos w/o scheduler
    Config("Autellix dynamic", "autellix", "dynamic"),  # Table 2(b): Kairos w/o scheduler
    Config("EDF static", "edf", "static"),  # beyond the paper: deadline = end of running execution
    Config("EDF dynamic", "edf", "dynamic"),
    # Beyond the paper: shortest remaining rounds first; the trace's hint is exact, so these
    # rows bound what remaining-work-aware ordering could add.
    Config("SRPT static", "srpt", "static"),
    Config("SRPT dynamic", "srpt", "dynamic"),
)
BY_LABEL = {c.label: c for c in CONFIGS}
# The Table 2 block in the regime where ordering can pay (reports/fleet/regime.md): the
# paper's configs, the SRPT oracle and `remaining` (learned remaining work, no client hint).
REGIME_CONFIGS = tuple(c for c in CONFIGS if c.label in (
    "FIFO", "Autellix", "Kairos static", "Kairos", "FIFO dynamic", "Autellix dynamic", "SRPT static")) + (
    Config("remaining static", "remaining", "static"),
    Config("remaining dynamic", "remaining", "dynamic"),
)
REGIME_FRACTIONS = (1.0, 1.2)
RATE_FRACTIONS = (0.2, 0.4, 0.6, 0.8, 1.0)
OVERLOAD_FRACTION = 1.25
FLEETS = (10, 50, 100)
MEASURED_NOTE = "measured on a real policy (reports/horizon/README.md)"


def default_workloads() -> list[str]:
    """The main tables' workloads; the regime workloads have their own block (REGIME_CONFIGS)."""
    return list(SHAPES) + measured_names()


def peak_rate(workload: str, load: float = 0.9) -> float:
    """Task rate at which FIFO-static requests are `load` x the engine's max throughput."""
    w = builtin_workload(workload)
    rounds = np.mean([len(t.rounds["static"]) for t in w.tasks])
    p = w.profile
    return load * p.throughput(p.saturation_batch) / rounds


def reduction(base: float, new: float) -> float:
    return (base - new) / base if base > 0 else 0.0


def run_bench(out_dir: Path, seeds=(0, 1, 2), tasks: int = 400, peak_load: float = 0.9,
              workloads=None, workers=None, regime_workloads=None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    if workloads:  # named: the regime ones go to the regime block
        names = [n for n in workloads if n not in REGIME_SHAPES]
        regime_workloads = [n for n in workloads if n in REGIME_SHAPES]
    else:
        names = default_workloads()
    t0 = time.time()
    peaks = {}
    for n in names:
        peaks[n] = {"rate": peak_rate(n, peak_load), "offered_load": peak_load}
    specs = []
    for n in names:
        for c in CONFIGS:
            for s in seeds:
                for f in RATE_FRACTIONS + (OVERLOAD_FRACTION,):
                    specs.append(RunSpec(n, c.scheduler, c.horizon, "online", peaks[n]["rate"] * f, s, tasks))
                for r in FLEETS:
                    specs.append(RunSpec(n, c.scheduler, c.horizon, "fleet", r, s))
    reg = list(regime_names() if regime_workloads is None else regime_workloads)
    for n in reg:
        peaks[n] = {"rate": peak_rate(n, peak_load), "offered_load": peak_load}
        for c in REGIME_CONFIGS:
            for s in seeds:
                for f in REGIME_FRACTIONS:
                    specs.append(RunSpec(n, c.scheduler, c.horizon, "online", peaks[n]["rate"] * f, s, tasks))
    res = run_many(specs, workers, desc="fleet bench")
    data = {"workloads": {}, "meta": _meta(seeds, tasks, peak_load, time.time() - t0)}
    for n in names:
        wd = data["workloads"][n] = {"peak": peaks[n], "shape": _shape(n), "online": {}, "fleet": {}}
        for c in CONFIGS:
            on = wd["online"][c.label] = []
            for f in RATE_FRACTIONS + (OVERLOAD_FRACTION,):
                rate = peaks[n]["rate"] * f
                runs = [res[RunSpec(n, c.scheduler, c.horizon, "online", rate, s, tasks)] for s in seeds]
                on.append({"fraction_of_peak": f, **pooled(runs).summary()})
            fl = wd["fleet"][c.label] = []
            for r in FLEETS:
                runs = [res[RunSpec(n, c.scheduler, c.horizon, "fleet", r, s)] for s in seeds]
                fl.append(pooled(runs).summary())
    data["regime"] = {}
    for n in reg:
        wd = data["regime"][n] = {"peak": peaks[n], "shape": _shape(n), "online": {}}
        for c in REGIME_CONFIGS:
            wd["online"][c.label] = [
                {"fraction_of_peak": f, **pooled(
                    [res[RunSpec(n, c.scheduler, c.horizon, "online", peaks[n]["rate"] * f, s, tasks)] for s in seeds]
                ).summary()}
                for f in REGIME_FRACTIONS
            ]
    data["meta"]["regime_fractions_of_peak"] = list(REGIME_FRACTIONS)
    data["meta"]["wall_s"] = round(time.time() - t0, 1)
    (out_dir / "fleet_bench.json").write_text(json.dumps(data, indent=1) + "\n")
    from .fleet_report import write_fleet_report

    write_fleet_report(data, out_dir)
    return data


def _shape(name: str) -> dict:
    """What the report says about a workload: a generated one from its WorkloadShape, a
    measured one from the workload file alone (engine block, tasks' control_hz, rounds)."""
    w = builtin_workload(name)
    st = np.concatenate([t.rounds["static"] for t in w.tasks])
    dy = np.concatenate([t.rounds["dynamic"] for t in w.tasks])
    # Seconds one round executes, per task's own control rate.
    phase = np.concatenate([np.asarray(t.rounds[m]) / t.control_hz for t in w.tasks for m in ("static", "dynamic")])
    if name in SHAPES or name in REGIME_SHAPES:
        s = SHAPES.get(name) or REGIME_SHAPES[name]
        info = {"measured": False, "shaped_like": s.shaped_like, "profile": s.profile, "control_hz": s.control_hz,
                "chunk": s.chunk}
    else:
        hz = sorted({t.control_hz for t in w.tasks})
        # The file records no chunk size; its largest round is what the simulator's engine
        # generates per request (SimulatedEngine chunk_size = Workload.max_round()).
        info = {"measured": True, "shaped_like": MEASURED_NOTE, "profile": "measured",
                "control_hz": hz[0] if len(hz) == 1 else hz, "chunk": None}
    return {
        **info,
        "batch_latency_ms": dict(w.batch_latency_ms),
        "saturation_batch": w.profile.saturation_batch,
        "max_round": w.max_round(),
        "tasks": len(w.tasks),
        "mean_static_h": float(st.mean()),
        "mean_dynamic_h": float(dy.mean()),
        "rounds_static_per_task": float(len(st) / len(w.tasks)),
        "rounds_dynamic_per_task": float(len(dy) / len(w.tasks)),
        "exec_phase_s": [float(phase.min()), float(phase.max())],
    }


def _meta(seeds, tasks, peak_load, wall) -> dict:
    m = machine_info()
    return {
        "command": "robotserve bench fleet " + " ".join(sys.argv[3:]) if len(sys.argv) > 2 else "robotserve bench fleet",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{m['cores']} cores, {m['cpu']}, Python {m['python']}",
        "seeds": list(seeds),
        "tasks_per_online_run": tasks,
        "peak_definition": (
            f"arrival rate at which FIFO with static horizons requests {peak_load:.0%} of the engine's maximum "
            "throughput (requests/s at the profile's saturation batch)"
        ),
        "rate_fractions_of_peak": list(RATE_FRACTIONS),
        "overload_fraction_of_peak": OVERLOAD_FRACTION,
        "fleets": list(FLEETS),
    }
