"""The real inference_server node with a cloud tier: a `robotserve gpu-server` subprocess on
127.0.0.1 (token), placement shortest_delay (seed 000 Algorithm 1 phase 3). A burst of
robots' requests overflows the slow edge, so some rounds are served by the cloud tier --
every call answered with a valid chunk, and the node's diagnostics say which tier served
how many."""
from __future__ import annotations

import math
import subprocess
import sys
import time

from rosutil import REPO_ROOT, requires_rclpy, ros_ctx, ros_env  # noqa: F401
from test_nodes import Caller, make_request

pytestmark = requires_rclpy

ROBOTS = 12


def start_gpu_server(tmp_path):
    """`robotserve gpu-server` on an ephemeral loopback port, token from a file."""
    token, ready = tmp_path / "token", tmp_path / "ready"
    token.write_text("node-test-token\n")
    token.chmod(0o600)
    log = open(tmp_path / "gpu-server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "robotserve_ros.cli", "gpu-server", "--address", "127.0.0.1:0", "--engine", "simulated",
         "--engine-params", '{"realtime": true, "chunk_size": 50}', "--batch-sizes", "1", "2", "4",
         "--latency-ms", "20", "25", "30", "--token-file", str(token), "--ready-file", str(ready)],
        stdout=log, stderr=subprocess.STDOUT, env=ros_env(), cwd=REPO_ROOT)
    end = time.monotonic() + 15
    while not ready.exists() or not ready.read_text().strip():
        assert proc.poll() is None and time.monotonic() < end, (tmp_path / "gpu-server.log").read_text()
        time.sleep(0.05)
    return proc, ready.read_text().strip(), str(token)


def test_cloud_tier_serves_part_of_a_burst(ros_ctx, tmp_path):
    import yaml
    from diagnostic_msgs.msg import DiagnosticArray

    gpu, address, token = start_gpu_server(tmp_path)
    try:
        params = {
            # A slow edge (a batch of 4 takes 340 ms) beside a fast cloud tier on loopback.
            "engine": {"batch_sizes": [1, 2, 4], "latency_ms": [300.0, 320.0, 340.0]},
            "obs_width": 96, "obs_height": 96, "obs_joints": 6, "obs_encodings": ["rgb8"], "diagnostics_hz": 5.0,
            "remote_tiers": ["cloud"], "cloud": {"address": address, "token_file": token, "ping_interval_s": 0.2},
            "placement": {"name": "shortest_delay"},
            # The burst below sends 12 calls at once from one client; the server's default queue keeps
            # the last 10 (robots re-send an unanswered round themselves, a test client does not).
            "infer_queue": {"depth": 32},
        }
        path = tmp_path / "server.yaml"
        path.write_text(yaml.safe_dump({"inference_server": {"ros__parameters": params}}))
        srv = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", str(path)])
        diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
        c = Caller(ros_ctx)
        # One call first: wait_for_service matches the request path only, and a burst sent
        # before the reply path has matched can lose its replies (a DDS discovery race).
        assert c.call(make_request("warmup/task0", 0)).status.reason == "ok"
        futs = [c.send(make_request(f"robot_{i}/task0", 0)) for i in range(ROBOTS)]
        assert ros_ctx.wait_for(lambda: all(f.done() for f in futs), 15), srv.output()
        for i, f in enumerate(futs):
            res = f.result()
            assert res.status.reason == "ok", res.status.message
            assert (res.chunk.task_id, res.chunk.round_id, res.chunk.horizon) == (f"robot_{i}/task0", 0, 8)
            assert len(res.chunk.actions) == 8 * res.chunk.action_dim and all(math.isfinite(x) for x in res.chunk.actions)

        def served():
            for m in reversed(diags):
                vals = {kv.key: kv.value for kv in m.status[0].values}
                if vals.get("served") == str(ROBOTS + 1):
                    return vals
            return None

        assert ros_ctx.wait_for(lambda: served() is not None, 5), "diagnostics never counted every reply"
        vals = served()
        by_tier = {k.split("/", 1)[1]: int(v) for k, v in vals.items() if k.startswith("served_by_tier/")}
        # The edge keeps the head of the order (line 15); the overflow beats its edge delay on the cloud.
        assert by_tier.get("edge", 0) >= 1 and by_tier.get("cloud", 0) >= 1, vals
        assert sum(by_tier.values()) == ROBOTS + 1 and vals["tier_failures"] == "{}", vals
        assert srv.stop() == 0, srv.output()
    finally:
        gpu.terminate()
        gpu.wait(10)
