"""Issue 27, the node half, with real nodes: lifecycle transitions of the inference server
(a policy reloaded under a running robot) and of the robot client, tasks as RunTask goals
(succeed, time limit, cancel holds, bad goal refused, deactivate ends the goal), named joints
mapped by name (another /joint_states order moves the right joints; an unknown name is
refused, nothing moves), trajectory_chunk, several robots per process each with its
parameter and lifecycle services, the client's waiting/connected logs, and /diagnostics
levels following recent errors."""
from __future__ import annotations

import pytest

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, make_request, server_args

pytestmark = requires_rclpy
NAMES = ["j0", "j1", "j2", "j3", "j4", "j5"]


def transition(ctx, node: str, label: str) -> bool:
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    ids = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE,
           "deactivate": Transition.TRANSITION_DEACTIVATE, "cleanup": Transition.TRANSITION_CLEANUP}
    cli = ctx.node.create_client(ChangeState, f"{node}/change_state")
    assert cli.wait_for_service(timeout_sec=60), f"{node} has no lifecycle services"
    fut = cli.call_async(ChangeState.Request(transition=Transition(id=ids[label])))
    assert ctx.wait_for(fut.done, 30), f"{node}: no answer to {label}"
    return fut.result().success


def set_params(ctx, node: str, **values) -> list:
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    cli = ctx.node.create_client(SetParameters, f"{node}/set_parameters")
    assert cli.wait_for_service(timeout_sec=60)
    ps = [Parameter(name=k, value=ParameterValue(type=ParameterType.PARAMETER_STRING_ARRAY, string_array_value=v))
          for k, v in values.items()]
    fut = cli.call_async(SetParameters.Request(parameters=ps))
    assert ctx.wait_for(fut.done, 10)
    return fut.result().results


def set_values(ctx, node: str, values: dict) -> list:
    """SetParameters with each value's own ROS type (int, double, string, bool), as `ros2 param set` sends."""
    from rclpy.parameter import Parameter
    from rcl_interfaces.srv import SetParameters

    cli = ctx.node.create_client(SetParameters, f"{node}/set_parameters")
    assert cli.wait_for_service(timeout_sec=60)
    ps = [Parameter(k, value=v).to_parameter_msg() for k, v in values.items()]
    fut = cli.call_async(SetParameters.Request(parameters=ps))
    assert ctx.wait_for(fut.done, 10)
    return fut.result().results


def drive(ctx, ns: str, names, hz: float = 20.0) -> None:
    """A robot driver: a 96x96 rgb8 camera and /joint_states in `names`' order, at hz."""
    from sensor_msgs.msg import Image, JointState

    cam, js = ctx.publisher(Image, f"{ns}/camera/image_raw"), ctx.publisher(JointState, f"{ns}/joint_states")
    im = Image(width=96, height=96, encoding="rgb8", step=96 * 3, data=bytes(96 * 96 * 3))

    def tick():
        cam.publish(im)
        js.publish(JointState(name=list(names), position=[0.0] * len(names)))

    ctx.node.create_timer(1.0 / hz, tick)


def client_args(ns: str, *params: str) -> list:
    args = ["robotserve_ros.nodes.robot_client", "--ros-args", "-r", f"__ns:={ns}"]
    for p in ("expected_latency_s:=0.05", "image_topics:=[camera/image_raw]", *params):
        args += ["-p", p]
    return args


def commanding_robot(ctx, ns: str):
    """A driver and a position-commanding robot client in `ns`, running a long task;
    returns (its process, its commands, every robot's progress), once it has moved."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import Float64MultiArray

    from robotserve_ros.msg import ExecutionProgress

    drive(ctx, ns, NAMES)
    reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
    progress = ctx.collect(ExecutionProgress, "/robotserve/progress", reliable)
    cmds = ctx.collect(Float64MultiArray, f"{ns}/command", 10)
    robot = ctx.start_node(client_args(ns, "command_type:=position", "task_actions:=100000"))
    assert ctx.wait_for(lambda: len(cmds) > 20, 30), robot.output()
    return robot, cmds, progress


def test_a_parameter_set_while_unconfigured_is_checked_in_one_line_and_any_plugins_knob_may_be_set(ros_ctx):
    """`ros2 param set` on an unconfigured server answers what configure would say, naming
    the dotted key; a knob of an engine not chosen at start (engine.lerobot.policy_dir on a
    server from config/fleet.yaml) may be set: the reload recipe of docs/lifecycle.md."""
    srv = ros_ctx.start_node(server_args("autostart:=false"))
    for values, line in (
        ({"engine.simulated.chunk_size": "abc"}, "parameter 'engine.simulated.chunk_size': 'abc' is not an integer"),
        ({"engine.simulated.chunk_size": 30.5}, "parameter 'engine.simulated.chunk_size': 30.5 is not an integer"),
        ({"engine.simulated.chunk_sise": 30}, "parameter 'engine.simulated.chunk_sise': given 30, but engine "
                                               "'simulated' has no such knob; its knobs: chunk_size, "),
    ):
        (res,) = set_values(ros_ctx, "/inference_server", values)
        assert not res.successful and res.reason.startswith(line), res.reason
    missing = "/nonexistent/robotserve-policy"
    assert all(r.successful for r in set_values(ros_ctx, "/inference_server", {
        "engine.name": "lerobot", "engine.lerobot.policy_dir": missing}))
    assert not transition(ros_ctx, "/inference_server", "configure")  # no such policy: refused, said in its log
    assert ros_ctx.wait_for(lambda: missing in srv.output(), 10), srv.output()
    assert set_values(ros_ctx, "/inference_server", {"engine.name": "simulated"})[0].successful
    assert transition(ros_ctx, "/inference_server", "configure"), srv.output()


def test_server_lifecycle_and_a_policy_reload_under_a_running_robot(ros_ctx):
    from robotserve_ros.srv import Infer

    srv = ros_ctx.start_node(server_args("autostart:=false", f"joint_names:={NAMES}".replace("'", "")))
    probe = ros_ctx.node.create_client(Infer, "/robotserve/infer")
    assert transition(ros_ctx, "/inference_server", "configure"), srv.output()
    assert not probe.wait_for_service(timeout_sec=1.0), "inactive, yet serving"
    assert transition(ros_ctx, "/inference_server", "activate"), srv.output()
    res = Caller(ros_ctx).call(make_request("arm", 0))
    assert res.status.reason == "ok" and list(res.chunk.joint_names) == NAMES, res.status.message
    # A configure-time parameter cannot change under an active node.
    assert not set_params(ros_ctx, "/inference_server", joint_names=["k"] * 6)[0].successful

    robot, cmds, progress = commanding_robot(ros_ctx, "/r1")

    # The reload a supervisor does: the robot process is never restarted.
    assert transition(ros_ctx, "/inference_server", "deactivate")
    assert transition(ros_ctx, "/inference_server", "cleanup")
    new = [f"k{i}" for i in range(6)]
    assert set_params(ros_ctx, "/inference_server", joint_names=new)[0].successful
    assert transition(ros_ctx, "/inference_server", "configure"), srv.output()
    assert transition(ros_ctx, "/inference_server", "activate"), srv.output()
    assert list(Caller(ros_ctx).call(make_request("arm2", 0)).chunk.joint_names) == new
    # The robot goes on under a new task id once the server is back (its old task was dropped);
    # its chunks now name joints it does not have, so it refuses them and holds.
    n = len(cmds)
    assert ros_ctx.wait_for(lambda: any(m.task_id == "r1/task1" for m in progress), 30), robot.output()
    assert ros_ctx.wait_for(lambda: "chunk refused" in robot.output(), 15), robot.output()
    assert robot.output().count("shutting_down") <= 1, robot.output()  # each kind of error logged once
    assert len(cmds) - n <= 60  # at most the chunk it had queued before the reload
    assert robot.running() and srv.stop() == 0, srv.output()
    assert robot.stop() == 0, robot.output()


def test_a_deactivated_robot_holds_and_resumes_under_a_new_task(ros_ctx):
    ros_ctx.start_node(server_args())
    robot, cmds, progress = commanding_robot(ros_ctx, "/r3")
    assert transition(ros_ctx, "/r3/robot_client", "deactivate")
    ros_ctx.spin(0.3)
    n = len(cmds)
    ros_ctx.spin(1.0)
    assert len(cmds) == n, "moved while inactive"
    assert transition(ros_ctx, "/r3/robot_client", "activate")
    assert ros_ctx.wait_for(lambda: len(cmds) > n + 20, 20), robot.output()
    assert any(m.task_id == "r3/task1" for m in progress), sorted({m.task_id for m in progress})
    assert robot.stop() == 0, robot.output()


def run_goal(ctx, ac, fb: list, cancel_after=None, **goal):
    from robotserve_ros.action import RunTask

    send = ac.send_goal_async(RunTask.Goal(**goal), feedback_callback=lambda m: fb.append(m.feedback))
    assert ctx.wait_for(send.done, 10)
    gh = send.result()
    assert gh.accepted
    if cancel_after is not None:
        assert ctx.wait_for(cancel_after, 20)
        gh.cancel_goal_async()
    res = gh.get_result_async()
    assert ctx.wait_for(res.done, 30)
    return res.result().result


def test_robot_client_lifecycle_and_run_task_goals(ros_ctx):
    from rclpy.action import ActionClient
    from std_msgs.msg import Float64MultiArray

    from robotserve_ros.action import RunTask

    ros_ctx.start_node(server_args())
    drive(ros_ctx, "/r2", NAMES)
    cmds = ros_ctx.collect(Float64MultiArray, "/r2/command", 10)
    robot = ros_ctx.start_node(client_args("/r2", "command_type:=position", "task_source:=action"))
    ac = ActionClient(ros_ctx.node, RunTask, "/r2/robot_client/run_task")
    assert ac.wait_for_server(timeout_sec=20), robot.output()
    ros_ctx.spin(1.0)
    assert cmds == [], "commanded motion before any task"

    fb: list = []
    res = run_goal(ros_ctx, ac, fb, instruction="pick the cube", max_actions=60)
    assert (res.outcome, res.task_id) == ("succeeded", "r2/task0") and res.actions_executed >= 60, res
    assert res.rounds >= 1 and fb and fb[-1].task_id == "r2/task0" and fb[-1].last_latency_s > 0
    # The goal's result and the command topic are two channels: the last commands may land after it.
    assert ros_ctx.wait_for(lambda: len(cmds) >= 60, 5), len(cmds)
    n = len(cmds)
    ros_ctx.spin(0.7)
    assert len(cmds) == n, "moved after its task ended"

    res = run_goal(ros_ctx, ac, [], instruction="wave", time_limit_s=1.0, max_actions=100000)
    assert res.outcome == "time_limit" and 0.9 <= res.elapsed_s < 10, res

    res = run_goal(ros_ctx, ac, [], cancel_after=lambda: len(cmds) > n + 80, instruction="wave", max_actions=100000)
    assert res.outcome == "canceled", res
    ros_ctx.spin(0.3)
    n = len(cmds)
    ros_ctx.spin(0.7)
    assert len(cmds) == n, "a canceled task kept moving"

    # A bad goal is rejected at the goal response (the sender knows at once), the why in the robot's log.
    send = ac.send_goal_async(RunTask.Goal(instruction="x", success_condition="no_such_hook"))
    assert ros_ctx.wait_for(send.done, 10) and not send.result().accepted
    assert ros_ctx.wait_for(lambda: "no_such_hook" in robot.output() and "action_budget" in robot.output(), 5)

    res = run_goal(ros_ctx, ac, [], instruction="x", success_condition="first_chunk_executed", max_actions=100000)
    assert res.outcome == "succeeded" and res.rounds >= 1, res

    # Deactivated mid-task: the goal ends, the robot holds; activated again, it takes goals.
    send = ac.send_goal_async(RunTask.Goal(instruction="long", max_actions=100000))
    assert ros_ctx.wait_for(send.done, 10) and send.result().accepted
    assert ros_ctx.wait_for(lambda: len(cmds) > n + 30, 20)
    assert transition(ros_ctx, "/r2/robot_client", "deactivate")
    res = send.result().get_result_async()
    assert ros_ctx.wait_for(res.done, 10) and res.result().result.outcome == "deactivated"
    n = len(cmds)
    ros_ctx.spin(0.7)
    assert len(cmds) == n
    assert run_goal(ros_ctx, ac, [], instruction="x").outcome == "rejected"  # inactive
    assert transition(ros_ctx, "/r2/robot_client", "activate")
    assert run_goal(ros_ctx, ac, [], instruction="again", max_actions=30).outcome == "succeeded"
    assert robot.stop() == 0, robot.output()


def test_a_goal_waiting_for_an_unconfigured_server_hears_so_in_its_feedback(ros_ctx):
    from rclpy.action import ActionClient

    from robotserve_ros.action import RunTask

    ros_ctx.start_node(server_args("autostart:=false"))  # up, but unconfigured: no srv/Infer
    drive(ros_ctx, "/r4", NAMES)
    robot = ros_ctx.start_node(client_args("/r4", "command_type:=position", "task_source:=action"))
    ac = ActionClient(ros_ctx.node, RunTask, "/r4/robot_client/run_task")
    assert ac.wait_for_server(timeout_sec=20), robot.output()
    fb: list = []
    send = ac.send_goal_async(RunTask.Goal(instruction="pick", max_actions=30), feedback_callback=lambda m: fb.append(m.feedback))
    assert ros_ctx.wait_for(send.done, 10) and send.result().accepted
    assert ros_ctx.wait_for(lambda: any("waiting for /robotserve/infer" in f.status for f in fb), 10), [f.status for f in fb]
    assert "not started, or not configured and active" in fb[-1].status and fb[-1].round == 0
    assert transition(ros_ctx, "/inference_server", "configure") and transition(ros_ctx, "/inference_server", "activate")
    res = send.result().get_result_async()
    assert ros_ctx.wait_for(res.done, 30), robot.output()
    assert res.result().result.outcome == "succeeded" and any(f.status == "running" for f in fb), [f.status for f in fb]


def test_named_joints_are_mapped_by_name_and_trajectory_chunks(ros_ctx):
    """The test serves srv/Infer itself: every chunk commands a=1, b=2, c=3 by name."""
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory

    from robotserve_ros.srv import Infer

    def serve(req, resp):
        c = resp.chunk
        c.task_id, c.round_id, c.first_timestep = req.task_id, req.round_id, req.observation.timestep
        c.horizon, c.action_dim, c.chunk_len = 20, 3, 20
        c.joint_names = ["a", "b", "z"] if req.robot_id == "/bad" else ["a", "b", "c"]
        c.actions = [1.0, 2.0, 3.0] * 20
        resp.status.reason = "ok"
        return resp

    ros_ctx.node.create_service(Infer, "/robotserve/infer", serve)
    for ns in ("/good", "/bad", "/traj"):
        drive(ros_ctx, ns, ["c", "a", "b"])  # the driver's order is not the chunk's
    good = ros_ctx.collect(Float64MultiArray, "/good/command", 10)
    bad = ros_ctx.collect(Float64MultiArray, "/bad/command", 10)
    traj = ros_ctx.collect(JointTrajectory, "/traj/command", 10)
    procs = [ros_ctx.start_node(client_args(ns, f"command_type:={kind}", "control_hz:=50.0"))
             for ns, kind in (("/good", "position"), ("/bad", "position"), ("/traj", "trajectory_chunk"))]
    assert ros_ctx.wait_for(lambda: len(good) > 30 and len(traj) >= 2, 30), procs[0].output() + procs[2].output()
    assert all(list(m.data) == [3.0, 1.0, 2.0] for m in good)  # c, a, b: each joint got its own value
    assert ros_ctx.wait_for(lambda: "chunk refused" in procs[1].output(), 10), procs[1].output()
    assert "['z']" in procs[1].output() and bad == []
    t = traj[-1]
    assert list(t.joint_names) == ["a", "b", "c"] and len(t.points) > 1
    steps = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in t.points]
    assert steps == pytest.approx([(i + 1) / 50.0 for i in range(len(steps))], abs=1e-6)
    assert all(list(p.positions) == [1.0, 2.0, 3.0] for p in t.points)
    for p in procs:
        assert p.stop() == 0, p.output()


def test_robots_in_one_process_each_have_services_and_log_waiting_then_connected(ros_ctx):
    robots = ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "2", "--ros-args",
                                 "-p", "expected_latency_s:=0.05"])
    want = {f"/robot_{i}/robot_client/{s}" for i in range(2)
            for s in ("get_parameters", "set_parameters", "change_state", "get_state", "fetch_observation")}
    have = lambda: {n for n, _ in ros_ctx.node.get_service_names_and_types()}  # noqa: E731
    assert ros_ctx.wait_for(lambda: want <= have(), 20), sorted(want - have())
    assert ros_ctx.wait_for(lambda: robots.output().count("waiting for /robotserve/infer") == 2, 15), robots.output()
    drive(ros_ctx, "/robot_0", NAMES)
    ros_ctx.start_node(server_args())
    assert ros_ctx.wait_for(lambda: robots.output().count("connected to /robotserve/infer") == 2, 30), robots.output()
    assert robots.stop() == 0, robots.output()


def test_diagnostics_level_follows_recent_errors_not_errors_ever():
    from diagnostic_msgs.msg import DiagnosticStatus as S

    from robotserve_ros.nodes.server_diagnostics import RecentErrors

    recent = RecentErrors(0.0, window_s=10.0)
    assert recent(1.0, 0, 50)[0] == S.OK
    assert recent(2.0, 5, 100) == (S.WARN, 5 / 105)
    assert recent(3.0, 200, 100)[0] == S.ERROR  # most of the window's requests refused
    assert recent(12.5, 200, 300)[0] == S.WARN  # the window still holds the errors of t=3
    assert recent(14.0, 200, 400)[0] == S.OK  # recovered: ten seconds without an error


def test_sim_robot_follows_a_multi_point_trajectory_and_holds_on_an_empty_one(ros_ctx):
    """What trajectory_chunk sends, as a JointTrajectoryController takes it: every point in turn."""
    from builtin_interfaces.msg import Duration
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    sim = ros_ctx.start_node(["robotserve_ros.nodes.sim_robot", "--ros-args", "-p", "camera_hz:=0.0",
                              "-p", "max_joint_speed:=1.0"])
    js = ros_ctx.collect(JointState, "joint_states")
    cmd = ros_ctx.publisher(JointTrajectory, "command")
    assert ros_ctx.wait_for_subscriber(cmd, 15), sim.output()
    lift = lambda: js[-1].position[1] if js else 0.0  # noqa: E731
    points = [JointTrajectoryPoint(positions=[0.1 * (i + 1)], time_from_start=Duration(nanosec=int(1e8 * (i + 1))))
              for i in range(5)]
    cmd.publish(JointTrajectory(joint_names=["shoulder_lift"], points=points))
    assert ros_ctx.wait_for(lambda: abs(lift() - 0.5) < 1e-9, 10), (lift(), sim.output())  # the last point
    cmd.publish(JointTrajectory(joint_names=["shoulder_lift"], points=[JointTrajectoryPoint(positions=[-1.0])]))
    ros_ctx.spin(0.3)
    cmd.publish(JointTrajectory())  # stop where it is
    ros_ctx.spin(0.3)
    held = lift()
    ros_ctx.spin(0.6)
    assert held > -0.9 and lift() == pytest.approx(held, abs=1e-9), (held, lift())
    assert sim.stop() == 0, sim.output()
