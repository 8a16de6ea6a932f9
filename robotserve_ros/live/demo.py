"""`robotserve demo`: the main job, as real ROS 2 processes.

Two demos share this module:
- the default closes the loop on a trained policy (issue 28 item 4): N simulated robots run
  Meta-World episodes of mixed tasks with real MuJoCo physics (nodes/metaworld_robot.py), the
  trained flow policy (models/metaworld_flow) serves them live from the inference server, and
  three rows of the closed-loop study of record at 10 robots (issue 34 item 6: its baseline,
  FIFO + the dynamic horizon, its best execution-aware configuration) run on the same robots
  and episode seeds, interleaved in blocks: success (Wilson CI), average / P95 episode time,
  robot idle time, rounds served, the same rows in the virtual fleet, the study's 100-robot
  table (run_metaworld_demo);
- `--workload NAME` replays a generated workload (the demo before issue 28; run_workload_demo).

Generated workloads: each run starts the inference server and N simulated robots (sim_robot +
robot_client, one process each for the whole fleet) on a private ROS domain with the same
seeded task mix: every robot replays tasks drawn from a built-in workload (FIFO asks for the
static horizons; the execution-aware runs for the dynamic ones, as in seed 000 §5.3). A regime
workload (`robotserve workload list`) is an engine that does not batch (a large policy on a
small edge GPU: saturation batch 1) serving more robots than it can keep idle-free, with task
types of very different lengths. The server's engine timing is the workload's engine profile;
nothing is tuned to the demo. A listener in this process collects each task's end-to-end
latency and idle time from the robots' progress messages and the server's diagnostics; then
everything is stopped and compared.
"""
from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..launch_description import default_config, fleet
from .processes import DomainContext, ProcessGroup, pick_free_domain, ros_env, server_diagnostics
from .demo_report import (ABLATION, PER_PROCESS, TARGET_REDUCTION, closed_loop_target,  # noqa: F401
                          incomplete_runs, reduction_ci, summarize, summarize_episodes, why, why_closed_loop,
                          write_metaworld_report, write_workload_report)

# (configuration name, scheduler, horizon mode). The execution-aware runs use the dynamic
# horizon (seed 000 §3.1) with an execution-aware order: Kairos' wait ratio (§3.2), or the
# remaining-work scheduler (core/schedulers/remaining.py).
RUNS = (("FIFO", "fifo", "static"), ("Kairos", "kairos", "dynamic"), ("remaining", "remaining", "dynamic"))


def _params_file(base: str, scheduler: str, horizon: str, workload: str, seed: int, tasks: int, out: Path) -> str:
    from ..core.profile import EngineProfile
    from ..sim.workloads import builtin_workload

    w = builtin_workload(workload)
    prof = EngineProfile(w.batch_latency_ms)
    cfg = yaml.safe_load(Path(base).read_text())
    srv = cfg["inference_server"]["ros__parameters"]
    srv["scheduler"] = {"name": scheduler}
    engine = srv.setdefault("engine", {})
    # The workload's engine profile: what the simulator replays it with, too.
    engine.update(batch_sizes=[int(b) for b in prof.batches], latency_ms=[float(x) for x in prof.latencies_ms])
    knobs = engine.setdefault(engine.get("name", "simulated"), {})
    knobs["chunk_size"] = max(int(knobs.get("chunk_size", 0)), w.max_round() + 8)  # a round plus its overlap
    rc = cfg["/**/robot_client"]["ros__parameters"]
    rc.update(workload=workload, horizon_mode=horizon, mix_seed=seed, tasks=tasks,
              control_hz=float(w.tasks[0].control_hz), expected_latency_s=prof.latency_s(1))
    out.write_text(yaml.safe_dump(cfg))
    return str(out)


def _collect(env: dict, robots: int, tasks: int, timeout: float, group: ProcessGroup) -> dict:
    """Listen on the private domain until every robot reported `tasks` finished tasks (or a
    process of the fleet died: then say which, at once, rather than wait out the timeout)."""
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
            dead = group.failed()
            if dead:
                node.destroy_node()
                names = ", ".join(f"{n} (exit {c}, log {group.log_dir / (n + '.log')})" for n, c in dead)
                raise RuntimeError(f"demo: a fleet process died: {names}")
        end = time.monotonic() + 1.5  # one more diagnostics message after the last task
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.1)
        node.destroy_node()
        return {"tasks": done, "server": diag}


def run_demo(out_dir: Path, robots: int = 10, tasks: int | None = None, workload: str | None = None, seed: int = 0,
             config: str | None = None, timeout: float | None = None, ablation: bool = False) -> dict:
    """The Meta-World closed loop (no workload), or a generated workload's replay."""
    if workload is None:
        return run_metaworld_demo(out_dir, robots=robots, episodes=tasks or EPISODES, seed=seed,
                                  timeout=timeout or 240.0)
    return run_workload_demo(out_dir, robots=robots, tasks=tasks or 2, workload=workload, seed=seed, config=config,
                             timeout=timeout or 240.0, ablation=ablation)


def run_workload_demo(out_dir: Path, robots: int = 12, tasks: int = 2, workload: str = "metaworld-mixed-edge",
                      seed: int = 0, config: str | None = None, timeout: float = 240.0, ablation: bool = False) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = config or default_config()
    results = {"robots": robots, "tasks_per_robot": tasks, "workload": workload, "seed": seed, "runs": {}}
    runs = RUNS + ((ABLATION,) if ablation else ())
    with tempfile.TemporaryDirectory(prefix="robotserve_demo_") as tmp:
        for label, scheduler, horizon in runs:
            params = _params_file(base, scheduler, horizon, workload, seed, tasks, Path(tmp) / f"{scheduler}.yaml")
            env = ros_env(domain_id=pick_free_domain(), log_dir=str(Path(tmp) / "ros_log"))
            print(f"[demo] {label}: server ({scheduler}, {horizon} horizons) + {robots} robots ...", flush=True)
            t0 = time.monotonic()
            group = ProcessGroup(fleet(params, robots), env, out_dir / "logs" / scheduler).start()
            try:
                got = _collect(env, robots, tasks, timeout, group)
            finally:
                group.stop()
            got.update(scheduler=scheduler, horizon=horizon, wall_s=round(time.monotonic() - t0, 1))
            got["summary"] = summarize(got)
            results["runs"][label] = got
            print(f"[demo] {label}: {len(got['tasks'])}/{robots * tasks} tasks in {got['wall_s']} s", flush=True)
    (out_dir / "live_demo.json").write_text(json.dumps(results, indent=1) + "\n")
    write_workload_report(results, out_dir)
    return results



# --- the closed loop on a trained policy: Meta-World, the flow policy, live (issue 28 item 4) -----

@dataclass(frozen=True)
class DemoConfig:
    """One configuration of the side-by-side run. `robot` and `server` are extra parameters of
    the robots' /**/metaworld_robot section and the server's section: a real-time-chunking
    entry (issue 28 items 2-3) is one more DemoConfig with its own there."""

    label: str
    scheduler: str
    horizon: str  # the horizon policy the robots ask for
    param: float  # its knob (static: H)
    robot: dict = field(default_factory=dict)
    server: dict = field(default_factory=dict)

    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "_", self.label).strip("_").lower()


# The rows come from the closed-loop study of record (`robotserve study fleet-closed`), at the
# demo's 10 robots on the CPU profile (the engine the demo runs).
STUDY = Path(__file__).resolve().parents[2] / "reports" / "closed_loop" / "fleet.json"
SCHEDULER_NAMES = {"fifo": "FIFO", "kairos": "Kairos", "remaining": "remaining"}
KNOB_NAMES = {"agreement": "tau", "schedule": "t"}  # sim/closed_loop.HORIZON_KNOBS' knobs


def _dynamic(scheduler: str, horizon: str) -> DemoConfig:
    from ..sim.closed_loop import HORIZON_KNOBS

    knob = HORIZON_KNOBS[horizon]
    return DemoConfig(f"{SCHEDULER_NAMES[scheduler]} + {horizon} {KNOB_NAMES[horizon]}={knob:g}", scheduler, horizon, knob)


def demo_configs(study: Path = STUDY, robots: int = 10, profile: str = "cpu") -> tuple:
    """make demo's rows (issue 34 item 6), from the study's regime of `robots` on `profile`: its
    baseline (the fastest FIFO + static H whose success is not below the best static's), FIFO +
    the dynamic horizon (plan agreement), and its best execution-aware configuration: an
    execution-aware order (Kairos §3.2, remaining) with a dynamic horizon, the lowest restricted
    mean (failures at the cap), ties to the primary test's scheduler."""
    try:
        rep = json.loads(Path(study).read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"demo: the closed-loop study of record {study} is not readable ({e})") from None
    reg = next((g for g in rep["regimes"] if (g["robots"], g["profile"]) == (robots, profile)), None)
    if reg is None or not reg.get("baseline"):
        raise RuntimeError(f"demo: {study} has no baseline for {robots} robots on the {profile} profile")
    h = int(reg["baseline"].rsplit("=", 1)[1])  # "fifo + static H=<k>"
    aware = [r for r in rep["rows"] if (r["robots"], r["profile"]) == (robots, profile)
             and r["scheduler"] != "fifo" and r["horizon"] in KNOB_NAMES]
    if not aware:
        raise RuntimeError(f"demo: {study} has no execution-aware row for {robots} robots on the {profile} profile")
    best = min(aware, key=lambda r: (r["restricted_mean_s"], r["scheduler"] != rep["primary"]["scheduler"]))
    return (DemoConfig(f"FIFO + static H={h}", "fifo", "static", h), _dynamic("fifo", "agreement"),
            _dynamic(best["scheduler"], best["horizon"]))


EPISODES = 8  # per robot and configuration
BLOCKS = 2  # the episodes run in this many blocks, every configuration in turn in each (interleaved)
POLICY = Path(__file__).resolve().parents[2] / "models" / "metaworld_flow"
# The flow head's engine profile of record (the same 0.4M-parameter network on PushGust's state).
PROFILE = "pushgust_flow"


def metaworld_params(cfg: DemoConfig, robots: int, episodes: int, seed: int, episodes_file: str, out: Path,
                     first_episode: int = 0) -> str:
    """The params file of one configuration: the server's section and the robots' (their
    episodes first_episode .. first_episode + episodes - 1)."""
    from ..profiles import profile_of_record
    from ..sim.closed_loop import LIVE_FIRST_SEED
    from ..study.metaworld_task import CONTROL_HZ

    prof = profile_of_record(PROFILE)
    server = {
        "service": "/robotserve/infer",
        "scheduler": {"name": cfg.scheduler},
        "engine": {"name": "flow", "profile": PROFILE, "flow": {"policy_dir": str(POLICY), "seed": seed}},
        "horizon": {"static": {"h": 4}, "agreement": {"h_min": 1}},  # h_min 1 as in the study
        "obs_cameras": 0,
        "obs_joints": -1,
        **cfg.server,
    }
    robot = {
        "service": "/robotserve/infer",
        "control_hz": CONTROL_HZ,
        "horizon_policy": cfg.horizon,
        "horizon_param": float(cfg.param),
        # the batch the whole fleet makes: the round trip the trigger point hides (core/robot_timing.py)
        "expected_latency_s": prof.latency_s(min(robots, prof.saturation_batch)),
        "tasks": episodes,
        "episode_seed": LIVE_FIRST_SEED + first_episode,  # episode k of robot i: its seed + 101 i + k
        "mix_seed": seed,
        "episodes_file": episodes_file,
        **cfg.robot,
    }
    from ..nodes.metaworld_robot import MetaWorldRobotConfig

    MetaWorldRobotConfig(**robot)  # a configuration's misspelt or wrong robot parameter fails here, not silently there
    out.write_text(yaml.safe_dump({"inference_server": {"ros__parameters": server},
                                   "/**/metaworld_robot": {"ros__parameters": robot}}))
    return str(out)


def run_metaworld_demo(out_dir: Path, robots: int = 10, episodes: int = EPISODES, seed: int = 0,
                       timeout: float = 240.0, configs=None, blocks: int = BLOCKS) -> dict:
    """Every configuration on the same robots and episode seeds, interleaved: the episodes run in
    `blocks` blocks and every configuration runs each block in turn, so a machine whose load drifts
    weighs on every row alike. The report in out_dir."""
    import os

    import numpy as np

    from ..machine import machine_info
    from ..study.metaworld_task import metaworld_missing, TASKS

    why_not = metaworld_missing()
    if why_not:
        raise RuntimeError(f"demo: {why_not}")
    if not (POLICY / "model.safetensors").is_file():
        raise RuntimeError(f"demo: the trained policy {POLICY} is not there")
    configs = configs or demo_configs()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"demo": "metaworld", "robots": robots, "episodes_per_robot": episodes, "seed": seed,
               "policy": "models/metaworld_flow", "engine_profile": PROFILE, "tasks": list(TASKS),
               "machine": machine_info(), "loadavg_start": list(os.getloadavg()), "runs": {},
               "study_of_record": str(STUDY.relative_to(STUDY.parents[2]))}
    sizes = [len(b) for b in np.array_split(np.arange(episodes), min(blocks, episodes))]
    with tempfile.TemporaryDirectory(prefix="robotserve_demo_") as tmp:
        for b, n in enumerate(sizes):
            for cfg in configs:
                part = _run_block(cfg, robots, n, sum(sizes[:b]), seed, Path(tmp) / f"{cfg.slug()}_{b}", out_dir, timeout)
                print(f"[demo] {cfg.label}, block {b + 1}/{len(sizes)}: {len(part['episodes'])}/{robots * n} episodes "
                      f"in {part['wall_s']} s", flush=True)
                _merge(results["runs"].setdefault(cfg.label, {}), part)
    for run in results["runs"].values():
        run["episodes"].sort(key=lambda e: (e["robot"], e["seed"]))
        run["summary"] = summarize_episodes(run)
    results["loadavg_end"] = list(os.getloadavg())
    results["why"] = why_closed_loop(results["runs"])
    results["target"] = closed_loop_target(results["runs"])
    from ..sim.closed_loop_live import virtual_check

    results["sim_vs_live"] = virtual_check(results, str(POLICY))
    (out_dir / "live_demo.json").write_text(json.dumps(results, indent=1) + "\n")
    write_metaworld_report(results, out_dir)
    return results


def _run_block(cfg: DemoConfig, robots: int, episodes: int, first: int, seed: int, tmp: Path, out_dir: Path,
               timeout: float) -> dict:
    """One configuration on episodes first .. first + episodes - 1 of every robot: a server and
    the robots' processes on a private domain, until every episode ended."""
    from ..launch_description import server
    from ..machine import busy_fraction, cpu_times
    from ..study.metaworld_task import CONTROL_HZ
    from .processes import ModuleSpec

    eps_file = tmp / "{robot}.jsonl"
    tmp.mkdir()
    params = metaworld_params(cfg, robots, episodes, seed, str(eps_file), tmp / "params.yaml", first_episode=first)
    env = ros_env(domain_id=pick_free_domain(), log_dir=str(tmp / "ros_log"))
    print(f"[demo] {cfg.label}: server (flow policy, {cfg.scheduler}) + {robots} Meta-World robots ...", flush=True)
    t0, cpu0 = time.monotonic(), cpu_times()
    specs = server(params) + [
        ModuleSpec(f"metaworld_robots_{i}", "robotserve_ros.nodes.metaworld_robot",
                   ["--robots", str(min(PER_PROCESS, robots - i)), "--first-index", str(i), "--params", params])
        for i in range(0, robots, PER_PROCESS)]
    group = ProcessGroup(specs, env, out_dir / "logs" / tmp.name).start()
    try:
        got = _collect(env, robots, episodes, timeout, group)
    finally:
        group.stop()
    wall = time.monotonic() - t0
    return {"control_hz": CONTROL_HZ, "scheduler": cfg.scheduler, "horizon": cfg.horizon, "param": cfg.param,
            "robot_params": cfg.robot, "server_params": cfg.server, "wall_s": round(wall, 1), "server": got["server"],
            # every process of the machine, ours and the other users': how contended the run was
            "machine_busy": round(busy_fraction(cpu0, cpu_times()), 3),
            "episodes": [json.loads(line) for f in sorted(tmp.glob("*.jsonl")) for line in f.read_text().splitlines()]}


def _merge(run: dict, part: dict) -> None:
    """A block into its configuration's run: episodes joined, the server's rounds served summed,
    its engine utilisation and the machine's busy share weighted by wall time; each block kept."""
    blocks = run.setdefault("blocks", [])
    blocks.append({k: part[k] for k in ("wall_s", "machine_busy", "server")})
    eps = run.get("episodes", []) + part["episodes"]
    run.update({k: v for k, v in part.items() if k not in ("episodes", "server", "wall_s", "machine_busy")})
    wall = sum(b["wall_s"] for b in blocks) or 1.0

    def weighted(get) -> float:
        return round(sum(get(b) * b["wall_s"] for b in blocks) / wall, 3)

    run.update(episodes=eps, wall_s=round(sum(b["wall_s"] for b in blocks), 1),
               machine_busy=weighted(lambda b: b["machine_busy"]),
               server={**part["server"], "served": str(sum(int(float(b["server"].get("served", 0) or 0)) for b in blocks)),
                       "engine_utilization": str(weighted(lambda b: float(b["server"].get("engine_utilization", "nan"))))})
