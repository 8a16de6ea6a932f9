"""A lightweight load generator: many robot clients in one process, so that a live bench
measures the inference server, not the robots (`robotserve bench fleet-live --light`).

Each light robot follows robot_client's rules (core.robot_timing's trigger point, the same
re-send and give-up rule, the same account: nodes.client_account.ClientAccount) but renders
nothing and computes no actions: it replays a few pre-encoded observations (built once at
start, rotated per round), and its "action queue" is a count (the chunk covers timesteps
first_timestep .. first_timestep + horizon; each control tick executes one if there is one,
else the robot holds position and the tick counts as idle). One rclpy node hosts them all:
one Infer client (calls in flight concurrently, one per robot), one control timer that
ticks every robot at the control rate, one FetchObservation service answering for all of
them (the server's refresh) -- or, with --refresh-topic, each waiting robot's newest
observation published on that topic at --refresh-hz (the server's refresh_topic, sensor-data
QoS, nodes/refresh.py) -- and progress published round-robin, each robot every
progress_period_s (liveness) and at once when its task is done (the server frees the task).

When the server answers unknown_task or task_dropped (it restarted, or reaped the task),
the robot continues its motion under a new task id from round 0 (counted as
tasks_continued), as robot_client does.

With --fault-drop P (live/fault.py) a fraction P of the requests is never sent and a fraction
P of the replies to a robot's open round is discarded on arrival, as if lost on the wire
(seeded by --fault-seed); the robot's re-send timer must find them. No drops once draining:
the settle sees the open rounds through. Each robot's account lists its lost rounds.

Run: python -m robotserve_ros.live.light_fleet --robots N --first-index I --params FILE
--stats-dir DIR; SIGINT writes one account per robot to DIR/{robot}.json.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..core.robot_loop import loop_fields, RobotLoop, trigger_actions


def _robot_config(params: Optional[str], config_class=None, section_name: str = "/**/robot_client"):
    """RobotClientConfig (or `config_class`, a subclass) from a params file's `section_name`
    section (defaults without one)."""
    import yaml

    from ..nodes.robot_client import RobotClientConfig

    config_class = config_class or RobotClientConfig
    section = {}
    if params:
        cfg = yaml.safe_load(Path(params).read_text()) or {}
        section = dict(cfg.get(section_name, {}).get("ros__parameters", {}))
    names = set(config_class.__dataclass_fields__)
    return config_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in section.items() if k in names})


def recorded_observations(n: int = 8, width: int = 96, height: int = 96, joints: int = 6, seed: int = 0) -> list:
    """n pre-encoded observations (a moving gradient scene and joint angles), rotated per
    round: the generator never renders or encodes on the hot path."""
    from sensor_msgs.msg import Image, JointState

    from ..msg import Observation

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    out = []
    for k in range(n):
        img = np.stack([(xx * 255 // max(1, width - 1) + 16 * k) % 256, (yy * 255 // max(1, height - 1)) % 256,
                        np.full_like(xx, 40 * k % 256)], axis=-1).astype(np.uint8)
        im = Image(height=height, width=width, encoding="rgb8", is_bigendian=0, step=3 * width)
        im.data = img.tobytes()
        js = JointState(name=[f"joint_{j}" for j in range(joints)], position=[float(x) for x in rng.uniform(-1, 1, joints)])
        o = Observation()
        o.images = [im]
        o.joint_state = js
        out.append(o)
    return out


class LightRobot:
    """One robot's state; its timing, re-send and task bookkeeping are core/robot_loop.py's
    RobotLoop (robot_client's rules), whose fields it shows as its own."""

    __slots__ = ("name", "acct", "loop", "hooks", "timestep", "queue_end", "fut", "futs", "obs_k")

    def __init__(self, name: str, hz: float, **loop_kw) -> None:
        from ..nodes.client_account import ClientAccount

        self.name, self.acct = name, ClientAccount(name, hz)
        self.loop = RobotLoop(name, hz, loop_kw.pop("trigger", 0), now=time.monotonic(), **loop_kw)
        self.obs_k = 0
        self.fut, self.futs, self.hooks = None, [], None
        self.start_task(time.monotonic())

    def start_task(self, now: float, keep_motion: bool = False) -> None:
        self.loop.start_task(now, keep_motion)
        if not keep_motion:
            self.timestep = self.queue_end = 0

    def left(self) -> int:
        return max(0, self.queue_end - self.timestep)


loop_fields(LightRobot, ("task_k", "task_id", "round", "outstanding", "open_round", "retry_at", "task_start",
                        "exec_start", "idle", "chunks", "done", "finished_tasks", "continued"))


class _FleetHooks:
    """A robot's RobotHooks: the fleet node's hook methods, bound to the robot."""

    __slots__ = ("fleet", "robot")

    def __init__(self, fleet: "LightFleetNode", robot: LightRobot) -> None:
        self.fleet, self.robot = fleet, robot

    def execute(self) -> bool:
        return self.fleet.execute(self.robot)

    def left(self) -> int:
        return self.robot.left()

    def task_over(self) -> bool:
        return self.fleet.task_over(self.robot)

    def needs_more(self) -> bool:
        return self.fleet.needs_more(self.robot)


class LightFleetNode:
    """N light robots on one rclpy node (see the module docstring). A fleet of robots that do
    act (nodes/metaworld_robot.py) subclasses it: the robot class, what fills an observation,
    how a tick executes, when a task is over and how a chunk is used are its hooks."""

    robot_class = LightRobot
    node_prefix = "light_fleet"
    config_section = "/**/robot_client"
    config_class = None  # RobotClientConfig

    def __init__(self, names: list, params: Optional[str], stats_dir: Optional[str], context=None,
                 refresh_topic: str = "", refresh_hz: float = 4.0, fault_drop: float = 0.0, fault_seed: int = 0) -> None:
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        from ..msg import ExecutionProgress
        from ..nodes.common import NodeClock, lean_node_kwargs, queue_hint, service_qos
        from ..srv import FetchObservation, Infer
        from .fault import FaultDrop

        self.c = c = _robot_config(params, self.config_class, self.config_section)
        self.hz = c.control_hz
        self.trigger = c.trigger_actions if c.trigger_actions >= 0 else trigger_actions(c.expected_latency_s, self.hz)
        self.resend_after = c.first_resend_s
        self.draining = False  # SIGUSR1: no new rounds, the open ones seen through (robot_client.drain)
        self.stats_dir = stats_dir
        self.fault = FaultDrop(fault_drop, fault_seed) if fault_drop > 0 else None
        first = names[0] if names else "light"
        self.node = Node(f"{self.node_prefix}_{first.replace('/', '_')}", context=context, **lean_node_kwargs())
        self.clock = NodeClock(self.node)
        self.Infer, self.ExecutionProgress = Infer, ExecutionProgress
        self.obs = recorded_observations()
        self.frames = None  # image_transport jpeg/png: each observation's cameras encoded once, here
        if c.image_transport != "raw":
            from ..transport.images import FrameEncoder

            self.frames = [FrameEncoder(c.image_transport, c.image_quality).encode(o.images) for o in self.obs]
        self.loop_kw = {"trigger": self.trigger, "resend_after_s": self.resend_after,
                        "request_timeout_s": c.request_timeout_s, "retry_s": c.retry_s,
                        "hint": queue_hint(self.node, c.queue_topic)}  # the server's word, for all its robots
        self.robots = [self.make_robot(i, n) for i, n in enumerate(names)]
        for r in self.robots:
            r.hooks = _FleetHooks(self, r)
        self.by_task = {r.task_id: r for r in self.robots}
        self.cli = self.node.create_client(Infer, c.service, qos_profile=service_qos())
        if refresh_topic:  # no refresh service: the newest observations of the waiting robots on a topic
            from rclpy.qos import qos_profile_sensor_data

            self.fetch_name = ""
            self.newest = self.node.create_publisher(Infer.Request, refresh_topic, qos_profile_sensor_data)
            self.node.create_timer(1.0 / refresh_hz, self._publish_newest)
        else:
            self.node.create_service(FetchObservation, "~/fetch_observation", self._on_fetch)
            self.fetch_name = self.node.resolve_service_name("~/fetch_observation")
        self.progress = self.node.create_publisher(ExecutionProgress, c.progress_topic,
                                                   QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        self.node.create_timer(1.0 / self.hz, self._tick)
        # Round-robin liveness: every robot every progress period, spread over 10 slices a second.
        self.progress_period_s = max(1.0 / c.progress_hz, 2.0)
        self._slice = max(1, math.ceil(len(self.robots) / (10 * self.progress_period_s)))
        self._next = 0
        self.node.create_timer(0.1, self._publish_some)

    # --- hooks (a robot that acts overrides them) -------------------------------------------
    def make_robot(self, index: int, name: str) -> LightRobot:
        return self.robot_class(name, self.hz, **self.loop_kw)

    def execute(self, r: LightRobot) -> bool:
        """One control tick: execute the next action if there is one (True), else hold (False)."""
        if r.timestep < r.queue_end:
            r.timestep += 1
            return True
        return False

    def task_over(self, r: LightRobot) -> bool:
        return r.timestep >= self.c.task_actions

    def needs_more(self, r: LightRobot) -> bool:
        return r.queue_end < self.c.task_actions

    def use_chunk(self, r: LightRobot, chunk) -> bool:
        """A chunk answered the robot's round: its actions join the robot's queue (False: the
        chunk is refused, the round is asked again after retry_s)."""
        r.queue_end = max(r.timestep, int(chunk.first_timestep) + int(chunk.horizon))
        return True

    def fill_observation(self, r: LightRobot, o) -> None:
        from ..nodes.common import to_time

        src = self.obs[r.obs_k % len(self.obs)]
        o.header.stamp = to_time(self.clock.now())
        o.timestep = r.timestep
        o.images, o.joint_state, o.instruction = src.images, src.joint_state, self.c.instruction

    # --- control -------------------------------------------------------------------------
    def _tick(self) -> None:
        now = self.clock.now()
        ready = self.cli.service_is_ready()
        for r in self.robots:
            if r.done:
                continue
            commanded, event = r.loop.tick(now, r.hooks, ready, self.draining)
            r.acct.tick(commanded, r.task_start is not None)
            if event == "finished":
                self._finish(r, now)
            elif event == "overdue":
                r.acct.errors["timeout"] += 1
            elif event == "send":  # a new round at the trigger point, or the open one again (draining: only that)
                self._send(r, now)

    def _send(self, r: LightRobot, now: float) -> None:
        from ..nodes.common import to_time

        q = self.Infer.Request()
        q.task_id, q.round_id = r.task_id, r.round
        q.robot_id = "/" + r.name  # /diagnostics keys robots by it
        self.fill_observation(r, q.observation)
        if self.frames is not None:
            q.compressed_images, q.observation.images = self.frames[r.obs_k % len(self.obs)], []
        r.obs_k += 1
        q.has_exec_info = r.round > 0
        q.exec_info.exec_start = to_time(r.exec_start)
        q.exec_info.actions_left = r.left()
        q.exec_info.control_hz = float(self.hz)
        q.horizon.name = self.c.horizon_policy
        q.horizon.has_param = self.c.horizon_param >= 0
        q.horizon.param = float(max(0.0, self.c.horizon_param))
        q.refresh_service = self.fetch_name
        r.loop.sent(now)
        key = (r.task_id, r.round)
        r.acct.on_send(key)
        n = r.acct.requests  # this request's number: the fault decisions of it and its reply
        if self._lost_on_wire("request", r, key, n, now):
            r.fut = None
            return
        r.fut = self.cli.call_async(q)
        r.futs.append(r.fut)
        r.fut.add_done_callback(lambda f, r=r, key=key, n=n: self._on_reply(r, key, f, n))

    def _lost_on_wire(self, kind: str, r: LightRobot, key: tuple, n: int, now: float) -> bool:
        """Fault injection: whether the robot's n-th request (or its reply) is lost; the account
        notes what the robot expected then (the server's queue wait, its re-send interval)."""
        if self.fault is None or self.draining or not self.fault.drops(kind, r.name, n):
            return False
        hint = self.loop_kw["hint"]
        r.acct.on_drop(key, kind, hint.wait(now) if hint is not None else 0.0, r.loop.resend_timer.interval(now))
        return True

    def _drop_calls(self, r: LightRobot) -> None:
        for f in r.futs:
            if not f.done():
                self.cli.remove_pending_request(f)
        r.futs = []

    def _on_reply(self, r: LightRobot, key: tuple, fut, n: int = 0) -> None:
        resp = fut.result()
        if key == (r.task_id, r.round) and fut is not r.fut and resp is not None \
                and resp.status.reason == "duplicate_request":
            r.loop.heard_queued()
            return  # an earlier call of a round sent again: the newer call gets the answer
        if resp is not None and key == (r.task_id, r.round) and not r.done \
                and self._lost_on_wire("reply", r, key, n, self.clock.now()):
            return  # (only a reply the open round waits for: every drop is a lost round)
        reply_ms = r.acct.on_answer(key, resp)
        if key != (r.task_id, r.round) or r.done:  # (done: every task finished; a late answer must not restart one)
            r.acct.left_task_answers += 1
            return
        self._drop_calls(r)
        now = self.clock.now()
        if resp is None:
            r.loop.refused(now)
            return
        if resp.status.code != 0:
            r.loop.refused(now, resp.status.reason)  # (overloaded: asked again later each time in a row)
            if resp.status.reason in ("unknown_task", "task_dropped"):
                # The server forgot the task (restarted, or reaped it): the motion goes on
                # under a new task id from round 0; the queue left is kept.
                self.by_task.pop(r.task_id, None)
                r.loop.restart(now)
                self.by_task[r.task_id] = r
            return
        if not self.use_chunk(r, resp.chunk):
            r.loop.refused(now)
            return
        r.acct.on_chunk_used(key, reply_ms, r.left())
        r.loop.answered(now)

    def _finish(self, r: LightRobot, now: float) -> None:
        """The task is over (the loop marked it done and counted it): say so, start the next."""
        self._publish(r, now, task_done=True)
        if self.c.tasks == 0 or r.finished_tasks < self.c.tasks:
            self.by_task.pop(r.task_id, None)
            r.task_k += 1
            r.start_task(now)
            self.by_task[r.task_id] = r

    # --- progress and refresh ----------------------------------------------------------------
    def _publish(self, r: LightRobot, now: float, task_done: bool = False) -> None:
        from ..nodes.common import to_time

        if r.task_start is None or (r.done and not task_done):  # a finished task is the server's no more
            return
        m = self.ExecutionProgress()
        m.header.stamp = to_time(now)
        m.task_id = r.task_id
        m.task_start = to_time(r.task_start)
        m.round_id = max(0, r.round - 1)
        m.timestep = r.timestep
        m.actions_left = r.left()
        m.exec_start = to_time(r.exec_start)
        m.control_hz = float(self.hz)
        m.idle_s = r.idle
        m.chunks = r.chunks
        m.task_done = task_done
        self.progress.publish(m)

    def _publish_some(self) -> None:
        if not self.robots:
            return
        now = self.clock.now()
        for _ in range(self._slice):
            self._publish(self.robots[self._next % len(self.robots)], now)
            self._next += 1

    def _publish_newest(self) -> None:
        """Each robot waiting for a reply: its newest observation, for the server to read at dispatch."""
        from ..nodes.common import to_time

        stamp = to_time(self.clock.now())
        for r in self.robots:
            if not r.outstanding or r.done:
                continue
            m = self.Infer.Request()
            m.task_id, m.round_id, m.robot_id = r.task_id, r.round, "/" + r.name
            src = self.obs[r.obs_k % len(self.obs)]
            o = m.observation
            o.header.stamp, o.timestep = stamp, r.timestep
            o.images, o.joint_state, o.instruction = src.images, src.joint_state, self.c.instruction
            self.newest.publish(m)

    def _on_fetch(self, request, response):
        r = self.by_task.get(request.task_id)
        if r is None or r.done:
            response.ok = False
            return response
        self.fill_observation(r, response.observation)
        response.ok = True
        return response

    def close(self) -> None:
        if not self.stats_dir:
            return
        for r in self.robots:
            r.acct.dump(os.path.join(self.stats_dir, f"{r.name}.json"),
                        {"finished_tasks": r.finished_tasks, "task_id": r.task_id, "tasks_continued": r.continued,
                         "light": True})


def main(argv=None, fleet_class=None, prog: str = "light_fleet", doc: str = __doc__) -> int:
    """One process hosting a fleet: `fleet_class` (LightFleetNode or a subclass) on one executor."""
    fleet_class = fleet_class or LightFleetNode
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--robots", type=int, required=True)
    ap.add_argument("--first-index", type=int, default=0)
    ap.add_argument("--params", help=f"ROS params file: its {fleet_class.config_section} section (default: the defaults)")
    ap.add_argument("--stats-dir", help="write each robot's account here on SIGINT")
    ap.add_argument("--refresh-topic", default="", help="publish waiting robots' newest observations here "
                    "(the server's refresh_topic) instead of serving srv/FetchObservation")
    ap.add_argument("--refresh-hz", type=float, default=4.0, help="per waiting robot, with --refresh-topic")
    ap.add_argument("--fault-drop", type=float, default=0.0, help="fraction of requests never sent and of replies "
                    "discarded, as if lost on the wire (live/fault.py)")
    ap.add_argument("--fault-seed", type=int, default=0, help="seed of --fault-drop's decisions")
    a, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

    from ..nodes.common import prepare_process, quiet_signals, restore_signals, stopped_by_signal

    prepare_process()
    rclpy.init(args=[sys.argv[0]] + rest)
    fleet = fleet_class([f"robot_{a.first_index + i}" for i in range(a.robots)], a.params, a.stats_dir,
                        refresh_topic=a.refresh_topic, refresh_hz=a.refresh_hz, fault_drop=a.fault_drop,
                        fault_seed=a.fault_seed)
    signal.signal(signal.SIGUSR1, lambda *_: setattr(fleet, "draining", True))
    ex = SingleThreadedExecutor()
    ex.add_node(fleet.node)
    try:
        ex.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception as e:  # noqa: BLE001 - the stop signal's KeyboardInterrupt wrapped by rclpy's C++
        if not stopped_by_signal(e):
            raise
    finally:
        before = quiet_signals()
        fleet.close()
        try:
            fleet.node.destroy_node()
            rclpy.try_shutdown()
        except Exception:
            pass
        restore_signals(before)
    return 0


if __name__ == "__main__":
    from ..nodes.common import exit_process

    exit_process(main())
