"""`robotserve security keystore DIR`: the SROS 2 policy it writes allows every topic,
service and action the package's nodes actually create. The nodes are started for real (the
server with its Generate and planner services, a robot client with its simulated robot, a
planner robot) and read back from the ROS graph, not from a hand list; each interface must be
allowed in that node's enclave, with the permission its role needs (publish / subscribe,
reply / request, execute / call). DDS security itself is compiled out of the PyPI Fast DDS
build, so the policy is checked, not enforced, here (docs/security.md)."""
from __future__ import annotations

import subprocess
import sys
from fnmatch import fnmatchcase

from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import fleet_params

pytestmark = requires_rclpy


def graph(node, name: str, ns: str) -> set:
    """(permission, ROS name) of everything node `ns/name` created; action parts as the action."""
    def base(n):
        return n.split("/_action/")[0] if "/_action/" in n else None

    out = set()
    for kind, action_kind, entities in (
            ("publish", "execute", node.get_publisher_names_and_types_by_node(name, ns)),
            ("subscribe", "call", node.get_subscriber_names_and_types_by_node(name, ns)),
            ("reply", "execute", node.get_service_names_and_types_by_node(name, ns)),
            ("request", "call", node.get_client_names_and_types_by_node(name, ns))):
        for n, _types in entities:
            out.add((action_kind, base(n)) if base(n) else (kind, n))
    return out


def test_policy_covers_every_interface_the_nodes_create(ros_ctx, tmp_path):
    from robotserve_ros.sros import read_policy

    out = tmp_path / "sros"
    run = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "security", "keystore", str(out), "--count", "1"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    policy = read_policy(out / "policy.xml")
    script = (out / "create_keystore.sh").read_text()
    assert all(f"create_enclave \"$keystore\" {p}" in script for p in policy)
    by_node = {(ns, node): kinds for ns, node, kinds in policy.values()}

    params = fleet_params(tmp_path, server={"stale_obs_s": 0.001, "refresh_timeout_s": 0.5,
                                            "services": ["generate", "planner"],
                                            "generate": {"engine": "tiny", "chat_template": False},
                                            "planner": {"model": "tiny"}}, task_actions=10000)
    ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", params])
    ros_ctx.start_node(["robotserve_ros.nodes.sim_robot", "--robots", "1", "--ros-args", "--params-file", params])
    ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "1", "--ros-args", "--params-file", params])
    ros_ctx.start_node(["robotserve_ros.nodes.planner_robot", "--ros-args", "-p", "agent_kind:=drone",
                        "-p", "prompts:=['Task: [A] find the cat']", "-p", "server_wait_s:=150.0"])
    me = ros_ctx.node.get_name()
    want = {("/", "inference_server"), ("/robot_0", "robot_client"), ("/robot_0", "sim_robot"), ("/", "planner_robot")}

    def seen():
        return {(ns, n) for n, ns in ros_ctx.node.get_node_names_and_namespaces() if n != me}

    def refresh_client_up():  # the server's FetchObservation client exists once it has refreshed
        return any(k == "request" and n.endswith("/fetch_observation")
                   for k, n in graph(ros_ctx.node, "inference_server", "/"))

    assert ros_ctx.wait_for(lambda: want <= seen() and refresh_client_up()
                            and ("execute", "/robotserve/plan_task") in graph(ros_ctx.node, "inference_server", "/"),
                            150), seen()
    ros_ctx.spin(1.0)  # late entities (the planner robot's action client) discovered
    missing = []
    for ns, name in sorted(seen()):
        assert (ns, name) in by_node, f"node {ns}/{name} has no enclave in the policy"
        allowed = by_node[(ns, name)]
        for kind, entity in sorted(graph(ros_ctx.node, name, ns)):
            if not any(fnmatchcase(entity, pattern) for pattern in allowed[kind]):
                missing.append(f"{ns.rstrip('/')}/{name}: {kind} {entity}")
    assert not missing, "\n".join(missing)
