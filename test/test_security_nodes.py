"""The ROS inference server against oversized srv/Infer fields: a 10 KB task id (and
instruction, horizon name, refresh service, image count) is refused with bad_request naming
the field and its limit, without echoing it, and a good robot is still served each time."""
from __future__ import annotations

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, make_request, server_args

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
