"""`robotserve bench openpi`: unchanged openpi clients against (a) a reference server that
serves one request at a time, as openpi's own WebsocketPolicyServer does (written here,
minimal, labelled "reference"), and (b) robotserve's openpi endpoint, same policy, same
engine code, same machine, in one run.

Each robot is openpi's own `WebsocketClientPolicy` wrapped in its own `ActionChunkBroker`
(a control loop at --control-hz taking one action per tick, calling `infer()` when the
--horizon actions of its chunk are spent, blocking meanwhile), a few robots per process.
A robot is idle while infer() blocks. The fleet grows until robots go hungry: a size is fed
when the mean idle time is <= 10 % of task time and no robot is above 25 %; a server's
capacity is the largest fed size. Per size: idle fraction (mean), P50/P95 round latency
(client side, per infer()), mean batch (robotserve: the core's dispatched/batches over the
run; reference: 1 by construction). Each size runs on the reference, then on robotserve, one
right after the other, so both see the same load of a shared machine.

Also measured, one client alone on robotserve: the websocket path's added latency over the
engine call, per round (client round trip minus the engine's own time for that round's
batch, from the Runner's stage trace), median.

The report of record (--out FILE) holds exactly REPORT's keys; FILE.meta.json holds the
method, per-robot figures, the added latency, the machine and its load average.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ..cli_types import positive
from ..machine import machine_info

ROBOTS_PER_PROCESS = 4
FLEET_KEY = "bench-openpi-fleet"  # a loopback-only bench server's key, not a secret
MIN_ROWS_TO = 16  # sizes up to this run even after a hungry one (latency and throughput still show batching)
FED_MEAN, FED_MAX = 0.10, 0.25
STAGES = ("submit", "dispatch", "engine_start", "engine_end", "reply")  # the "kept fed": mean idle <= 10 % of task time, none above 25 %


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="the report JSON (FILE.meta.json beside it)")
    p.add_argument("--horizon", type=positive(int), default=10, help="actions executed per chunk (ActionChunkBroker)")
    p.add_argument("--control-hz", type=positive(), default=50.0, help="control rate of every client, Hz")
    p.add_argument("--seconds", type=positive(), default=8.0, help="measured time per fleet size")
    p.add_argument("--sizes", type=positive(int), nargs="+", default=[1, 2, 4, 6, 8, 12, 16, 24, 32, 48],
                   help=f"fleet sizes tried in order; a server stops at its first hungry size past {MIN_ROWS_TO}")
    p.add_argument("--steps", type=positive(int), default=10, help="flow steps of the tiny SmolVLA")
    p.add_argument("--torch-threads", type=positive(int), default=1, help="torch intra-op threads of the engine "
                   "(fixed: an unset count races whatever else runs on the machine)")


# --- robots (in worker processes) ----------------------------------------------------------
def _robot(port: int, horizon: int, hz: float, start: float, end: float, obs: dict, out: list) -> None:
    from openpi_client.action_chunk_broker import ActionChunkBroker
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    # every robot on loopback is one address: they present the fleet's key, budgeted per key
    # (the reference server ignores it)
    policy = WebsocketClientPolicy("127.0.0.1", port, api_key=FLEET_KEY)
    broker = ActionChunkBroker(policy, action_horizon=horizon)
    broker.infer(obs)  # the first chunk: connection and warm-up, not measured
    broker.reset()
    while time.time() < start:
        time.sleep(0.001)
    idle, rounds, t0 = 0.0, [], time.monotonic()
    tick = t0
    while time.time() < end:
        a = time.monotonic()
        broker.infer(obs)
        took = time.monotonic() - a
        if took > 0.002:  # a server round (cached actions return in microseconds)
            idle += took
            rounds.append(took * 1e3)
        tick = max(tick + 1.0 / hz, time.monotonic())  # a late robot does not catch up
        time.sleep(max(0.0, tick - time.monotonic()))
    out.append({"idle_s": idle, "task_s": time.monotonic() - t0, "rounds_ms": rounds})


def _worker(port, n, horizon, hz, start, end, obs, q) -> None:
    out: list = []
    ts = [threading.Thread(target=_robot, args=(port, horizon, hz, start, end, obs, out)) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put(out)


def run_fleet(port: int, robots: int, horizon: int, hz: float, seconds: float, obs: dict) -> list:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 2.0 + 0.25 * robots  # every robot connected and warm first
    end = start + seconds
    sizes = [min(ROBOTS_PER_PROCESS, robots - i) for i in range(0, robots, ROBOTS_PER_PROCESS)]
    procs = [ctx.Process(target=_worker, args=(port, n, horizon, hz, start, end, obs, q), daemon=True) for n in sizes]
    for p in procs:
        p.start()
    got = []
    for _ in procs:
        got.extend(q.get(timeout=end - time.time() + 120))
    for p in procs:
        p.join(10)
    return got


def size_row(robots: int, per_robot: list, mean_batch: float) -> tuple:
    idle = [r["idle_s"] / r["task_s"] for r in per_robot]
    rounds = [x for r in per_robot for x in r["rounds_ms"]]
    p50, p95 = (float(np.percentile(rounds, q)) for q in (50, 95)) if rounds else (math.nan, math.nan)
    row = {"robots": robots, "idle_fraction": round(statistics.fmean(idle), 4), "p50_ms": round(p50, 2),
           "p95_ms": round(p95, 2), "mean_batch": round(mean_batch, 2)}
    fed = statistics.fmean(idle) <= FED_MEAN and max(idle) <= FED_MAX and len(per_robot) == robots
    return row, {"robots": robots, "fed": fed, "max_idle_fraction": round(max(idle), 4),
                 "robots_fed": sum(i <= FED_MAX for i in idle), "rounds": len(rounds),
                 "chunks_per_s": round(len(rounds) / statistics.fmean(r["task_s"] for r in per_robot), 2)}


# --- the reference: one request at a time ---------------------------------------------------
class ReferenceServer:
    """REFERENCE, written here: openpi's WebsocketPolicyServer's shape (serve_policy.py): an
    asyncio websockets server whose handler calls the policy inside the event loop, so one
    request is served at a time and every other client waits. Same engine code at batch 1,
    same key map and codec as robotserve's endpoint (so only the serving differs)."""

    def __init__(self, engine) -> None:
        import asyncio

        from websockets.asyncio.server import serve
        from websockets.exceptions import ConnectionClosed

        from ..core.types import HorizonChoice, InferenceRequest
        from ..transport.openpi.codec import Limits, pack, unpack
        from ..transport.openpi.features import KeyMap, PolicyFeatures

        keys = KeyMap({}, PolicyFeatures.of(engine))
        meta = pack({"server": "reference (one request at a time)", **keys.metadata()})
        self.port, self._n = 0, 0
        ready = threading.Event()

        async def handler(ws):
            self._n += 1
            task, rnd = f"ref{self._n}", 0
            await ws.send(meta)
            try:
                async for msg in ws:
                    obs = keys.observation(unpack(msg, Limits()), time.monotonic())
                    req = InferenceRequest(task, rnd, None, HorizonChoice("static", None), obs)
                    (res,) = engine.infer([req])  # blocks the loop: openpi's server does the same
                    rnd += 1
                    await ws.send(pack({"actions": np.asarray(res.actions, np.float32)}))
            except ConnectionClosed:  # openpi clients never close: a robot that stopped
                pass
            finally:
                engine.forget(task)

        async def main():
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as srv:
                self.port = srv.sockets[0].getsockname()[1]
                ready.set()
                await self._stop.wait()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


# --- the run ------------------------------------------------------------------------------
class _Grown:
    """One server's fleet sizes so far: rows, per-size detail, capacity (the largest fed size
    with every smaller size fed too) and the mean batch there."""

    def __init__(self, name: str, port: int, mean_batch) -> None:
        self.name, self.port, self.mean_batch = name, port, mean_batch
        self.rows, self.detail, self.capacity, self.cap_batch, self.done = [], [], 0, 0.0, False

    def run(self, n: int, a, obs: dict) -> None:
        before = self.mean_batch(None)
        per = run_fleet(self.port, n, a.horizon, a.control_hz, a.seconds, obs)
        mb = self.mean_batch(before)
        row, more = size_row(n, per, mb)
        self.rows.append(row)
        self.detail.append({**more, "load_avg_1m": round(os.getloadavg()[0], 2)})
        print(f"{self.name:>10} robots {n:3d}: idle {row['idle_fraction']:.3f} (max {more['max_idle_fraction']:.3f}) "
              f"p50 {row['p50_ms']:.1f} ms p95 {row['p95_ms']:.1f} ms mean batch {mb:.2f} -> "
              f"{'fed' if more['fed'] else 'HUNGRY'} (load {os.getloadavg()[0]:.1f})", flush=True)
        if all(d["fed"] for d in self.detail):  # fed, and every smaller size was too
            self.capacity, self.cap_batch = n, mb
        self.done = not more["fed"] and n >= MIN_ROWS_TO


def grow_side_by_side(servers: list, a, obs: dict) -> None:
    """Each fleet size on every server still growing, one right after the other, so both see
    the same load on a shared machine."""
    for n in a.sizes:
        live = [g for g in servers if not g.done]
        if not live:
            return
        for g in live:
            g.run(n, a, obs)


def added_latency(srv, obs: dict, rounds: int = 60) -> dict:
    """One client alone: client round trip minus the engine time of that round's batch."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from ..core.runner import StageTrace

    trace = StageTrace(time.monotonic_ns)
    srv.fleet.observe(trace)
    c = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=FLEET_KEY)
    samples = []
    for i in range(rounds + 5):
        t = time.monotonic_ns()
        r = c.infer(obs)
        rt = time.monotonic_ns() - t
        m = trace.snapshot().get(f"{r['robotserve']['task']}#{r['robotserve']['round']}", {})
        if i >= 5 and all(k in m for k in STAGES):
            samples.append((rt / 1e6, *((m[b] - m[a]) / 1e6 for a, b in zip(STAGES, STAGES[1:]))))
    c._ws.close()
    added = [s[0] - s[3] for s in samples]
    med = lambda j: round(statistics.median(s[j] for s in samples), 3)  # noqa: E731
    return {"rounds": len(samples), "round_trip_ms_p50": med(0), "engine_ms_p50": med(3),
            "added_ms_p50": round(statistics.median(added), 3), "added_ms_p95": round(float(np.percentile(added, 95)), 3),
            "target_ms": 2.0,
            # where the added time goes (medians): the core's queue and the two thread hand-offs
            # into the engine, the hand-back; the rest is websocket, msgpack and the hop back to the loop.
            "submit_to_dispatch_ms_p50": med(1), "dispatch_to_engine_ms_p50": med(2), "engine_to_reply_ms_p50": med(4)}


def cli(a) -> int:
    from ..engines.torch_env import import_lerobot_policies

    import_lerobot_policies()
    from ..engines.torch_env import import_torch

    import_torch().set_num_threads(a.torch_threads)
    from ..engines.tiny_policies import make_policy_dir
    from ..transport.openpi.config import EndpointConfig, OpenPiConfig
    from ..transport.openpi.server import OpenPiServer

    out = Path(a.out)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-openpi-") as tmp:
        # The profile of record's engine (reports/profiles/README.md, smolvla_tiny): 64x64, chunk 50.
        pdir = make_policy_dir("smolvla", Path(tmp) / "smolvla", image_hw=(64, 64), steps=a.steps, chunk_size=50,
                               n_action_steps=50)
        key = Path(tmp) / "key"
        key.write_text(FLEET_KEY + "\n")
        srv = OpenPiServer(OpenPiConfig(policy=str(pdir), engine_params={"profile_file": "smolvla_tiny"},
                                        endpoint=EndpointConfig(port=0, max_rate_hz=1000.0, api_key_file=str(key))))
        try:
            meta = srv.endpoint.metadata
            rng = np.random.default_rng(0)
            obs = {k: rng.integers(0, 256, v["shape"], dtype=np.uint8) for k, v in meta["images"].items()}
            obs.update({"observation/state": rng.standard_normal(meta["state"]["dim"]).astype(np.float32),
                        "prompt": "pick up the cube"})
            lat = added_latency(srv, obs)
            print(f"added latency, one client: {lat['added_ms_p50']:.2f} ms median (engine {lat['engine_ms_p50']:.1f} ms)",
                  flush=True)
            def batches(before):
                st = srv.fleet.core_stats()
                now = (st["dispatched"], st["batches"])
                if before is None:
                    return now
                return (now[0] - before[0]) / max(1, now[1] - before[1])

            ref_srv = ReferenceServer(srv.engine)  # the same engine object: each server runs while the other idles
            try:
                ours = _Grown("robotserve", srv.port, batches)
                ref = _Grown("reference", ref_srv.port, lambda before: 0 if before is None else 1.0)
                grow_side_by_side([ref, ours], a, obs)
            finally:
                ref_srv.stop()
        finally:
            srv.stop()
    report = {"horizon": a.horizon, "control_hz": a.control_hz,
              "reference": {"capacity": ref.capacity, "sizes": ref.rows},
              "robotserve": {"capacity": ours.capacity, "mean_batch_at_capacity": round(ours.cap_batch, 2),
                             "sizes": ours.rows}}
    ratio = ours.capacity / ref.capacity if ref.capacity else None
    extra = {"method": __doc__.split("\n\n")[1:3],
             "policy": "tiny SmolVLA, the smolvla_tiny profile's shapes (64x64 image, chunk 50), random weights",
             "steps": a.steps, "torch_threads": a.torch_threads, "seconds_per_size": a.seconds, "robots_per_process": ROBOTS_PER_PROCESS,
             "fed_rule": {"mean_idle_max": FED_MEAN, "any_idle_max": FED_MAX},
             "capacity_ratio": ratio, "target_ratio": 3.0, "added_latency": lat,
             "per_size": {"robotserve": ours.detail, "reference": ref.detail},
             "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "machine": machine_info(),
             "command": " ".join(["robotserve", *sys.argv[1:]])}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    Path(str(out) + ".meta.json").write_text(json.dumps(extra, indent=1) + "\n")
    print(f"capacity: robotserve {ours.capacity} vs reference {ref.capacity} robots "
          f"(x{ratio if ratio is None else round(ratio, 2)}, target x3); mean batch at capacity {ours.cap_batch:.2f}; "
          f"added latency {lat['added_ms_p50']:.2f} ms median (target <= 2 ms). Report: {out}")
    return 0
