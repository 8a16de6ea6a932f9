"""The ROS robots of `robotserve bench robots-per-engine`: srv/Infer as the project's robot_client
calls it. Each robot is a node of its own with its own Infer client and executor (one rclpy
context, one DDS participant, per robot process), and the robot's thread spins that executor
while it waits: the reply is taken by the thread that acts on it, as in robot_client, whose
executor runs its robot. (A shared executor thread handing each reply to the robot's thread
cost a done-callback task, an Event and a GIL hand-off per round: 0.25-0.9 ms of "added
latency" that no robot_client feels.)

An unanswered round is re-sent as robot_client re-sends it (its RobotLoop, core/robot_loop.py,
keeps the round: OpenRound with ResendTimer.for_robot at robot_client's defaults, 2 s until the
first answer, then from the measured reply times, at least 0.2 s, doubling per re-send): same task_id and round_id, so the server runs the
round once (an earlier call still queued is answered `duplicate_request`, a round already
answered is replayed). The round trip runs from the first send. A round with no reply in
GIVE_UP_S is an error, the robot's row unfed. Why rounds go unanswered: the server's srv/Infer
request queue keeps `infer_queue.depth` (10) calls until its executor takes them, and a burst
of robots answered in one batch asks again together (docs/openpi.md)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np

SERVICE = "/robotserve/infer"
GIVE_UP_S = 30.0
_CTX: dict = {}  # this robot process's rclpy context (made by its first robot)
_LOCK = threading.Lock()


def _context():
    with _LOCK:
        if "ctx" not in _CTX:
            import rclpy

            ctx = rclpy.Context()
            rclpy.init(context=ctx, args=["rpe_robots", "--ros-args", "--log-level", "warn"])
            _CTX["ctx"] = ctx
        return _CTX["ctx"]


def shutdown() -> None:
    """This process's robots' context shut down (their nodes with it); the next robot makes a new one."""
    with _LOCK:
        ctx = _CTX.pop("ctx", None)
    if ctx is not None:
        ctx.try_shutdown()


class RosRobot:
    """One robot's srv/Infer calls; `call(step)` sends its next round and returns the reply
    (RuntimeError if refused, TimeoutError with none in GIVE_UP_S). `resends` counts re-sends."""

    def __init__(self, i: int, rng: np.random.Generator, *, horizon: int, trigger: int, hz: float) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from ..core.robot_loop import RobotLoop
        from ..live.light_fleet import recorded_observations
        from ..nodes.common import lean_node_kwargs, service_qos
        from ..nodes.robot_client_config import RobotClientConfig
        from ..srv import Infer
        from .rpe_clients import CAMERA_HW

        ctx = _context()
        with _LOCK:  # the process's robots (threads) start together
            self.node = rclpy.create_node(f"rpe_robot_{os.getpid()}_{i}", context=ctx, **lean_node_kwargs())
            self.cli = self.node.create_client(Infer, SERVICE, qos_profile=service_qos())
            self.ex = SingleThreadedExecutor(context=ctx)
            self.ex.add_node(self.node)
        if not self.cli.wait_for_service(timeout_sec=60.0):
            raise TimeoutError(f"no {SERVICE} on the bench's ROS domain in 60 s")
        # The project's robot loop keeps the round and its re-send state (the bench's robot()
        # keeps the timing: it wakes once per round, not per control tick). A task per run: a
        # past run's was reaped.
        self.loop = RobotLoop(f"rpe_{os.getpid()}_{i}_{time.monotonic_ns()}", hz, trigger, request_timeout_s=GIVE_UP_S,
                              resend_after_s=RobotClientConfig().first_resend_s)  # robot_client's default
        self.Request, self.horizon, self.trigger, self.hz = Infer.Request, horizon, trigger, hz
        self.obs = recorded_observations(n=2, width=CAMERA_HW[1], height=CAMERA_HW[0], seed=int(rng.integers(1 << 16)))
        self.robot_id, self.resends = f"/rpe_robot_{i}", 0

    @property
    def task(self) -> str:
        return self.loop.task_id

    @property
    def round(self) -> int:
        return self.loop.round

    def request(self, step: int):
        """The project's request as its light fleet fills it (recorded observations: a camera
        and joint angles; exec info from round 1 on: the robot asks with `trigger` actions
        left, so its chunk began (horizon - trigger) / hz ago)."""
        from ..nodes.common import to_time

        q = self.Request()
        q.task_id, q.round_id, q.robot_id = self.loop.task_id, self.loop.round, self.robot_id
        rnd, src, now = self.loop.round, self.obs[self.loop.round % len(self.obs)], time.time()
        o = q.observation
        o.header.stamp, o.timestep = to_time(now), step
        o.images, o.joint_state, o.instruction = src.images, src.joint_state, "pick up the cube"
        q.has_exec_info = rnd > 0
        q.exec_info.exec_start = to_time(now - (self.horizon - self.trigger) / self.hz if rnd else now)
        q.exec_info.actions_left = self.trigger if rnd else 0
        q.exec_info.control_hz = float(self.hz)
        return q

    def __call__(self, step: int):
        q, loop = self.request(step), self.loop
        now = time.monotonic()
        loop.sent(now)
        futs, give_up = [self.cli.call_async(q)], now + GIVE_UP_S
        while True:
            resp = self._wait(futs, min(give_up, loop.open_round.resend_due_at(now, loop.resend_after_s) + 1e-3))
            now = time.monotonic()
            if resp is not None:
                break
            if now >= give_up:
                for f in futs:
                    self.cli.remove_pending_request(f)
                raise TimeoutError(f"no reply to round {loop.round} in {GIVE_UP_S:g} s ({loop.open_round.resends} re-sends)")
            if loop.open_round.check(now, loop.resend_after_s, GIVE_UP_S) == "resend":
                loop.sent(now)
                self.resends += 1
                futs.append(self.cli.call_async(q))  # the same task and round: the server runs it once
        for f in futs:
            if not f.done():
                self.cli.remove_pending_request(f)
        if resp.status.code != 0:
            raise RuntimeError(f"refused: {resp.status.reason}")
        loop.answered(now)  # the next round; the re-send interval learns the reply time (ResendTimer)
        return resp

    def _wait(self, futs: list, until: float):
        """Spin this robot's executor until one of its calls is answered (the reply) or `until`
        (None); an earlier call answered `duplicate_request` means the round is queued."""
        while True:
            for f in [f for f in futs if f.done()]:
                resp = f.result()
                if resp is None or (f is not futs[-1] and resp.status.reason == "duplicate_request"):
                    self.loop.heard_queued()
                    futs.remove(f)
                    continue
                return resp
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.ex.spin_once(timeout_sec=left)


ros_caller = RosRobot  # the bench's caller for the ROS protocol: (i, rng, *, horizon, trigger, hz)
