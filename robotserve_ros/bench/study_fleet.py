"""`robotserve study fleet`: the fleet-bench pieces issue 11 asks for, on the measured workloads.

Kairos (wait-ratio order, dynamic horizon) vs FIFO (static horizon) average end-to-end
latency at peak load (bench/fleet.py peak_rate: FIFO-static offers 90 % of the engine's
saturation throughput) and with 100 robots, plus FIFO with the dynamic horizon and Kairos
with the static one (Table 2's split of horizon and ordering). The same simulator, runs and
peak definition as `robotserve bench fleet`, restricted to these 4 configurations x 2 points.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from ..cli_types import scratch

CONFIGS = (("FIFO", "fifo", "static"), ("Kairos", "kairos", "dynamic"), ("FIFO dynamic", "fifo", "dynamic"),
           ("Kairos static", "kairos", "static"))


def run_fleet_check(workloads, seeds=(0, 1, 2), tasks: int = 400, robots: int = 100, workers: int = 1,
                    log=print) -> dict:
    from .fleet import peak_rate, reduction
    from ..sim.runner import RunSpec, pooled, run_many

    load0 = os.getloadavg()
    t0 = time.time()
    specs, points = [], {}
    for w in workloads:
        rate = peak_rate(w, 0.9)
        points[w] = {"peak": ("online", rate, tasks), "robots": ("fleet", float(robots), 0)}
        for _, sch, hor in CONFIGS:
            for s in seeds:
                for mode, load, n in points[w].values():
                    specs.append(RunSpec(w, sch, hor, mode, load, s, n))
    res = run_many(specs, workers, desc="study fleet")
    out = {"workloads": {}, "meta": {"seeds": list(seeds), "tasks_at_peak": tasks, "robots": robots,
                                      "loadavg_before": list(load0), "loadavg_after": list(os.getloadavg()),
                                      "wall_s": round(time.time() - t0, 1)}}
    for w in workloads:
        wd = out["workloads"][w] = {"peak_rate": points[w]["peak"][1]}
        for key, (mode, load, n) in points[w].items():
            summ = {label: pooled([res[RunSpec(w, sch, hor, mode, load, s, n)] for s in seeds]).summary()
                    for label, sch, hor in CONFIGS}
            fifo = summ["FIFO"]["avg_latency_s"]
            wd[key] = {label: {k: v[k] for k in ("avg_latency_s", "p95_latency_s", "rounds", "tasks", "mean_batch")}
                       for label, v in summ.items()}
            wd[key]["kairos_vs_fifo_avg"] = reduction(fifo, summ["Kairos"]["avg_latency_s"])
            wd[key]["fifo_dynamic_vs_fifo_avg"] = reduction(fifo, summ["FIFO dynamic"]["avg_latency_s"])
            log(f"  {w} {key}: FIFO {fifo:.2f} s, Kairos {summ['Kairos']['avg_latency_s']:.2f} s "
                f"({wd[key]['kairos_vs_fifo_avg']:+.1%} lower), rounds {summ['FIFO']['rounds']} -> {summ['Kairos']['rounds']}")
    return out


def markdown(data: dict) -> str:
    m = data["meta"]
    lines = ["# Kairos vs FIFO on the measured PushGust workloads (issue 11, seed 000 §5.3)", "",
             f"`robotserve study fleet`: virtual-clock simulator, {len(m['seeds'])} seeds, {m['tasks_at_peak']} tasks "
             f"per run at peak load, {m['robots']} robots in fleet mode; {m['wall_s']:.0f} s, load average "
             f"{m['loadavg_before'][0]:.1f} before / {m['loadavg_after'][0]:.1f} after (the simulator's clock is "
             f"virtual: results do not depend on load). Target: Kairos (dynamic) >= 25 % lower average latency than "
             f"FIFO (static).", "",
             "| workload | point | FIFO avg s | Kairos avg s | Kairos vs FIFO | FIFO dynamic vs FIFO | Kairos static avg s "
             "| rounds FIFO / Kairos | target |", "|---|---|---|---|---|---|---|---|---|"]
    for w, wd in data["workloads"].items():
        for key in ("peak", "robots"):
            d = wd[key]
            red = d["kairos_vs_fifo_avg"]
            lines.append(f"| {w} | {'peak load' if key == 'peak' else str(m['robots']) + ' robots'} "
                         f"| {d['FIFO']['avg_latency_s']:.2f} | {d['Kairos']['avg_latency_s']:.2f} | {red:+.1%} "
                         f"| {d['fifo_dynamic_vs_fifo_avg']:+.1%} | {d['Kairos static']['avg_latency_s']:.2f} "
                         f"| {d['FIFO']['rounds']} / {d['Kairos']['rounds']} | {'met' if red >= 0.25 else 'MISSED'} |")
    return "\n".join(lines) + "\n"


def cmd_fleet(a) -> int:
    from ..sim.workloads import measured_names

    known = measured_names()
    bad = [w for w in a.workloads if w not in known]
    if bad:
        from ..cli_types import UsageError

        raise UsageError(f"--workloads {bad[0]!r} is not a measured workload; known: {', '.join(known)}")
    data = run_fleet_check(a.workloads, tuple(a.seeds), a.tasks, a.robots, a.workers)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "fleet.md").write_text(markdown(data))
    print(f"wrote {out / 'fleet.json'}, {out / 'fleet.md'}")
    return 0


def add_arguments(p) -> None:
    from ..cli_types import positive, seed

    p.add_argument("--workloads", nargs="+", default=["pushgust-diffusion", "pushgust-flow-matching"])
    p.add_argument("--out", default=scratch("horizon"), help="report folder (the record: reports/horizon)")
    p.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", type=positive(int), default=400, help="tasks per run at peak load")
    p.add_argument("--robots", type=positive(int), default=100)
    p.add_argument("--workers", type=positive(int), default=1)
    p.set_defaults(func=cmd_fleet)
