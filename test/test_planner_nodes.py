"""The LLM planner (seed 002) as real nodes: the inference server with the `planner` service
(a tiny random-weight Llama) and a drone planner robot, as subprocesses on an isolated ROS
domain. Plans come back one segment per feedback and are executed; every kind of bad input
gets its own Status code while another robot's plans go on."""
from __future__ import annotations

import json

from rosutil import requires_rclpy, ros_ctx  # noqa: F401

pytestmark = requires_rclpy

ACTION = "/robotserve/plan_task"
PARAMS = """/**:
  ros__parameters:
    engine: {batch_sizes: [1, 2, 4], latency_ms: [20.0, 22.0, 25.0]}
    services: [planner]
    planner: {model: tiny, max_segment_tokens: 4, max_segments: 3, max_prompt_tokens: 400}
"""


def send(ctx, client, **kw):
    from robotserve_ros.action import PlanTask

    g = PlanTask.Goal()
    g.task_id, g.agent_id, g.agent_kind = kw.get("task_id", "t"), "tester", kw.get("kind", "drone")
    g.prompt, g.urgent, g.tuf = kw.get("prompt", "Scene: [] Task: [A] find the cat"), kw.get("urgent", False), kw.get("tuf", [])
    feedback = []
    fut = client.send_goal_async(g, feedback_callback=lambda fb: feedback.append(fb.feedback))
    assert ctx.wait_for(fut.done, 20), "goal not answered"
    handle = fut.result()
    assert handle.accepted
    res = handle.get_result_async()
    return res, feedback


def test_planner_serves_segments_and_refuses_bad_input(ros_ctx, tmp_path):
    from rclpy.action import ActionClient

    from robotserve_ros.action import PlanTask

    params = tmp_path / "params.yaml"
    params.write_text(PARAMS)
    server = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", str(params)])
    out = tmp_path / "robot.json"
    robot = ros_ctx.start_node(["robotserve_ros.nodes.planner_robot", "--ros-args", "-p", "agent_kind:=drone",
                                "-p", "prompts:=['Scene: [] Task: [A] find the cat', 'Task: [Q] any keys here?']",
                                "-p", "skill_s:=0.2", "-p", f"out:={out}", "-p", "exit_when_done:=true",
                                "-p", "server_wait_s:=150.0"])
    client = ActionClient(ros_ctx.node, PlanTask, ACTION)
    # the server imports torch and transformers first: on a loaded machine that took > 60 s
    assert ros_ctx.wait_for(lambda: client.server_is_ready(), 150), server.output()

    bad = {
        "beta": dict(task_id="b1", tuf=[0.0, 1.0, 1.5]),
        "cutoff": dict(task_id="b2", tuf=[1.0, 1.0, 0.5]),
        "empty": dict(task_id="b3", prompt="   "),
        "long": dict(task_id="b4", prompt="word " * 100),  # 400+ tokens with the system turn
        "kind": dict(task_id="b5", kind="submarine"),
    }
    futs = {name: send(ros_ctx, client, **kw) for name, kw in bad.items()}
    good, feedback = send(ros_ctx, client, task_id="g1", urgent=True)
    assert ros_ctx.wait_for(lambda: good.done() and all(f.done() for f, _ in futs.values()), 60), server.output()
    codes = {name: f.result().result.status.reason for name, (f, _) in futs.items()}
    assert codes == {"beta": "bad_deadline", "cutoff": "bad_deadline", "empty": "bad_prompt", "long": "bad_prompt",
                     "kind": "unknown_agent"}
    assert all(f.result().result.status.message for f, _ in futs.values())
    r = good.result().result
    assert r.status.reason == "ok", r.status.message
    assert 1 <= len(r.skills) <= 3 and r.response_time_s > 0 and r.generation_s > 0
    assert ros_ctx.wait_for(lambda: len(feedback) == len(r.skills), 5)  # one feedback per segment
    assert [f.segment_index for f in feedback] == list(range(len(r.skills)))
    assert [f.skill for f in feedback] == list(r.skills) and feedback[-1].last

    # the robot's two plans were served beside all that and executed segment by segment
    assert robot.wait(120) == 0, robot.output()
    rec = json.loads(out.read_text())["plans"]
    assert len(rec) == 2 and all(p["status"] == "ok" for p in rec), rec
    for p in rec:
        assert len(p["segments"]) == len(p["skills"]) >= 1
        starts = [s["start"] for s in p["segments"]]
        assert starts == sorted(starts) and all(s["start"] >= s["received"] - 1e-6 for s in p["segments"])
    assert server.running, server.output()
