"""The closed-loop virtual fleet beside a live demo record (issue 34 item 6): the record's rows
run in sim/closed_loop.py's fleet at its robots, seeds and the CPU profile of record, and the
Markdown of both side by side."""
from __future__ import annotations

import numpy as np

from .closed_loop import HORIZON_KNOBS, LIVE_FIRST_SEED, POLICY_DIR, ClosedLoopFleet, EnvPool, FleetConfig, load_policy


def virtual_check(results: dict, policy_dir: str = POLICY_DIR, log=print) -> dict:
    """A live demo record's rows (live/demo.py) in the closed-loop virtual fleet (issue 34 item 6): as many
    robots, the same episode seeds, the policy's CPU profile of record, every robot at its full 80 Hz.
    Adds "virtual" to each run's summary and returns sim_vs_live: per row, the live mean episode
    time's gap to the virtual one (target within 15 %) and whether the live success lies within the
    virtual row's 95 % CI."""
    from ..study.horizon_report import wilson_ci

    engine, pool, out = load_policy(policy_dir, seed=results["seed"]), None, {}
    for label, run in results["runs"].items():
        if run["horizon"] != "static" and float(run["param"]) != HORIZON_KNOBS.get(run["horizon"]):
            raise ValueError(f"{label}: the virtual fleet runs {run['horizon']} at {HORIZON_KNOBS.get(run['horizon'])}, "
                             f"not {run['param']}")
        cfg = FleetConfig(results["robots"], "cpu", run["scheduler"], run["horizon"],
                          run["param"] if run["horizon"] == "static" else 0, episodes=results["episodes_per_robot"],
                          seed=results["seed"], first_seed=LIVE_FIRST_SEED)
        pool = pool or EnvPool(cfg.max_steps)
        res = ClosedLoopFleet(cfg, engine, pool).run()
        ok = sum(e.success for e in res.episodes)
        v = {"avg_latency_s": float(np.mean([e.duration_s for e in res.episodes])), "success": ok / len(res.episodes),
             "success_ci95": wilson_ci(ok, len(res.episodes)), "episodes": len(res.episodes),
             "actions_per_round": sum(e.steps for e in res.episodes) / max(1, sum(e.rounds for e in res.episodes)),
             "engine_utilization": res.engine_busy_s / res.makespan_s, "mean_batch": res.dispatched / max(1, res.batches),
             "profile": "cpu", "wall_s": round(res.wall_s, 1)}
        run["summary"]["virtual"] = v
        live = run["summary"]
        gap = (live["avg_latency_s"] - v["avg_latency_s"]) / v["avg_latency_s"]
        out[label] = {"avg_latency_gap": gap, "latency_within_15pct": abs(gap) <= 0.15,
                      "success_within_ci": v["success_ci95"][0] <= live["success"] <= v["success_ci95"][1],
                      "live_control_hz_reached": live.get("achieved_control_hz")}
        log(f"[demo] {label}: virtual fleet {v['avg_latency_s']:.2f} s per episode, success {v['success']:.3f}; "
            f"live {live['avg_latency_s']:.2f} s, {live['success']:.3f}")
    return out


def sim_vs_live_lines(results: dict) -> list:
    """The Markdown of virtual_check's rows beside the live ones (live_demo.md)."""
    runs, lines = results["runs"], []
    lines += ["", "The same rows in the closed-loop virtual fleet ([docs/closed_loop.md](../../docs/closed_loop.md): "
                  "as many robots, the same episode seeds, the CPU profile of record, every robot at its full 80 Hz): "
                  "a check of the simulator against the live run (target: live episode time within 15 % of the "
                  "virtual, live success within the virtual 95 % CI).", "",
              "| configuration | live avg episode s | virtual avg episode s | gap | live success | virtual success "
              "(95 % CI) | live control Hz | engine util live / virtual | within 15 % | success within CI |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for label, run in runs.items():
        r, v, c = run["summary"], run["summary"]["virtual"], results["sim_vs_live"][label]
        lines.append(f"| {label} | {r['avg_latency_s']:.2f} | {v['avg_latency_s']:.2f} | {c['avg_latency_gap']:+.0%} "
                     f"| {r['success']:.3f} | {v['success']:.3f} ({v['success_ci95'][0]:.2f}-{v['success_ci95'][1]:.2f}) "
                     f"| {r['achieved_control_hz']:.0f} | {r['engine_utilization']:.2f} / {v['engine_utilization']:.2f} "
                     f"| {'yes' if c['latency_within_15pct'] else 'NO'} "
                     f"| {'yes' if c['success_within_ci'] else 'NO'} |")
    return lines
