"""The robot side of asynchronous inference, for any robot that speaks standard topics.

Assembles observations from camera and joint-state topics (sensor-data QoS), executes the
queued actions at the control rate as commands (trajectory_msgs/JointTrajectory or a
std_msgs/Float64MultiArray position command), sends the next round when the actions left
fall to the trigger point, blends each new chunk into the queue at its timestep, holds
position (sends nothing, never runs past its chunk) while the next chunk is late and counts
that idle time, publishes execution progress, and serves FetchObservation so the server can
refresh a stale observation.

`--robots N` hosts N clients in one process (one executor), in namespaces
robot_0..robot_{N-1}, each node named robot_client with its own parameter and lifecycle
services (up to LEAN_ABOVE robots per process; past it only the first has them).

A lifecycle node (rclpy.lifecycle.LifecycleNode, through nodes/managed.py): configure reads
the parameters and makes the topics, the Infer client and (task_source `action`) the RunTask
action server; activate starts the control loop (with task_source `parameters` the tasks
start at once, as before lifecycle); deactivate ends the running task, drops its open
round's calls and holds position; cleanup frees it all.
`autostart` (default true) walks configure + activate at start.

Tasks as actions (action/RunTask.action, `~/run_task`, task_source `action`): the robot holds
until a goal comes; the goal's instruction, horizon policy, time limit and success condition
(core/task_success.py) are the task's; feedback at progress_hz; a cancel holds the robot.

Named joints: a chunk's joint_names are mapped onto /joint_states by name (a position command
is sent in /joint_states order); a chunk naming a joint the robot does not publish, or other
names than the task's earlier chunks, is refused (the task ends, the robot holds), never
executed on the wrong joints.

Parameters: the fields of RobotClientConfig, each a ROS parameter with its help as
description; a bad value prints the one line naming it and exits 2.

With `stats_file` set, each client keeps an account of its rounds (ClientAccount: every
request and every answer keyed by (task_id, round_id), chunk lateness, control-tick timing)
and writes it as JSON there on shutdown; "{robot}" in the path is replaced by the robot's
name (needed when a process hosts several robots).
"""
from __future__ import annotations

import argparse
import math
import signal
import sys
from dataclasses import dataclass

import numpy as np
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.task import Future
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..core.action_queue import AGGREGATES, ActionQueue
from ..core.robot_timing import OpenRound, trigger_actions
from ..core.task_success import SUCCESS_CONDITIONS, TaskView
from ..action import RunTask
from ..sim.simulator import task_type_of
from ..msg import ExecutionProgress
from ..srv import FetchObservation, Infer
from .common import (exit_process, NodeClock, NodeConfig, check, check_one_of, lean_node_kwargs, param,
                     ParamError, run_nodes, service_qos, to_ns, to_time)
from .managed import ManagedNode
from ..core.task_auth import read_key, task_mac
from .client_account import ClientAccount
from .convert import chunk_to_array
from ..config import check_image_transport
from ..transport.images import FrameEncoder
from .rtc_client import RtcAccount, fill_leftover


@dataclass(frozen=True)
class RobotClientConfig(NodeConfig):
    service: str = param("/robotserve/infer", "the srv/Infer service of the inference server")
    progress_topic: str = param("/robotserve/progress", "where execution progress is published")
    robot_name: str = param("", "the robot's name in task ids (default: the node's namespace, or its name)")
    control_hz: float = param(30.0, "control rate: actions executed per second, > 0")
    image_topics: tuple[str, ...] = param(("camera/image_raw",), "camera topics, one image each per observation")
    joint_topic: str = param("joint_states", "the robot's sensor_msgs/JointState topic")
    command_topic: str = param("command", "where actions are sent")
    command_type: str = param("trajectory", "trajectory (a one-point trajectory_msgs/JointTrajectory per tick), "
                              "trajectory_chunk (the queued actions as one multi-point JointTrajectory, re-sent "
                              "when a chunk is blended in: for a ros2_control JointTrajectoryController) or "
                              "position (std_msgs/Float64MultiArray per tick)")
    task_source: str = param("parameters", "parameters (tasks from instruction/task_actions/workload, started "
                             "on activation) or action (only RunTask goals on ~/run_task; holds in between)")
    # Not checked here: a policy registered on the server (register_horizon_policy) is unknown to this process.
    horizon_policy: str = param("confidence", "the execution horizon policy the server applies to our rounds")
    horizon_param: float = param(-1.0, "the horizon policy's knob (< 0: the server's default)")
    trigger_actions: int = param(-1, "send the next round when this many actions are left "
                                 "(< 0: from expected_latency_s and control_hz, core.robot_timing)")
    expected_latency_s: float = param(0.1, "expected round trip of a request, >= 0 (sets the trigger point)")
    aggregate: str = param("weighted_average", f"how a new chunk blends into queued actions: one of {', '.join(AGGREGATES)}")
    instruction: str = param("", "the language instruction sent with each observation")
    task_actions: int = param(300, "actions per task when no workload is replayed, > 0")
    # Trace replay: tasks drawn (seeded, per robot) from a built-in workload; each round asks
    # for the recorded horizon of `horizon_mode`.
    workload: str = param("", "a built-in workload whose tasks are replayed ('' = off)")
    horizon_mode: str = param("dynamic", "with workload: the recorded horizons to ask for, static or dynamic")
    mix_seed: int = param(0, "with workload: seed of the task draw")
    tasks: int = param(0, "tasks to run, >= 0 (0 = run forever)")
    # 100 robots x 5 Hz already swamped the server.
    progress_hz: float = param(2.0, "progress publication rate (liveness), > 0")
    # A safety net for answers that never come, not a latency bound: an overloaded machine
    # delivers replies seconds late, and a timed-out round's late answer is thrown away.
    request_timeout_s: float = param(30.0, "a round unanswered this long is reported overdue (still re-sent), > 0")
    # A reply lost on the way (an RMW drop, a server restart) must not freeze the robot: the
    # same (task, round) goes again; the server attaches it to the round it already holds or
    # answers it from its reply cache, and never generates a round twice.
    resend_after_s: float = param(0.0, "re-send an unanswered round after this many s, >= 0 "
                                       "(0: 20 x expected_latency_s, at least 2 s)")
    retry_s: float = param(0.2, "pause before resending after an error, > 0")
    stats_file: str = param("", "write the client's account here on shutdown; '{robot}' -> the robot's name; '' = off")
    image_transport: str = param("raw", "how camera frames go in srv/Infer: raw (sensor_msgs/Image as received), "
                                 "jpeg or png (sensor_msgs/CompressedImage, encoded here; docs/transport.md)")
    image_quality: int = param(90, "jpeg quality 1..100 (png: compression level 0..9)")
    rtc: bool = param(False, "real-time chunking: send the unexecuted leftover with each request and start each "
                              "chunk at the action d the server inpainted from (docs/rtc_serving.md)")
    task_key_file: str = param("", "this robot's task key, the file the server has as <robot id>.key in its "
                                   "task_auth.key_dir: requests and progress carry its HMAC; '' = unsigned")

    def check(self) -> None:
        from ..sim.workloads import builtin_names

        check_one_of("command_type", self.command_type, COMMAND_TYPES)
        check_one_of("task_source", self.task_source, ("parameters", "action"))
        check_one_of("aggregate", self.aggregate, AGGREGATES)
        check_image_transport(self.image_transport, self.image_quality)
        check_one_of("horizon_mode", self.horizon_mode, ("static", "dynamic"))
        if self.workload:
            check_one_of("workload", self.workload, builtin_names())
        check(self.horizon_policy != "", "horizon_policy", self.horizon_policy, "is empty")
        for name in ("control_hz", "task_actions", "progress_hz", "request_timeout_s", "retry_s"):
            check(getattr(self, name) > 0, name, getattr(self, name), "is not > 0")
        for name in ("expected_latency_s", "tasks", "resend_after_s"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "is not >= 0")


COMMAND_TYPES = ("trajectory", "trajectory_chunk", "position")


class RobotClientNode(ManagedNode):
    config_class = RobotClientConfig

    def __init__(self, name: str = "robot_client", namespace: str = "", **kw) -> None:
        super().__init__(name, namespace=namespace, **kw)
        self.acct = None
        self.task_k = 0  # kept across cleanup + configure: a task id is never sent twice
        self.autostart()

    def configure(self, c: RobotClientConfig) -> None:
        """Parameters read; topics, the Infer client and the RunTask action server made."""
        self.robot = c.robot_name or (self.get_namespace().strip("/") or self.get_name())
        # Whose tasks these are (diagnostics, and the server's key file: key_file_name); a
        # robot_name that is no ROS namespace is sent anonymous, or refused with a key.
        self.robot_id = "/" + self.robot if _is_namespace("/" + self.robot) else ""
        try:
            self.task_key = read_key(c.task_key_file) if c.task_key_file else None
        except (OSError, ValueError) as e:
            raise ParamError("task_key_file", str(e)) from None
        if self.task_key is not None and not self.robot_id:
            raise ParamError("robot_name", f"{self.robot!r} is not a ROS namespace: a signing robot needs one")
        self.hz = c.control_hz
        self.draining = False  # SIGUSR1: start no new round, see the open ones through (bench drain)
        self.trigger = c.trigger_actions if c.trigger_actions >= 0 else trigger_actions(c.expected_latency_s, self.hz)
        self.resend_after = c.resend_after_s or max(2.0, 20 * c.expected_latency_s)
        self.mix = None
        if c.workload:
            from ..sim.workloads import builtin_workload

            self.mix = builtin_workload(c.workload).tasks
        self.robot_index = int(self.robot.rsplit("_", 1)[1]) if self.robot.rsplit("_", 1)[-1].isdigit() else 0
        self.rounds: list = []
        self.clock = NodeClock(self)
        self.queue = ActionQueue(c.aggregate)
        self.acct = ClientAccount(self.robot, self.hz)
        self.rtc = RtcAccount() if c.rtc else None
        self.images = [None] * len(c.image_topics)
        self.encoder = FrameEncoder(c.image_transport, c.image_quality) if c.image_transport != "raw" else None
        self.joints: JointState | None = None
        for i, topic in enumerate(c.image_topics):
            self.create_subscription(Image, topic, lambda m, i=i: self._on_image(i, m), qos_profile_sensor_data)
        self.create_subscription(JointState, c.joint_topic, self._on_joints, qos_profile_sensor_data)
        msg_type = Float64MultiArray if c.command_type == "position" else JointTrajectory
        self.cmd = self.create_publisher(msg_type, c.command_topic, 10)
        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.progress = self.create_publisher(ExecutionProgress, c.progress_topic, reliable)
        self.fetch = self.create_service(FetchObservation, "~/fetch_observation", self._on_fetch)
        self.fetch_name = self.resolve_service_name("~/fetch_observation")  # the server needs it expanded
        self.cli = self.create_client(Infer, c.service, qos_profile=service_qos())
        self.finished_tasks = 0
        self.tasks_continued = 0
        self.fut, self.futs = None, []  # the latest call, and every call open for the current round
        self.goal, self.goal_end = None, None  # the running RunTask goal, and the future its execute awaits
        self.goals = 0
        self.logged: set = set()  # what was logged once (waiting, connected, each kind of error)
        self.connected = False
        self.waiting_since = None
        self.last_latency_s = 0.0
        self.task_id, self.done, self.task_start, self.chunk_names = f"{self.robot}/task0", True, None, None
        # Only where goals are taken: each action server is 3 services and 2 topics more for
        # the executor of a process hosting many robots (see LEAN_ABOVE).
        self.actions = ActionServer(self, RunTask, "~/run_task", self._run_task, goal_callback=self._on_goal,
                                    cancel_callback=lambda _goal: CancelResponse.ACCEPT) \
            if c.task_source == "action" else None
        self.loop = []

    def activate(self) -> None:
        c = self.config
        self.loop = [self.create_timer(1.0 / self.hz, self._tick),
                     self.create_timer(1.0 / c.progress_hz, self._publish_progress)]
        if c.task_source == "parameters":
            self._start_task()
        self.get_logger().info(f"active: {c.command_type} commands on {self.resolve_topic_name(c.command_topic)}, "
                               f"tasks from {c.task_source}" + (f" ({self.resolve_service_name('~/run_task')})"
                                                                if c.task_source == "action" else ""))

    def deactivate(self) -> None:
        """The robot holds position; the open round's calls are dropped; a running goal ends."""
        self._end_goal("deactivated", "the robot client was deactivated")
        self._hold()
        self.task_k += 1  # activated again, it starts a task the server has not seen
        for t in self.loop:
            self.destroy_timer(t)
        self.loop = []

    def cleanup(self) -> None:
        if self.actions is not None:
            self.actions.destroy()

    def _hold(self) -> None:
        """Stop commanding: queued actions dropped, open calls dropped, a controller's
        trajectory replaced by an empty one (a JointTrajectoryController then holds position)."""
        self.done = True
        self.outstanding = False
        self._drop_calls()
        self.queue.reset()
        if self.config.command_type == "trajectory_chunk" and self.context.ok():  # (not at process shutdown)
            self.cmd.publish(JointTrajectory())

    # --- task lifecycle -------------------------------------------------------------
    def _start_task(self, goal=None) -> None:
        c = self.config
        self.task_id = f"{self.robot}/task{self.task_k}"
        self.horizon = (c.horizon_policy, c.horizon_param >= 0, float(max(0.0, c.horizon_param)))
        self.budget = c.task_actions
        self.chunk_names, self.cmd_index = None, None
        if self.mix is not None:  # the same robot, seed and k pick the same task every run
            rng = np.random.default_rng([self.config.mix_seed, self.robot_index, self.task_k])
            spec = self.mix[int(rng.integers(len(self.mix)))]
            self.rounds = list(spec.rounds[self.config.horizon_mode])
            self.instruction = task_type_of(spec.id)  # what the robot is asked to do: its task's type
            self.cum_rounds = np.concatenate([[0], np.cumsum(self.rounds)[:-1]])  # first action of each round
        elif goal is not None:  # the task is the goal's
            self.rounds = []
            self.instruction = goal.instruction
            if goal.has_horizon:
                self.horizon = (goal.horizon.name, goal.horizon.has_param, float(goal.horizon.param))
            self.budget = int(goal.max_actions) or c.task_actions
        else:
            self.instruction = c.instruction
        self.round = 0
        self.outstanding = False
        self.open_round = OpenRound()
        self.retry_at = 0.0
        self.queue.reset()
        self.task_start = None
        self.exec_start = self.clock.now()
        self.idle = 0.0
        self.chunks = 0
        self.done = False

    def _continue_task(self) -> None:
        """The server no longer knows the task (it restarted, or reaped it): the motion goes on
        under a new task id from round 0, the queued actions kept; counted."""
        self.task_k += 1
        self.task_id = f"{self.robot}/task{self.task_k}"
        self.round = 0
        self.outstanding = False
        self.open_round = OpenRound()
        self.tasks_continued += 1

    def _task_actions(self) -> int:
        # A replayed task is its motion: done when the trace's actions are executed, however
        # many rounds that takes (actions that went stale during generation are not motion).
        return sum(self.rounds) if self.rounds else self.budget

    def _task_complete(self) -> bool:
        return self.queue.timestep >= self._task_actions()

    def _needs_more(self) -> bool:
        return self.queue.timestep + len(self.queue) < self._task_actions()

    # --- sensors ----------------------------------------------------------------------
    def _on_image(self, i: int, m: Image) -> None:
        self.images[i] = m

    def _on_joints(self, m: JointState) -> None:
        self.joints = m

    def _sensors_ready(self) -> bool:
        return self.joints is not None and all(im is not None for im in self.images)

    def _fill_observation(self, obs) -> None:
        obs.header.stamp = to_time(self.clock.now())
        obs.timestep = self.queue.timestep
        obs.images = list(self.images)  # forwarded as received: no copy, no re-encode
        obs.joint_state = self.joints
        obs.instruction = self.instruction

    # --- control loop -------------------------------------------------------------------
    def _tick(self) -> None:
        if self.goal is not None:
            self._check_goal()
        if self.done:
            return
        a = self.queue.pop()
        self.acct.tick(a is not None, self.task_start is not None)
        if a is None:
            if self.task_start is not None:
                self.idle += 1.0 / self.hz  # holding position: the chunk is late
        else:
            self._command(a)
        if self._task_complete():
            self._finish()
            return
        self._check_timeout()
        # Draining starts no new round, but a re-send that could not go out yet (service not
        # ready, a retry pause) is still the open round's and goes when it can.
        if not self.outstanding and (self.open_round.resending or not self.draining) and len(self.queue) <= self.trigger \
                and self._needs_more():
            self._send()

    def _command(self, a: np.ndarray) -> None:
        kind = self.config.command_type
        if kind == "trajectory_chunk":
            return  # the controller executes the trajectory sent with the chunk (_send_trajectory)
        if kind == "trajectory":
            m = JointTrajectory()
            m.joint_names = self._command_names(len(a))
            pt = JointTrajectoryPoint(positions=[float(x) for x in a[: len(m.joint_names) or len(a)]])
            pt.time_from_start.nanosec = int(1e9 / self.hz)
            m.points = [pt]
        else:  # by name when the chunk names its columns: in /joint_states order
            m = Float64MultiArray(data=[float(x) for x in (a[self.cmd_index] if self.cmd_index is not None else a)])
        self.cmd.publish(m)

    def _command_names(self, n: int) -> list:
        if self.chunk_names is not None:
            return list(self.chunk_names)
        return list(self.joints.name)[:n] if self.joints is not None else []  # unnamed chunk: by position

    def _send_trajectory(self) -> None:
        """trajectory_chunk: everything queued as one JointTrajectory, point i due (i+1) ticks from now."""
        q = self.queue.queued()
        if not q:
            return
        m = JointTrajectory()
        m.header.stamp = to_time(self.clock.now())
        m.joint_names = self._command_names(len(q[0]))
        for i, a in enumerate(q):
            pt = JointTrajectoryPoint(positions=[float(x) for x in a])
            ns = int(round((i + 1) * 1e9 / self.hz))
            pt.time_from_start.sec, pt.time_from_start.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
            m.points.append(pt)
        self.cmd.publish(m)

    def _map_joints(self, names: list) -> str:
        """Map a chunk's joint names onto the robot's; '' when they map, else why not."""
        if self.chunk_names is not None and names != self.chunk_names:
            return f"joint names {names} differ from this task's earlier chunks' {self.chunk_names}"
        have = list(self.joints.name) if self.joints is not None else []
        missing = [n for n in names if n not in have]
        if missing or len(set(names)) != len(names):
            return (f"joint names {missing} are not in {self.config.joint_topic} ({have})" if missing
                    else f"joint names {names} repeat a joint")
        self.chunk_names = list(names)
        self.cmd_index = np.array([names.index(n) for n in have if n in names])
        return ""
    def _send(self) -> None:
        now = self.clock.now()
        if now < self.retry_at or not self._service_ready(now) or not self._sensors_ready():
            return
        r = Infer.Request()
        r.task_id, r.round_id = self.task_id, self.round
        self._fill_observation(r.observation)
        if self.encoder is not None:  # the cameras as JPEG/PNG instead (the refresh service still sends raw)
            r.compressed_images, r.observation.images = self.encoder.encode(r.observation.images), []
        r.has_exec_info = self.round > 0
        r.exec_info.exec_start = to_time(self.exec_start)
        r.exec_info.actions_left = len(self.queue)
        r.exec_info.control_hz = float(self.hz)
        if self.rounds:  # trace replay: the recorded round where the new motion starts
            # New motion begins where the queue ends; the chunk's first len(queue) rows
            # overlap queued actions (blended, or stale by arrival), then H_k new ones follow.
            k = int(np.searchsorted(self.cum_rounds, self.queue.timestep + len(self.queue), side="right")) - 1
            k = min(max(k, 0), len(self.rounds) - 1)
            r.horizon.name, r.horizon.has_param = "static", True
            r.horizon.param = float(len(self.queue) + self.rounds[k])
            r.remaining_rounds = len(self.rounds) - k
        else:
            r.horizon.name, r.horizon.has_param, r.horizon.param = self.horizon
        r.refresh_service = self.fetch_name
        if self.rtc is not None:
            fill_leftover(r, self.queue.queued())
        r.robot_id = self.robot_id
        if self.task_key is not None:
            r.auth_stamp = to_time(now)
            r.auth_mac = task_mac(self.task_key, r.task_id, r.round_id, to_ns(r.auth_stamp))
        if self.task_start is None:
            self.task_start = now
        self.outstanding = True
        self.open_round.sent(now)
        task, rnd = self.task_id, self.round
        self.acct.on_send((task, rnd))
        self.fut = self.cli.call_async(r)
        self.futs.append(self.fut)
        self.fut.add_done_callback(lambda f: self._on_reply(task, f, rnd))

    def _check_timeout(self) -> None:
        """An answer that never comes must not freeze the robot: after the resend interval
        (doubling per re-send) the same round goes again, so a lost reply is recovered; after
        request_timeout_s the round is reported overdue (counted as a timeout) and still re-sent
        -- never given up (core/robot_timing.py says why)."""
        if not self.outstanding:
            return
        act = self.open_round.check(self.clock.now(), self.resend_after, self.config.request_timeout_s)
        if act == "resend":
            # The earlier call stays open: on a loaded robot its reply may only be late in our
            # own executor, and dropping it here would drop every reply slower than
            # resend_after (a livelock at 100 robots on 2 cores). Whichever answer comes first
            # is used; the server never generates the round twice.
            self.outstanding = False
            self._send()
            return
        if act == "overdue":
            self.acct.errors["timeout"] += 1
            self._log_once("timeout", f"{self.task_id} round {self.round}: no answer in {self.config.request_timeout_s} s; "
                                      "still re-sending (logged once; counted in the account)")

    def _drop_calls(self) -> None:
        """The calls still open for the current round are no longer wanted."""
        for f in self.futs:
            if not f.done():
                self.cli.remove_pending_request(f)
        self.futs = []

    def _on_reply(self, task: str, fut, rnd: int = -1) -> None:
        resp = fut.result()
        if (task, rnd) == (self.task_id, self.round) and fut is not self.fut and resp is not None \
                and resp.status.reason == "duplicate_request":
            return  # an earlier call of the round we sent again: the newer call gets the answer
        reply_ms = self.acct.on_answer((task, rnd), resp)
        if resp is not None and math.isfinite(reply_ms):
            self.last_latency_s = reply_ms / 1000
        if task != self.task_id or rnd != self.round:
            self.acct.left_task_answers += 1
            return  # an answer for a task we left, or a round we gave up on
        self.outstanding = False
        self._drop_calls()
        if resp is None:
            self.retry_at = self.clock.now() + self.config.retry_s
            return
        if resp.status.code != 0:
            self._log_once(resp.status.reason, f"{self.task_id} round {self.round}: {resp.status.reason}: "
                                               f"{resp.status.message} (each kind logged once; counted in the account)")
            self.retry_at = self.clock.now() + self.config.retry_s
            if resp.status.reason in ("unknown_task", "task_dropped"):
                self._continue_task()  # the server forgot us (restarted, or reaped the task)
            return
        why = self._map_joints(list(resp.chunk.joint_names)) if resp.chunk.joint_names else ""
        if why:  # never executed on the wrong joints: the task ends and the robot holds
            self.acct.errors["unmapped_joints"] += 1
            self._log_once("unmapped_joints", f"{self.task_id} round {self.round}: chunk refused: {why}; holding",
                           error=True)
            self._end_goal("aborted", f"chunk refused: {why}")
            self._hold()
            return
        if self.rtc is not None:  # from action d on, under RTC
            self.rtc.place(self.queue, resp.chunk, chunk_to_array(resp.chunk))
        else:
            self.queue.merge(resp.chunk.first_timestep, chunk_to_array(resp.chunk))
        if self.config.command_type == "trajectory_chunk":
            self._send_trajectory()
        self.acct.on_chunk_used((task, rnd), reply_ms, len(self.queue))
        self.exec_start = self.clock.now()  # this round's execution phase starts with its chunk
        self.chunks += 1
        self.round += 1

    def _finish(self) -> None:
        self.done = True
        self.finished_tasks += 1
        self._publish_progress(task_done=True)
        if self.goal is not None:
            hook = self.goal.request.success_condition
            self._end_goal(*(("succeeded", "the action budget is executed") if not hook else
                             ("aborted", f"the action budget is spent before {hook!r} held")))
            return
        if self.config.task_source == "action":
            return
        if self.config.tasks == 0 or self.finished_tasks < self.config.tasks:
            self.task_k += 1
            self._start_task()

    # --- progress and refresh -------------------------------------------------------------
    def _publish_progress(self, task_done: bool = False) -> None:
        if self.task_start is None:  # no round sent yet: a goal hears what it waits for
            if self.goal is not None:
                self._goal_feedback()
            return
        m = ExecutionProgress()
        m.header.stamp = to_time(self.clock.now())
        m.task_id = self.task_id
        m.task_start = to_time(self.task_start)
        m.round_id = max(0, self.round - 1)
        m.timestep = self.queue.timestep
        m.actions_left = len(self.queue)
        m.exec_start = to_time(self.exec_start)
        m.control_hz = float(self.hz)
        m.idle_s = self.idle
        m.chunks = self.chunks
        m.task_done = task_done
        m.robot_id = self.robot_id
        if self.task_key is not None:
            m.auth_mac = task_mac(self.task_key, m.task_id, m.round_id, to_ns(m.header.stamp))
        self.progress.publish(m)
        if self.goal is not None and not task_done:
            self._goal_feedback()

    def _goal_feedback(self) -> None:
        self.goal.publish_feedback(RunTask.Feedback(
            task_id=self.task_id, round=self.chunks, actions_executed=self.queue.timestep, idle_s=self.idle,
            last_latency_s=self.last_latency_s, status=self._waiting_for() or "running"))

    def _waiting_for(self) -> str:
        """What keeps the task from its next round, for a human ('' when nothing does)."""
        if not self.cli.service_is_ready():
            return (f"waiting for {self.cli.srv_name}: no inference server offers it (not started, or not "
                    "configured and active)")
        if not self._sensors_ready():
            c = self.config
            missing = [t for t, im in zip(c.image_topics, self.images) if im is None]
            missing += [c.joint_topic] if self.joints is None else []
            return f"waiting for the robot's sensors: nothing yet on {', '.join(missing)}"
        return ""

    def _on_fetch(self, request, response):
        if request.task_id != self.task_id or not self._sensors_ready():
            response.ok = False
            return response
        self._fill_observation(response.observation)
        response.ok = True
        return response

    def drain(self) -> None:
        """Start no new round; the open one is still re-sent until answered or given up. A
        benchmark drains its robots before it stops them, so an unanswered round at the stop
        is one that was lost, not one that was merely in flight."""
        self.draining = True

    # --- tasks as actions (action/RunTask) ------------------------------------------------
    async def _run_task(self, gh):
        """A goal: checked, run as the robot's task until it ends (_end_goal), answered."""
        started = self.clock.now()
        why = self._goal_error(gh.request)
        if why:
            self.acct.errors["goal_rejected"] += 1
            self._log_once("goal_rejected", f"RunTask goal refused: {why}")
            gh.abort()
            return RunTask.Result(outcome="rejected", message=why)
        self.goal, self.goal_end, self.goal_started = gh, Future(), started
        self.task_k += self.goals > 0  # a task id is never used twice, however the last one ended
        self.goals += 1
        self._start_task(goal=gh.request)
        self.get_logger().info(f"task {self.task_id}: {gh.request.instruction!r}")
        outcome, message = await self.goal_end
        self.goal = None
        res = RunTask.Result(outcome=outcome, message=message, task_id=self.task_id, rounds=self.chunks,
                             actions_executed=self.executed,
                             idle_s=self.idle, elapsed_s=self.clock.now() - started)
        {"succeeded": gh.succeed, "canceled": gh.canceled}.get(outcome, gh.abort)()
        self.get_logger().info(f"task {self.task_id} {outcome}: {message}")
        return res

    def _on_goal(self, g) -> "GoalResponse":
        """The goal response: a goal that is bad in itself (an unknown success condition, a
        negative time limit, a horizon without a name) is rejected here, counted and logged;
        one this robot cannot take now (inactive, busy) is accepted and answered `rejected`
        with why, in its result."""
        why = self._bad_goal(g)
        if why:
            self.acct.errors["goal_rejected"] += 1
            self.get_logger().warning(f"RunTask goal rejected: {why}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _bad_goal(self, g) -> str:
        if not math.isfinite(g.time_limit_s) or g.time_limit_s < 0:
            return f"time_limit_s {g.time_limit_s} is not >= 0"
        if g.success_condition and g.success_condition not in SUCCESS_CONDITIONS:
            return f"success_condition {g.success_condition!r} is not one of {', '.join(SUCCESS_CONDITIONS.names())}"
        if g.has_horizon and not g.horizon.name:
            return "horizon.name is empty"
        return ""

    def _goal_error(self, g) -> str:
        if self.state() != "active":
            return f"the robot client is {self.state()}, not active"
        if self.goal is not None:
            return f"task {self.task_id} is running: cancel it first"
        return self._bad_goal(g)

    def _check_goal(self) -> None:
        """Each tick of a goal's task: cancel, time limit, success condition."""
        g, now = self.goal.request, self.clock.now()
        elapsed = now - self.goal_started
        if self.goal.is_cancel_requested:
            self._end_goal("canceled", "canceled by the sender; the robot holds")
        elif g.time_limit_s > 0 and now - self.goal_started >= g.time_limit_s:
            self._end_goal("time_limit", f"{g.time_limit_s} s passed; the robot holds")
        elif g.success_condition and SUCCESS_CONDITIONS.create(g.success_condition)(TaskView(
                self.queue.timestep, self._task_actions(), elapsed, self.chunks,
                list(self.joints.position) if self.joints is not None else None)):
            self._end_goal("succeeded", f"{g.success_condition} held")
            self.finished_tasks += 1
            self._publish_progress(task_done=True)
        else:
            return
        self._hold()

    def _end_goal(self, outcome: str, message: str) -> None:
        if self.goal_end is not None and not self.goal_end.done():
            self.executed = self.queue.timestep  # before the hold resets the queue
            self.goal_end.set_result((outcome, message))

    # --- logging ----------------------------------------------------------------------
    def _service_ready(self, now: float) -> bool:
        """Log waiting for the server (after a second), connected, and a lost server, once each time."""
        ready = self.cli.service_is_ready()
        if ready and not self.connected:
            self.get_logger().info(f"connected to {self.cli.srv_name}")
        elif not ready and self.connected:
            self.get_logger().warning(f"lost {self.cli.srv_name}; holding until it is back")
            self.waiting_since = now
        elif not ready and self.waiting_since is None:
            self.waiting_since = now
        elif not ready and now - self.waiting_since >= 1.0 and "waiting" not in self.logged:
            self.logged.add("waiting")
            self.get_logger().info(f"waiting for {self.cli.srv_name} (is the inference server up?)")
        if ready:
            self.logged.discard("waiting")
        self.connected = ready
        return ready

    def _log_once(self, kind: str, message: str, error: bool = False) -> None:
        if kind not in self.logged:
            self.logged.add(kind)
            if error:  # one call site per severity: rclpy refuses to change it at one
                self.get_logger().error(message)
            else:
                self.get_logger().warning(message)

    def close(self) -> None:
        """run_nodes calls this on shutdown: write the account, if asked for; leave the lifecycle."""
        if self.acct is not None and self.config.stats_file:
            self.acct.dump(self.config.stats_file.replace("{robot}", self.robot),
                           {"finished_tasks": self.finished_tasks, "task_id": self.task_id,
                            "tasks_continued": self.tasks_continued,
                            **({"rtc": self.rtc.snapshot()} if self.rtc is not None else {})})
        super().close()


def _is_namespace(ns: str) -> bool:
    from rclpy.validate_namespace import validate_namespace

    try:
        return bool(validate_namespace(ns))
    except Exception:  # rclpy's InvalidNamespaceException
        return False


# A process hosting many robots spends most of its executor's time rebuilding the wait set
# over every node's services (py-spy: 70 % of a 25-robot client with parameter services on
# each); a lifecycle node adds 5 more. Fleets of light robots per process (the live benches)
# stay lean past this many.
LEAN_ABOVE = 8


def main(argv=None) -> int:
    argv = list(sys.argv if argv is None else argv)
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--robots", type=int, default=0)
    ap.add_argument("--first-index", type=int, default=0)
    ns, rest = ap.parse_known_args(argv[1:])
    nodes: list = []

    def make(names=None):
        if names:  # past LEAN_ABOVE robots, only the first keeps its parameter and lifecycle services
            lean = len(names) > LEAN_ABOVE
            nodes.extend(RobotClientNode(namespace=n, **(lean_node_kwargs({"lean": True}) if lean and i else {}))
                         for i, n in enumerate(names))
        else:
            nodes.append(RobotClientNode())
        return nodes

    signal.signal(signal.SIGUSR1, lambda *_: [n.drain() for n in nodes])
    names = [f"robot_{ns.first_index + i}" for i in range(ns.robots)] if ns.robots > 0 else None
    return run_nodes(lambda: make(names), [argv[0]] + rest)


if __name__ == "__main__":
    exit_process(main())
