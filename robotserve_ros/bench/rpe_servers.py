"""The servers of `robotserve bench robots-per-engine`, each in its own process pinned to the
server core, all on one device: a simulated engine that sleeps the batch-cost curve (sleep
releases the GIL) under an exclusive file lock, so the calls of every server process are
serialised as one GPU would serialise them (several LeRobot servers never get several devices).
With --curve smolvla_cpu the device's work is the real tiny SmolVLA instead of the sleep, under
the same lock (bench/rpe_smolvla.py).

- robotserve/ros: the project's inference_server node (srv/Infer), its engine the device, on
  the bench's own ROS domain.
- robotserve/openpi, robotserve/lerobot: the project's openpi and LeRobot endpoints on one
  fleet (serve/) over that engine: requests of every robot batched. Every cap at its default;
  the openpi endpoint asks for an API key, which the bench's robots present.
- openpi_serial/openpi: the reference of openpi's serve_policy shape (bench/openpi.py's
  ReferenceServer: infer inside the asyncio handler, one request at a time), same engine.
- lerobot/lerobot: LeRobot 0.4.4's own PolicyServer, unchanged, on its real gRPC socket, one
  process per robot (it resets its state when a second client says Ready). Its policy is a
  tiny ACT whose predict_action_chunk is the device (batch 1): the server's own observation
  conversion, pre/post-processing, TimedAction list and pickles all run as they ship.
"""
from __future__ import annotations

import fcntl
import logging
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

from ..engines.simulated import SimulatedEngine
from .rpe_rules import arm_chunk, curve_fn

ACTION_DIM = 6


class Device:
    """One device shared by processes: an flock around each call; each process keeps the
    (batch, ms) of its own calls, measured while it held the device. Its work: sleeping the
    curve, or (policy_dir given: smolvla_cpu) the real tiny SmolVLA's forward (bench/rpe_smolvla.py)."""

    def __init__(self, lock_path: str, curve: str, points=None, policy_dir: str = "", hz: float = 50.0) -> None:
        self.lock_path, self.curve, self.hz = lock_path, curve_fn(curve, points), hz  # hz: the robots' (arm_chunk)
        self.model = None
        if policy_dir:
            from .rpe_smolvla import SmolVLAWork

            self.model = SmolVLAWork(policy_dir)
        self._fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._mutex = threading.Lock()  # flock is per open file: threads of one process queue here first
        self.calls: list = []

    def run(self, batch: int, work):
        with self._mutex:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                t0 = time.perf_counter()
                out = work()
                self.calls.append((batch, (time.perf_counter() - t0) * 1e3))
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return out

    def busy(self, batch: int) -> None:
        """What one call of `batch` does on the device (the caller holds it: run())."""
        if self.model is not None:
            self.model(batch)
        else:
            time.sleep(self.curve(batch) / 1e3)

    def take(self) -> list:
        out, self.calls = self.calls, []
        return out


class DeviceEngine(SimulatedEngine):
    """The simulated engine run on the shared device: realtime (it sleeps the curve's L(b)), or
    its chunks made at once while the device runs the real model for the batch. Its actions are
    the arm's motion (rpe_rules.arm_chunk), as LeRobot's peer's are."""

    def __init__(self, device: Device, chunk: int) -> None:
        from ..core.profile import EngineProfile

        prof = EngineProfile({b: device.curve(b) for b in (1, 2, 4, 8, 16, 32, 64, 128)})
        super().__init__(prof, chunk_size=chunk, action_dim=ACTION_DIM, realtime=device.model is None)
        self.device = device

    def _actions(self, req, key):
        return arm_chunk(time.monotonic(), self.chunk_size, self.device.hz, self.action_dim)

    def infer(self, batch):
        sup = super().infer
        if self.device.model is None:
            return self.device.run(len(batch), lambda: sup(batch))
        return self.device.run(len(batch), lambda: (self.device.busy(len(batch)), sup(batch))[1])


def _fleet_refusals(fleet) -> dict:
    """The fleet's refusals so far, by protocol and reason (serve/fleet.py counts them)."""
    with fleet.lock:
        return {f"{p}:{k}": v for p, c in fleet.counts.items() for k, v in c.items() if k.startswith("refused:")}


def _fleet(engine):
    from ..config import SchedulerConfig
    from ..core.clock import WallClock
    from ..serve import fleet_over

    return fleet_over(engine, SchedulerConfig(name="remaining").build(), WallClock(), slots=1).start()


def _robotserve_openpi(device: Device, chunk: int, hz: float, key_file: str):
    from ..transport.openpi.config import EndpointConfig
    from ..transport.openpi.endpoint import OpenPiEndpoint

    fleet = _fleet(DeviceEngine(device, chunk))
    # Every cap at its default (issue 40: zero refusals under the defaults); the robots present
    # the API key, so they are budgeted as its holder rather than as one loopback address.
    ep = OpenPiEndpoint(EndpointConfig(port=0, control_hz=hz, api_key_file=key_file), fleet, {"type": "simulated"}).start()
    return ep.port, lambda: (ep.close(), fleet.close()), lambda: {**{f"openpi:{k}": v for k, v in ep.refused.items()},
                                                                  **_fleet_refusals(fleet)}


def _robotserve_lerobot(device: Device, chunk: int, hz: float, key_file: str):
    from ..core.clock import WallClock
    from ..transport.lerobot.config import CompatConfig
    from ..transport.lerobot.fleet import Fleet
    from ..transport.lerobot.protocol import LeRobotCompatServer

    fleet = _fleet(DeviceEngine(device, chunk))
    srv = LeRobotCompatServer(CompatConfig(port=0, fps=hz, engine="simulated"), WallClock(), Fleet(fleet))

    def refused() -> dict:
        st = srv.servicer.stats()
        calls = {f"calls:{k}": v for k, v in st["calls"].items() if isinstance(v, int) and k.endswith("_refused")}
        return {**{f"lerobot:{k}": v for k, v in st["protocol_errors"].items()}, **calls, **_fleet_refusals(fleet)}

    return srv.port, lambda: (srv.stop(), fleet.close()), refused


def _robotserve_ros(device: Device, chunk: int, hz: float, key_file: str):
    """The project's inference_server node, unchanged but for its engine: `rpe_device`, this
    process's device engine, registered here only (the server process of this bench). The ROS
    domain is the bench's own (its environment, set before this process was spawned)."""
    import rclpy

    from ..engines import ENGINES, ROLES
    from rclpy.executors import SingleThreadedExecutor

    from ..nodes.inference_server import InferenceServerNode

    ENGINES.register("rpe_device", lambda profile=None, **kw: DeviceEngine(device, chunk))
    ROLES["rpe_device"] = "action"
    ctx = rclpy.Context()
    rclpy.init(context=ctx, args=["rpe_server", "--ros-args", "-p", "engine.name:=rpe_device",
                                  "--log-level", "error"])  # (a past run's tasks are reaped: said at warn)
    node = InferenceServerNode(context=ctx)
    if node.config_error is not None:
        raise RuntimeError(f"inference_server did not configure: {node.config_error}")
    ex = SingleThreadedExecutor(context=ctx)  # `executor: auto` without side services: the node's own choice
    ex.add_node(node)
    spin = threading.Thread(target=ex.spin, name="rpe-ros-server", daemon=True)
    spin.start()

    def stop():  # run_nodes' order: the node's own clean-up, the executor, then the handles
        node.close()
        ex.shutdown(timeout_sec=1.0)
        node.destroy_node()
        ctx.try_shutdown()

    return 0, stop, lambda: _fleet_refusals(node.fleet)


def _openpi_serial(device: Device, chunk: int, hz: float, key_file: str):
    from .openpi import ReferenceServer

    srv = ReferenceServer(DeviceEngine(device, chunk))
    return srv.port, srv.stop, dict  # no caps: it refuses nothing


def normalised_arm(postprocessor, torch, chunk: int, hz: float):
    """t -> the (1, chunk, ACTION_DIM) policy output that LeRobot's server, after its own
    postprocessor (unnormalising: an affine map per joint, read off it here), sends as the arm's
    motion from t (rpe_rules.arm_chunk): the path the device engine's actions follow too."""
    zero = postprocessor(torch.zeros(1, ACTION_DIM)).reshape(-1)
    scale = postprocessor(torch.ones(1, ACTION_DIM)).reshape(-1) - zero
    return lambda t: ((torch.from_numpy(arm_chunk(t, chunk, hz, ACTION_DIM)) - zero) / scale)[None]


def _lerobot_peer(device: Device, chunk: int, hz: float, key_file: str):
    """LeRobot's PolicyServer as its own `serve()` starts it (4 gRPC threads), on port 0."""
    from concurrent import futures

    import grpc

    from ..engines.torch_env import import_lerobot_policies, import_torch

    import_lerobot_policies()  # torchvision's missing operators declared first (notes/lerobot-on-cpu.md)
    torch = import_torch()
    from lerobot.async_inference.configs import PolicyServerConfig
    from lerobot.async_inference.policy_server import PolicyServer
    from lerobot.transport import services_pb2_grpc

    torch.set_num_threads(1)  # a fixed thread count: its torch work (pre/post-processing) is not a thread race
    server = PolicyServer(PolicyServerConfig(host="127.0.0.1", port=8080, fps=int(round(hz)), inference_latency=0.0,
                                             obs_queue_timeout=2.0))
    PolicyServer.logger.setLevel(logging.WARNING)
    load = server.SendPolicyInstructions

    def instructions(request, context):  # its own loading, then the policy's forward pass becomes the device
        out = load(request, context)
        arm = normalised_arm(server.postprocessor, torch, chunk, hz)

        def predict_action_chunk(batch, **kw):
            return device.run(1, lambda: (device.busy(1), arm(time.monotonic()))[1])

        server.policy.predict_action_chunk = predict_action_chunk
        return out

    server.SendPolicyInstructions = instructions
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    services_pb2_grpc.add_AsyncInferenceServicer_to_server(server, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    return port, lambda: grpc_server.stop(0.5).wait(), dict  # no caps: it refuses nothing


SERVES = {("robotserve", "ros"): _robotserve_ros, ("robotserve", "openpi"): _robotserve_openpi, ("robotserve", "lerobot"): _robotserve_lerobot,
          ("openpi_serial", "openpi"): _openpi_serial, ("lerobot", "lerobot"): _lerobot_peer}


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return float("nan")


def _child(server: str, protocol: str, lock_path: str, curve: str, chunk: int, hz: float, core, key_file: str,
           conn, points=None, policy_dir: str = "") -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    os.chdir(os.environ.get("TMPDIR", "/tmp"))  # LeRobot's logger writes logs/ into the cwd
    logging.disable(logging.INFO)  # LeRobot's transport logs a line per observation received
    try:
        device = Device(lock_path, curve, points, policy_dir, hz)
        port, stop, refused = SERVES[(server, protocol)](device, chunk, hz, key_file)
    except Exception as e:  # noqa: BLE001 - said to the parent, which stops the bench with it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("port", port))
    while True:
        cmd = conn.recv()
        if cmd == "calls":
            conn.send(device.take())
        elif cmd == "refused":
            conn.send(refused())
        elif cmd == "stop":
            stop()
            conn.send("stopped")
            from ..nodes.common import exit_process

            exit_process(0)  # no interpreter teardown: rclpy's and gRPC's threads may still hold handles


class ServerProcess:
    """One server in a spawned process on `core`; `calls()` hands back its device calls so far.
    points, policy_dir: a measured curve's {batch: ms} and the model the device runs (smolvla_cpu)."""

    def __init__(self, server: str, protocol: str, lock_path: str, curve: str, chunk: int, hz: float, core,
                 key_file: str = "", points=None, policy_dir: str = "") -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child, args=(server, protocol, lock_path, curve, chunk, hz, core, key_file, child,
                                                     points, policy_dir),
                                daemon=True)
        self.proc.start()
        if not self._conn.poll(180):
            self.close()
            raise RuntimeError(f"{server}/{protocol} server did not start in 180 s")
        kind, val = self._conn.recv()
        if kind == "error":
            self.close()
            raise RuntimeError(f"{server}/{protocol} server failed to start: {val}")
        self.port = val

    def calls(self) -> list:
        self._conn.send("calls")
        return self._conn.recv()

    def refused(self) -> dict:
        """The server's refusals so far, by where and why (cumulative)."""
        self._conn.send("refused")
        return self._conn.recv()

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self._conn.send("stop")
                self._conn.poll(10)
        except (OSError, EOFError, BrokenPipeError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
