"""The robots of `robotserve bench robots-per-engine`: processes pinned to the client core, a
few robots (threads) each. A robot runs its chunk by the clock (H actions at control_hz), asks
for the next chunk when `trigger` actions are left, and holds position (idle) when they run out
before the reply is back: the timing of core/robot_timing.py, the simulator's. It wakes once per
round, not per action, so the client core measures the protocol, not a tick loop.

Each protocol's client is the peer's own: openpi's unchanged `WebsocketClientPolicy` (with
the server's API key); for ROS, the project's request through rclpy, a node per robot that
re-sends as robot_client does (bench/rpe_ros.py); for LeRobot, by default its RobotClient itself
(bench/rpe_robotclient.py), else (`--lerobot-client stubs`, and the added-latency run) the calls
RobotClient makes (Ready, SendPolicyInstructions, SendObservations of a pickled
TimedObservation in its own transfer pieces, GetActions until a chunk comes) through LeRobot's
own stubs and classes.
"""
from __future__ import annotations

import functools
import logging
import multiprocessing as mp
import os
import pickle  # nosec - our own payloads to LeRobot's own server, as its RobotClient sends them
import resource
import threading
import time
from pathlib import Path

import numpy as np

STATE_DIM = 6
CAMERA_HW = (32, 32)  # the tiny ACT's camera (the LeRobot peer's policy): every LeRobot robot sends one


def openpi_caller(port: int, rng: np.random.Generator, api_key: str = ""):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    policy = WebsocketClientPolicy("127.0.0.1", port, api_key=api_key or None)  # its own `Authorization: Api-Key`
    obs = {"observation/state": rng.standard_normal(STATE_DIM).astype(np.float32), "prompt": "pick up the cube"}
    return lambda step: policy.infer(obs)


def lerobot_caller(port: int, rng: np.random.Generator, policy_dir: str, chunk: int, fps: float):
    import grpc
    from lerobot.async_inference.helpers import RemotePolicyConfig, TimedObservation
    from lerobot.transport import services_pb2, services_pb2_grpc
    from lerobot.transport.utils import send_bytes_in_chunks

    joints = [f"joint_{i}.pos" for i in range(STATE_DIM)]
    feats = {"observation.state": {"dtype": "float32", "shape": (STATE_DIM,), "names": joints},
             "observation.images.cam0": {"dtype": "image", "shape": (*CAMERA_HW, 3), "names": ["height", "width", "channels"]}}
    # A connection of its own: channels of one process share one by default, and a server that
    # knows a robot by its connection (robotserve's does, as LeRobot's runs one robot) would see one robot.
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    stub = services_pb2_grpc.AsyncInferenceStub(channel)
    stub.Ready(services_pb2.Empty())
    spec = RemotePolicyConfig(policy_type="act", pretrained_name_or_path=policy_dir, lerobot_features=feats,
                              actions_per_chunk=chunk, device="cpu")
    stub.SendPolicyInstructions(services_pb2.PolicySetup(data=pickle.dumps(spec)))
    raw = {j: float(x) for j, x in zip(joints, rng.standard_normal(STATE_DIM))}
    raw["cam0"] = rng.integers(0, 256, (*CAMERA_HW, 3), dtype=np.uint8)
    raw["task"] = "pick up the cube"

    def call(step: int):
        tobs = TimedObservation(timestamp=time.time(), timestep=step, observation=raw, must_go=True)
        stub.SendObservations(send_bytes_in_chunks(pickle.dumps(tobs), services_pb2.Observation))
        give_up = time.monotonic() + 30.0
        while time.monotonic() < give_up:  # RobotClient's receiver asks again on an empty reply
            got = stub.GetActions(services_pb2.Empty(), timeout=10.0)
            if got.data:
                return got.data
        raise TimeoutError(f"no chunk for timestep {step} in 30 s")

    return call


def robot(call, *, horizon: int, trigger: int, hz: float, start: float, end: float) -> dict:
    """One robot from `start` (its phase) to `end` (wall clock): idle time, round trips."""
    dt = 1.0 / hz
    _sleep_until(start)
    idle, rts, late, k = 0.0, [], 0.0, 0
    chunk_start = None  # no actions yet: the first request goes out at once, the robot idle until it is back
    t_req = time.time()
    while t_req < end:
        _sleep_until(t_req)
        a = time.time()
        late += a - t_req
        call(k * horizon + (horizon - trigger if k else 0))
        r = time.time()
        rts.append(r - a)
        runs_out = a if chunk_start is None else chunk_start + horizon * dt  # leftover's last action done
        if r > runs_out:
            idle += r - runs_out
        chunk_start = max(r, runs_out)
        t_req = chunk_start + (horizon - trigger) * dt
        k += 1
    task = max(end, time.time()) - start
    return {"idle_s": idle, "task_s": task, "rt_s": rts, "late_s": late}


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def _worker(make_call, phases, kw, core, q, ready, t_start) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    logging.disable(logging.INFO)  # LeRobot's transport logs a line per observation sent
    out, lock = [], threading.Lock()

    def one(i, phase):
        call, warm = None, 0
        try:
            call = make_call(i, np.random.default_rng(i))
            call(0)  # connection and warm-up, not measured
            warm = getattr(call, "resends", 0)  # (a new robot process's first call waits for DDS discovery)
            with ready.get_lock():
                ready.value += 1
            while t_start.value == 0.0:  # the parent starts the clock once every robot is warm
                time.sleep(0.005)
            start = t_start.value + phase
            res = robot(call, start=start, end=t_start.value + kw["window_s"] + kw["max_phase"],
                        **{k: kw[k] for k in ("horizon", "trigger", "hz")})
            if not res["rt_s"]:
                res = {"error": "no round in the window (the robot started too late)"}
        except Exception as e:  # noqa: BLE001 - a robot that failed is reported, and the row is unfed
            res = {"error": f"{type(e).__name__}: {e}"}
        if hasattr(call, "resends"):  # a robot that re-sends (ROS): how often in the window, failed or not
            res["resends"] = call.resends - warm
        with lock:
            out.append(res)

    ts = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in phases]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put(out)


def core_busy(core) -> tuple:
    """(busy, total) jiffies of one core so far, from /proc/stat."""
    if core is None:
        return 0, 0
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:]]
            return sum(v) - v[3] - v[4], sum(v)
    return 0, 0


def run_fleet(make_call, phases: list, *, per_process: int, core, horizon: int, trigger: int, hz: float,
              window_s: float, worker=None) -> tuple:
    """Robots (forked processes on `core`), started together once every robot made its warm-up
    call, for window_s; returns (per-robot results, the client core's busy share over the window
    (/proc/stat: whatever ran there), the client processes' own CPU share). worker: a client
    process's body other than the bench's robot loop over make_call (rpe_robotclient's), called
    as worker(phases, kw, core, q, ready, t_start)."""
    ctx = mp.get_context("fork")  # the parent imported the clients' modules once
    q, ready, t_start = ctx.Queue(), ctx.Value("i", 0), ctx.Value("d", 0.0)
    n = len(phases)
    kw = dict(horizon=horizon, trigger=trigger, hz=hz, window_s=window_s, max_phase=max(phases, default=0.0))
    idx = list(enumerate(phases))
    body = worker or functools.partial(_worker, make_call)
    procs = [ctx.Process(target=body, args=(idx[i:i + per_process], kw, core, q, ready, t_start), daemon=True)
             for i in range(0, n, per_process)]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for p in procs:
        p.start()
    deadline = time.time() + 120
    while ready.value < n and time.time() < deadline and any(p.is_alive() for p in procs):
        time.sleep(0.01)
    start = time.time() + 0.2
    t_start.value = start
    _sleep_until(start)
    b0 = core_busy(core)
    got = []
    for _ in procs:
        got.extend(q.get(timeout=start + window_s + kw["max_phase"] - time.time() + 120))
    b1 = core_busy(core)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / (window_s + kw["max_phase"])
    busy = (b1[0] - b0[0]) / (b1[1] - b0[1]) if b1[1] > b0[1] else 0.0
    return got, busy, round(own, 3)
