"""The robot side of asynchronous inference, for any robot that speaks standard topics.

Assembles observations from camera and joint-state topics (sensor-data QoS; robot_sensors.py), executes the
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

Tasks as actions (action/RunTask.action, `~/run_task`, task_source `action`; robot_goals.py): the robot holds
until a goal comes; the goal's instruction, horizon policy, time limit and success condition
(core/task_success.py) are the task's; feedback at progress_hz; a cancel holds the robot.

Named joints (robot_commands.py): a chunk's joint_names are mapped onto /joint_states by name (a position command
is sent in /joint_states order); a chunk naming a joint the robot does not publish, or other
names than the task's earlier chunks, is refused (the task ends, the robot holds), never
executed on the wrong joints.

Parameters: the fields of RobotClientConfig (robot_client_config.py), each a ROS parameter with its help as
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

import numpy as np
from rclpy.action import ActionServer, CancelResponse
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from ..core.action_queue import ActionQueue
from ..core.robot_loop import loop_fields, RobotLoop, trigger_actions
from ..action import RunTask
from ..sim.simulator import task_type_of
from ..msg import ExecutionProgress
from ..srv import FetchObservation, Infer
from .common import (exit_process, NodeClock, lean_node_kwargs, ParamError, queue_hint, run_nodes, service_qos, sign,
                     Stamps, to_time)
from .managed import ManagedNode
from ..core.task_auth import read_key
from .client_account import ClientAccount
from .convert import chunk_to_array, is_namespace
from .interface_check import waiting_for
from ..transport.images import FrameEncoder
from .robot_client_config import COMMAND_TYPES, RobotClientConfig  # noqa: F401  (imported from here)
from .robot_commands import JointCommands
from .robot_goals import RunTaskGoals
from .robot_sensors import RobotSensors
from ..core.rtc_account import RtcAccount


class RobotClientNode(RobotSensors, JointCommands, RunTaskGoals, ManagedNode):
    config_class = RobotClientConfig

    def __init__(self, name: str = "robot_client", namespace: str = "", **kw) -> None:
        super().__init__(name, namespace=namespace, **kw)
        self.acct = None
        self.robot_loop = None  # core/robot_loop.py: timing, re-send and task bookkeeping (configure)
        self.autostart()

    def configure(self, c: RobotClientConfig) -> None:
        """Parameters read; topics, the Infer client and the RunTask action server made."""
        self.robot = c.robot_name or (self.get_namespace().strip("/") or self.get_name())
        # Whose tasks these are (diagnostics, and the server's key file: key_file_name); a
        # robot_name that is no ROS namespace is sent anonymous, or refused with a key.
        self.robot_id = "/" + self.robot if is_namespace("/" + self.robot) else ""
        try:
            self.task_key, self.stamps = (read_key(c.task_key_file) if c.task_key_file else None), Stamps()
        except (OSError, ValueError) as e:
            raise ParamError("task_key_file", str(e)) from None
        if self.task_key is not None and not self.robot_id:
            raise ParamError("robot_name", f"{self.robot!r} is not a ROS namespace: a signing robot needs one")
        self.hz = c.control_hz
        self.draining = False  # SIGUSR1: start no new round, see the open ones through (bench drain)
        self.trigger = c.trigger_actions if c.trigger_actions >= 0 else trigger_actions(c.expected_latency_s, self.hz)
        self.resend_after = c.first_resend_s
        k = self.robot_loop.task_k if self.robot_loop is not None else 0  # a task id is never sent twice
        self.robot_loop = RobotLoop(self.robot, self.hz, self.trigger, resend_after_s=self.resend_after,
                                    request_timeout_s=c.request_timeout_s, retry_s=c.retry_s,
                                    hint=queue_hint(self, c.queue_topic))  # the server's queue wait
        self.robot_loop.task_k, self.robot_loop.done = k, True  # no task until one starts
        self.hooks = _ClientHooks(self)
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
        self.fut, self.futs = None, []  # the latest call, and every call open for the current round
        self.goal, self.goal_end = None, None  # the running RunTask goal, and the future its execute awaits
        self.goals = 0
        self.logged: set = set()  # what was logged once (waiting, connected, each kind of error)
        self.connected = False
        self.waiting_since = None
        self.last_latency_s = 0.0
        self.chunk_names = None
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
        self.queue.reset()
        self.robot_loop.start_task(self.clock.now())

    def _task_actions(self) -> int:
        # A replayed task is its motion: done when the trace's actions are executed, however
        # many rounds that takes (actions that went stale during generation are not motion).
        return sum(self.rounds) if self.rounds else self.budget

    def _task_complete(self) -> bool:
        return self.queue.timestep >= self._task_actions()

    def _needs_more(self) -> bool:
        return self.queue.timestep + len(self.queue) < self._task_actions()

    # --- control loop -------------------------------------------------------------------
    def _execute(self) -> bool:
        """One control tick's action, commanded (False: none queued, the robot holds position)."""
        a = self.queue.pop()
        if a is not None:
            self._command(a)
        return a is not None

    def _tick(self) -> None:
        """The robot loop's tick (core/robot_loop.py: trigger point, hold, re-send, overdue); a
        send waits for the server and the sensors; draining starts no new round, a due re-send
        still goes."""
        if self.goal is not None:
            self._check_goal()
        if self.done:
            return
        now = self.clock.now()
        commanded, event = self.robot_loop.tick(now, self.hooks, lambda: self._service_ready(now) and self._sensors_ready(),
                                                self.draining)
        self.acct.tick(commanded, self.task_start is not None)
        if event == "finished":
            self._finish()
        elif event == "overdue":
            self.acct.errors["timeout"] += 1
            self._log_once("timeout", f"{self.task_id} round {self.round}: no answer in {self.config.request_timeout_s} s; "
                                      "still re-sending (logged once; counted in the account)")
        elif event == "send":
            self._send(now)

    def _send(self, now: float) -> None:
        r = self._infer_request(now)
        self.robot_loop.sent(now)
        task, rnd = self.task_id, self.round
        self.acct.on_send((task, rnd))
        self.fut = self.cli.call_async(r)
        self.futs.append(self.fut)
        self.fut.add_done_callback(lambda f: self._on_reply(task, f, rnd))

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
            self.robot_loop.heard_queued()  # its first call got through: the wait may be learnt from it
            return  # an earlier call of the round we sent again: the newer call gets the answer
        reply_ms = self.acct.on_answer((task, rnd), resp)
        if resp is not None and math.isfinite(reply_ms):
            self.last_latency_s = reply_ms / 1000
        if task != self.task_id or rnd != self.round:
            self.acct.left_task_answers += 1
            return  # an answer for a task we left, or a round we gave up on
        self._drop_calls()
        now = self.clock.now()
        if resp is None:
            self.robot_loop.refused(now)  # asked again after retry_s
            return
        if resp.status.code != 0:
            self._log_once(resp.status.reason, f"{self.task_id} round {self.round}: {resp.status.reason}: "
                                               f"{resp.status.message} (each kind logged once; counted in the account)")
            self.robot_loop.refused(now, resp.status.reason)  # overloaded: asked again later each time in a row
            if resp.status.reason in ("unknown_task", "task_dropped"):
                # The server forgot us (restarted, or reaped the task): the motion goes on under
                # a new task id from round 0, the queued actions kept; counted.
                self.robot_loop.restart(now)
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
        self.robot_loop.answered(now)  # a new execution phase; the re-send interval learns the wait

    def _finish(self) -> None:
        """The task is over (the robot loop marked it done and counted it)."""
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

    # --- progress -------------------------------------------------------------------------
    def _publish_progress(self, task_done: bool = False) -> None:
        if self.task_start is None:  # no round sent yet: a goal hears what it waits for
            if self.goal is not None:
                self._goal_feedback()
            return
        m = ExecutionProgress()
        m.header.stamp = self.stamps(self.clock.now())  # signed: a sequence, so never the same twice
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
            sign(m, self.task_key, "progress")
        self.progress.publish(m)
        if self.goal is not None and not task_done:
            self._goal_feedback()

    def drain(self) -> None:
        """Start no new round; the open one is still re-sent until answered or given up. A
        benchmark drains its robots before it stops them, so an unanswered round at the stop
        is one that was lost, not one that was merely in flight."""
        self.draining = True

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
            line, foreign = waiting_for(self, self.cli.service_name)  # absent, or built from other msg/srv
            (self.get_logger().error if foreign else self.get_logger().info)(line)
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


class _ClientHooks:
    """The robot client's RobotHooks (core/robot_loop.py): its action queue and task."""

    __slots__ = ("node",)

    def __init__(self, node: RobotClientNode) -> None:
        self.node = node

    def execute(self) -> bool:
        return self.node._execute()

    def left(self) -> int:
        return len(self.node.queue)

    def task_over(self) -> bool:
        return self.node._task_complete()

    def needs_more(self) -> bool:
        return self.node._needs_more()


# The robot loop's state, read and written as the node's own (the mixins and progress use it).
loop_fields(RobotClientNode, ("task_k", "task_id", "round", "outstanding", "open_round", "retry_at", "task_start",
                              "exec_start", "idle", "chunks", "done", "finished_tasks"), attr="robot_loop",
            renamed={"tasks_continued": "continued"})


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
