"""`robotserve bench hybrid`: edge-only vs cloud-only vs hybrid placement, seed 000 Figure 13
in small, over a real (shaped) link.

Setting (§5.1, §5.3): the edge tier is a profile-driven engine in this process with the
CPU-measured diffusion profile (the profile of record diffusion_arm); the cloud tier is
ONE `robotserve gpu-server` engine instance (one batch of up to its saturation batch in
flight, its round trip included) in another network namespace with a CLOUD_SPEEDUP x faster
profile, behind a veth pair shaped by tbf (1 Gbit/s) and a delaying TCP relay adding the
WAN's base latency (100 ms round trip: 50 ms each way). Both engines sleep their profile's
latency (realtime), so the GPUs are simulated but time, bytes, gRPC and the link are real.
Robots are the simulator's tasks (built-in workload, static horizons, every task whole) run
on the wall clock with asynchronous inference (sim/robot.py): the trigger point is
ceil(batch-1 EDGE latency x control rate) whatever the placement (the robot does not know
where it is served, so a cloud round pays the WAN each time). Tasks arrive as a Poisson
process; the scheduler is Kairos. Modes: edge_only (edge tier), cloud_only (cloud tier),
hybrid (both, placement shortest_delay: Algorithm 1 phase 3, round trip and bandwidth
measured as it runs). The three modes of one rate run side by side (one process each, each
cloud mode with its own server), so they see the same machine load.

Also measured: gRPC overhead on loopback for a batch of eight 224x224x3 observations
(median round trip beside the raw payload copy), and a cloud server SIGKILLed mid-run in
hybrid mode (every round answered once: lost and duplicated rounds counted).

Helper process (started by the benchmark inside the edge namespace):
    python -m robotserve_ros.bench.hybrid drive --cloud HOST:PORT --token-file F --out F ...
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
from .hybrid_report import MODES, WORKLOAD, summarize, write_markdown

# Seed 000 §5.1: RTX A6000 edge, A100 80GB cloud. Public specs: dense FP16 tensor 312 vs
# ~155 TFLOPS (2.0x), memory bandwidth ~1.9-2.0 TB/s vs 768 GB/s (2.5x), FP32 19.5 vs 38.7
# TFLOPS (0.5x); small-batch diffusion inference is part launch/memory bound, so we assume
# 1.75x (inside the 1.5-2x measured inference gaps), not the tensor-core peak.
CLOUD_SPEEDUP = 1.75


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli_types import seed

    p.add_argument("--out", required=True, help="result JSON (a Markdown summary is written beside it)")
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0, 6.0], help="task arrivals per second")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of Poisson arrivals per run (tasks run whole)")
    p.add_argument("--wan-rtt-ms", type=float, default=100.0, help="round-trip time of the shaped link to the cloud tier, ms")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="bandwidth of the shaped link, Mbit/s")
    p.add_argument("--image", type=int, default=96, help="side of each request's rgb8 observation")
    p.add_argument("--seed", type=seed, default=0)


# --------------------------------------------------------------------------------------
# Profiles and tasks
# --------------------------------------------------------------------------------------
def profiles():
    from ..profiles import batch_latency_ms

    edge = batch_latency_ms("diffusion_arm")
    return edge, {b: ms / CLOUD_SPEEDUP for b, ms in edge.items()}


def draw_tasks(rate: float, duration: float, seed: int):
    from ..sim.workloads import builtin_workload

    wl = builtin_workload(WORKLOAD, seed)
    rng = np.random.default_rng([seed, int(rate * 1000)])
    t, out = 0.0, []
    while True:
        t += rng.exponential(1.0 / rate)
        if t > duration:
            return out
        spec = wl.tasks[int(rng.integers(len(wl.tasks)))]
        out.append((t, f"{spec.id}#{len(out)}", spec.rounds["static"], spec.control_hz))


# --------------------------------------------------------------------------------------
# A fleet of simulated robots on the wall clock, driving a ServingCore through the core's Runner
# --------------------------------------------------------------------------------------
class LiveFleet:
    def __init__(self, core, lock, tasks, l1_s: float, image: int, seed: int) -> None:
        from ..core.observation import Observation

        self.core, self.lock, self.tasks = core, lock, tasks
        self.l1 = l1_s
        img = np.random.default_rng(seed).integers(0, 255, (image, image, 3), dtype=np.uint8)
        self.obs = Observation(images=[img], joints=np.zeros(6, np.float32))
        self.cv = threading.Condition()
        self.events: list = []
        self._seq = itertools.count()
        self.robots: dict = {}
        self.latency: dict = {}
        self.answers: Counter = Counter()
        self.requested: set = set()
        self.tiers: Counter = Counter()
        self.runner = None

    def push(self, t: float, kind: str, data) -> None:
        with self.cv:
            heapq.heappush(self.events, (t, next(self._seq), kind, data))
            self.cv.notify()

    def on_replies(self, replies, _dispatch=None, _results=None) -> None:  # under the core lock, from a tier slot thread
        now = time.monotonic()
        for r in replies:
            self.answers[(r.task_id, r.round_id)] += 1
            self.tiers[r.tier] += 1
            self.push(now, "chunk", r)

    def _submit(self, tid: str, info) -> None:
        from ..core.types import HorizonChoice, InferenceRequest

        rb = self.robots[tid]
        req = InferenceRequest(tid, rb.round, info, HorizonChoice("static", float(rb.horizon())), observation=self.obs)
        self.runner.submit(req)
        self.requested.add((tid, rb.round))

    def run(self, timeout_s: float) -> None:
        """Robots on core/robot_loop.py's ReplayRobot: each round's chunk, next request and end in
        closed form, as events on the wall clock."""
        from ..core.robot_loop import ReplayRobot

        t0 = time.monotonic() + 0.2
        for at, tid, rounds, hz in self.tasks:
            self.push(t0 + at, "arrive", (tid, rounds, hz))
        end = t0 + timeout_s
        while len(self.latency) < len(self.tasks) and time.monotonic() < end:
            with self.cv:
                while not self.events or self.events[0][0] > time.monotonic():
                    wait = self.events[0][0] - time.monotonic() if self.events else 0.05
                    self.cv.wait(min(max(wait, 0.0), 0.05))
                    if time.monotonic() >= end:
                        return
                _, _, kind, data = heapq.heappop(self.events)
            now = time.monotonic()
            if kind == "arrive":
                tid, rounds, hz = data
                # The trigger point is the EDGE's batch-1 latency whatever the placement (module docstring).
                self.robots[tid] = ReplayRobot.for_latency(tid, rounds, hz, self.l1, now)
                self._submit(tid, None)
            elif kind == "chunk":
                what, at, info = self.robots[data.task_id].answered(now)
                self.push(at, what, (data.task_id, info))
            elif kind == "request":
                self._submit(*data)
            else:
                tid, info = data
                with self.lock:
                    self.core.finish_task(tid, info)
                    self.core.cancel(tid)
                self.latency[tid] = now - self.robots[tid].arrival


def run_mode(mode: str, rate: float, a, edge_profile, remote, kill=None) -> dict:
    from ..core.clock import WallClock
    from ..core.placement import ShortestDelay
    from ..core.profile import EngineProfile
    from ..core.schedulers import make_scheduler
    from ..core.serving import ServingCore, Tier
    from ..engines.simulated import SimulatedEngine
    from ..core.runner import Runner

    tasks = draw_tasks(rate, a.duration, a.seed)
    chunk = max(max(t[2]) for t in tasks)
    prof = EngineProfile(edge_profile)
    edge = SimulatedEngine(prof, chunk_size=chunk, realtime=True)
    engines, tiers, placement = {}, [], None
    if mode in ("edge_only", "hybrid"):
        tiers.append(Tier("edge", prof))
        engines["edge"] = edge
    if mode in ("cloud_only", "hybrid"):
        tiers.append(Tier("cloud", remote.profile))
        engines["cloud"] = remote
    if mode == "hybrid":
        placement = ShortestDelay({"cloud": remote.link}, [tiers[0]])
    core = ServingCore(make_scheduler("kairos"), tiers, WallClock(), placement=placement)
    lock = threading.Lock()
    fleet = LiveFleet(core, lock, tasks, prof.latency_s(1), a.image, a.seed)
    runner = fleet.runner = Runner(core, engines, fleet.on_replies, lock=lock, retry_pause_s=0.2).start()
    killer, killed = None, {}
    if kill is not None:
        killer = threading.Thread(target=_kill_when_busy, args=(kill, core, lock, killed), daemon=True)
        killer.start()
    t = time.monotonic()
    try:
        fleet.run(timeout_s=a.duration + 150.0)
    finally:
        runner.close()
        if killer is not None:
            killer.join(timeout=1.0)
    from ..core.robot_loop import alone_latency

    lat = np.array(list(fleet.latency.values())) if fleet.latency else np.array([np.nan])
    # Contention-free latency of the same tasks (every round served at once at edge batch 1):
    # the run's slowdown over it says how overloaded the mode was.
    alone = float(np.mean([alone_latency(r, hz, prof.latency_s(1)) for _, _, r, hz in tasks]))
    dup = sum(1 for v in fleet.answers.values() if v > 1)
    lost = sum(1 for key in fleet.requested if fleet.answers[key] == 0)
    return {
        "mode": mode, "rate": rate, "tasks": len(tasks), "finished": len(fleet.latency),
        "avg_latency_s": float(lat.mean()), "alone_avg_s": alone, "slowdown": float(lat.mean()) / alone,
        "rounds_total": int(sum(len(r) for _, _, r, _ in tasks)), "p25_latency_s": float(np.percentile(lat, 25)),
        "p50_latency_s": float(np.percentile(lat, 50)), "p95_latency_s": float(np.percentile(lat, 95)),
        "rounds_requested": len(fleet.requested), "rounds_answered": sum(1 for v in fleet.answers.values() if v),
        "rounds_lost": lost, "rounds_duplicated": dup, "late_replies_discarded": runner.late_replies,
        "requeued": core.stats.requeued, "tier_failures": dict(runner.failures),
        "served_by_tier": {k: int(v) for k, v in fleet.tiers.items()},
        "mean_batch": core.stats.dispatched / max(1, core.stats.batches),
        "link": remote.link.as_dict() if "cloud" in engines else None,
        "wall_s": time.monotonic() - t, "loadavg_end": list(os.getloadavg()), "killed": killed or None,
    }


def _kill_when_busy(kill, core, lock, killed: dict) -> None:
    """SIGKILL the cloud server after kill[1] s, at a moment the cloud tier has a batch in
    flight and the edge is busy too (several batches in flight); give up waiting after 15 s."""
    pid, after = kill
    time.sleep(after)
    end = time.monotonic() + 15.0
    while True:
        with lock:
            by_tier = {}
            for d in core.inflight.values():
                by_tier.setdefault(d.tier, []).append(len(d.requests))
            ready = "cloud" in by_tier and "edge" in by_tier and core.pending
            if ready or time.monotonic() > end:
                os.kill(pid, signal.SIGKILL)
                killed.update(at_s=after + 15.0 - (end - time.monotonic()), inflight_batches=by_tier,
                              inflight_requests=sum(map(sum, by_tier.values())), pending=len(core.pending),
                              both_tiers_busy=bool(ready))
                return
        time.sleep(0.002)


def drive(argv=None) -> int:
    """Inside the edge namespace: relay to the cloud server, then every mode x rate."""
    from ..net.relay import DelayRelay
    from ..transport.remote_engine import RemoteEngine

    p = argparse.ArgumentParser(prog="bench.hybrid drive")
    add_arguments(p)
    p.add_argument("--cloud", help="HOST:PORT of the cloud gpu-server (cloud modes)")
    p.add_argument("--token-file")
    p.add_argument("--modes", nargs="+", default=list(MODES))
    p.add_argument("--kill-pid", type=int)
    p.add_argument("--kill-after", type=float, default=4.0)
    a = p.parse_args(argv)
    edge_profile, _ = profiles()
    out = {"runs": []}

    def runs(remote):
        for rate in a.rates:
            for mode in a.modes:
                kill = (a.kill_pid, a.kill_after) if a.kill_pid else None
                r = run_mode(mode, rate, a, edge_profile, remote, kill)
                print(json.dumps({k: r[k] for k in ("mode", "rate", "finished", "avg_latency_s", "served_by_tier")}), flush=True)
                out["runs"].append(r)

    if not a.cloud:
        runs(None)
    else:
        with DelayRelay("127.0.0.1:0", a.cloud, a.wan_rtt_ms / 2000.0) as relay:
            remote = RemoteEngine(address=relay.address, token_file=a.token_file, deadline_s=2.0, ping_interval_s=0.5,
                                  connect_timeout_s=10.0)
            try:
                out["ping_rtt_s"] = [remote.ping() for _ in range(5)]
                runs(remote)
            finally:
                remote.close()
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


# --------------------------------------------------------------------------------------
# gRPC overhead on loopback
# --------------------------------------------------------------------------------------
def grpc_overhead(rounds: int = 60) -> dict:
    from ..core.observation import Observation
    from ..core.profile import EngineProfile
    from ..core.types import InferenceRequest
    from ..engines.simulated import SimulatedEngine
    from ..transport.gpu_server import GpuServer
    from ..transport.remote_engine import RemoteEngine

    rng = np.random.default_rng(0)
    batch = [InferenceRequest(f"r{i}", 0, observation=Observation(images=[rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)],
                                                                  joints=np.zeros(6, np.float32))) for i in range(8)]
    # No sleeping (transport only), and a flat profile so the server runs the 8 as one batch.
    eng = SimulatedEngine(EngineProfile({1: 0.001, 8: 0.001}), chunk_size=50)
    with GpuServer(eng, "127.0.0.1:0", token="t") as srv:
        remote = RemoteEngine(address=srv.address, token="t", ping_interval_s=0)
        try:
            rt = []
            for i in range(rounds + 10):
                t = time.perf_counter()
                remote.infer(batch)
                if i >= 10:
                    rt.append(time.perf_counter() - t)
        finally:
            remote.close()
    imgs = [r.observation.images[0] for r in batch]
    copies = []
    for _ in range(rounds):
        t = time.perf_counter()
        _ = [im.copy() for im in imgs]
        copies.append(time.perf_counter() - t)
    nbytes = sum(im.nbytes for im in imgs)
    return {"batch": 8, "image": [224, 224, 3], "payload_bytes": int(nbytes), "rounds": rounds,
            "grpc_round_trip_median_s": float(np.median(rt)), "grpc_round_trip_p95_s": float(np.percentile(rt, 95)),
            "raw_copy_median_s": float(np.median(copies)),
            "ratio": float(np.median(rt) / np.median(copies))}


# --------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------
def _start_server(link, port: int, cloud_profile: dict, token_file: str, tmp: Path, tag: str):
    ready = tmp / f"ready-{tag}"
    argv = [sys.executable, "-m", "robotserve_ros.transport.gpu_server_cli", "--address", f"{link.addr_b}:{port}",
            "--engine", "simulated", "--engine-params", json.dumps({"realtime": True, "chunk_size": 50}),
            "--batch-sizes", *map(str, cloud_profile), "--latency-ms", *map(str, cloud_profile.values()),
            "--token-file", token_file, "--ready-file", str(ready)]
    log = open(tmp / f"server-{tag}.log", "w")
    proc = link.popen("b", argv, stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"gpu-server did not start: {(tmp / f'server-{tag}.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def _drive(link, jobs: dict, tmp: Path) -> dict:
    """Run one driver per job (tag -> args) at once in the edge namespace; their results."""
    procs = {}
    for tag, args in jobs.items():
        out = tmp / f"drive-{tag}.json"
        log = open(tmp / f"drive-{tag}.log", "w")
        argv = [sys.executable, "-m", "robotserve_ros.bench.hybrid", "drive", *args, "--out", str(out)]
        procs[tag] = (link.popen("a", argv, stdout=log, stderr=subprocess.STDOUT), out, log)
    res = {}
    for tag, (proc, out, log) in procs.items():
        rc = proc.wait(600)
        log.close()
        text = (tmp / f"drive-{tag}.log").read_text()
        if rc != 0:
            raise RuntimeError(f"driver {tag} failed ({rc}): {text[-3000:]}")
        print(text, end="", flush=True)
        res[tag] = json.loads(out.read_text())
    return res


def run_bench(a) -> dict:
    from ..machine import machine_info
    from ..net.netns import NetnsLink, netns_available

    why = netns_available()
    if why:
        raise SystemExit(f"robotserve bench hybrid: network namespaces unavailable: {why}")
    edge_profile, cloud_profile = profiles()
    res = {"setting": {"workload": WORKLOAD, "rounds_per_task": "whole task", "edge_profile_ms": edge_profile,
                       "cloud_profile_ms": cloud_profile, "cloud_speedup": CLOUD_SPEEDUP, "cloud_instances": 1,
                       "wan_rtt_ms": a.wan_rtt_ms, "link_rate_mbit": a.rate_mbit, "image": [a.image, a.image, 3],
                       "rates": a.rates, "duration_s": a.duration, "scheduler": "kairos",
                       "hybrid_placement": "shortest_delay", "trigger": "ceil(edge batch-1 latency x control_hz)"},
           "machine": machine_info(), "loadavg_start": list(os.getloadavg())}
    print("gRPC overhead on loopback ...", flush=True)
    res["grpc_overhead"] = grpc_overhead()
    common = ["--duration", str(a.duration), "--wan-rtt-ms", str(a.wan_rtt_ms), "--image", str(a.image),
              "--seed", str(a.seed)]
    with tempfile.TemporaryDirectory(prefix="rs-hybrid-") as d, NetnsLink(rate_mbit=a.rate_mbit) as link:
        tmp = Path(d)
        token = tmp / "token"
        token.write_text(os.urandom(16).hex())
        token.chmod(0o600)
        cloud = ["--token-file", str(token), "--cloud"]
        # One server (one engine instance) per cloud mode, so the side-by-side modes share no GPU.
        servers = {m: _start_server(link, port, cloud_profile, str(token), tmp, m)
                   for m, port in (("cloud_only", 50051), ("hybrid", 50052))}
        res["runs"], res["ping_rtt_s"] = [], []
        for rate in a.rates:
            jobs = {m: common + ["--rates", str(rate), "--modes", m]
                    + (cloud + [f"{link.addr_b}:{50051 if m == 'cloud_only' else 50052}"] if m != "edge_only" else [])
                    for m in MODES}
            data = _drive(link, jobs, tmp)
            for m in MODES:
                res["runs"] += data[m]["runs"]
                res["ping_rtt_s"] += data[m].get("ping_rtt_s", [])
        for srv in servers.values():
            srv.terminate()
            srv.wait(10)
        # The cloud server SIGKILLed mid-run (hybrid, the middle rate) while batches are in
        # flight on both tiers: every round must be answered once, none lost or doubled.
        srv = _start_server(link, 50053, cloud_profile, str(token), tmp, "kill")
        mid = sorted(a.rates)[len(a.rates) // 2]
        kargs = common + ["--rates", str(mid), "--modes", "hybrid", "--kill-pid", str(_child_pid(srv)),
                          "--kill-after", str(a.duration / 2)] + cloud + [f"{link.addr_b}:50053"]
        data = _drive(link, {"kill": kargs}, tmp)
        res["server_killed"] = data["kill"]["runs"][0]
        res["server_killed"]["server_exit"] = srv.wait(10)
    res["loadavg_end"] = list(os.getloadavg())
    res["summary"] = summarize(res)
    return res


def _child_pid(proc) -> int:
    """`ip netns exec` execs the command, so the Popen pid is the server's own."""
    return proc.pid


def cli(a) -> int:
    t = time.monotonic()
    res = run_bench(a)
    res["bench_wall_s"] = time.monotonic() - t
    res["args"] = {k: v for k, v in vars(a).items() if not callable(v)}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    write_markdown(res, out.with_suffix(".md"))
    print(json.dumps(res["summary"], indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        raise SystemExit(drive(sys.argv[2:]))
    raise SystemExit("usage: python -m robotserve_ros.bench.hybrid drive ...")
