"""Node tests: the real inference server and robot client as subprocesses on an isolated
ROS domain (test/rosutil.py). A full round trip; two robots served concurrently; every kind
of bad input answered with its own clear error while another robot keeps being served; the
whole loop with a simulated robot; a client vanishing mid-task (its work dropped, its task
reaped after a timeout)."""
from __future__ import annotations

import math
import time

from rosutil import requires_rclpy, ros_ctx  # noqa: F401

pytestmark = requires_rclpy

SERVICE = "/robotserve/infer"


def server_args(*params: str) -> list[str]:
    base = ["engine.batch_sizes:=[1,2,4]", "engine.latency_ms:=[40.0,45.0,50.0]", "obs_width:=96", "obs_height:=96",
            "obs_joints:=6", "obs_encodings:=[rgb8]", "task_timeout_s:=1.5", "diagnostics_hz:=5.0"]
    args = ["robotserve_ros.nodes.inference_server", "--ros-args"]
    for p in base + list(params):
        args += ["-p", p]
    return args


def make_request(task, rnd, *, width=96, encoding="rgb8", joints=None, exec_info=None, horizon=("static", 8.0), nbytes=None):
    from sensor_msgs.msg import Image

    from robotserve_ros.srv import Infer

    r = Infer.Request()
    r.task_id, r.round_id = task, rnd
    im = Image()
    im.width = im.height = width
    im.encoding = encoding
    im.step = width * 3
    im.data = bytes(nbytes if nbytes is not None else width * width * 3)
    r.observation.images = [im]
    r.observation.joint_state.position = list(joints if joints is not None else [0.0] * 6)
    if exec_info is not None:
        r.has_exec_info = True
        r.exec_info.exec_start.sec, r.exec_info.actions_left, r.exec_info.control_hz = int(exec_info[0]), exec_info[1], 30.0
    r.horizon.name, r.horizon.has_param, r.horizon.param = horizon[0], True, horizon[1]
    return r


class Caller:
    def __init__(self, ctx):
        from robotserve_ros.srv import Infer

        from robotserve_ros.nodes.common import service_qos

        self.ctx = ctx
        # One test client may send a burst of a dozen calls: rclpy's default queue (keep last
        # 10) on the client's side would drop the oldest before they are sent (a fleet has one
        # client per robot, each with one call out).
        self.cli = ctx.node.create_client(Infer, SERVICE, qos_profile=service_qos(100))
        # a server with a real policy imports torch and LeRobot first: ~17 s on 2 busy cores
        assert self.cli.wait_for_service(timeout_sec=60), "inference server did not come up"

    def send(self, req):
        return self.cli.call_async(req)

    def call(self, req, timeout=10.0):
        fut = self.send(req)
        assert self.ctx.wait_for(fut.done, timeout), "no answer"
        return fut.result()

    def now(self):
        return self.ctx.node.get_clock().now().nanoseconds * 1e-9


def test_full_round_trip(ros_ctx):
    srv = ros_ctx.start_node(server_args())
    c = Caller(ros_ctx)
    res = c.call(make_request("arm", 0))
    assert res.status.reason == "ok", res.status.message
    assert (res.chunk.task_id, res.chunk.round_id, res.chunk.horizon, res.chunk.action_dim) == ("arm", 0, 8, 6)
    assert len(res.chunk.actions) == 8 * 6 and res.chunk.chunk_len == 50
    assert all(math.isfinite(x) for x in res.chunk.actions)
    assert res.chunk.horizon_reason == "static H=8"
    res = c.call(make_request("arm", 1, exec_info=(c.now(), 3), horizon=("confidence", 0.4)))
    assert res.status.reason == "ok" and res.chunk.round_id == 1
    assert res.chunk.horizon >= 10  # H_min of the confidence policy
    assert srv.stop() == 0, srv.output()


def test_two_robots_are_served_concurrently(ros_ctx):
    """Both calls are outstanding at once and both are answered, in one batch or two."""
    ros_ctx.start_node(server_args("engine.latency_ms:=[300.0,310.0,320.0]"))
    c = Caller(ros_ctx)
    t0 = time.monotonic()
    fa, fb = c.send(make_request("a", 0)), c.send(make_request("b", 0))
    assert ros_ctx.wait_for(lambda: fa.done() and fb.done(), 10)
    both = time.monotonic() - t0
    assert [fa.result().status.reason, fb.result().status.reason] == ["ok", "ok"]
    assert {fa.result().chunk.task_id, fb.result().chunk.task_id} == {"a", "b"}
    # Not held behind one another: a callback that kept the only thread would add a third engine
    # latency or the server's wait timeout. The slack is wide because this runs on shared 2-core
    # machines (0.91 s seen for two back-to-back batches at load 5); timing targets live in benches.
    assert both < 2 * 0.32 + 0.6, both


def test_a_robot_past_the_servers_capacity_is_refused_overloaded_with_the_reason(ros_ctx):
    ros_ctx.start_node(server_args("admission.max_tasks:=1", "task_timeout_s:=60.0"))  # (not reaped on a slow machine)
    c = Caller(ros_ctx)
    assert c.call(make_request("a", 0), timeout=30).status.reason == "ok"
    res = c.call(make_request("b", 0), timeout=30)  # (anonymous: admitted by task)
    assert (res.status.reason, res.status.code) == ("overloaded", res.status.OVERLOADED), res.status
    assert "not admitted" in res.status.message and "max_tasks" in res.status.message, res.status.message
    assert c.call(make_request("a", 1, exec_info=(c.now(), 2)), timeout=30).status.reason == "ok"  # the admitted goes on


def test_a_round_whose_observation_is_too_old_is_not_generated_and_its_robot_told(ros_ctx):
    ros_ctx.start_node(server_args("max_obs_age_s:=3.0"))  # (no refresh service: nothing fresher comes)
    c = Caller(ros_ctx)
    old = make_request("a", 0)
    old.observation.header.stamp.sec = int(c.now()) - 10
    res = c.call(old, timeout=30)
    assert (res.status.reason, res.status.code) == ("stale_observation", res.status.STALE_OBSERVATION), res.status
    assert "over its maximum 3 s" in res.status.message, res.status.message
    fresh = make_request("a", 0)  # the round again, with a fresh observation
    fresh.observation.header.stamp.sec, fresh.observation.header.stamp.nanosec = divmod(int(c.now() * 1e9), 10**9)
    assert c.call(fresh, timeout=30).status.reason == "ok"


def test_bad_inputs_get_clear_errors_and_the_good_robot_keeps_going(ros_ctx):
    from diagnostic_msgs.msg import DiagnosticArray

    ros_ctx.start_node(server_args("max_request_bytes:=100000"))
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    c = Caller(ros_ctx)
    assert c.call(make_request("good", 0)).status.reason == "ok"
    first = c.call(make_request("dup", 0))
    assert first.status.reason == "ok"
    assert c.call(make_request("back", 0)).status.reason == "ok"
    assert c.call(make_request("back", 1, exec_info=(c.now(), 2))).status.reason == "ok"
    bad = {
        "wrong image encoding": (make_request("x1", 0, encoding="bgr16"), "bad_observation", "encoding 'bgr16'"),
        "wrong image size": (make_request("x2", 0, width=64), "bad_observation", "64x64"),
        "NaN in joint state": (make_request("x3", 0, joints=[0, 0, float("nan"), 0, 0, 0]), "bad_observation", "nan"),
        "unknown task": (make_request("ghost", 4, exec_info=(c.now(), 2)), "unknown_task", "ghost"),
        "round id going backwards": (make_request("back", 0), "round_out_of_order", "round 0 arrived after round 1"),
        "oversized payload": (make_request("x4", 0, width=224), "payload_too_large", "at most 100000"),
        "truncated image": (make_request("x5", 0, nbytes=100), "bad_observation", "bytes of data"),
    }
    # A round asked again (its reply lost on the way) is answered from the reply cache: the
    # same chunk, no second generation.
    again = c.call(make_request("dup", 0))
    assert again.status.reason == "ok" and list(again.chunk.actions) == list(first.chunk.actions)
    good_round = 1
    for what, (req, code, text) in bad.items():
        res = c.call(req)
        assert res.status.reason == code, f"{what}: {res.status.reason}: {res.status.message}"
        assert res.status.code != 0 and text in res.status.message, f"{what}: {res.status.message}"
        # ... and the other robot keeps being served, round after round.
        ok = c.call(make_request("good", good_round, exec_info=(c.now(), 2)))
        assert ok.status.reason == "ok" and ok.chunk.round_id == good_round, what
        good_round += 1

    def counted():
        for d in diags:
            vals = {kv.key: kv.value for kv in d.status[0].values}
            if (vals.get("errors/bad_observation") == "4" and vals.get("errors/payload_too_large") == "1"
                    and vals.get("replies_replayed") == "1"):
                return vals
        return None

    assert ros_ctx.wait_for(lambda: counted() is not None, 5), "errors not counted in diagnostics"
    vals = counted()
    for code in ("unknown_task", "round_out_of_order"):
        assert vals[f"errors/{code}"] == "1", vals
    # The operator sees why, not only how many: the last refusal of each kind (robotserve up/status print it).
    assert "bytes of data" in vals["last_error/bad_observation"], vals  # the truncated image came last
    assert "round 0 arrived after round 1" in vals["last_error/round_out_of_order"], vals


def merge(tree: dict, over: dict) -> dict:
    """`over` into the nested parameter tree: sections merged, values replaced."""
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(tree.get(k), dict):
            merge(tree[k], v)
        else:
            tree[k] = v
    return tree


def fleet_params(tmp_path, server=None, **client):
    import yaml

    from robotserve_ros.launch_description import default_config

    cfg = yaml.safe_load(open(default_config()).read())
    merge(cfg["inference_server"]["ros__parameters"], {"task_timeout_s": 1.5, "diagnostics_hz": 5.0, **(server or {})})
    cfg["/**/robot_client"]["ros__parameters"].update({"task_actions": 45, **client})
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def start_fleet_of_one(ros_ctx, params):
    """Server, one simulated robot and its client from `params`; returns (client process,
    last(): the server's latest diagnostics as a dict)."""
    from diagnostic_msgs.msg import DiagnosticArray

    ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", params])
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    ros_ctx.start_node(["robotserve_ros.nodes.sim_robot", "--robots", "1", "--ros-args", "--params-file", params])
    client = ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "1", "--ros-args", "--params-file", params])

    def last():
        return {kv.key: kv.value for kv in diags[-1].status[0].values} if diags else {}

    return client, last


def test_robot_client_runs_tasks_with_a_simulated_robot(ros_ctx, tmp_path):
    from trajectory_msgs.msg import JointTrajectory

    from robotserve_ros.msg import ExecutionProgress
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    # 3 tasks, any 2 seen: the first can end (1.5 s) before this test's subscriber has matched.
    params = fleet_params(tmp_path, tasks=3)
    ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", params])
    ros_ctx.start_node(["robotserve_ros.nodes.sim_robot", "--robots", "1", "--ros-args", "--params-file", params])
    client = ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "1", "--ros-args", "--params-file", params])
    progress = ros_ctx.collect(ExecutionProgress, "/robotserve/progress", QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    commands = ros_ctx.collect(JointTrajectory, "/robot_0/command", 10)
    done = lambda: [m for m in progress if m.task_done]  # noqa: E731
    assert ros_ctx.wait_for(lambda: len(done()) >= 2, 60), client.output()
    first = done()[0]
    assert first.task_id.startswith("robot_0/task") and first.timestep >= 45 and first.chunks >= 2
    assert len(commands) >= 45 and len(commands[0].points[0].positions) == 6
    assert client.stop() == 0, client.output()


def test_vanished_client_is_reaped_and_its_work_dropped(ros_ctx, tmp_path):
    # 1.5 s of silence would also reap a live client starved by a loaded machine: give it 3 s.
    params = fleet_params(tmp_path, server={"task_timeout_s": 3.0}, task_actions=10000)
    client, last = start_fleet_of_one(ros_ctx, params)

    assert ros_ctx.wait_for(lambda: last().get("tasks") == "1" and int(last().get("served", "0")) >= 2, 20), client.output()
    import signal

    reaped_before = int(last().get("reaped_tasks", "0"))
    client.stop(sig=signal.SIGKILL)  # gone mid-task, without a word
    gone = lambda: (last().get("tasks") == "0" and last().get("queue_length") == "0"  # noqa: E731
                    and int(last().get("reaped_tasks", "0")) > reaped_before)
    assert ros_ctx.wait_for(gone, 15), last()


def test_stale_observations_are_refreshed_from_the_robot(ros_ctx, tmp_path):
    """Algorithm 1 lines 20-21 over srv/FetchObservation: with every observation stale at
    dispatch, the server fetches a fresh one from the robot client before the engine runs."""
    params = fleet_params(tmp_path, server={"stale_obs_s": 0.001, "refresh_timeout_s": 0.5}, task_actions=10000)
    client, last = start_fleet_of_one(ros_ctx, params)

    assert ros_ctx.wait_for(lambda: int(last().get("refreshes", "0")) >= 3, 30), (last(), client.output())
    assert int(last()["refreshes"]) > int(last()["refresh_failures"]), last()


def test_a_reply_that_does_not_come_in_time_is_asked_for_again(ros_ctx, tmp_path):
    """Generation slower than the client's resend_after_s (as a reply lost in the RMW would
    look): the client sends the same round again, the server attaches it to the round it is
    generating (resent_requests), the robot gets one chunk per round and finishes its task.
    (The client does not hear the server's expected wait, queue_topic '', as a client that
    knows nothing of it.)"""
    import json

    stats = tmp_path / "client_{robot}.json"
    params = fleet_params(tmp_path, server={"engine": {"batch_sizes": [1, 2], "latency_ms": [1200.0, 1300.0]}},
                          resend_after_s=0.4, expected_latency_s=0.05, tasks=1, task_actions=30,
                          stats_file=str(stats), queue_topic="")
    client, last = start_fleet_of_one(ros_ctx, params)
    assert ros_ctx.wait_for(lambda: int(last().get("resent_requests", "0")) >= 1
                            and int(last().get("finished_tasks", "0")) >= 1, 40), (last(), client.output())
    client.stop()
    acct = json.loads((tmp_path / "client_robot_0.json").read_text())
    assert acct["resent"] >= 1 and acct["duplicates"] == 0 and acct["mismatched"] == 0, acct
    assert int(last()["served"]) == acct["chunks"] - acct["answers_to_resent"], (last(), acct)


def test_a_round_queued_as_long_as_the_last_one_is_not_asked_for_again(ros_ctx, tmp_path):
    """Generation slower than the client's first re-send guess: round 0 may be re-sent
    (unless the server's word on its queue came first), and from its answer the robot's
    re-send interval follows the wait it measured (core/robot_timing.ResendTimer), so the
    later rounds, as slow, are not. The server says how long a round sent now waits."""
    import json

    from std_msgs.msg import Float64

    waits = ros_ctx.collect(Float64, "/robotserve/queue_wait")
    stats = tmp_path / "client_{robot}.json"
    params = fleet_params(tmp_path, server={"engine": {"batch_sizes": [1, 2], "latency_ms": [1000.0, 1100.0]}},
                          resend_after_s=0.4, expected_latency_s=0.05, tasks=1, task_actions=125,
                          stats_file=str(stats))
    client, last = start_fleet_of_one(ros_ctx, params)
    assert ros_ctx.wait_for(lambda: int(last().get("finished_tasks", "0")) >= 1, 60), (last(), client.output())
    client.stop()
    acct = json.loads((tmp_path / "client_robot_0.json").read_text())
    rounds = sorted({rnd for _, rnd, *_ in acct["chunk_log"]})
    assert len(rounds) >= 4, acct  # (every round waits ~1 s: a fixed 0.4 s interval re-sent each twice)
    assert acct["resent"] <= 2 and acct["duplicates"] == 0, acct  # round 0's only
    assert int(last()["resent_requests"]) == acct["resent"], (last(), acct)
    assert waits and min(m.data for m in waits) >= 1.0, [m.data for m in waits[:5]]  # at least one batch (1-1.1 s)
