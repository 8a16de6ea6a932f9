"""`robotserve bench robots-per-engine` (issue 40): how many robots one engine keeps fed, for
robotserve (through ROS srv/Infer, its openpi and its LeRobot endpoints) and for the servers labs run today
(openpi's serial serve_policy shape, LeRobot's own PolicyServer), on the same device, the same
robots and the same rule.

Device (--curve): gpu_like, a simulated engine sleeping the curve L(b) = 28 ms x (1 + 0.08 (b - 1))
(batch 1 from a published pi0.5 latency; the slope an assumption, the closed-loop fleet's); or
smolvla_cpu, the real tiny SmolVLA at one torch thread, its batch curve measured by the bench
before the rows (bench/rpe_smolvla.py). Either way the calls of every server process are
serialised by one lock (bench/rpe_servers.py). Servers run on one core, robots
on another (os.sched_setaffinity); a run whose client core was over 80 % busy is client-bound.
Robots start at seeded phases within a chunk period and ask with `trigger` actions left
(bench/rpe_clients.py; the ROS robots re-send as robot_client does, bench/rpe_ros.py; LeRobot's
own RobotClient keeps its own timing, bench/rpe_robotclient.py).
Every server cap stays at its default; openpi robots present the API key; what a server
refused during a run is counted in its row (a row with refusals is unfed). A robot is fed when its idle share is <= its batch-1 idle share + 5
points and its p95 round trip <= (H - trigger) x dt; capacity is the largest fleet with every
robot fed (bench/rpe_rules.py). Sizes step by 1 to 16, then by <= 25 %; every size runs
`--repeats` times, repeats interleaved across servers (repeat r of each server back to back,
under the same load), every attempted run a row. The predicted capacity comes from the
simulator on the same curve, sizes, phases and trigger, computed before the first run.
Added latency: one robot alone, back-to-back calls, round trip minus the device time of that call
(LeRobot rows: through LeRobot's stubs, as RobotClient makes no back-to-back calls).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..cli_types import UsageError, comma_list, positive, scratch, seed
from ..machine import machine_info
from . import rpe_rules as rules
from .rpe_clients import core_busy, lerobot_caller, openpi_caller, run_fleet
from .rpe_ros import ros_caller
from .rpe_servers import ServerProcess

KEYS = ("robotserve_ros", "robotserve_openpi", "openpi_serial_openpi", "lerobot_lerobot", "robotserve_lerobot")
SERIAL = {"openpi_serial", "lerobot"}  # one request at a time: the simulator predicts them at max batch 1
LATEST_ONLY = ("LeRobot's RobotClient, latest_only (a chunk replaces the queue, one request per H - 1 - trigger "
               "ticks, its reply within trigger ticks); not modelled: RobotClient's observations sent while a "
               "chunk generates (LeRobot's server predicts the newest next; robotserve's answers it by that chunk)")


def add_arguments(p) -> None:
    p.add_argument("--out", default=scratch("robots_per_engine.json"),
                   help="report JSON (the record: reports/peers/robots_per_engine.json); FILE.meta.json beside it")
    p.add_argument("--servers", type=comma_list(KEYS), default=list(KEYS),
                   help="comma-separated <server>_<protocol> to run, of " + ", ".join(KEYS))
    p.add_argument("--curve", choices=sorted(rules.CURVES), default="gpu_like", help="the device: gpu_like (a sleep of the GPU-like curve) or smolvla_cpu (the real tiny "
                        "SmolVLA at one torch thread, its curve measured first)")
    p.add_argument("--seconds", type=positive(), default=6.0, help="measured time per run (after every robot started)")
    p.add_argument("--repeats", type=positive(int), default=3, help="interleaved repeats of every fleet size")
    p.add_argument("--max-robots", type=positive(int), default=64, help="largest fleet tried")
    p.add_argument("--horizon", type=positive(int), default=10, help="H: actions executed per chunk")
    p.add_argument("--control-hz", type=positive(), default=50.0, help="every robot's control rate, Hz")
    p.add_argument("--trigger", type=positive(int), default=5, help="actions left when a robot asks for the next chunk")
    p.add_argument("--per-process", type=positive(int), default=8, help="robots per client process")
    p.add_argument("--server-core", type=positive(int, zero_ok=True), default=0, help="the core every server process runs on")
    p.add_argument("--client-core", type=positive(int, zero_ok=True), default=1,
                   help="the core every robot (client) process runs on")
    p.add_argument("--latency-rounds", type=positive(int), default=100, help="calls of the one-robot added-latency run")
    p.add_argument("--seed", type=seed, default=0, help="the robots' start phases")
    p.add_argument("--lerobot-client", choices=("robotclient", "stubs"), default="robotclient",
                   help="the LeRobot rows' robots: LeRobot's own RobotClient (a fake robot, its own timing), or the "
                        "bench's robot loop making RobotClient's calls through LeRobot's stubs")
    p.add_argument("--robotclients-per-process", type=positive(int), default=2,
                   help="RobotClients per client process (each runs two threads of its own under one GIL)")


def _check(a) -> None:
    if a.trigger >= a.horizon:
        raise UsageError(f"--trigger {a.trigger} must be below --horizon {a.horizon}")
    cores = os.sched_getaffinity(0)
    for name, c in (("--server-core", a.server_core), ("--client-core", a.client_core)):
        if c not in cores:
            raise UsageError(f"{name} {c} is not a core this process may use ({sorted(cores)})")
    if a.server_core == a.client_core:
        raise UsageError("--server-core and --client-core must differ (clients on a core apart from the servers)")
    if a.curve == "smolvla_cpu" and not all(importlib.util.find_spec(m) for m in ("torch", "lerobot")):
        raise UsageError("--curve smolvla_cpu needs torch and lerobot installed (make ml)")


class Servers:
    """The servers under test, started once; LeRobot's own server one process per robot, its
    pool grown as the fleet grows."""

    def __init__(self, a, lock: str, policy_dir, key_file: str, points=None, model_dir: str = "") -> None:
        self.a, self.lock, self.policy_dir, self.procs = a, lock, policy_dir, {}
        self.points, self.model_dir = points, model_dir  # smolvla_cpu: its measured curve and the model
        self.curve_ms = rules.curve_fn(a.curve, points)
        self.key_file, self.api_key = key_file, Path(key_file).read_text().strip()
        for k in a.servers:
            if k != "lerobot_lerobot":
                self.procs[k] = [self._start(k)]
        self.procs.setdefault("lerobot_lerobot", [])

    def _start(self, k: str) -> ServerProcess:
        s, p = k.rsplit("_", 1)
        return ServerProcess(s, p, self.lock, self.a.curve, self.a.horizon, self.a.control_hz, self.a.server_core,
                             self.key_file, self.points, self.model_dir)

    def for_fleet(self, k: str, n: int) -> list:
        pool = self.procs[k]
        while k == "lerobot_lerobot" and len(pool) < n:
            pool.append(self._start(k))
        for s in pool:
            s.calls()  # drop what came before this run
        return pool

    def caller(self, k: str):
        pool, a = self.procs[k], self.a
        if k.endswith("_openpi"):  # every robot presents the API key (the serial reference ignores it)
            return lambda i, rng: openpi_caller(pool[0].port, rng, self.api_key)
        if k.endswith("_ros"):
            return lambda i, rng: ros_caller(i, rng, horizon=a.horizon, trigger=a.trigger, hz=a.control_hz)
        one = k == "lerobot_lerobot"
        return lambda i, rng: lerobot_caller(pool[i if one else 0].port, rng, str(self.policy_dir), a.horizon, a.control_hz)

    def worker(self, k: str):
        """The client processes' body for key k: LeRobot's RobotClients for the LeRobot rows
        (--lerobot-client robotclient), else the bench's robot loop (None)."""
        if not k.endswith("_lerobot") or self.a.lerobot_client != "robotclient":
            return None
        from .rpe_robotclient import robotclient_worker

        pool, one = self.procs[k], k == "lerobot_lerobot"
        return functools.partial(robotclient_worker, lambda i: pool[i if one else 0].port, str(self.policy_dir))

    def refused(self, k: str, n: int) -> dict:
        """Refusals so far of the servers a fleet of n uses, summed by reason."""
        out: dict = {}
        for srv in self.procs[k][:n]:
            for why, v in srv.refused().items():
                out[why] = out.get(why, 0) + v
        return out

    def close(self) -> None:
        for pool in self.procs.values():
            for s in pool:
                s.close()


def added_latency(servers: Servers, k: str, a) -> dict:
    """One robot alone, back-to-back calls: round trip minus the device time of each call."""
    import multiprocessing as mp

    pool = servers.for_fleet(k, 1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def go():
        os.sched_setaffinity(0, {a.client_core})
        logging.disable(logging.INFO)  # LeRobot's transport logs a line per observation sent
        call = servers.caller(k)(0, np.random.default_rng(0))
        for i in range(5):
            call(i)
        pool_calls_start.set()
        rts = []
        for i in range(a.latency_rounds):
            t = time.perf_counter()
            call(5 + i)
            rts.append((time.perf_counter() - t) * 1e3)
        q.put(rts)

    pool_calls_start = ctx.Event()
    p = ctx.Process(target=go, daemon=True)
    p.start()
    pool_calls_start.wait(120)
    pool[0].calls()  # the warm-up calls' device time
    rts = q.get(timeout=300)
    p.join(10)
    dev = [ms for _, ms in pool[0].calls()]
    if len(dev) == len(rts):  # one device call per round, in order
        added = [r - d for r, d in zip(rts, dev)]
    else:
        added = [r - statistics.median(dev) for r in rts] if dev else rts
    return {"p50": round(float(np.percentile(added, 50)), 3), "p95": round(float(np.percentile(added, 95)), 3),
            "rounds": len(rts), "rt_p50": round(float(np.percentile(rts, 50)), 3),
            "device_p50": round(statistics.median(dev), 3) if dev else None, "paired_per_call": len(dev) == len(rts)}


def one_run(servers: Servers, k: str, n: int, rep: int, a, b1_idle: dict) -> tuple:
    s, p = k.rsplit("_", 1)
    pool = servers.for_fleet(k, n)
    phases = rules.start_phases(n, a.horizon / a.control_hz, a.seed)
    make = servers.caller(k)
    ref0 = servers.refused(k, n)
    sb0 = core_busy(a.server_core)
    worker = servers.worker(k)
    got, busy, own = run_fleet(make, phases, per_process=a.robotclients_per_process if worker else a.per_process,
                               core=a.client_core, horizon=a.horizon, trigger=a.trigger, hz=a.control_hz,
                               window_s=a.seconds, worker=worker)
    sb1 = core_busy(a.server_core)
    ok = [r for r in got if "error" not in r]
    calls = [c for srv in pool[:n] for c in srv.calls()]
    refused = {why: v - ref0.get(why, 0) for why, v in servers.refused(k, n).items() if v > ref0.get(why, 0)}
    if n == 1 and ok:
        b1_idle[(k, rep)] = ok[0]["idle_s"] / ok[0]["task_s"]
    idle1 = b1_idle.get((k, rep), 0.0)
    row = rules.make_row(s, p, a.curve, n, rep, ok, idle1,
                         rules.round_trip_budget_s(a.horizon, a.trigger, a.control_hz, p == "lerobot"),
                         calls, busy, sum(refused.values()), curve_ms=servers.curve_ms)
    detail = {"key": k, "robots": n, "repeat": rep, "errors": sorted({r["error"] for r in got if "error" in r})[:3],
              "refused_by_reason": refused, "resends": sum(r.get("resends", 0) for r in got),
              "client_processes_cpu_share": own, "server_core_busy": round((sb1[0] - sb0[0]) / max(1, sb1[1] - sb0[1]), 3),
              "client_late_ms_mean": round(1e3 * statistics.fmean(r["late_s"] / max(1, len(r["rt_s"])) for r in ok), 2)
              if ok else None, "device_calls": len(calls), "batch1_idle_share": round(idle1, 4),
              "max_idle_share": round(max((r["idle_s"] / r["task_s"] for r in ok), default=float("nan")), 4),
              "load_avg_1m": round(os.getloadavg()[0], 2)}
    if ok and "short_s" in ok[0]:  # RobotClient: executed actions' shortfall (its loop's lateness with the idle)
        detail["max_action_shortfall_share"] = round(max(r["short_s"] / r["task_s"] for r in ok), 4)
    return row, detail


def grow(servers: Servers, a, sizes: list) -> tuple:
    rows, details, b1 = [], [], {}
    first_unfed = {k: {} for k in a.servers}  # key -> repeat -> first unfed size
    for n in sizes:
        live = [k for k in a.servers if len(first_unfed[k]) < a.repeats]
        if not live:
            break
        for rep in range(a.repeats):
            for k in live:
                row, d = one_run(servers, k, n, rep, a, b1)
                rows.append(row)
                details.append(d)
                if not (row["fed"] and row["valid"]):
                    first_unfed[k].setdefault(rep, n)
                print(f"{k:>22} n={n:3d} rep {rep}: {'fed' if row['fed'] else 'UNFED'}{'' if row['valid'] else ' INVALID'} "
                      f"idle {row['idle_fraction']} p95 {row['rt_p95_ms']} ms batch {row['mean_batch']} "
                      f"client core {row['client_core_busy']:.2f} server core {d['server_core_busy']:.2f}", flush=True)
    return rows, details


def build_report(a, rows: list, predicted: dict, latency: dict, smolvla: dict = None) -> dict:
    """smolvla: the smolvla_cpu device's engine block (rpe_smolvla.engine_block), its curve's points."""
    if smolvla:
        curve = rules.curve_fn(a.curve, {int(b): v for b, v in smolvla["curve_batch_ms"].items()})
        head = {"curve": a.curve, "batch_ms": {str(b): round(curve(b), 2) for b in (1, 2, 4, 8, 16, 32, 64)}, **smolvla}
    else:
        curve = rules.CURVES[a.curve]
        head = {"curve": a.curve, "formula": "L(b) = 28 ms x (1 + 0.08 (b - 1))",
                "batch_ms": {str(b): round(curve(b), 2) for b in (1, 2, 4, 8, 16, 32, 64)},
                "source": "batch 1: a published pi0.5 latency; the slope 0.08 is an assumption (the closed-loop fleet's)",
                "device": "one simulated device: sleeps L(b), releases the GIL; every server process's calls under one "
                          "file lock"}
    engine = {**head, "horizon": a.horizon, "control_hz": a.control_hz, "trigger_actions": a.trigger,
              "round_trip_budget_ms": round(1e3 * rules.leftover_s(a.horizon, a.trigger, a.control_hz), 1),
              "idle_slack": rules.IDLE_SLACK, "seconds_per_run": a.seconds, "repeats": a.repeats}
    cap = {}
    for k in a.servers:
        s, p = k.rsplit("_", 1)
        mine = [r for r in rows if r["server"] == s and r["protocol"] == p]
        if mine:
            cap[rules.key(s, p, a.curve)] = {**rules.capacity_of(mine), "predicted": predicted[k]["predicted"]}
    lat = {rules.key(*k.rsplit("_", 1), a.curve): v for k, v in latency.items()}
    rep = {"engine": engine, "rows": rows, "capacity": cap, "added_latency_ms": lat}
    rules.check_report(rep)
    return rep


def targets(rep: dict, curve: str) -> dict:
    """Issue 40's targets, read off the report (bench targets, not tests)."""
    cap, out = rep["capacity"], {}
    peers = [k for k in cap if not k.startswith("robotserve_")]
    for k in (k for k in cap if k.startswith("robotserve_")):
        ours = cap[k]
        out[k] = {"vs_" + p: rules.paired_ratio(ours, cap[p]) for p in peers}
        pred = ours["predicted"]
        out[k]["within_20pct_of_predicted"] = bool(pred) and abs(ours["measured"] - pred) <= 0.2 * pred
        out[k]["at_least_3x_every_peer"] = all((cap[p]["measured"] and ours["measured"] >= 3 * cap[p]["measured"])
                                               for p in peers) if peers else None
    for k, v in rep["added_latency_ms"].items():
        if k.startswith(("robotserve_openpi_", "robotserve_ros_")):  # the target: the openpi and ROS paths
            out.setdefault(k, {})["added_latency_p50_le_2ms_p95_le_5ms"] = v["p50"] <= 2.0 and v["p95"] <= 5.0
    out["no_invalid_row_under_capacities"] = all(c["valid_rows_only"] for c in cap.values())
    return out


def command(a) -> str:
    """The command line of this run, every option spelled out (defaults too): what reproduces it."""
    opts = [f"--out {a.out}", f"--servers {','.join(a.servers)}"] + [
        f"--{k.replace('_', '-')} {getattr(a, k)}" for k in ("curve", "seconds", "repeats", "max_robots", "horizon",
                                                             "control_hz", "trigger", "per_process", "server_core",
                                                             "client_core", "latency_rounds", "seed", "lerobot_client",
                                                             "robotclients_per_process")]
    return " ".join(["robotserve bench robots-per-engine", *opts])


def _ros_domain(a) -> dict:
    """The ROS rows' own domain (one nobody on this machine uses, DDS on loopback), set in this
    process's environment before any server or robot process starts, so they all inherit it;
    returns the environment to restore."""
    saved = dict(os.environ)
    if "robotserve_ros" in a.servers:
        from ..live.processes import pick_free_domain, ros_env

        os.environ.update(ros_env(pick_free_domain(), log_dir=os.path.join(tempfile.gettempdir(), "rpe_ros_log")))
    return saved


def cli(a) -> int:
    _check(a)
    out = Path(a.out)
    sizes = rules.fleet_sizes(a.max_robots)
    rounds = int(a.seconds * a.control_hz / a.horizon) + 1
    t0, load0 = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-rpe-") as tmp:
        smolvla, points, model_dir = None, None, ""
        if a.curve == "smolvla_cpu":  # the device's curve, measured on the server core before anything else
            from . import rpe_smolvla

            measured = rpe_smolvla.measure_curve(Path(tmp) / "smolvla", a.server_core, a.max_robots)
            smolvla, model_dir = rpe_smolvla.engine_block(measured), measured["policy_dir"]
            points = {int(b): v for b, v in smolvla["curve_batch_ms"].items()}
            print(f"smolvla_cpu device, ms per batch: {smolvla['curve_batch_ms']}", flush=True)
        # Fixed before the first run: the simulator's prediction on the same curve, sizes, phases, trigger.
        # RobotClient rows (protocol lerobot): LeRobot's latest_only robot, its own asking period and budget.
        predicted = {k: rules.predicted_capacity(
            sizes, curve=a.curve, horizon=a.horizon, trigger=a.trigger, control_hz=a.control_hz, rounds=rounds,
            phases_seed=a.seed, serial=k.rsplit("_", 1)[0] in SERIAL, latest_only=lo, points=points,
            budget_s=rules.round_trip_budget_s(a.horizon, a.trigger, a.control_hz, latest_only=lo))
            for k, lo in ((k, k.endswith("_lerobot")) for k in a.servers)}
        policy_dir = None
        if any(k.endswith("_lerobot") for k in a.servers):
            from ..engines.tiny_policies import make_policy_dir
            from .rpe_clients import CAMERA_HW

            policy_dir = make_policy_dir("act", Path(tmp) / "act", image_hw=CAMERA_HW, chunk_size=a.horizon,
                                         n_action_steps=a.horizon)
        key_file = Path(tmp) / "api.key"
        key_file.write_text(secrets.token_urlsafe(24) + "\n")
        key_file.chmod(0o600)
        saved_env = _ros_domain(a)
        servers = Servers(a, str(Path(tmp) / "device.lock"), policy_dir, str(key_file), points, model_dir)
        try:
            latency = {k: added_latency(servers, k, a) for k in a.servers}
            for k, v in latency.items():
                print(f"{k:>22} added latency p50 {v['p50']:.2f} ms p95 {v['p95']:.2f} ms", flush=True)
            rows, details = grow(servers, a, sizes)
            rss = {k: [s.rss_mb() for s in pool] for k, pool in servers.procs.items() if pool}
        finally:
            servers.close()
            os.environ.clear()
            os.environ.update(saved_env)
    rep = build_report(a, rows, predicted, latency, smolvla)
    meta = {"method": __doc__.split("\n\n")[1:], "command": command(a),
            "sizes": sizes, "predicted": predicted,
            "predicted_by": {k: "sim.Simulator.run_fleet on the same curve, sizes, start phases and trigger "
                                f"({'max batch 1 FIFO' if k.rsplit('_', 1)[0] in SERIAL else 'remaining'}), the same fed "
                                "rule; robots: " + (LATEST_ONLY if k.endswith("_lerobot") else "the bench's own (all H "
                                "actions of a chunk, the next asked with trigger left: one request per H ticks)")
                             for k in a.servers},
            "targets": targets(rep, a.curve), "runs": details, "server_rss_mb": rss,
            "not_built": ["the real SmolVLA batch curve measured on a GPU (issue 40 item 2: when one is lent)"],
            "lerobot_added_latency_client": "LeRobot's stubs making RobotClient's calls back to back (RobotClient "
                                            "itself sends on its own clock)",
            "cores": {"server": a.server_core, "client": a.client_core}, "load_avg_before": load0,
            "load_avg_after": os.getloadavg(), "elapsed_s": round(time.monotonic() - t0, 1), "machine": machine_info()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1) + "\n")
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    for k, c in rep["capacity"].items():
        print(f"{k}: capacity {c['reported']} (repeats {c['per_repeat']}), predicted {c['predicted']}, "
              f"first unfed {c['first_unfed']}")
    print(f"report: {out} (method and per-run detail: {out}.meta.json)")
    return 0
