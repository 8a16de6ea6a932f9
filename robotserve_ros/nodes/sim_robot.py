"""A simulated robot as a ROS 2 node: an SO-101-like arm or a drone, with a camera.

    python -m robotserve_ros.nodes.sim_robot [--robots N] [--first-index K]
        [--name-prefix robot_] [--lean auto|on|off] [--ros-args ...]

Publishes (relative names, so a namespace such as /robot_3 prefixes them):
  joint_states       sensor_msgs/JointState   at joint_state_hz, stamped with the node clock
  camera/image_raw   sensor_msgs/Image rgb8   at camera_hz (0 turns the camera off),
                                              header.stamp = capture time, frame_id "camera"
  /clock             rosgraph_msgs/Clock      only with publish_clock:=true
Subscribes:
  command            trajectory_msgs/JointTrajectory (command_type "trajectory": the
                     positions matched by joint_names, unknown names ignored; several points
                     are followed in time, each the target from the previous one's
                     time_from_start on, as a JointTrajectoryController would; an empty
                     one holds where the robot is) or
                     std_msgs/Float64MultiArray (command_type "position": one value per
                     joint, in JointState.name order)

Time. Physics advances by the elapsed time of the process's time line, stepped lazily
(just before each publication and each command; the kinematics make that exact):
  * default: the node clock on the system clock;
  * use_sim_time:=true: the node clock follows /clock published by someone else; a paused
    /clock pauses the robot and its publications (sensor rates are in simulated seconds);
  * publish_clock:=true: the process owns simulated time. It starts at 0, advances by
    clock_rate x wall time (clock_rate may be changed at run time, 0 pauses) and is
    published on /clock; use_sim_time is set on the (first) node, whose clock follows it.
Only public rclpy is used for this: the use_sim_time parameter, Node.get_clock(), timers.

--robots N hosts N robots in one process: nodes "sim_robot" in namespaces
{prefix}{K}..{prefix}{K+N-1} (default robot_0..), spun by one executor and driven by one
shared timer; robot i uses seed + K + i. Parameters given with -p or a params file apply
to every robot ("/robot_3/sim_robot:" sections address one). In that mode every robot
runs on the first robot's node clock (the other nodes are made with use_sim_time false,
so the process holds one /clock subscription), and (--lean auto) the other robots' nodes
are lean: no parameter or type-description services and no QoS-event handlers, which
cuts the executor's per-wake work (measured: 50 idle robots took 34% of a core without
it, 12.5% with it).

Parameters: the fields of SimRobotConfig, validated at start; a bad value prints the one
line naming the parameter and exits with status 2. SIGINT or SIGTERM shut down cleanly
with status 0.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence

from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from robotserve_ros.nodes.common import (exit_process, NodeConfig, ParamError, check, check_one_of, declare_config, lean_node_kwargs, node_options,
                                        param, run_nodes)
from robotserve_ros.sim.robots import ROBOT_TYPES, SimRobot, make_robot, render

NODE_NAME = "sim_robot"
COMMAND_TYPES = ("trajectory", "position")
EXIT_BAD_PARAMETER = 2
_NS = 1_000_000_000
_MAX_HZ = 1000.0


@dataclass(frozen=True)
class SimRobotConfig(NodeConfig):
    robot_type: str = param("so101", f"which robot: one of {', '.join(ROBOT_TYPES)}")
    joint_state_hz: float = param(30.0, f"JointState publication rate (Hz of the node clock), in (0, {_MAX_HZ:g}]")
    camera_hz: float = param(15.0, f"camera image rate (Hz of the node clock), in [0, {_MAX_HZ:g}]; 0 turns the camera off")
    image_width: int = param(96, "camera image width in pixels (8..4096)")
    image_height: int = param(96, "camera image height in pixels (8..4096)")
    command_type: str = param("trajectory", f"message type on 'command': one of {', '.join(COMMAND_TYPES)}")
    max_joint_speed: float = param(2.0, "max joint speed (rad/s) of the arm; max linear speed (m/s) of the drone; "
                                   "in (0, 100]")
    seed: int = param(0, "random seed (cube placement), >= 0; robot i of a multi-robot process uses seed + i")
    publish_clock: bool = param(False, "own simulated time: publish /clock and step physics on it")
    clock_rate: float = param(1.0, "simulated seconds per wall second with publish_clock, in [0, 1000] "
                              "(0 pauses; settable at run time)", runtime=True)

    def check(self) -> None:
        check_one_of("robot_type", self.robot_type, ROBOT_TYPES)
        check_one_of("command_type", self.command_type, COMMAND_TYPES)
        check(0.0 < self.joint_state_hz <= _MAX_HZ, "joint_state_hz", self.joint_state_hz, f"is not in (0, {_MAX_HZ:g}]")
        check(0.0 <= self.camera_hz <= _MAX_HZ, "camera_hz", self.camera_hz, f"is not in [0, {_MAX_HZ:g}] (0 = no camera)")
        for name in ("image_width", "image_height"):
            check(8 <= getattr(self, name) <= 4096, name, getattr(self, name), "is not in [8, 4096]")
        check(0.0 < self.max_joint_speed <= 100.0, "max_joint_speed", self.max_joint_speed, "is not in (0, 100]")
        check(self.seed >= 0, "seed", self.seed, "is not >= 0")
        check(0.0 <= self.clock_rate <= 1000.0, "clock_rate", self.clock_rate, "is not in [0, 1000]")


def _stamp(msg_stamp, now_ns: int) -> None:
    msg_stamp.sec, msg_stamp.nanosec = divmod(now_ns, _NS)


class SimRobotNode(Node):
    """One simulated robot (SimArm or SimDrone) with its joint states, camera and command.

    With drive=True (the default) the node drives itself with its own SimDriver; a process
    hosting many robots builds them with drive=False and one SimDriver for all.
    """

    def __init__(self, node_name: str = NODE_NAME, *, namespace: Optional[str] = None,
                 seed_offset: int = 0, drive: bool = True, lean: bool = False, **node_kwargs: Any) -> None:
        if lean:
            node_kwargs = lean_node_kwargs(node_kwargs)
        super().__init__(node_name, namespace=namespace, **node_options(node_kwargs))
        self.lean = lean
        events = dict(event_callbacks=PublisherEventCallbacks(use_default_callbacks=False)) if lean else {}
        sub_events = dict(event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False)) if lean else {}
        self.config = cfg = declare_config(self, SimRobotConfig)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.robot: SimRobot = make_robot(cfg.robot_type, max_speed=cfg.max_joint_speed,
                                          seed=cfg.seed + seed_offset)

        self.joint_state_pub = self.create_publisher(JointState, "joint_states", qos_profile_sensor_data,
                                                    **events)
        self.image_pub = (self.create_publisher(Image, "camera/image_raw", qos_profile_sensor_data, **events)
                          if cfg.camera_hz > 0 else None)
        if cfg.command_type == "trajectory":
            self.command_sub = self.create_subscription(JointTrajectory, "command", self._on_trajectory, 10,
                                                        **sub_events)
        else:
            self.command_sub = self.create_subscription(Float64MultiArray, "command", self._on_position, 10,
                                                        **sub_events)

        self.commands_accepted = 0
        self.commands_rejected = 0
        self.joint_states_published = 0
        self.images_published = 0

        names = list(self.robot.names)
        self._traj = None  # a multi-point trajectory being followed: names, points, due times, current point
        self._js_msg = JointState()
        self._js_msg.name = names
        self._img_msg = Image()
        self._img_msg.header.frame_id = "camera"
        self._img_msg.height, self._img_msg.width = cfg.image_height, cfg.image_width
        self._img_msg.encoding = "rgb8"
        self._img_msg.is_bigendian = 0
        self._img_msg.step = 3 * cfg.image_width
        self._img_key: Optional[bytes] = None  # state the cached image data shows

        self._js_period_ns = int(round(_NS / cfg.joint_state_hz))
        self._cam_period_ns = int(round(_NS / cfg.camera_hz)) if cfg.camera_hz > 0 else 0
        self._slack_ns = 0
        self._last_ns: Optional[int] = None  # node-clock time the physics has reached
        self._js_due = 0
        self._cam_due = 0
        self.driver: Optional[SimDriver] = None  # set by the SimDriver that drives this robot
        if drive:
            SimDriver([self])

    # -- parameters ---------------------------------------------------------------------
    def _on_set_parameters(self, params: List[Parameter]) -> SetParametersResult:
        for p in params:
            if p.name == "clock_rate":
                try:
                    self.config = replace(self.config, clock_rate=p.value)  # checked as at start
                except ParamError as e:
                    return SetParametersResult(successful=False, reason=str(e))
        return SetParametersResult(successful=True)

    # -- time and physics --------------------------------------------------------------
    def advance_to(self, now_ns: int) -> None:
        """Step the physics to time now_ns of the driver's time line (a jump back restarts it)."""
        last = self._last_ns
        if last is None or now_ns < last:
            self._last_ns = now_ns
            self._js_due = self._cam_due = now_ns
            return
        if now_ns > last:
            self.robot.step((now_ns - last) / _NS)
            self._last_ns = now_ns

    def tick(self, now_ns: int) -> None:
        """Publish what is due at node-clock time now_ns (called by the driver)."""
        if self._traj is not None:
            self._follow(now_ns)
        if self._last_ns is None or now_ns < self._last_ns:
            self.advance_to(now_ns)
        limit = now_ns + self._slack_ns
        if limit >= self._js_due:
            self.advance_to(now_ns)
            self.publish_joint_state(now_ns)
            self._js_due += self._js_period_ns
            if self._js_due <= now_ns:
                self._js_due = now_ns + self._js_period_ns
        if self.image_pub is not None and limit >= self._cam_due:
            self.advance_to(now_ns)
            self.publish_image(now_ns)
            self._cam_due += self._cam_period_ns
            if self._cam_due <= now_ns:
                self._cam_due = now_ns + self._cam_period_ns

    def publish_joint_state(self, now_ns: int) -> None:
        m = self._js_msg
        _stamp(m.header.stamp, now_ns)
        m.position = self.robot.positions().tolist()
        m.velocity = self.robot.velocities().tolist()
        self.joint_state_pub.publish(m)
        self.joint_states_published += 1

    def publish_image(self, now_ns: int) -> None:
        m = self._img_msg
        key = self.robot.positions().tobytes() + self.robot.targets().tobytes()
        if key != self._img_key:  # a robot at rest shows the same picture: reuse it
            m.data = render(self.robot, self.config.image_width, self.config.image_height).tobytes()
            self._img_key = key
        _stamp(m.header.stamp, now_ns)
        self.image_pub.publish(m)
        self.images_published += 1

    # -- commands ------------------------------------------------------------------------
    def _apply(self, targets, **kw) -> None:
        try:
            now = self.driver.now_ns() if self.driver is not None else None
            if now is not None:
                self.advance_to(now)
            self.robot.command(targets, **kw)
        except ValueError as e:
            self.commands_rejected += 1
            self.get_logger().warning(f"command rejected: {e}", throttle_duration_sec=1.0)
            return
        self.commands_accepted += 1

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        self._traj = None  # a new trajectory replaces the rest of the old one
        if not msg.points:  # a JointTrajectoryController's convention: stop where it is
            self._apply(dict(zip(self._js_msg.name, self.robot.positions().tolist())))
            return
        bad = [len(p.positions) for p in msg.points if len(p.positions) != len(msg.joint_names)]
        if bad:
            self.commands_rejected += 1
            self.get_logger().warning(
                f"command rejected: {len(msg.joint_names)} joint_names but {bad[0]} positions",
                throttle_duration_sec=1.0)
            return
        self._apply(dict(zip(msg.joint_names, msg.points[0].positions)), ignore_unknown=True)
        if len(msg.points) > 1 and self.driver is not None and self.driver.now_ns() is not None:
            t0 = self.driver.now_ns()
            due = [t0 + p.time_from_start.sec * 1_000_000_000 + p.time_from_start.nanosec for p in msg.points]
            self._traj = (list(msg.joint_names), [list(p.positions) for p in msg.points], due, 0)

    def _follow(self, now_ns: int) -> None:
        """Point i + 1 becomes the target once point i's time has come."""
        names, points, due, i = self._traj
        j = i
        while j + 1 < len(points) and now_ns >= due[j]:
            j += 1
        if j != i:
            self._apply(dict(zip(names, points[j])), ignore_unknown=True)
        self._traj = None if j + 1 == len(points) else (names, points, due, j)

    def _on_position(self, msg: Float64MultiArray) -> None:
        self._apply(list(msg.data))


class SimDriver:
    """One timer that drives every robot of a process, on one time line; with publish_clock
    it owns time.

    The first node hosts the timer (and the /clock publisher). Without publish_clock the
    time line is the first node's clock (ROS time: the system clock, or /clock with
    use_sim_time) and its timer ticks on it; every robot is stepped and stamped on it, so
    one /clock subscription serves the process. With publish_clock the time line is
    simulated time, advanced by a wall-clock timer by clock_rate x wall time and published
    on /clock; the first node's clock follows that /clock (use_sim_time is set on it).
    """

    def __init__(self, nodes: Sequence[SimRobotNode]) -> None:
        if not nodes:
            raise ValueError("SimDriver needs at least one node")
        self.nodes = list(nodes)
        self.host = host = self.nodes[0]
        for n in self.nodes:
            n.driver = self
        tick_hz = max(max(n.config.joint_state_hz, n.config.camera_hz) for n in self.nodes)
        self.publish_clock = host.config.publish_clock
        if self.publish_clock:
            host.set_parameters([Parameter("use_sim_time", value=True)])  # the node clock follows our /clock
            self.sim_ns = 0
            self._clock_msg = ClockMsg()
            self.clock_pub = host.create_publisher(ClockMsg, "/clock", QoSProfile(depth=10))
            wall_hz = min(tick_hz * max(1.0, host.config.clock_rate), _MAX_HZ)
            self._wall_ns = time.monotonic_ns()
            self._publish_clock()
            self.timer = host.create_timer(1.0 / wall_hz, self._on_wall_tick,
                                           clock=Clock(clock_type=ClockType.STEADY_TIME))
            slack = 0.5 * host.config.clock_rate / wall_hz
        else:
            self.timer = host.create_timer(1.0 / tick_hz, self._on_tick)
            slack = 0.5 / tick_hz
            if host.get_clock().ros_time_is_active:
                host.get_logger().info("use_sim_time: following /clock")
        for n in self.nodes:
            n._slack_ns = int(slack * _NS)

    def now_ns(self) -> Optional[int]:
        """Now on the process's time line; None while use_sim_time waits for a first /clock."""
        if self.publish_clock:
            return self.sim_ns
        clock = self.host.get_clock()
        now = clock.now().nanoseconds
        return None if now == 0 and clock.ros_time_is_active else now

    def _publish_clock(self) -> None:
        _stamp(self._clock_msg.clock, self.sim_ns)
        self.clock_pub.publish(self._clock_msg)

    def _on_wall_tick(self) -> None:
        now = time.monotonic_ns()
        self.sim_ns += int((now - self._wall_ns) * self.host.config.clock_rate)
        self._wall_ns = now
        self._publish_clock()
        self._tick_all(self.sim_ns)

    def _on_tick(self) -> None:
        now = self.now_ns()
        if now is not None:
            self._tick_all(now)

    def _tick_all(self, now_ns: int) -> None:
        for n in self.nodes:
            n.tick(now_ns)


# ======================================================================================
# Process entry point
# ======================================================================================
def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    from rclpy.utilities import remove_ros_args

    parser = argparse.ArgumentParser(prog="python -m robotserve_ros.nodes.sim_robot",
                                     description="Simulated robots (SO-101 arm or drone) with a camera.")
    parser.add_argument("--robots", type=int, default=0,
                        help="host N robots in namespaces PREFIX0..PREFIX{N-1} (default: one robot, no namespace)")
    parser.add_argument("--first-index", type=int, default=0,
                        help="index of the first robot with --robots (to split a fleet over processes)")
    parser.add_argument("--name-prefix", default="robot_", help="namespace prefix with --robots")
    parser.add_argument("--lean", choices=("auto", "on", "off"), default="auto",
                        help="per-robot overhead: 'on' drops each robot node's parameter and type-description "
                             "services and QoS-event handlers (auto: on with --robots)")
    args = parser.parse_args(remove_ros_args(args=list(argv))[1:])
    if args.robots < 0 or args.first_index < 0:
        parser.error("--robots and --first-index must be >= 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    try:
        args = _parse_args(argv)
    except RuntimeError as e:  # rclpy's RCLError: malformed --ros-args
        print(f"sim_robot: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_PARAMETER

    def make() -> List[SimRobotNode]:
        nodes: List[SimRobotNode] = []
        if args.robots == 0:
            nodes.append(SimRobotNode(lean=args.lean == "on"))
        else:
            for i in range(args.robots):
                k = args.first_index + i
                # The first robot keeps its parameter services: clock_rate is set there. The
                # others run on its time line (SimDriver), so their node clocks need no /clock
                # subscription of their own: one per process, not one per robot.
                own = {} if i == 0 else {"parameter_overrides": [Parameter("use_sim_time", value=False)]}
                nodes.append(SimRobotNode(namespace=f"{args.name_prefix}{k}", seed_offset=k, drive=False,
                                          lean=args.lean == "on" or (args.lean == "auto" and i > 0), **own))
            SimDriver(nodes)
        # rclpy.experimental.EventsExecutor is no option here: with the Kilted PyPI wheels it
        # spins at 100% CPU, never fires timers and ignores SIGINT (seen with one plain timer).
        cfg = nodes[0].config
        nodes[0].get_logger().info(
            f"{len(nodes)} x {cfg.robot_type} up: joint_states {cfg.joint_state_hz:g} Hz, camera "
            f"{cfg.camera_hz:g} Hz {cfg.image_width}x{cfg.image_height}, command {cfg.command_type}"
            + (f", publishing /clock at rate {cfg.clock_rate:g}" if cfg.publish_clock else ""))
        return nodes

    return run_nodes(make, argv)


if __name__ == "__main__":
    exit_process(main())
