"""RTC served remotely over ROS (issue 28 item 2): a request's leftover reaches the engine, the
reply says the delay d the dispatcher set, d <= s <= H - d holds; a bad leftover is refused
with its own status (bad_rtc), counted, while another robot keeps being served; a robot_client
with rtc true runs its task on RTC chunks. The server's engine is the simulated one, whose RTC
is a stand-in (its chunk's first d rows are the leftover's): the wire and the dispatch are
what is tested here, the guided denoising in the flow engines' own tests."""
from __future__ import annotations

import json

import numpy as np

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, fleet_params, make_request, server_args, start_fleet_of_one

pytestmark = requires_rclpy

DIM, CHUNK = 6, 50  # the simulated engine's defaults


def with_leftover(req, leftover):
    left = np.asarray(leftover, dtype=np.float32)
    req.rtc_leftover = left.ravel().tolist()
    req.rtc_leftover_actions = len(left) if left.ndim == 2 else 1
    return req


def test_the_leftover_reaches_the_engine_and_the_reply_says_d(ros_ctx):
    srv = ros_ctx.start_node(server_args())
    c = Caller(ros_ctx)
    assert c.call(make_request("arm", 0)).status.reason == "ok"
    left = np.arange(12 * DIM, dtype=np.float32).reshape(12, DIM) / 100
    res = c.call(with_leftover(make_request("arm", 1, exec_info=(c.now(), 12), horizon=("static", 1.0)), left))
    assert res.status.reason == "ok", res.status.message
    d, s = res.chunk.rtc_delay_steps, res.chunk.horizon
    # 40 ms of generation at 30 Hz: at least 2 steps, at most the leftover
    assert 2 <= d <= 12, d
    assert d <= s <= CHUNK - d and f"RTC d={d}" in res.chunk.horizon_reason, (d, s, res.chunk.horizon_reason)
    rows = np.asarray(res.chunk.actions, np.float32).reshape(s, DIM)
    np.testing.assert_array_equal(rows[:d], left[:d])  # the stand-in froze exactly what was sent
    plain = c.call(make_request("other", 0))
    assert plain.status.reason == "ok" and plain.chunk.rtc_delay_steps == -1  # no leftover: unguided
    assert srv.stop() == 0, srv.output()


def test_a_bad_leftover_gets_bad_rtc_and_the_good_robot_keeps_going(ros_ctx):
    from diagnostic_msgs.msg import DiagnosticArray

    ros_ctx.start_node(server_args())
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    c = Caller(ros_ctx)
    assert c.call(make_request("good", 0)).status.reason == "ok"
    for t in ("b1", "b2", "b3", "b4"):
        assert c.call(make_request(t, 0)).status.reason == "ok"
    nan = np.zeros((4, DIM), np.float32)
    nan[2, 3] = np.nan
    bad = {
        "wrong width": (with_leftover(make_request("b1", 1, exec_info=(c.now(), 4)), np.zeros((4, DIM - 1))),
                        "5 values per action, the policy takes 6"),
        "NaN": (with_leftover(make_request("b2", 1, exec_info=(c.now(), 4)), nan), "not finite"),
        "too long": (with_leftover(make_request("b3", 1, exec_info=(c.now(), 4)), np.zeros((CHUNK + 1, DIM))),
                     f"more than a chunk of {CHUNK}"),
        "rows do not divide": (with_leftover(make_request("b4", 1, exec_info=(c.now(), 4)), np.zeros((3, DIM))),
                               "rtc_leftover_actions"),
    }
    bad["rows do not divide"][0].rtc_leftover_actions = 4
    good_round = 1
    for what, (req, text) in bad.items():
        res = c.call(req)
        assert res.status.reason == "bad_rtc" and res.status.code != 0, f"{what}: {res.status.reason}"
        assert text in res.status.message, f"{what}: {res.status.message}"
        ok = c.call(with_leftover(make_request("good", good_round, exec_info=(c.now(), 3)), np.ones((3, DIM))))
        assert ok.status.reason == "ok" and ok.chunk.rtc_delay_steps >= 0, what
        good_round += 1

    def counted():
        for m in diags:
            vals = {kv.key: kv.value for kv in m.status[0].values}
            if vals.get("errors/bad_rtc") == str(len(bad)):
                return True
        return False

    assert ros_ctx.wait_for(counted, 5), "bad_rtc not counted in diagnostics"


def test_a_robot_client_with_rtc_runs_its_task_on_rtc_chunks(ros_ctx, tmp_path):
    stats = tmp_path / "client_{robot}.json"
    params = fleet_params(tmp_path, rtc=True, tasks=1, task_actions=150, stats_file=str(stats))
    client, last = start_fleet_of_one(ros_ctx, params)
    assert ros_ctx.wait_for(lambda: int(last().get("finished_tasks", "0")) >= 1, 60), (last(), client.output())
    client.stop()
    acct = json.loads((tmp_path / "client_robot_0.json").read_text())
    rtc = acct["rtc"]
    assert rtc["guided"] >= 2 and rtc["unguided"] <= 1, rtc  # round 0 has no leftover: unguided
    for d, s, h in rtc["horizons"]:
        assert 0 <= d <= s and (s <= h - d or s == d), (d, s, h)
    assert acct["mismatched"] == 0 and acct["duplicates"] == 0, acct
