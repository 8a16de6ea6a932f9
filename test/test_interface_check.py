"""A peer built from other msg/srv files (nodes/interface_check.py): ROS 2 shows each
endpoint's type and layout hash (RIHS01); the server names a robot whose Infer request differs
and counts it as `interface_mismatch`, a robot client says the server is there under another
hash instead of "is the server up?". Both hashes are named."""
from __future__ import annotations

from types import SimpleNamespace

from robotserve_ros.nodes.interface_check import describe, foreign_peers, request_topic, waiting_for
from rosutil import requires_rclpy, ros_ctx  # noqa: F401

INFER = "robotserve_ros::srv::dds_::Infer_Request_"
NEW, OLD = "RIHS01_" + "a" * 64, "RIHS01_" + "b" * 64


def ep(node, ns, type_, hash_):
    return SimpleNamespace(node_name=node, node_namespace=ns, topic_type=type_, topic_type_hash=hash_)


class FakeGraph:
    """A node on a graph of request-topic endpoints: writers are clients, readers servers."""

    def __init__(self, name, writers, readers):
        self.name, self.writers, self.readers, self.asked = name, writers, readers, []

    def get_name(self):
        return self.name

    def get_namespace(self):
        return "/"

    def get_publishers_info_by_topic(self, topic, no_mangle=False):
        self.asked.append((topic, no_mangle))
        return self.writers

    def get_subscriptions_info_by_topic(self, topic, no_mangle=False):
        self.asked.append((topic, no_mangle))
        return self.readers


def test_the_server_names_only_the_clients_of_another_type_or_hash():
    server = FakeGraph("inference_server", writers=[ep("robot_client", "/robot_0", INFER, NEW),
                                                    ep("robot_client", "/robot_1", INFER, OLD),
                                                    ep("old", "/", "std_msgs::msg::dds_::String_", OLD),
                                                    ep("robot_client", "/robot_2", INFER, "INVALID"),  # not known yet
                                                    ep("_NODE_NAME_UNKNOWN_", "_NODE_NAMESPACE_UNKNOWN_", INFER, OLD)],
                       readers=[ep("inference_server", "/", INFER, NEW)])
    assert foreign_peers(server, "/robotserve/infer", "server") == [
        ("/old", "std_msgs::msg::dds_::String_", OLD), ("/robot_1/robot_client", INFER, OLD)]
    assert server.asked[0] == ("rq/robotserve/inferRequest", True) == (request_topic("/robotserve/infer"), True)
    line = describe("/robot_1/robot_client", INFER, OLD, f"robotserve_ros/srv/Infer_Request {NEW}", "server")
    assert line.startswith(f"robot /robot_1/robot_client sends robotserve_ros/srv/Infer_Request {OLD}, this node "
                           f"serves robotserve_ros/srv/Infer_Request {NEW}")


def test_nothing_is_named_before_the_own_endpoint_is_on_the_graph():
    server = FakeGraph("inference_server", writers=[ep("robot_client", "/robot_1", INFER, OLD)], readers=[])
    assert foreign_peers(server, "/robotserve/infer", "server") == []


def test_a_waiting_robot_says_the_server_is_there_under_another_hash():
    robot = FakeGraph("robot_client", writers=[ep("robot_client", "/", INFER, NEW)],
                      readers=[ep("inference_server", "/", INFER, OLD)])
    line, foreign = waiting_for(robot, "/robotserve/infer")
    assert foreign and f"the server /inference_server takes robotserve_ros/srv/Infer_Request {OLD}" in line
    assert f"this node sends robotserve_ros/srv/Infer_Request {NEW}" in line
    alone = FakeGraph("robot_client", writers=[ep("robot_client", "/", INFER, NEW)], readers=[])
    assert waiting_for(alone, "/robotserve/infer") == ("waiting for /robotserve/infer (is the inference server up?)",
                                                       False)


@requires_rclpy
def test_the_server_counts_a_client_of_another_interface_and_names_both(ros_ctx):
    """A client of another request type on the server's service name (an old build's stand-in:
    its request topic carries another type and hash) is named in /diagnostics
    (last_error/interface_mismatch, counted once); a client of this build is not."""
    from diagnostic_msgs.msg import DiagnosticArray

    from robotserve_ros.srv import Generate, Infer

    server = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "-p", "diagnostics_hz:=5.0"])
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    import rclpy

    ros_ctx.node.create_client(Infer, "/robotserve/infer")  # this build's client: not named
    other = rclpy.Context()  # a second participant: one may not hold two types on one topic
    rclpy.init(context=other, domain_id=ros_ctx.domain_id)
    old = rclpy.create_node("old_build_robot", context=other)
    old.create_client(Generate, "/robotserve/infer")  # the same name, another layout
    try:
        check_named_once(ros_ctx, diags, server)
    finally:
        old.destroy_node()
        other.try_shutdown()


def check_named_once(ros_ctx, diags, server):

    def values():
        return {kv.key: kv.value for kv in diags[-1].status[0].values} if diags else {}

    assert ros_ctx.wait_for(lambda: "last_error/interface_mismatch" in values(), 60), values()
    ros_ctx.spin(1.0)  # a few more periods: still counted once
    v = values()
    line = v["last_error/interface_mismatch"]
    assert v["errors/interface_mismatch"] == "1", server.output()
    assert "robot /old_build_robot sends robotserve_ros/srv/Generate_Request RIHS01_" in line, line
    assert "this node serves robotserve_ros/srv/Infer_Request RIHS01_" in line, line
