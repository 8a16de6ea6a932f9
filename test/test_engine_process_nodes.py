"""`engine_process: separate` on real processes (isolated ROS domain): the inference server
node is the ROS front end, the engine core process (serve/core_process.py) holds the core,
scheduler and engine. The same replies as inline; a front end killed and restarted loses no
round; a core killed is reported (logged, counted) and started again, robots resume."""
from __future__ import annotations

import os
import re
import signal

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, make_request, server_args

pytestmark = requires_rclpy


def req(c, task, rnd):
    return make_request(task, rnd, exec_info=(c.now(), 4) if rnd else None)


def chunks(c, tasks=("a", "b"), rounds=3):
    out = []
    for t in tasks:
        for r in range(rounds):
            res = c.call(req(c, t, r), timeout=20)
            assert res.status.reason == "ok", res.status.message
            out.append((res.chunk.task_id, res.chunk.round_id, res.chunk.horizon, res.chunk.action_dim,
                        list(res.chunk.actions)))
    return out


def core_pid(srv, timeout=30):
    """The engine core process's pid, as the front end logged it (started or attached to)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = re.findall(r"(?:started|attached to) the engine core process (\d+)", srv.output())
        if m:
            return int(m[-1])
        time.sleep(0.1)
    raise AssertionError(srv.output())


def test_separate_serves_the_same_replies_as_inline(ros_ctx):
    inline = ros_ctx.start_node(server_args())
    got_inline = chunks(Caller(ros_ctx))
    inline.stop()
    sep = ros_ctx.start_node(server_args("engine_process:=separate"))
    pid = core_pid(sep)
    got_sep = chunks(Caller(ros_ctx))
    assert got_sep == got_inline
    assert sep.stop() == 0, sep.output()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", \
        "the core process outlived its front end's clean stop"


def test_a_front_end_killed_and_restarted_loses_no_round(ros_ctx):
    slow = ["engine_process:=separate", "engine.latency_ms:=[1500.0,1500.0,1500.0]", "task_timeout_s:=30.0"]
    srv = ros_ctx.start_node(server_args(*slow))
    pid = core_pid(srv)
    c = Caller(ros_ctx)
    assert c.call(make_request("a", 0), timeout=20).status.reason == "ok"
    c.send(req(c, "a", 1))  # in flight in the core when its front end dies
    ros_ctx.wait_for(lambda: False, 0.3)
    srv.stop(sig=signal.SIGKILL)
    srv = ros_ctx.start_node(server_args(*slow))
    assert core_pid(srv) == pid, "the restarted front end started a new core instead of attaching"
    c = Caller(ros_ctx)
    # The robot sends it again until answered (as robot_client's RTO): a call sent before the
    # new server's endpoints are matched reaches nobody; the core answers the round once, the
    # older calls of it `duplicate_request`.
    sent = [c.send(req(c, "a", 1))]
    while not ros_ctx.wait_for(lambda: any(f.done() and f.result().status.reason == "ok" for f in sent), 2.0):
        assert len(sent) < 10, [f.result().status.reason for f in sent if f.done()]
        sent.append(c.send(req(c, "a", 1)))
    ok = [f.result() for f in sent if f.done() and f.result().status.reason == "ok"]
    assert len(ok) == 1 and (ok[0].chunk.task_id, ok[0].chunk.round_id) == ("a", 1)
    assert all(f.result().status.reason == "duplicate_request" for f in sent if f.done() and f.result() not in ok)
    assert c.call(req(c, "a", 2), timeout=20).status.reason == "ok"  # the task goes on, not started again
    assert srv.stop() == 0, srv.output()


def test_the_core_killed_is_reported_and_started_again(ros_ctx):
    from diagnostic_msgs.msg import DiagnosticArray

    from robotserve_ros.live.processes import server_diagnostics

    srv = ros_ctx.start_node(server_args("engine_process:=separate"))
    pid = core_pid(srv)
    c = Caller(ros_ctx)
    assert c.call(make_request("a", 0), timeout=20).status.reason == "ok"
    os.kill(pid, signal.SIGKILL)
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)

    def restarts():
        d = [server_diagnostics(m) for m in diags]
        d = [x for x in d if x and "core_restarts" in x]
        return int(d[-1]["core_restarts"]) if d else 0

    assert ros_ctx.wait_for(lambda: restarts() >= 1, 30), srv.output()
    assert f"engine core process {pid} exited" in srv.output()
    assert ros_ctx.wait_for(lambda: core_pid(srv) != pid, 30), srv.output()  # a new one started
    # The new core does not know the task (as a server killed and started again): the robot is
    # told, and its task starts again from round 0 under a new id and is served.
    res = c.call(req(c, "a", 1), timeout=20)
    assert res.status.reason in ("unknown_task", "engine_failure"), res.status
    assert ros_ctx.wait_for(lambda: c.call(make_request("a2", 0), timeout=20).status.reason == "ok", 30)
    assert srv.stop() == 0, srv.output()


def test_a_wrong_engine_process_is_one_line(ros_ctx):
    srv = ros_ctx.start_node(server_args("engine_process:=elsewhere"))
    assert srv.wait(30) == 2
    assert "engine_process" in srv.stderr() and "inline, separate" in srv.stderr(), srv.output()
