"""The vla_language service on the real inference server (engine oxygen, a tiny SmolVLA):
srv/Infer with language_prompt returns its action chunk and a language_id whose tokens stream
on msg/LanguageOutput until finished; srv/Generate answers a question about an observation
and about a task's current frame; bad prompts / unknown tasks get their Status while the
robot's actions keep being served."""
from __future__ import annotations


import pytest

pytest.importorskip("lerobot")

from lerobot_policies import make_policy_dir  # noqa: E402
from rosutil import requires_rclpy, ros_ctx  # noqa: E402,F401

pytestmark = requires_rclpy


def infer_request(task, rnd, prompt="", max_tokens=0):
    from sensor_msgs.msg import Image

    from robotserve_ros.srv import Infer

    r = Infer.Request()
    r.task_id, r.round_id = task, rnd
    im = Image()
    im.width = im.height = 32
    im.encoding, im.step = "rgb8", 32 * 3
    im.data = bytes(range(256)) * (32 * 32 * 3 // 256)
    r.observation.images = [im]
    r.observation.instruction = "pick up the cube"
    r.observation.joint_state.position = [0.1] * 6
    r.horizon.name = "static"
    if rnd > 0:  # later rounds carry the last execution info
        r.has_exec_info = True
        r.exec_info.actions_left, r.exec_info.control_hz = 0, 30.0
    r.language_prompt, r.language_max_tokens = prompt, max_tokens
    return r


def call(ctx, cli, req, timeout=60.0):
    fut = cli.call_async(req)
    assert ctx.wait_for(fut.done, timeout), "no answer"
    return fut.result()


def test_infer_language_streams_and_generate_answers(ros_ctx, tmp_path):
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from robotserve_ros.msg import LanguageOutput
    from robotserve_ros.srv import Generate, Infer

    d = make_policy_dir("smolvla", tmp_path / "vla", steps=2)
    srv = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "-p", "engine.name:=oxygen",
                        "-p", f"engine.oxygen.policy_dir:={d}", "-p", "engine.oxygen.tokens_per_frame:=3",
                        "-p", "services:=[vla_language]", "-p", "vla_language.idle_frame_s:=0.02"])
    out = ros_ctx.collect(LanguageOutput, "/robotserve/language", QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    infer = ros_ctx.node.create_client(Infer, "/robotserve/infer")
    gen = ros_ctx.node.create_client(Generate, "/robotserve/generate")
    assert infer.wait_for_service(timeout_sec=60) and gen.wait_for_service(timeout_sec=30), srv.output()
    ros_ctx.spin(1.0)  # the output subscription matched

    res = call(ros_ctx, infer, infer_request("arm", 0, "open the drawer", 7))
    assert res.status.reason == "ok", res.status.message
    assert len(res.chunk.actions) > 0 and res.language_id
    mine = lambda: [m for m in out if m.language_id == res.language_id]  # noqa: E731
    assert ros_ctx.wait_for(lambda: any(m.finished for m in mine()), 30), [(m.output_tokens, m.finished) for m in out]
    msgs = mine()
    assert msgs[-1].output_tokens == 7 and msgs[-1].status.reason == "ok" and msgs[-1].task_id == "arm"
    assert all(m.output_tokens <= 3 * (i + 1) for i, m in enumerate(msgs))  # at most k tokens per frame

    q = Generate.Request()
    q.task_id, q.prompt, q.max_tokens = "arm", "what is in the bin", 4  # about arm's current frame
    ans = call(ros_ctx, gen, q)
    assert ans.status.reason == "ok", ans.status.message
    assert ans.output_tokens == 4 and ans.prompt_tokens > 0 and ans.latency_s >= ans.ttft_s >= 0

    q2 = Generate.Request()
    q2.prompt, q2.max_tokens = "what is here", 3  # about an observation of its own
    q2.observation = infer_request("x", 0).observation
    ans2 = call(ros_ctx, gen, q2)
    assert ans2.status.reason == "ok" and ans2.output_tokens == 3, ans2.status.message

    # bad input: each its own status; the robot's actions go on
    ghost = Generate.Request()
    ghost.task_id, ghost.prompt = "ghost", "where am i"
    bad = call(ros_ctx, gen, ghost)
    assert bad.status.reason == "unknown_task" and "ghost" in bad.status.message
    empty = Generate.Request()
    empty.prompt = "hello"
    assert call(ros_ctx, gen, empty).status.reason == "bad_observation"
    long = call(ros_ctx, infer, infer_request("arm", 1, "open the drawer " * 300, 5))
    assert long.status.reason == "bad_prompt" and "context limit" in long.status.message
    ok = call(ros_ctx, infer, infer_request("arm", 1))
    assert ok.status.reason == "ok" and ok.language_id == "" and len(ok.chunk.actions) > 0
