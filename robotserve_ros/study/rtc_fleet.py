"""The fleet simulator on the RTC study's measured rounds (issue 28 item 3): FIFO with the
zero-delay static rounds vs Kairos and remaining-work order with the rounds of the best RTC
configuration at a fleet delay >= 0.2 s, per task family, at peak load and with 100 robots.
The same virtual-clock simulator and peak definition as `robotserve study fleet`
(bench/study_fleet.py): FIFO-static offers 90 % of the engine's saturation throughput."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

CONFIGS = (("FIFO", "fifo", "static"), ("Kairos", "kairos", "dynamic"), ("remaining", "remaining", "dynamic"),
           ("FIFO rtc-rounds", "fifo", "dynamic"))
FLEET_DELAY_S = 0.2  # the fleet delay floor for the RTC configuration


def pick_rtc_row(rows: list, task: str):
    """The `+rtc` row at delay >= 0.2 s with the highest success (then the longer horizon);
    None when RTC could not run at such a delay (d > H / 2)."""
    cand = [r for r in rows if r["task"] == task and r["config"].endswith("+rtc") and r["delay_s"] >= FLEET_DELAY_S]
    return max(cand, key=lambda r: (r["success"], r["mean_horizon"])) if cand else None


def _workload(name: str, static_row: dict, dyn_row: dict, control_hz: float, profile_ms: dict):
    from ..sim.workload import TaskSpec, Workload

    by_seed = dict(zip(dyn_row["_extra"]["episode_seeds"], dyn_row["_extra"]["rounds"]))
    tasks = tuple(TaskSpec(f"{name}-{s}", float(control_hz), {"static": tuple(r), "dynamic": tuple(by_seed[s])})
                  for s, r in zip(static_row["_extra"]["episode_seeds"], static_row["_extra"]["rounds"])
                  if r and by_seed.get(s))
    return Workload(name, {int(k): float(v) for k, v in profile_ms.items()}, tasks)


def _resampled(w, seed: int, n: int):
    from ..sim.workload import TaskSpec, Workload

    rng = np.random.default_rng([seed, 28])
    pick = rng.integers(0, len(w.tasks), n)
    return Workload(w.name, w.batch_latency_ms, tuple(TaskSpec(f"{w.tasks[i].id}#{k}", w.tasks[i].control_hz,
                                                                w.tasks[i].rounds) for k, i in enumerate(pick)))


def fleet_on_rounds(rows: list, meta: dict, seeds=(0, 1, 2), tasks: int = 400, robots: int = 100) -> dict:
    from ..sim.runner import pooled
    from ..sim.simulator import Simulator

    t0 = time.time()
    out = {"seeds": list(seeds), "tasks_at_peak": tasks, "robots": robots, "families": {}}
    for fam, m in meta["families"].items():
        static0 = next((r for r in rows if r["task"] == m["task"] and r["config"] == "static" and r["delay_s"] == 0), None)
        dyn = pick_rtc_row(rows, m["task"])
        entry = out["families"][fam] = {"static_row": _label(static0), "rtc_row": _label(dyn)}
        if static0 is None or dyn is None:
            entry["why_not"] = ("no zero-delay static row" if static0 is None else
                                f"no +rtc row at a delay >= {FLEET_DELAY_S} s: d > H / 2 for chunk {m['chunk']} at "
                                f"{m['control_hz']:g} Hz (RTC's d <= s <= H - d has no s)")
            continue
        w = _workload(f"rtc-{fam}", static0, dyn, m["control_hz"], m["engine_profile_ms"])
        p = w.profile
        rate = 0.9 * p.throughput(p.saturation_batch) / np.mean([len(t.rounds["static"]) for t in w.tasks])
        entry["peak_rate"] = float(rate)
        for key in ("peak", "robots"):
            summ = {}
            for label, sch, hor in CONFIGS:
                res = []
                for s in seeds:
                    if key == "peak":
                        res.append(Simulator(_resampled(w, s, tasks), sch, hor, s).run_online(rate, tasks))
                    else:
                        res.append(Simulator(w, sch, hor, s).run_fleet(robots))
                sm = pooled(res).summary()
                summ[label] = {k: sm[k] for k in ("avg_latency_s", "p95_latency_s", "mean_idle_s", "rounds", "tasks",
                                                 "mean_batch")}
            fifo = summ["FIFO"]["avg_latency_s"]
            for label in ("Kairos", "remaining"):
                summ[label]["vs_fifo_avg"] = (fifo - summ[label]["avg_latency_s"]) / fifo if fifo > 0 else 0.0
            entry[key] = summ
    out["wall_s"] = round(time.time() - t0, 1)
    return out


def _label(r):
    return None if r is None else {"delay_s": r["delay_s"], "config": r["config"], "success": r["success"],
                                   "mean_horizon": r["mean_horizon"]}


def markdown(data: dict) -> str:
    lines = ["# Fleet simulator on the RTC study's measured rounds", "",
             f"Virtual clock, {len(data['seeds'])} seeds, {data['tasks_at_peak']} tasks at peak load (FIFO-static at 90 % "
             f"of saturation throughput), {data['robots']} robots in fleet mode. FIFO runs the zero-delay static "
             f"rounds; Kairos and remaining run the best `+rtc` configuration's rounds at a delay >= "
             f"{FLEET_DELAY_S} s.", "",
             "| family | point | rtc rounds from | FIFO avg s | Kairos avg s (vs FIFO) | remaining avg s (vs FIFO) "
             "| FIFO on rtc rounds avg s | P95 FIFO / Kairos |", "|---|---|---|---|---|---|---|---|"]
    for fam, e in data["families"].items():
        if "why_not" in e:
            lines.append(f"| {fam} | — | — | not run: {e['why_not']} | | | | |")
            continue
        src = f"{e['rtc_row']['config']} @ {e['rtc_row']['delay_s']:g} s"
        for key in ("peak", "robots"):
            d = e[key]
            lines.append(f"| {fam} | {'peak load' if key == 'peak' else str(data['robots']) + ' robots'} | {src} "
                         f"| {d['FIFO']['avg_latency_s']:.2f} | {d['Kairos']['avg_latency_s']:.2f} "
                         f"({d['Kairos']['vs_fifo_avg']:+.1%}) | {d['remaining']['avg_latency_s']:.2f} "
                         f"({d['remaining']['vs_fifo_avg']:+.1%}) | {d['FIFO rtc-rounds']['avg_latency_s']:.2f} "
                         f"| {d['FIFO']['p95_latency_s']:.2f} / {d['Kairos']['p95_latency_s']:.2f} |")
    return "\n".join(lines) + "\n"


def write_fleet(data: dict, out: Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "fleet.md").write_text(markdown(data))
    return [out / "fleet.json", out / "fleet.md"]
