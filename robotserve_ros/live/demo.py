"""`robotserve demo`: the live fleet, FIFO then Kairos, as real ROS 2 processes.

Each run starts the inference server and N simulated robots (sim_robot + robot_client, one
process each for the whole fleet) on a private ROS domain with the same seeded task mix:
every robot replays tasks drawn from a built-in workload (FIFO asks for the static
horizons, Kairos for the dynamic ones, as in seed 000 §5.3). A listener in this process
collects each task's end-to-end latency and idle time from the robots' progress messages
and the server's diagnostics; then everything is stopped and compared.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from ..launch_description import default_config, fleet
from .processes import DomainContext, ProcessGroup, pick_free_domain, ros_env, server_diagnostics

RUNS = (("FIFO", "fifo", "static"), ("Kairos", "kairos", "dynamic"))


def _params_file(base: str, scheduler: str, horizon: str, workload: str, seed: int, tasks: int, out: Path) -> str:
    cfg = yaml.safe_load(Path(base).read_text())
    cfg["inference_server"]["ros__parameters"]["scheduler"] = scheduler
    cfg["inference_server"]["ros__parameters"]["scheduler_params"] = "{}"
    rc = cfg["/**/robot_client"]["ros__parameters"]
    rc.update(workload=workload, horizon_mode=horizon, mix_seed=seed, tasks=tasks)
    out.write_text(yaml.safe_dump(cfg))
    return str(out)


def _collect(env: dict, robots: int, tasks: int, timeout: float) -> dict:
    """Listen on the private domain until every robot reported `tasks` finished tasks."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from ..msg import ExecutionProgress
    from ..nodes.common import to_sec

    with DomainContext(env) as ctx:
        node = rclpy.create_node("fleet_demo_listener", context=ctx)
        done: dict = {}
        diag: dict = {}

        def on_progress(m):
            if m.task_done and m.task_id not in done:
                done[m.task_id] = {"latency_s": to_sec(m.header.stamp) - to_sec(m.task_start), "idle_s": m.idle_s,
                                   "chunks": m.chunks, "actions": int(m.timestep)}

        def on_diag(m):
            diag.update(server_diagnostics(m) or {})

        node.create_subscription(ExecutionProgress, "/robotserve/progress", on_progress,
                                 QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
        ex = rclpy.executors.SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        end = time.monotonic() + timeout
        while len(done) < robots * tasks and time.monotonic() < end:
            ex.spin_once(timeout_sec=0.1)
        end = time.monotonic() + 1.5  # one more diagnostics message after the last task
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.1)
        node.destroy_node()
        return {"tasks": done, "server": diag}


def run_demo(out_dir: Path, robots: int = 8, tasks: int = 1, workload: str = "bimanual-diffusion", seed: int = 0,
             config: str | None = None, timeout: float = 240.0) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = config or default_config()
    results = {"robots": robots, "tasks_per_robot": tasks, "workload": workload, "seed": seed, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="robotserve_demo_") as tmp:
        for label, scheduler, horizon in RUNS:
            params = _params_file(base, scheduler, horizon, workload, seed, tasks, Path(tmp) / f"{scheduler}.yaml")
            env = ros_env(domain_id=pick_free_domain(), log_dir=str(Path(tmp) / "ros_log"))
            print(f"[demo] {label}: server ({scheduler}, {horizon} horizons) + {robots} robots ...", flush=True)
            t0 = time.monotonic()
            group = ProcessGroup(fleet(params, robots), env, out_dir / "logs" / scheduler).start()
            try:
                got = _collect(env, robots, tasks, timeout)
            finally:
                group.stop()
            got.update(scheduler=scheduler, horizon=horizon, wall_s=round(time.monotonic() - t0, 1))
            results["runs"][label] = got
            print(f"[demo] {label}: {len(got['tasks'])}/{robots * tasks} tasks in {got['wall_s']} s", flush=True)
    (out_dir / "live_demo.json").write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, out_dir)
    return results


def summarize(run: dict) -> dict:
    lat = np.array([t["latency_s"] for t in run["tasks"].values()]) if run["tasks"] else np.array([np.nan])
    idle = np.array([t["idle_s"] for t in run["tasks"].values()]) if run["tasks"] else np.array([np.nan])
    s = run["server"]
    return {
        "tasks": len(run["tasks"]),
        "avg_latency_s": float(np.mean(lat)),
        "p95_latency_s": float(np.percentile(lat, 95)),
        "avg_idle_s": float(np.mean(idle)),
        "chunks_served": int(float(s.get("served", "nan"))) if s.get("served") else 0,
        "mean_obs_age_ms": 1000 * float(s.get("mean_obs_age_s", "nan")),
        "engine_utilization": float(s.get("engine_utilization", "nan")),
        "refreshes": int(float(s.get("refreshes", "0"))),
    }


def write_report(results: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {label: summarize(run) for label, run in results["runs"].items()}
    lines = [
        "# Live fleet demo: FIFO vs Kairos as real ROS 2 processes",
        "",
        f"{results['robots']} simulated SO-101 robots, {results['tasks_per_robot']} task(s) each from the seeded "
        f"`{results['workload']}` mix (seed {results['seed']}); FIFO with static horizons, Kairos with dynamic ones.",
        "",
        "| run | tasks | avg latency s | P95 latency s | avg idle s | chunks served | obs age at dispatch ms | engine util |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['tasks']} | {r['avg_latency_s']:.2f} | {r['p95_latency_s']:.2f} | {r['avg_idle_s']:.2f} "
                     f"| {r['chunks_served']} | {r['mean_obs_age_ms']:.1f} | {r['engine_utilization']:.2f} |")
    labels = list(results["runs"])
    lines += ["", "Per robot (end-to-end latency s / idle s / chunks):", "",
              "| task | " + " | ".join(labels) + " |", "|---" * (1 + len(labels)) + "|"]
    tids = sorted(set().union(*(r["tasks"] for r in results["runs"].values())))
    for tid in tids:
        cells = []
        for label in labels:
            t = results["runs"][label]["tasks"].get(tid)
            cells.append(f"{t['latency_s']:.2f} / {t['idle_s']:.2f} / {t['chunks']}" if t else "not finished")
        lines.append(f"| {tid} | " + " | ".join(cells) + " |")
    if "FIFO" in rows and "Kairos" in rows and rows["FIFO"]["avg_latency_s"] > 0:
        red = (rows["FIFO"]["avg_latency_s"] - rows["Kairos"]["avg_latency_s"]) / rows["FIFO"]["avg_latency_s"] * 100
        lines += ["", f"Kairos vs FIFO, average end-to-end latency: {red:+.1f}% reduction."]
    lines += ["", "![per-robot latency](live_demo.png)", ""]
    (out_dir / "live_demo.md").write_text("\n".join(lines))
    print("\n".join(lines[4:]))

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for label, run in results["runs"].items():
        items = sorted(run["tasks"].items())
        ax[0].plot(range(len(items)), [t["latency_s"] for _, t in items], "o-", ms=3, label=label)
        ax[1].plot(range(len(items)), [t["idle_s"] for _, t in items], "o-", ms=3, label=label)
    ax[0].set(title="end-to-end task latency", xlabel="task (by robot)", ylabel="s")
    ax[1].set(title="robot idle time waiting for chunks", xlabel="task (by robot)", ylabel="s")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "live_demo.png", dpi=110)
    plt.close(fig)
