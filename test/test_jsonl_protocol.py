"""A new client protocol (JSON lines over TCP, jsonl_protocol.py) added on serve.Fleet alone:
it imports neither core.runner nor core.serving, and its robots share batches with ROS robots
(a ROS robot_client and its simulated robot against an inference server node whose fleet the
protocol serves on)."""
from __future__ import annotations

import ast
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np

from rosutil import requires_rclpy, ros_ctx, wait_for  # noqa: F401 (the fixture)

import jsonl_protocol
from jsonl_protocol import JsonLinesProtocol

HERE = Path(__file__).resolve().parent


def test_the_protocol_reaches_the_core_through_the_fleet_only():
    tree = ast.parse((HERE / "jsonl_protocol.py").read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert mods and not {m for m in mods if m and (m.endswith("core.runner") or m.endswith("core.serving"))}
    assert len((HERE / "jsonl_protocol.py").read_text().splitlines()) <= 100


def ask(f, line: dict) -> dict:
    f.write((json.dumps(line) + "\n").encode())
    f.flush()
    return json.loads(f.readline())


def test_rounds_refusals_and_a_closed_connection_on_a_fleet_of_its_own():
    from robotserve_ros.core.clock import WallClock
    from robotserve_ros.core.profile import EngineProfile
    from robotserve_ros.core.schedulers import make_scheduler
    from robotserve_ros.engines import SimulatedEngine
    from robotserve_ros.serve import fleet_over

    fleet = fleet_over(SimulatedEngine(EngineProfile({1: 1.0}), chunk_size=8, action_dim=3), make_scheduler("fifo"),
                       WallClock()).start()
    proto = JsonLinesProtocol(fleet)
    try:
        with socket.create_connection(("127.0.0.1", proto.port), 5) as sk, sk.makefile("rwb") as f:
            r0 = ask(f, {"task": "t", "round": 0, "joints": [0, 0, 0], "horizon": 4})
            assert r0["round"] == 0 and np.asarray(r0["actions"]).shape == (4, 3)
            assert ask(f, {"task": "t", "round": 1, "joints": [0, 0, 0], "left": 2, "hz": 50})["round"] == 1
            assert ask(f, {"task": "u", "round": 5, "joints": [0]})["error"] == "unknown_task"
            assert ask(f, {"nonsense": True})["error"] == "bad_request"
            assert len(fleet.tasks()) == 1
        assert wait_for(lambda: not fleet.tasks(), 10.0)  # the connection closed: its task went with it
        assert fleet.core_stats()["errors"] == {"unknown_task": 1, "bad_request": 1}
        assert fleet.protocol_stats()["jsonl"]["served"] == 2
    finally:
        proto.close()
        fleet.close()



@requires_rclpy
def test_jsonl_robots_share_batches_with_ros_robots(ros_ctx, tmp_path):
    from rclpy.executors import MultiThreadedExecutor

    from robotserve_ros.nodes.inference_server import InferenceServerNode
    from test_nodes import fleet_params

    params = fleet_params(tmp_path, server={"task_timeout_s": 10.0}, tasks=50)
    node = InferenceServerNode(context=ros_ctx.context, cli_args=["--ros-args", "--params-file", params])
    assert node.config_error is None, node.config_error
    ex = MultiThreadedExecutor(4, context=ros_ctx.context)
    ex.add_node(node)
    spinner = threading.Thread(target=ex.spin, daemon=True)
    spinner.start()
    proto = JsonLinesProtocol(node.fleet)
    stop, answered = threading.Event(), []

    def robot(i: int) -> None:  # asks, "executes" 2 to 10 actions at 50 Hz, asks again
        rng = np.random.default_rng(i)  # uneven rhythms: the robots do not fall into lockstep with the engine
        with socket.create_connection(("127.0.0.1", proto.port), 5) as sk, sk.makefile("rwb") as f:
            rnd = 0
            while not stop.is_set():
                r = ask(f, {"task": f"arm{i}", "round": rnd, "joints": [i] * 6, "left": 0, "hz": 50, "horizon": 10})
                answered.append(r.get("error", "ok"))
                rnd += 1
                time.sleep(rng.integers(2, 11) / 50)

    robots = [threading.Thread(target=robot, args=(i,), daemon=True) for i in range(3)]
    try:
        ros_ctx.start_node(["robotserve_ros.nodes.sim_robot", "--robots", "1", "--ros-args", "--params-file", params])
        ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "1", "--ros-args", "--params-file", params])
        for t in robots:
            t.start()
        ok = wait_for(lambda: node.fleet.batches_by_protocols().get("jsonl+ros", 0) >= 2, 120)
        assert ok, (node.fleet.batches_by_protocols(), node.fleet.protocol_stats())
        assert answered and set(answered) == {"ok"}
        assert node.fleet.protocol_stats()["ros"]["served"] > 0
    finally:
        stop.set()
        for t in robots:
            t.join(5)
        proto.close()
        ex.shutdown(timeout_sec=2.0)
        node.cleanup()
        node.destroy_node()
