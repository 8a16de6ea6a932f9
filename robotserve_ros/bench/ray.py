"""`robotserve bench ray`: the fleet scheduler over 1/2/4 replicas, through today's gRPC tiers
and through a Ray Serve pool, and the pool under chaos (issue 24).

The engine costs a fixed wall time per batch (50 ms for any batch up to 8, sleep-based: the
2 cores do not limit it, so the figure is the serving path's, not the model's). The Runner is
driven directly by simulated robots in-process, closed loop (a robot's next round is
submitted when its chunk arrives), enough of them to keep every replica's batches full;
no ROS. Measured side by side in one run:

- rounds/s, P50/P95 round latency (submit -> reply) for n = 1, 2, 4 replicas:
  (a) `grpc`: n `robotserve gpu-server` processes on 127.0.0.1, each a remote tier;
  (b) `ray`: one ray tier of n replicas on a local cluster of two worker nodes;
- overhead_ms_p50: the median engine call's wall time on the ray tier (1 replica) minus
  the same on a local tier, the engine's own 50 ms cancelled out;
- order: Kairos vs FIFO on the regime workload's task mix over the Ray pool (docs/fleet.md);
- chaos, 50 robots, 4 replicas over the two worker nodes: a replica killed; a worker node
  removed (its replicas move to the other). lost, duplicated, recovery_s (from the fault
  until every robot has been served again).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from ..cli_types import UsageError, positive
from ..core.clock import WallClock
from ..core.robot_loop import ReplayRobot
from ..core.profile import EngineProfile
from ..core.runner import Runner
from ..core.schedulers import make_scheduler
from ..core.serving import ServingCore, Tier
from ..core.types import ExecInfo, InferenceRequest
from ..engines import make_engine
from ..engines.simulated import SimulatedEngine

BATCH_MS = 50.0  # the fixed-cost engine: any batch up to 8 costs this, asleep
FIXED = EngineProfile({1: BATCH_MS, 8: BATCH_MS})
SIM_PARAMS = {"realtime": True, "chunk_size": 8, "action_dim": 2, "steps": 2}


class _Instant(Sequence):
    """A task of n rounds with nothing to execute (n = sys.maxsize: it runs until stopped)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):
        return 0


ROBOT_HZ = 30.0


class ClosedLoopFleet:
    """Robots in-process, each submitting its next round when the last one's chunk arrives
    (core/robot_loop.py's ReplayRobot of rounds with nothing to execute: closed loop).

    Every reply is counted per (robot, round): `duplicated` counts rounds answered more than
    once, `lost()` the rounds submitted and never answered (after the fleet stopped)."""

    def __init__(self, core: ServingCore, engines: dict, robots: int, *, prefix: str = "r",
                 kinds: Optional[list] = None, rounds_of: Optional[list] = None, **runner_kw) -> None:
        self.names = [f"{prefix}{i}" for i in range(robots)]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.kinds = kinds or [None] * robots
        self.rounds_of = rounds_of  # per robot: rounds its task has (None: it runs until stopped)
        self.robots = [ReplayRobot(n, _Instant(sys.maxsize if rounds_of is None else rounds_of[i]), ROBOT_HZ, 0,
                                   core.clock.now()) for i, n in enumerate(self.names)]
        self.answers: Counter = Counter()
        self.sent: dict = {}  # (robot, round) -> submit time
        self.latency_s: list = []
        self.last_served: dict = {}  # robot -> when its last chunk arrived
        self.finished: dict = {}  # robot -> when its task ended (rounds_of)
        self.running = False
        self.runner = Runner(core, engines, self._on_replies, lock=threading.RLock(), **runner_kw)

    def _submit(self, i: int, info: Optional[ExecInfo] = None) -> None:
        rb = self.robots[i]
        self.sent[(rb.task_id, rb.round)] = time.monotonic()
        left = None if self.rounds_of is None else rb.remaining()
        self.runner.submit(InferenceRequest(rb.task_id, rb.round, info, remaining_rounds=left, task_type=self.kinds[i]))

    def _on_replies(self, replies, dispatch, results) -> None:
        now = time.monotonic()
        for r in replies:
            key = (r.task_id, r.round_id)
            self.answers[key] += 1
            if self.answers[key] > 1:
                continue
            self.latency_s.append(now - self.sent[key])
            self.last_served[r.task_id] = now
            i = self.index[r.task_id]
            if not self.running:
                continue
            # Closed loop: the robot asks as its chunk arrives, nothing of it left to execute.
            what, _at, info = self.robots[i].answered(self.runner.core.clock.now())
            if what == "done":
                self.finished[r.task_id] = now
                continue
            self._submit(i, info)

    def start(self) -> "ClosedLoopFleet":
        self.running = True
        self.runner.start()
        for i in range(len(self.names)):
            self._submit(i)
        return self

    def stop(self, drain_s: float = 5.0) -> None:
        """No more rounds; wait up to drain_s for the ones in flight, then stop the runner."""
        with self.runner.lock:
            self.running = False
        end = time.monotonic() + drain_s
        while time.monotonic() < end and self.lost():
            time.sleep(0.05)
        self.runner.close()

    def served(self) -> int:
        return sum(1 for n in self.answers.values() if n)

    def duplicated(self) -> int:
        return sum(n - 1 for n in self.answers.values() if n > 1)

    def lost(self) -> int:
        return sum(1 for k in self.sent if not self.answers[k])

    def all_served_since(self, t: float) -> bool:
        return all(self.last_served.get(n, -1.0) >= t or n in self.finished for n in self.names)


class _Timed:
    """An engine whose calls' wall times are kept (the per-round overhead of a tier)."""

    def __init__(self, engine) -> None:
        self.engine, self.profile, self.wall_s = engine, engine.profile, []

    def infer(self, batch):
        t = time.perf_counter()
        out = self.engine.infer(batch)
        self.wall_s.append(time.perf_counter() - t)
        return out


def _pct(xs, q) -> Optional[float]:
    return round(float(np.percentile(xs, q)) * 1e3, 2) if xs else None


def measure(engines: dict, slots: dict, robots: int, seconds: float, scheduler: str = "fifo",
            warmup_s: float = 1.0, attach=()) -> dict:
    """Closed-loop robots on tiers `engines` (name -> engine, `slots` each) for `seconds`
    after a warm-up: rounds/s and round latency (submit -> reply) of the rounds sent meanwhile."""
    tiers = [Tier(n, e.profile, slots=slots[n]) for n, e in engines.items()]
    fleet = ClosedLoopFleet(ServingCore(make_scheduler(scheduler), tiers, WallClock()), engines, robots,
                            retry_pause_s=0.05, max_attempts=20)
    fleet.runner.start()
    for name in attach:
        engines[name].engine.attach(fleet.runner, name)
    fleet.start()
    time.sleep(warmup_s)
    n0, t0, k0 = fleet.served(), time.monotonic(), len(fleet.latency_s)
    time.sleep(seconds)
    n1, t1, lat = fleet.served(), time.monotonic(), list(fleet.latency_s[k0:])
    fleet.stop()
    dispatch = list(fleet.runner.dispatch_s)
    return {"rounds_per_s": round((n1 - n0) / (t1 - t0), 1), "p50_ms": _pct(lat, 50), "p95_ms": _pct(lat, 95),
            "lost": fleet.lost(), "duplicated": fleet.duplicated(), "robots": robots,
            "dispatch_ms_p50": _pct(dispatch, 50)}


class GpuServers:
    """n `robotserve gpu-server` processes on 127.0.0.1 hosting the fixed-cost engine."""

    def __init__(self, n: int, folder: Path) -> None:
        self.procs, self.addresses = [], []
        folder = Path(tempfile.mkdtemp(prefix="gpu-servers-", dir=folder))  # no ready file of an earlier run
        for i in range(n):
            ready = folder / f"gpu{i}.addr"
            cmd = [sys.executable, "-m", "robotserve_ros.cli", "gpu-server", "--address", "127.0.0.1:0",
                   "--engine", "simulated", "--engine-params", json.dumps(SIM_PARAMS), "--batch-sizes", "1", "8",
                   "--latency-ms", str(BATCH_MS), str(BATCH_MS), "--ready-file", str(ready)]
            self.procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), ready))
        for p, ready in self.procs:
            end = time.monotonic() + 60
            while not ready.exists() and p.poll() is None and time.monotonic() < end:
                time.sleep(0.1)
            if not ready.exists():
                self.close()
                raise RuntimeError(f"a gpu-server did not start: {p.stderr.read().decode()[-500:] if p.poll() is not None else 'timeout'}")
            self.addresses.append(ready.read_text().strip())

    def close(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.terminate()
        for p, _ in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


class BenchCluster:
    """A Ray cluster of this run's own on 127.0.0.1: a head and two worker nodes with the
    custom resource `pool` (replicas go there); its temp folder under `folder`.
    RAY_AUTH_MODE=disabled: token auth would write ~/.ray/auth_token, outside the run's
    folder, and the cluster is reachable on loopback only."""

    def __init__(self, folder: Path) -> None:
        import ray
        from ray import serve
        from ray.cluster_utils import Cluster

        from ..transport.ray_pool import LOOPBACK, use_loopback

        (folder / "ray").mkdir(parents=True, exist_ok=True)
        os.environ.update(RAY_TMPDIR=str(folder), RAY_AUTH_MODE="disabled")
        use_loopback()
        node = {"node_ip_address": LOOPBACK, "num_cpus": 1}
        self.cluster = Cluster(initialize_head=True, head_node_args={**node, "temp_dir": str(folder / "ray"),
                                                                     "include_dashboard": False})
        self.workers = [self.cluster.add_node(**node, resources={"pool": 8}) for _ in range(2)]
        ray.init(address=self.cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False)
        serve.start(proxy_location="Disabled")

    def pool(self, n: int, app: str, profile: EngineProfile = FIXED):
        from ..transport.ray_pool import RayPoolEngine, wait_running

        eng = RayPoolEngine(profile, make=make_engine, engine="simulated", engine_params=SIM_PARAMS, replicas=n,
                            resources={"pool": 1}, app=app)
        if not wait_running(eng.pool, n, 60):
            eng.close()
            raise RuntimeError(f"{n} replicas did not start within 60 s")
        return eng

    def close(self) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            self.cluster.shutdown()


def chaos(bc: BenchCluster, scenario: str, robots: int = 50, replicas: int = 4, timeout_s: float = 60.0) -> dict:
    """A fault while `robots` are served by `replicas` over the two worker nodes:
    `replica_killed` (ray.kill of one replica) or `node_removed` (a worker node and its
    replicas gone; Serve starts them on the other). recovery_s: from the fault until every
    robot has been served again."""
    import ray

    eng = bc.pool(replicas, f"chaos-{scenario}")
    fleet = ClosedLoopFleet(ServingCore(make_scheduler("fifo"), [Tier("pool", eng.profile, slots=eng.slots)],
                                        WallClock()), {"pool": eng}, robots, retry_pause_s=0.05, max_attempts=50)
    fleet.runner.start()
    eng.attach(fleet.runner, "pool")
    fleet.start()
    try:
        time.sleep(3.0)
        nodes = {w.node_id for w in bc.workers}
        spread = len({eng.pool.where()["node_id"] for _ in range(8)} & nodes)
        t_fault = time.monotonic()
        if scenario == "replica_killed":
            ray.kill(eng.pool.replica_actors()[0], no_restart=True)
        else:
            bc.cluster.remove_node(bc.workers.pop())
        recovered = None
        while time.monotonic() - t_fault < timeout_s:
            if fleet.all_served_since(t_fault + 1e-3):
                recovered = time.monotonic() - t_fault
                break
            time.sleep(0.01)
        # Serve notices the death after its health check: first the drop, then the replacement.
        dropped = None
        while time.monotonic() - t_fault < 10.0:
            if eng.pool.running() < replicas:
                dropped = time.monotonic() - t_fault
                break
            time.sleep(0.05)
        while eng.pool.running() < replicas and time.monotonic() - t_fault < timeout_s:
            time.sleep(0.2)
        back = time.monotonic() - t_fault
        time.sleep(1.0)
    finally:
        fleet.stop(drain_s=10.0)
        eng.close()
    return {"scenario": scenario, "lost": fleet.lost(), "duplicated": fleet.duplicated(),
            "recovery_s": None if recovered is None else round(recovered, 2), "robots": robots, "replicas": replicas,
            "replica_count_dropped_s": None if dropped is None else round(dropped, 2),
            "replicas_back_s": round(back, 2), "failed_batches": int(fleet.runner.failures["pool"]),
            "failed_calls": eng.failures,
            "worker_nodes_used_before": spread, "rounds_served": fleet.served()}


def order(bc: BenchCluster, seconds: float) -> dict:
    """The fleet scheduler still orders the pool's work: mixed task lengths (short 3-round and
    long 12-round tasks, as the regime workloads mix LIBERO types), more robots than the
    pool serves at once; mean task time per scheduler."""
    eng = bc.pool(2, "order")
    out = {}
    try:
        for sched in ("fifo", "kairos", "remaining"):
            robots = 48
            rounds = [3 if i % 2 else 12 for i in range(robots)]
            kinds = ["short" if r == 3 else "long" for r in rounds]
            fleet = ClosedLoopFleet(ServingCore(make_scheduler(sched), [Tier("pool", eng.profile, slots=2)], WallClock()),
                                    {"pool": eng}, robots, kinds=kinds, rounds_of=rounds, retry_pause_s=0.05)
            t0 = time.monotonic()
            fleet.start()
            end = t0 + seconds
            while len(fleet.finished) < robots and time.monotonic() < end:
                time.sleep(0.02)
            fleet.stop()
            times = [fleet.finished[n] - t0 for n in fleet.names if n in fleet.finished]
            short = [fleet.finished[n] - t0 for n, k in zip(fleet.names, kinds) if k == "short" and n in fleet.finished]
            out[sched] = {"mean_task_s": round(float(np.mean(times)), 3) if times else None,
                          "short_task_s": round(float(np.mean(short)), 3) if short else None,
                          "finished": len(times), "tasks": robots, "lost": fleet.lost(), "duplicated": fleet.duplicated()}
    finally:
        eng.close()
    return out


def run_ray(out: Path, seconds: float = 5.0, counts=(1, 2, 4)) -> dict:
    from ..machine import machine_info

    started = time.time()
    load_before = os.getloadavg()
    rows, res = [], {}
    with tempfile.TemporaryDirectory(prefix="robotserve-bench-ray-") as tmp:
        folder = Path(tmp)
        for n in counts:  # (a) today's gRPC tiers: n gpu-server processes, n remote tiers
            from ..transport.remote_engine import RemoteEngine

            servers = GpuServers(n, folder)
            engines = {}
            try:
                engines = {f"g{i}": RemoteEngine(address=a, deadline_s=5.0, ping_interval_s=1.0)
                           for i, a in enumerate(servers.addresses)}
                r = measure(engines, {k: 1 for k in engines}, robots=16 * n, seconds=seconds)
            finally:
                for e in engines.values():
                    e.close()
                servers.close()
            rows.append({"tier": "grpc", "n": n, **r})
        local = _Timed(SimulatedEngine(FIXED, **SIM_PARAMS))
        base = measure({"local": local}, {"local": 1}, robots=16, seconds=seconds)
        bc = BenchCluster(folder)
        try:
            for n in counts:  # (b) the Ray pool: one tier, a slot per replica
                eng = _Timed(bc.pool(n, f"bench{n}"))
                try:
                    r = measure({"pool": eng}, {"pool": n}, robots=16 * n, seconds=seconds, attach=("pool",))
                finally:
                    eng.engine.close()
                rows.append({"tier": "ray", "n": n, **r})
                if n == 1:
                    ray_wall = list(eng.wall_s)
            res["order"] = order(bc, seconds=30.0)
            res["chaos"] = [chaos(bc, "replica_killed"), chaos(bc, "node_removed")]
        finally:
            bc.close()
    overhead = (np.median(ray_wall) - np.median(local.wall_s)) * 1e3
    by = {(r["tier"], r["n"]): r["rounds_per_s"] for r in rows}
    scaling = {t: {f"x{n}": round(by[(t, n)] / by[(t, 1)], 2) for n in counts[1:]} for t in ("grpc", "ray")}
    res = {"replicas": rows, "overhead_ms_p50": round(float(overhead), 2), "chaos": res["chaos"],
           "local": {"tier": "local", "n": 1, **base}, "scaling": scaling, "order": res["order"],
           "engine": f"fixed cost: {BATCH_MS:g} ms per batch of 1..8, time.sleep (simulated engine, realtime)",
           "targets": targets(scaling, overhead, res["chaos"]),
           "machine": machine_info(), "load_avg_before": [round(x, 2) for x in load_before],
           "load_avg_after": [round(x, 2) for x in os.getloadavg()], "seconds_per_point": seconds,
           "wall_s": round(time.time() - started, 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


def targets(scaling: dict, overhead_ms: float, chaos_rows: list) -> dict:
    """Issue 24's targets, each met or missed."""
    s = scaling["ray"]
    return {
        "ray_x2_ge_1.8": bool(s.get("x2", 0) >= 1.8), "ray_x4_ge_3.4": bool(s.get("x4", 0) >= 3.4),
        "overhead_le_5ms": bool(overhead_ms <= 5.0),
        "chaos_0_lost_0_dup_within_10s": all(c["lost"] == 0 and c["duplicated"] == 0 and c["recovery_s"] is not None
                                             and c["recovery_s"] <= 10.0 for c in chaos_rows),
    }


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="report JSON (reports/ray/ray.json is the report of record)")
    p.add_argument("--seconds", type=positive(), default=5.0, help="measured seconds per point (after 1 s warm-up)")


def cli(a) -> int:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError("robotserve bench ray: ray is not installed (pip install '.[ray]')") from None
    res = run_ray(Path(a.out), seconds=a.seconds)
    for r in res["replicas"]:
        print(f"{r['tier']:5s} n={r['n']}  {r['rounds_per_s']:7.1f} rounds/s  p50 {r['p50_ms']} ms  p95 {r['p95_ms']} ms")
    print(f"overhead (ray vs local, median engine call): {res['overhead_ms_p50']} ms; scaling {res['scaling']}")
    for c in res["chaos"]:
        print(f"chaos {c['scenario']}: lost {c['lost']}, duplicated {c['duplicated']}, recovery {c['recovery_s']} s")
    print(f"targets: {res['targets']}\nwrote {a.out}")
    return 0
