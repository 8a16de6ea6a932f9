"""The ROS robots of `robotserve bench robots-per-engine` (bench/rpe_ros.py) against a stand-in
srv/Infer service that loses calls on purpose: a lost round is re-sent with the same task and
round ids and counted, an older call answered `duplicate_request` does not end the round, and a
round never answered is an error."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from rosutil import requires_rclpy, ros_ctx  # noqa: F401 - the fixture


class LossyInfer:
    """srv/Infer on the test's node: `plan[(round, k)]` says what the k-th call of a round gets:
    "ok" (a chunk), "drop" (never answered), "hold" (answered `duplicate_request` when the next
    call of its round comes). Unplanned calls get "ok"."""

    def __init__(self, node, plan: dict) -> None:
        from robotserve_ros.nodes.deferred import DeferredReplies
        from robotserve_ros.nodes.common import service_qos
        from robotserve_ros.srv import Infer

        self.plan, self.calls, self.held, self.dropped = plan, [], {}, []
        self.srv = node.create_service(Infer, "/robotserve/infer", self._on, qos_profile=service_qos(10))
        self.replies = DeferredReplies(self.srv)

    def _on(self, req, resp):
        from robotserve_ros.nodes.convert import fill_status

        key = (req.task_id, req.round_id)
        k = sum(1 for c in self.calls if c == key)
        self.calls.append(key)
        if key in self.held:  # a re-send of a held round: the older call is told so
            old = self.held.pop(key)
            fill_status(old.status, "duplicate_request", "a newer call of this round waits")
            self.replies.finish(old)
        what = self.plan.get((req.round_id, k), "ok")
        if what == "ok":
            resp.status.code, resp.status.reason = 0, "ok"
            resp.chunk.task_id, resp.chunk.round_id = req.task_id, req.round_id
            return resp
        self.replies.defer(resp)  # "drop": never finished, so never sent
        if what == "hold":
            self.held[key] = resp
        else:
            self.dropped.append(resp)  # kept: DeferredReplies knows a response by its id()
        return resp


@requires_rclpy
def test_a_lost_round_is_re_sent_as_the_same_round_and_a_round_never_answered_is_an_error(ros_ctx, monkeypatch):
    from robotserve_ros.bench import rpe_ros

    svc = LossyInfer(ros_ctx.node, {(1, 0): "drop", (2, 0): "hold", (3, 0): "drop", (3, 1): "drop", (3, 2): "drop"})
    spin = threading.Thread(target=ros_ctx.executor.spin, daemon=True)
    spin.start()
    try:
        robot = rpe_ros.ros_caller(0, np.random.default_rng(0), horizon=10, trigger=5, hz=50.0)
        for step in (0, 5, 15):
            resp = robot(step)
            assert resp.status.code == 0 and resp.chunk.round_id == robot.round - 1
        task = robot.task
        # Round 1's first call was lost: sent again once the re-send interval (learnt from
        # round 0's reply, at least 0.2 s) passed; round 2's first call was held and told
        # duplicate_request when its re-send came: the re-send's chunk is the answer.
        assert svc.calls == [(task, 0), (task, 1), (task, 1), (task, 2), (task, 2)]
        assert robot.resends == 2
        monkeypatch.setattr(rpe_ros, "GIVE_UP_S", 1.0)
        with pytest.raises(TimeoutError, match=r"no reply to round 3 in 1 s \(2 re-sends\)"):
            robot(25)  # 0.2 s, then 0.4 s later: two re-sends, then given up (an error, the row unfed)
        assert svc.calls[5:] == [(task, 3)] * 3 and robot.resends == 4
    finally:
        rpe_ros.shutdown()
