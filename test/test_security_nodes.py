"""The ROS nodes against a hostile participant on their domain (issues 23 and 29), each attack
on a real inference server with a good robot served in the same test during and after it:
oversized srv/Infer fields; 100 concurrent srv/Generate calls and a cancel storm on
action/PlanTask (each call answered, served or OVERLOADED, none left waiting); srv/Infer past
its waiting calls (OVERLOADED); another node ending a robot's task or re-sending its task and
round, flipping or replaying its signed progress, squatting its next task id (refused by
the MAC over the whole message and its sequence, counted); a new refresh service name each round (its
client reaped); /diagnostics keyed by robot, never by task id."""
from __future__ import annotations

import time

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, fleet_params, make_request, server_args, start_fleet_of_one

pytestmark = requires_rclpy


def test_oversized_fields_refused_and_the_good_robot_served(ros_ctx):
    ros_ctx.start_node(server_args("max_instruction_bytes:=64", "max_images:=2"))
    c = Caller(ros_ctx)
    assert c.call(make_request("good", 0)).status.reason == "ok"
    long_id = make_request("t" * 10_000, 0)
    long_text = make_request("x2", 0)
    long_text.observation.instruction = "pick " * 20
    long_hz = make_request("x3", 0, horizon=("s" * 300, 8.0))
    long_refresh = make_request("x4", 0)
    long_refresh.refresh_service = "/r" * 200
    many = make_request("x5", 0)
    many.observation.images = list(many.observation.images) * 3
    cases = [(long_id, "task_id: 10000 bytes, at most 256"),
             (long_text, "observation.instruction: 100 bytes, at most 64"),
             (long_hz, "horizon.name: 300 bytes, at most 256"),
             (long_refresh, "refresh_service: 400 bytes, at most 256"),
             (many, "observation.images: 3 images, at most 2")]
    for rnd, (req, says) in enumerate(cases, 1):
        res = c.call(req)
        assert res.status.reason == "bad_request" and res.status.message == says, res.status.message
        ok = c.call(make_request("good", rnd, exec_info=(c.now(), 2)))
        assert ok.status.reason == "ok" and ok.chunk.round_id == rnd


def deep_qos():
    """The attacker's and the test's own queues deep enough to hold every answer: what is
    tested is that the server answers each call, not the client's own history depth."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)


def test_infer_past_its_waiting_calls_is_overloaded_never_dropped(ros_ctx):
    """40 robots' round 0 at once against a server that lets 4 calls wait: every call is
    answered (ok or OVERLOADED, counted), and a good robot is served during and after."""
    from diagnostic_msgs.msg import DiagnosticArray

    from robotserve_ros.srv import Infer

    ros_ctx.start_node(server_args("engine.latency_ms:=[200.0,210.0,220.0]", "infer_queue.max_waiting:=4", "infer_queue.depth:=100",
                                   "threads:=16"))
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    c = Caller(ros_ctx)
    assert c.call(make_request("good", 0)).status.reason == "ok"
    flood = ros_ctx.node.create_client(Infer, "/robotserve/infer", qos_profile=deep_qos())
    assert flood.wait_for_service(timeout_sec=60)
    futs = [flood.call_async(make_request(f"flood{i}", 0)) for i in range(40)]
    during = c.send(make_request("good", 1, exec_info=(c.now(), 2)))
    assert ros_ctx.wait_for(lambda: all(f.done() for f in futs) and during.done(), 60), \
        sum(f.done() for f in futs)
    reasons = [f.result().status.reason for f in futs]
    assert set(reasons) <= {"ok", "overloaded"} and reasons.count("overloaded") >= 20, reasons
    assert during.result().status.reason in ("ok", "overloaded")
    for rnd in (2, 3):  # after the flood: served
        res = c.call(make_request("good", rnd, exec_info=(c.now(), 2)))
        assert res.status.reason == "ok" and res.chunk.round_id == rnd, res.status
    want = str(reasons.count("overloaded") + (during.result().status.reason == "overloaded"))
    assert ros_ctx.wait_for(lambda: diags and any(kv.key == "errors/overloaded" and kv.value == want
                                                  for kv in diags[-1].status[0].values), 5)


def test_generate_flood_and_plan_cancel_storm_leave_no_call_unanswered(ros_ctx, tmp_path):
    """100 concurrent srv/Generate calls, then 120 PlanTask goals each cancelled as soon as it
    is accepted (issue 29: 86 of 100 and 84 of 120 were never answered with the default queue
    depth of 10). Every call gets its answer; a robot's srv/Infer rounds are served during the
    flood, and Generate and PlanTask serve good requests after it."""
    import yaml
    from rclpy.action import ActionClient

    from robotserve_ros.action import PlanTask
    from robotserve_ros.srv import Generate
    from test_planner_nodes import send
    from test_slo_generate_node import request

    cfg = {"inference_server": {"ros__parameters": {
        "engine": {"batch_sizes": [1, 2, 4], "latency_ms": [40.0, 45.0, 50.0]}, "obs_width": 96, "obs_height": 96,
        "obs_joints": 6, "obs_encodings": ["rgb8"], "task_timeout_s": 30.0, "services": ["generate", "planner"],
        "generate": {"engine": "tiny", "chat_template": False, "ttft_slo_s": 30.0, "tpot_slo_s": 5.0, "max_tokens": 4,
                     "max_in_flight": 8},
        "planner": {"model": "tiny", "max_segment_tokens": 4, "max_segments": 3, "max_prompt_tokens": 400,
                    "max_goals": 8}}}}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(cfg))
    srv = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", str(path)])
    gen = ros_ctx.node.create_client(Generate, "/robotserve/generate", qos_profile=deep_qos())
    assert gen.wait_for_service(timeout_sec=150), srv.output()  # torch + transformers import under load
    robot = Caller(ros_ctx)

    futs = [gen.call_async(request(f"q{i}", max_tokens=3)) for i in range(100)]
    for rnd in range(3):  # a robot served while the flood is in
        res = robot.call(make_request("robot", rnd, exec_info=(robot.now(), 2) if rnd else None), timeout=30)
        assert res.status.reason == "ok" and res.chunk.round_id == rnd, res.status
    assert ros_ctx.wait_for(lambda: all(f.done() for f in futs), 120), (sum(f.done() for f in futs), srv.output())
    reasons = [f.result().status.reason for f in futs]
    assert set(reasons) <= {"ok", "overloaded"} and "overloaded" in reasons and "ok" in reasons, reasons
    after = gen.call_async(request("after", max_tokens=3))
    assert ros_ctx.wait_for(after.done, 60) and after.result().status.reason == "ok", after.result().status

    deep = deep_qos()
    plans = ActionClient(ros_ctx.node, PlanTask, "/robotserve/plan_task", goal_service_qos_profile=deep,
                         result_service_qos_profile=deep, cancel_service_qos_profile=deep,
                         feedback_sub_qos_profile=deep)
    assert ros_ctx.wait_for(plans.server_is_ready, 30)
    goals = []
    for i in range(120):
        g = PlanTask.Goal()
        g.task_id, g.agent_id, g.agent_kind, g.prompt = f"storm{i}", "attacker", "drone", "Task: [A] find the cat"
        goals.append(plans.send_goal_async(g))
    assert ros_ctx.wait_for(lambda: all(f.done() for f in goals), 60), sum(f.done() for f in goals)
    handles = [f.result() for f in goals]
    assert all(h.accepted for h in handles)
    cancels = [h.cancel_goal_async() for h in handles]
    results = [h.get_result_async() for h in handles]
    assert ros_ctx.wait_for(lambda: all(f.done() for f in results + cancels), 120), \
        (sum(f.done() for f in results), srv.output())
    got = {r.result().result.status.reason for r in results}
    assert got <= {"ok", "task_dropped", "overloaded"}, got
    res, feedback = send(ros_ctx, plans, task_id="good", urgent=True)
    assert ros_ctx.wait_for(res.done, 60) and res.result().result.status.reason == "ok", res.result().result.status
    res = robot.call(make_request("robot", 3, exec_info=(robot.now(), 2)), timeout=30)
    assert res.status.reason == "ok", res.status
    assert srv.stop() == 0, srv.output()


def signed(req, key: bytes, robot: str, now: float):
    from robotserve_ros.nodes.common import sign, to_time

    req.robot_id, req.auth_stamp = robot, to_time(now)
    sign(req, key, "infer")
    return req


def test_tasks_belong_to_their_robot_and_diagnostics_name_robots_not_tasks(ros_ctx, tmp_path):
    """A robot client signing with its key (task_auth): another node on the domain that reads
    its progress cannot end its task (task_done unsigned, signed with the attacker's own key,
    or flipped in the robot's own signed message; an old message of the robot replayed), take
    its chunk (re-sending its task and round) nor squat its next task id; each try is refused
    and counted, the robot keeps being served, and no task id is on /diagnostics."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from robotserve_ros.core.task_auth import key_file_name, new_key
    from robotserve_ros.msg import ExecutionProgress
    from robotserve_ros.nodes.common import sign, to_time

    keys = tmp_path / "keys"
    keys.mkdir()
    robot_key, attacker_key = new_key(), new_key()
    (keys / key_file_name("/robot_0")).write_bytes(robot_key)
    (keys / key_file_name("/attacker")).write_bytes(attacker_key)
    (tmp_path / "robot_0.key").write_bytes(robot_key)
    params = fleet_params(tmp_path, server={"task_auth": {"key_dir": str(keys)}, "task_timeout_s": 3.0},
                          task_actions=10000, task_key_file=str(tmp_path / "robot_0.key"))
    reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    progress = ros_ctx.collect(ExecutionProgress, "/robotserve/progress", reliable)
    client, last = start_fleet_of_one(ros_ctx, params)
    assert ros_ctx.wait_for(lambda: int(last().get("served", "0")) >= 3 and len(progress) >= 2, 40), (last(), client.output())
    victim, older = progress[-1], progress[-2]
    tid, rnd = victim.task_id, victim.round_id
    assert victim.robot_id == "/robot_0" and len(victim.auth_mac) == 32 and tid == "robot_0/task0"

    # Ending its task: unsigned, signed with the attacker's key under its own name, and under the robot's name.
    pub = ros_ctx.publisher(ExecutionProgress, "/robotserve/progress", reliable)
    assert ros_ctx.wait_for_subscriber(pub)
    now = ros_ctx.node.get_clock().now().nanoseconds * 1e-9
    for robot, key in (("", None), ("/attacker", attacker_key), ("/robot_0", attacker_key)):
        m = ExecutionProgress(task_id=tid, round_id=rnd, task_done=True, robot_id=robot)
        m.header.stamp = to_time(now)
        if key is not None:
            sign(m, key, "progress")
        pub.publish(m)
    # The robot's own signed message with task_done flipped, and an older one of its own replayed.
    flipped = ExecutionProgress()
    for f in victim.get_fields_and_field_types():
        setattr(flipped, f, getattr(victim, f))
    flipped.task_done = True
    pub.publish(flipped)
    pub.publish(older)
    # Taking its chunk: its task and round re-sent, unsigned and signed by the attacker.
    c = Caller(ros_ctx)
    for req in (make_request(tid, rnd + 1), signed(make_request(tid, rnd + 1), attacker_key, "/attacker", c.now()),
                signed(make_request(tid, rnd + 1), attacker_key, "/robot_0", c.now())):
        res = c.call(req)
        assert res.status.reason == "not_task_owner" and not res.chunk.actions, res.status
    # Squatting the robot's next task id with the attacker's own valid key.
    res = c.call(signed(make_request("robot_0/task1", 0), attacker_key, "/attacker", c.now()))
    assert res.status.reason == "not_task_owner" and "opens tasks named 'attacker/...'" in res.status.message, res.status
    # A task of its own, signed with its own key, is served; an unsigned one is not.
    assert c.call(signed(make_request("attacker/mine", 0), attacker_key, "/attacker", c.now())).status.reason == "ok"
    assert c.call(make_request("anon", 0)).status.reason == "not_task_owner"

    served = int(last()["served"])
    refused = lambda: int(last().get("progress_refused/not_task_owner", "0"))  # noqa: E731
    assert ros_ctx.wait_for(lambda: refused() == 5 and last().get("errors/not_task_owner") == "5", 10), last()
    # the robot's task was not ended: still served, nothing finished or reaped
    assert ros_ctx.wait_for(lambda: int(last()["served"]) >= served + 3, 20), last()
    st = last()
    assert st["finished_tasks"] == "0" and st["reaped_tasks"] == "0", st
    assert any(m.task_id == tid and m.chunks > victim.chunks for m in progress)
    # /diagnostics: robots by namespace, no task id anywhere
    assert {k for k in st if k.startswith("wait_ratio/")} == {"wait_ratio/robot_0", "wait_ratio/attacker"}, st
    assert not [kv for kv in st.items() if tid in kv[0] or tid in kv[1] or "mine" in kv[0] or "mine" in kv[1]]
    assert client.stop() == 0, client.output()


def test_refresh_clients_are_reaped_when_no_task_names_them(ros_ctx):
    """A robot naming a new refresh service each round (none of them served), beside a good
    robot whose refresh service (this test's node) answers: the server keeps the clients of
    the names tasks use now (2), not one per name ever seen (13 before issue 29)."""
    from diagnostic_msgs.msg import DiagnosticArray

    from robotserve_ros.srv import FetchObservation

    ros_ctx.start_node(server_args("stale_obs_s:=0.001", "refresh_timeout_s:=0.2"))
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    fresh = make_request("good", 0).observation

    def fetch(request, response):
        response.ok, response.observation = True, fresh
        return response

    ros_ctx.node.create_service(FetchObservation, "/good/fetch", fetch)
    c = Caller(ros_ctx)

    def good(rnd):
        req = make_request("good", rnd, exec_info=(c.now(), 2) if rnd else None)
        req.refresh_service = "/good/fetch"
        res = c.call(req)
        assert res.status.reason == "ok" and res.chunk.round_id == rnd, res.status

    good(0)
    for rnd in range(12):
        req = make_request("churn", rnd, exec_info=(c.now(), 2) if rnd else None)
        req.refresh_service = f"/nobody/fetch_{rnd}"
        assert c.call(req).status.reason == "ok"
        good(rnd + 1)
    ros_ctx.spin(0.5)
    vals = {kv.key: kv.value for kv in diags[-1].status[0].values}
    assert int(vals["refreshes"]) >= 1 and int(vals["refresh_failures"]) >= 1, vals  # both kinds were asked
    assert int(vals["refresh_clients"]) <= 2, vals
    # A name no client can be made for is refused with the request (it used to fail the
    # whole batch it was dispatched in: engine_failure for every robot in it).
    bad = make_request("badname", 0)
    bad.refresh_service = "/not a name!"
    res = c.call(bad)
    assert res.status.reason == "bad_request" and "refresh_service" in res.status.message, res.status
    good(13)


def test_a_missing_key_or_key_dir_stops_the_node_with_one_line(tmp_path):
    """A task key that cannot be read is an error at start (exit 2, one line), never a
    robot or server running unsigned by accident; an empty key file likewise."""
    from rosutil import ros_env, start_node

    from robotserve_ros.nodes.server_config import InferenceServerConfig
    from test_node_configs import error_of

    assert error_of(InferenceServerConfig, infer_queue={"max_waiting": 0}).startswith(
        "parameter 'infer_queue.max_waiting': 0 is not >= 1")
    assert error_of(InferenceServerConfig, task_auth={"max_skew_s": 0}).startswith(
        "parameter 'task_auth.max_skew_s': 0.0 is not > 0")
    (tmp_path / "empty.key").write_bytes(b"\n")
    env = ros_env()
    cases = {"robotserve_ros.nodes.inference_server": (f"task_auth.key_dir:={tmp_path / 'none'}",
                                                       "parameter 'task_auth.key_dir': key_dir "),
             "robotserve_ros.nodes.robot_client": (f"task_key_file:={tmp_path / 'empty.key'}",
                                                   "parameter 'task_key_file': key file ")}
    procs = {m: start_node([m, "--ros-args", "-p", p], env) for m, (p, _) in cases.items()}
    for module, proc in procs.items():
        try:
            code = proc.wait(timeout=60)
        finally:
            proc.stop()
        lines = [ln for ln in proc.stderr().splitlines() if ln.strip()]
        assert code == 2, proc.output()
        assert len(lines) == 1 and lines[0].startswith("robotserve_ros: " + cases[module][1]), proc.output()


def test_what_a_task_mac_covers_is_the_same_bytes_at_both_ends():
    """CDR leaves padding uninitialised, so the MAC covers canonical bytes (nodes/canonical.py):
    a robot's message and the server's deserialized copy give the same bytes (a float32 field
    set from a Python double included), and any changed field gives others."""
    from rclpy.serialization import deserialize_message, serialize_message

    from robotserve_ros.msg import ExecutionProgress
    from robotserve_ros.nodes.common import signed_body
    from robotserve_ros.srv import Infer

    r = make_request("a/t", 1, exec_info=(1.1, 3))
    r.exec_info.control_hz, r.rtc_leftover, r.robot_id, r.auth_mac = 0.1, [0.1, 0.2], "/a", b"x" * 32
    m = ExecutionProgress(task_id="a/t", idle_s=0.3, control_hz=33.3, timestep=2**63 + 5, auth_mac=b"y" * 32)
    for msg, typ in ((r, Infer.Request), (m, ExecutionProgress)):
        for _ in range(3):  # padding differs from one serialization to the next
            assert signed_body(deserialize_message(serialize_message(msg), typ)) == signed_body(msg)
    body = signed_body(m)
    m.task_done = True
    assert signed_body(m) != body and bytes(m.auth_mac) == b"y" * 32  # the MAC field itself is left as it was


def test_a_signers_stamps_grow_even_when_its_clock_does_not():
    """A signed message's stamp is its sequence number: a coarse clock (sim time) reading the
    same instant twice must not make the robot's second message look like a replay."""
    from robotserve_ros.nodes.common import Stamps, to_ns

    s = Stamps()
    got = [to_ns(s(t)) for t in (5.0, 5.0, 5.0, 4.0, 6.0)]
    assert got == [5_000_000_000, 5_000_000_001, 5_000_000_002, 5_000_000_003, 6_000_000_000]
