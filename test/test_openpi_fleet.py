"""One fleet, three client protocols: a ROS 2 robot_client (with its simulated robot), an
unchanged LeRobot RobotClient and unchanged openpi clients, served by ONE inference server
node (its `lerobot` and `openpi` services on the node's Runner), in one scheduler, in the
same batches: the openpi service counts the batches by the protocols of the robots in them,
and /diagnostics must show batches holding all three."""
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
        key = "services/openpi/batches/lerobot+openpi+ros"
        ok = ros_ctx.wait_for(lambda: int(last().get(key, 0)) >= 2, 120)
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
