"""A server for many robots (issue 26), on a real inference server: srv/Infer's deferred
replies (nodes/deferred.py: a waiting call holds no executor thread, so more calls wait at
once than the server has threads, and each is answered), and the observation refresh from a
topic (nodes/refresh.py: no client per robot)."""
from __future__ import annotations

import os

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, make_request, server_args
from test_security_nodes import deep_qos

pytestmark = requires_rclpy


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_more_calls_wait_than_the_executor_has_threads_and_all_are_answered(ros_ctx):
    """50 robots' round 0 at once on a server with 4 executor threads and batches of at most
    4 (~100 ms each): the calls wait together (/diagnostics counts more waiters than threads),
    the process starts no thread for them, and every call is answered ok."""
    from diagnostic_msgs.msg import DiagnosticArray

    from robotserve_ros.srv import Infer

    proc = ros_ctx.start_node(server_args("engine.latency_ms:=[100.0,105.0,110.0]", "threads:=4",
                                          "infer_queue.depth:=100", "task_timeout_s:=30.0"))
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    c = Caller(ros_ctx)
    assert c.call(make_request("warm", 0)).status.reason == "ok"
    before = _threads(proc.pid)
    flood = ros_ctx.node.create_client(Infer, "/robotserve/infer", qos_profile=deep_qos())
    assert flood.wait_for_service(timeout_sec=60)
    futs = [flood.call_async(make_request(f"r{i}", 0)) for i in range(50)]
    waiters, threads = [], []

    def watch() -> bool:
        threads.append(_threads(proc.pid))
        for d in diags[-3:]:
            waiters.extend(int(kv.value) for kv in d.status[0].values if kv.key == "waiters")
        return all(f.done() for f in futs)

    assert ros_ctx.wait_for(watch, 60), sum(f.done() for f in futs)
    reasons = [f.result().status.reason for f in futs]
    assert reasons == ["ok"] * 50, reasons
    assert max(waiters) > 4, waiters  # more rounds waited at once than there are threads
    assert max(threads) <= before, (before, max(threads))


def test_refresh_by_topic_reads_the_newest_observation_at_dispatch(ros_ctx):
    """Robots publish their newest observation on the server's refresh_topic (no refresh
    service, no client per robot): a round whose observation went stale while queued is
    served with the topic's newer one (counted, its age at dispatch measured); a malformed
    one is refused and counted, and its robot's round is served with what it sent."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import qos_profile_sensor_data

    from robotserve_ros.srv import Infer

    ros_ctx.start_node(server_args("refresh_topic:=/robotserve/observations", "stale_obs_s:=0.05",
                                   "task_timeout_s:=30.0"))
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    c = Caller(ros_ctx)
    pub = ros_ctx.publisher(Infer.Request, "/robotserve/observations", qos_profile_sensor_data)
    assert ros_ctx.wait_for_subscriber(pub, 10)
    for task in ("good", "bad"):  # round 0: the task is the server's from now on
        assert c.call(make_request(task, 0)).status.reason == "ok"

    def newest(task: str, width: int):
        m = make_request(task, 1, width=width)
        m.observation.header.stamp = ros_ctx.node.get_clock().now().to_msg()  # newer than the round's (0)
        return m

    for _ in range(5):  # best effort: a few, as a robot streaming its camera would
        pub.publish(newest("good", 96))
        pub.publish(newest("bad", 50))  # not the policy's image size
        ros_ctx.spin(0.05)
    for task in ("good", "bad"):
        res = c.call(make_request(task, 1, exec_info=(c.now(), 2)))
        assert res.status.reason == "ok", res.status

    def value(key):
        for d in reversed(diags):
            for kv in d.status[0].values:
                if kv.key == key:
                    return kv.value
        return None

    assert ros_ctx.wait_for(lambda: value("refresh_topic_used") == "1" and value("refresh_topic_refused") == "1", 5), \
        (value("refresh_topic_used"), value("refresh_topic_refused"))
    age = float(value("refresh_age_ms_p50"))
    assert 0 <= age < 5000, age


def test_a_burst_is_taken_in_one_callback_and_every_call_answered(ros_ctx):
    """nodes/deferred: the server's Infer and progress callbacks take what is queued behind
    them, and a refresh reply resolves the replies queued behind it (one executor wake-up per
    burst, not one per call). A node that no executor spins: 5 calls and 5 messages sent, all
    taken in order at once; each call answered gets its own reply, resolved in this thread."""
    import rclpy
    from std_msgs.msg import Float64

    from robotserve_ros.nodes.deferred import queued_messages, queued_requests, resolve_queued_responses
    from robotserve_ros.srv import Infer

    server = rclpy.create_node("burst_server", context=ros_ctx.context)
    try:
        srv = server.create_service(Infer, "/burst/infer", lambda req, resp: resp)
        sub = server.create_subscription(Float64, "/burst/progress", lambda m: None, 100)
        assert list(queued_requests(srv)) == [] and list(queued_messages(sub)) == []
        pub = ros_ctx.publisher(Float64, "/burst/progress", 100)
        cli = server.create_client(Infer, "/burst/infer")  # not spun either: its replies wait until taken
        assert cli.wait_for_service(timeout_sec=10) and ros_ctx.wait_for_subscriber(pub, 10)
        for i in range(5):
            pub.publish(Float64(data=float(i)))
        futs = [cli.call_async(Infer.Request(task_id=f"t{i}")) for i in range(5)]
        called_back: list = []
        for f in futs:
            f.add_done_callback(lambda f: called_back.append(f.result().language_id))
        taken, msgs = [], []

        def take_all() -> bool:
            taken.extend(queued_requests(srv))
            msgs.extend(queued_messages(sub))
            return len(taken) == 5 and len(msgs) == 5

        assert ros_ctx.wait_for(take_all, 10), (len(taken), len(msgs))
        assert [m.data for m in msgs] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert [r.task_id for r, _ in taken] == [f"t{i}" for i in range(5)]
        for req, header in taken:
            resp = Infer.Response()
            resp.language_id = req.task_id  # each reply names its call: matched to the right future
            srv.send_response(resp, header)
        resolved = []
        assert ros_ctx.wait_for(lambda: resolved.append(resolve_queued_responses(cli)) or sum(resolved) == 5, 10)
        assert all(f.done() for f in futs) and [f.result().language_id for f in futs] == [f"t{i}" for i in range(5)]
        assert called_back == [f"t{i}" for i in range(5)]  # each future's callbacks ran, here
        for i in range(3):  # at most `limit` per callback: the rest stays for the next
            pub.publish(Float64(data=float(i)))
        ros_ctx.spin(0.5)
        assert len(list(queued_messages(sub, limit=2))) == 2
        assert len(list(queued_messages(sub))) == 1
    finally:
        server.destroy_node()
