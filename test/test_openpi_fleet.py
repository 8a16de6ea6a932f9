"""One fleet, three client protocols: a ROS 2 robot_client (with its simulated robot), an
unchanged LeRobot RobotClient and unchanged openpi clients, served by ONE inference server
node (its `lerobot` and `openpi` services on the node's Runner), in one scheduler, in the
same batches: the openpi service counts the batches by the protocols of the robots in them,
and /diagnostics must show each protocol's rounds in batches shared with another's."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from rosutil import requires_rclpy, ros_ctx  # noqa: F401 (the fixture)

pytest.importorskip("lerobot")
openpi = pytest.importorskip("openpi_client.websocket_client_policy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@requires_rclpy
def test_ros_lerobot_and_openpi_robots_share_batches(ros_ctx, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray

    import test_lerobot_compat as lc
    from test_nodes import fleet_params

    policies = tmp_path / "policies"
    (policies / "act").mkdir(parents=True)  # the stand-in engine serves any name under policy_dirs
    op, lr = free_port(), free_port()
    params = fleet_params(tmp_path, server={"services": ["openpi", "lerobot"], "openpi": {"port": op},
                                            "lerobot": {"port": lr, "policy_dirs": [str(policies)]},
                                            "task_timeout_s": 10.0}, tasks=50)
    server = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", params])
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    ros_ctx.start_node(["robotserve_ros.nodes.sim_robot", "--robots", "1", "--ros-args", "--params-file", params])
    ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "1", "--ros-args", "--params-file", params])

    def last() -> dict:
        return {kv.key: kv.value for kv in diags[-1].status[0].values} if diags else {}

    assert ros_ctx.wait_for(lambda: "services/openpi/connected" in last(), 60), server.output()
    stop, chunks = threading.Event(), []

    def openpi_robot(i: int) -> None:  # ActionChunkBroker's rhythm: execute 10 actions at 50 Hz, then ask
        c = openpi.WebsocketClientPolicy("127.0.0.1", op)
        while not stop.is_set():
            a = c.infer({"observation/state": np.full(6, i, np.float32), "prompt": "pick"})["actions"]
            chunks.append(a.shape)
            time.sleep(10 / 50)

    robots = [threading.Thread(target=openpi_robot, args=(i,), daemon=True) for i in range(2)]
    for t in robots:
        t.start()
    proc, rec = lc.start_robot_client(tmp_path, 0, lr, "act", policies / "act")
    try:
        # Each protocol's rounds share batches with another protocol's: a batch of all three needs
        # three robots' clocks to line up (a LeRobot robot asks once per chunk since its held
        # observations are answered by their chunk; here the robots settled into alternate batches).
        def shared(protocol: str) -> int:
            mixes = {k.rsplit("/", 1)[1]: int(v) for k, v in last().items() if k.startswith("services/openpi/batches/")}
            return sum(n for mix, n in mixes.items() if "+" in mix and protocol in mix.split("+"))

        ok = ros_ctx.wait_for(lambda: all(shared(p) >= 2 for p in ("lerobot", "openpi", "ros")), 120)
        assert ok, (last(), (tmp_path / "robot0.log").read_text()[-2000:], server.output())
        assert len(lc.executed(rec)) > 0 and chunks and all(s == (50, 6) for s in chunks)
        d = last()
        assert int(d.get("services/lerobot/clients", 0)) == 1 and int(d["services/openpi/connected"]) == 2
    finally:
        stop.set()
        proc.kill()
        proc.wait(10)
        for t in robots:
            t.join(5)


@requires_rclpy
def test_bench_mixed_fleet_reports_every_protocol_and_mixed_batches(tmp_path):
    """`robotserve bench mixed-fleet` at its smallest: one robot of each protocol (two openpi
    robots), a few seconds; every process it started is gone afterwards."""
    import json
    import shutil
    import subprocess
    import sys

    out = tmp_path / "mixed.json"
    r = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "bench", "mixed-fleet", "--out", str(out),
                        "--ros", "1", "--lerobot", "1", "--openpi", "2", "--duration", "4"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    for name, n in (("ros", 1), ("lerobot", 1), ("openpi", 2)):
        p = res["protocols"][name]
        assert p["robots"] == n and p["rounds_served"] > 0 and p["errors"] == 0, (name, p)
        assert 0.0 <= p["idle_fraction"] <= 1.0
    for name in ("ros", "openpi"):
        assert 0 < res["protocols"][name]["p50_ms"] <= res["protocols"][name]["p95_ms"]
    assert res["exit_codes"]["inference_server"] == 0, res["exit_codes"]  # the server stopped cleanly
    s = res["server"]
    assert s["batches"] > 0 and s["mean_batch"] >= 1.0 and 0 < s["engine_utilization"]
    assert s["mixed_batches_fraction"] > 0, s  # robots of different protocols shared batches
    assert sum(v for k, v in s["batches_with_openpi_by_protocols"].items() if "+" in k) > 0
    left = subprocess.run(["pgrep", "-f", f"robotserve_mixed_fleet_.*{res['run_dir'].rsplit('_', 1)[1]}"],
                          capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the run still alive: {left}"
    shutil.rmtree(res["run_dir"])  # the run's logs and accounts, kept by the bench for a person
