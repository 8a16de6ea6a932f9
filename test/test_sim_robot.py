"""The simulated robots: kinematics and camera (pure), and the sim_robot node (real ROS).

Node tests start `python -m robotserve_ros.nodes.sim_robot` as a subprocess on an isolated
ROS domain (see rosutil.py) and are skipped where rclpy is not installed.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from robotserve_ros.sim.robots import SimArm, SimDrone, make_robot, render
from rosutil import requires_rclpy, ros_ctx, start_node  # noqa: F401  (ros_ctx is a fixture)

SIM = "robotserve_ros.nodes.sim_robot"
ARM_NAMES = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


# ======================================================================================
# Kinematics (pure)
# ======================================================================================
def test_arm_joint_moves_at_max_speed_and_stops_at_target():
    arm = SimArm(max_joint_speed=2.0)
    assert list(arm.names) == ARM_NAMES
    arm.command({"shoulder_lift": 1.0, "gripper": 0.5})
    arm.step(0.25)
    q = arm.positions()
    assert q[1] == pytest.approx(0.5)
    assert q[5] == pytest.approx(0.5)  # reached: 0.5 < 2 rad/s x 0.25 s
    assert arm.velocities()[1] == pytest.approx(2.0)
    assert q[[0, 2, 3, 4]] == pytest.approx(0.0)
    arm.step(1.0)
    assert arm.positions()[1] == pytest.approx(1.0)
    assert arm.at_target()
    arm.step(1.0)
    assert arm.velocities() == pytest.approx(np.zeros(6))


def test_arm_limits_and_bad_commands():
    arm = SimArm()
    assert np.all(arm.lower < arm.upper)
    assert (arm.lower[5], arm.upper[5]) == (0.0, 1.0)
    arm.command([10.0, -10.0, 0.0, 0.0, 0.0, 5.0])
    assert arm.targets()[0] == pytest.approx(arm.upper[0])
    assert arm.targets()[1] == pytest.approx(arm.lower[1])
    assert arm.targets()[5] == 1.0
    before = arm.targets()
    with pytest.raises(ValueError, match="non-finite"):
        arm.command({"elbow_flex": float("nan")})
    with pytest.raises(ValueError, match="expected 6"):
        arm.command([0.1, 0.2])
    with pytest.raises(ValueError, match="unknown joint"):
        arm.command({"tail": 1.0})
    assert arm.targets() == pytest.approx(before)  # a rejected command changes nothing
    arm.command({"tail": 1.0, "elbow_flex": 0.3}, ignore_unknown=True)
    assert arm.targets()[2] == pytest.approx(0.3)
    with pytest.raises(ValueError):
        arm.step(-0.1)


def test_one_long_step_equals_many_short_ones():
    """What lets the node step lazily (only when it publishes or gets a command)."""
    rng = np.random.default_rng(1)
    for robot_type in ("so101", "drone"):
        a, b = make_robot(robot_type, max_speed=1.5), make_robot(robot_type, max_speed=1.5)
        for _ in range(5):
            target = rng.uniform(a.lower.clip(-3, 3), a.upper.clip(-3, 3))
            a.command(target)
            b.command(target)
            a.step(0.37)
            for _ in range(37):
                b.step(0.01)
            assert a.positions() == pytest.approx(b.positions(), abs=1e-9)


def test_arm_forward_kinematics():
    arm = SimArm(link_lengths=(0.11, 0.13, 0.10))
    tool = arm.tool_position()
    assert tool == pytest.approx([0.0, 0.0, arm.BASE_HEIGHT + 0.34])  # all joints 0: straight up
    arm = SimArm(initial=[0.0, math.pi / 2, 0.0, 0.0, 0.0, 0.0])
    assert arm.tool_position() == pytest.approx([0.34, 0.0, arm.BASE_HEIGHT])  # lying forward
    arm = SimArm(initial=[math.pi / 2, math.pi / 2, 0.0, 0.0, 0.0, 0.0])
    assert arm.tool_position() == pytest.approx([0.0, 0.34, arm.BASE_HEIGHT], abs=1e-12)  # panned
    # The cube is seeded, on the table, in reach.
    c1, c2, c3 = SimArm(seed=7).cube_position, SimArm(seed=7).cube_position, SimArm(seed=8).cube_position
    assert c1 == pytest.approx(c2) and not np.allclose(c1, c3)
    assert 0.1 < math.hypot(c1[0], c1[1]) < 0.34 and c1[2] == pytest.approx(SimArm.CUBE_SIZE / 2)


def test_drone_flies_straight_at_max_speed_and_turns_the_short_way():
    d = SimDrone(max_speed=2.0, max_yaw_rate=1.0)
    assert list(d.names) == ["x", "y", "z", "yaw"]
    d.command([3.0, 4.0, 0.0, 0.0])  # 5 m away
    d.step(1.0)
    assert d.positions()[:2] == pytest.approx([1.2, 1.6])  # 2 m along the line
    assert np.linalg.norm(d.velocities()[:3]) == pytest.approx(2.0)
    d.step(10.0)
    assert d.positions()[:3] == pytest.approx([3.0, 4.0, 0.0])
    d.command({"z": -5.0})  # below ground: held at z = 0
    assert d.targets()[2] == 0.0
    d = SimDrone(max_yaw_rate=1.0, initial=[0, 0, 1, 3.0])
    d.command({"yaw": -3.0})  # the short way is +0.283 rad through pi, not -6 rad
    d.step(0.1)
    assert d.positions()[3] == pytest.approx(3.1)
    d.step(1.0)
    assert d.positions()[3] == pytest.approx(-3.0)
    assert d.at_target()


@pytest.mark.parametrize("robot_type", ["so101", "drone"])
def test_render_shape_and_it_shows_the_state(robot_type):
    robot = make_robot(robot_type, seed=3)
    for w, h in ((96, 96), (224, 224), (160, 120)):
        img = render(robot, w, h)
        assert img.shape == (h, w, 3) and img.dtype == np.uint8
    before = render(robot, 96, 96)
    assert np.array_equal(before, render(robot, 96, 96))  # deterministic
    assert len(np.unique(before.reshape(-1, 3), axis=0)) > 3  # not a blank frame
    if robot_type == "so101":
        robot.command({"shoulder_lift": 0.9, "elbow_flex": 0.7})
    else:
        robot.command([2.0, -1.0, 4.0, 1.2])
    robot.step(5.0)
    after = render(robot, 96, 96)
    assert (before != after).any(axis=2).sum() > 30  # a visible change, not a pixel or two


def test_render_sees_every_arm_joint_and_the_cube():
    base = np.array([0.0, 0.8, 0.3, 0.2, 0.0, 0.5])  # leaning forward, so pan and roll show
    ref = render(SimArm(seed=0, initial=base), 96, 96)
    for i, name in enumerate(ARM_NAMES):
        q = base.copy()
        q[i] += 0.4 if name != "wrist_roll" else 0.9
        assert not np.array_equal(render(SimArm(seed=0, initial=q), 96, 96), ref), name
    assert not np.array_equal(render(SimArm(seed=1, initial=base), 96, 96), ref)  # the cube moved


# ======================================================================================
# The node (real rclpy, subprocesses on an isolated domain)
# ======================================================================================
def _msgs():
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    return Clock, Image, JointState, Float64MultiArray, JointTrajectory, JointTrajectoryPoint


def _sim(ros, *params, robots=None):
    args = [SIM] + (["--robots", str(robots)] if robots else []) + ["--ros-args"]
    for p in params:
        args += ["-p", p]
    return ros.start_node(args)


def _ok(ros, proc, predicate, timeout, what):
    if not ros.wait_for(lambda: predicate() or not proc.running(), timeout) or not predicate():
        pytest.fail(f"timed out waiting for {what} (node rc={proc.returncode})\n{proc.output()}")


def _stamp(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


@requires_rclpy
def test_arm_node_publishes_and_a_trajectory_moves_it(ros_ctx):
    ros = ros_ctx
    _, Image, JointState, _, JointTrajectory, JointTrajectoryPoint = _msgs()
    proc = _sim(ros, "joint_state_hz:=50.0", "camera_hz:=20.0", "max_joint_speed:=2.0")
    js = ros.collect(JointState, "joint_states")
    imgs = ros.collect(Image, "camera/image_raw")
    _ok(ros, proc, lambda: len(js) >= 3 and len(imgs) >= 2, 10, "joint states and images")

    m = js[-1]
    assert list(m.name) == ARM_NAMES and len(m.position) == 6 and len(m.velocity) == 6
    assert list(m.position) == pytest.approx([0.0] * 6)
    assert abs(_stamp(m) - time.time()) < 5  # wall clock by default
    im = imgs[-1]
    assert (im.height, im.width, im.encoding, im.step) == (96, 96, "rgb8", 96 * 3)
    assert im.header.frame_id == "camera" and len(im.data) == 96 * 96 * 3
    first_image = bytes(im.data)

    cmd = ros.publisher(JointTrajectory, "command")
    assert ros.wait_for_subscriber(cmd)
    traj = JointTrajectory()
    traj.joint_names = ["elbow_flex", "not_a_joint", "shoulder_lift"]
    traj.points = [JointTrajectoryPoint(positions=[0.6, 9.0, 0.8])]
    js.clear()
    cmd.publish(traj)
    lift = lambda: js[-1].position[1] if js else 0.0  # noqa: E731
    _ok(ros, proc, lambda: abs(lift() - 0.8) < 1e-9, 5, "shoulder_lift to reach 0.8")
    lifts = [m.position[1] for m in js]
    assert any(0.05 < v < 0.75 for v in lifts), f"moved in one jump: {lifts}"  # over time, at 2 rad/s
    assert js[-1].position[2] == pytest.approx(0.6)
    assert list(js[-1].position[3:]) == pytest.approx([0.0, 0.0, 0.0])
    _ok(ros, proc, lambda: bytes(imgs[-1].data) != first_image, 3, "the image to change")
    assert proc.stop() == 0, proc.output()


@requires_rclpy
def test_drone_node_follows_position_commands(ros_ctx):
    import signal

    ros = ros_ctx
    _, Image, JointState, Float64MultiArray, _, _ = _msgs()
    proc = _sim(ros, "robot_type:=drone", "command_type:=position", "max_joint_speed:=4.0",
                "image_width:=64", "image_height:=48", "joint_state_hz:=40")
    js = ros.collect(JointState, "joint_states")
    imgs = ros.collect(Image, "camera/image_raw")
    _ok(ros, proc, lambda: js and imgs, 10, "joint states and images")
    assert list(js[-1].name) == ["x", "y", "z", "yaw"]
    assert (imgs[-1].height, imgs[-1].width, len(imgs[-1].data)) == (48, 64, 48 * 64 * 3)
    first_image = bytes(imgs[-1].data)
    cmd = ros.publisher(Float64MultiArray, "command")
    assert ros.wait_for_subscriber(cmd)
    cmd.publish(Float64MultiArray(data=[1.0, -0.5, 1.5, 0.5]))
    _ok(ros, proc, lambda: np.allclose(js[-1].position, [1.0, -0.5, 1.5, 0.5]), 5, "the drone to arrive")
    _ok(ros, proc, lambda: bytes(imgs[-1].data) != first_image, 3, "the image to change")
    cmd.publish(Float64MultiArray(data=[1.0, 2.0]))  # wrong length: rejected, nothing moves
    ros.spin(0.3)
    assert np.allclose(js[-1].position, [1.0, -0.5, 1.5, 0.5])
    assert proc.running()
    # SIGINT, as every runner here stops nodes; SIGTERM crashed rclpy's shutdown 2 times in 20.
    assert proc.stop(sig=signal.SIGINT) == 0, proc.output()


@requires_rclpy
def test_one_process_hosts_several_robots_in_namespaces(ros_ctx):
    ros = ros_ctx
    _, Image, JointState, _, JointTrajectory, JointTrajectoryPoint = _msgs()
    proc = _sim(ros, "joint_state_hz:=30.0", "max_joint_speed:=3.0", robots=2)
    js0 = ros.collect(JointState, "/robot_0/joint_states")
    js1 = ros.collect(JointState, "/robot_1/joint_states")
    img1 = ros.collect(Image, "/robot_1/camera/image_raw")
    _ok(ros, proc, lambda: js0 and js1 and img1, 10, "both robots' topics")
    cmd = ros.publisher(JointTrajectory, "/robot_1/command")
    assert ros.wait_for_subscriber(cmd)
    cmd.publish(JointTrajectory(joint_names=["shoulder_pan"], points=[JointTrajectoryPoint(positions=[0.5])]))
    _ok(ros, proc, lambda: abs(js1[-1].position[0] - 0.5) < 1e-9, 5, "robot_1 to turn")
    assert js0[-1].position[0] == 0.0  # robot_0 did not get robot_1's command
    # Both are driven by one timer on one clock.
    assert abs(_stamp(js0[-1]) - _stamp(js1[-1])) < 0.2
    assert proc.stop() == 0, proc.output()


@requires_rclpy
def test_publish_clock_owns_sim_time_and_stamps_follow_it(ros_ctx):
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient

    ros = ros_ctx
    Clock, _, JointState, _, JointTrajectory, JointTrajectoryPoint = _msgs()
    proc = _sim(ros, "publish_clock:=true", "clock_rate:=2.0", "joint_state_hz:=20.0", "camera_hz:=0.0",
                "max_joint_speed:=0.5", robots=2)
    clocks = []
    ros.node.create_subscription(Clock, "/clock", lambda m: clocks.append((time.monotonic(), m.clock)), 10)
    js = ros.collect(JointState, "/robot_1/joint_states")
    _ok(ros, proc, lambda: len(clocks) >= 2 and js, 10, "/clock and joint states")
    ros.spin(1.0)
    (w0, c0), (w1, c1) = clocks[1], clocks[-1]
    t0, t1 = c0.sec + c0.nanosec * 1e-9, c1.sec + c1.nanosec * 1e-9
    assert t1 < 1000.0  # simulated time starts at 0, not at the epoch
    rate = (t1 - t0) / (w1 - w0)
    assert 1.6 < rate < 2.4, rate
    stamps = [_stamp(m) for m in js]
    assert all(b > a for a, b in zip(stamps, stamps[1:]))
    assert abs(stamps[-1] - t1) < 0.3  # stamped with sim time
    gaps = np.diff(stamps[-10:])
    assert np.median(gaps) == pytest.approx(1 / 20.0, rel=0.25)  # the rate is in sim seconds

    # Pause simulated time at run time (clock_rate on the process's first node): /clock
    # stands still and a commanded robot does not move.
    params = AsyncParameterClient(ros.node, "/robot_0/sim_robot")
    assert params.wait_for_services(timeout_sec=5.0)
    fut = params.set_parameters([Parameter("clock_rate", value=0.0)])
    assert ros.wait_for(fut.done, 5.0) and fut.result().results[0].successful
    ros.spin(0.2)
    cmd = ros.publisher(JointTrajectory, "/robot_1/command")
    assert ros.wait_for_subscriber(cmd)
    cmd.publish(JointTrajectory(joint_names=["elbow_flex"], points=[JointTrajectoryPoint(positions=[1.0])]))
    frozen = clocks[-1][1]
    ros.spin(0.5)
    assert clocks[-1][1] == frozen and js[-1].position[2] == 0.0
    fut = params.set_parameters([Parameter("clock_rate", value=1.0)])
    assert ros.wait_for(fut.done, 5.0) and fut.result().results[0].successful
    _ok(ros, proc, lambda: js[-1].position[2] > 0.05, 5, "the arm to move once time runs again")
    assert js[-1].position[2] <= 0.5 * (_stamp(js[-1]) - (frozen.sec + frozen.nanosec * 1e-9)) + 1e-6
    assert proc.stop() == 0, proc.output()


@requires_rclpy
def test_use_sim_time_follows_clock_and_a_paused_clock_stops_the_robot(ros_ctx):
    from builtin_interfaces.msg import Time as TimeMsg

    ros = ros_ctx
    Clock, _, JointState, Float64MultiArray, _, _ = _msgs()
    proc = _sim(ros, "use_sim_time:=true", "command_type:=position", "max_joint_speed:=1.0",
                "joint_state_hz:=50.0", "camera_hz:=0.0")
    js = ros.collect(JointState, "joint_states")
    clock = ros.publisher(Clock, "/clock")
    cmd = ros.publisher(Float64MultiArray, "command")
    assert ros.wait_for_subscriber(clock) and ros.wait_for_subscriber(cmd)

    def set_clock(t):
        clock.publish(Clock(clock=TimeMsg(sec=int(t), nanosec=int(round((t % 1) * 1e9)))))

    ros.spin(0.3)
    assert not js  # no /clock yet, no sim time: nothing published
    set_clock(100.0)
    _ok(ros, proc, lambda: js and _stamp(js[-1]) == pytest.approx(100.0), 5, "a joint state at t=100")
    cmd.publish(Float64MultiArray(data=[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    ros.spin(0.3)  # the clock stands still: the arm does not move
    set_clock(100.0)
    ros.spin(0.2)
    assert js[-1].position[1] == 0.0
    set_clock(100.2)
    _ok(ros, proc, lambda: _stamp(js[-1]) == pytest.approx(100.2), 5, "a joint state at t=100.2")
    assert js[-1].position[1] == pytest.approx(0.2)  # 1 rad/s x 0.2 simulated s
    n = len(js)
    ros.spin(0.5)  # paused: no new states, no motion
    assert len(js) == n
    set_clock(100.5)
    _ok(ros, proc, lambda: _stamp(js[-1]) == pytest.approx(100.5), 5, "a joint state at t=100.5")
    assert js[-1].position[1] == pytest.approx(0.5)
    assert proc.stop() == 0, proc.output()


@requires_rclpy
def test_robots_of_one_process_share_one_clock_subscription_and_its_time(ros_ctx):
    """Every robot of a process runs on the first node's clock: one /clock subscription for
    the process, and robot_2's stamps and motion follow /clock as robot_0's do."""
    from builtin_interfaces.msg import Time as TimeMsg

    ros = ros_ctx
    Clock, _, JointState, Float64MultiArray, _, _ = _msgs()
    proc = _sim(ros, "use_sim_time:=true", "command_type:=position", "max_joint_speed:=1.0", "camera_hz:=0.0", robots=3)
    js = ros.collect(JointState, "/robot_2/joint_states")
    clock = ros.publisher(Clock, "/clock")
    cmd = ros.publisher(Float64MultiArray, "/robot_2/command")
    assert ros.wait_for_subscriber(clock) and ros.wait_for_subscriber(cmd)
    ros.spin(0.5)
    assert ros.node.count_subscribers("/clock") == 1
    clock.publish(Clock(clock=TimeMsg(sec=50)))
    _ok(ros, proc, lambda: js and _stamp(js[-1]) == pytest.approx(50.0), 5, "robot_2 at t=50")
    cmd.publish(Float64MultiArray(data=[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    ros.spin(0.3)
    clock.publish(Clock(clock=TimeMsg(sec=50, nanosec=300_000_000)))
    _ok(ros, proc, lambda: _stamp(js[-1]) == pytest.approx(50.3), 5, "robot_2 at t=50.3")
    assert js[-1].position[1] == pytest.approx(0.3)  # 1 rad/s x 0.3 simulated s
    assert proc.stop() == 0, proc.output()


@requires_rclpy
@pytest.mark.parametrize("param,value", [
    ("robot_type", "tank"),
    ("joint_state_hz", "-5.0"),
    ("image_width", "3"),
    ("command_type", "velocity"),
    ("publish_clock", "maybe"),
])
def test_bad_parameter_exits_2_naming_it(param, value):
    proc = start_node([SIM, "--ros-args", "-p", f"{param}:={value}"])
    try:
        code = proc.wait(timeout=20)
    finally:
        proc.stop()
    assert code == 2, proc.output()
    assert param in proc.stderr(), proc.output()
