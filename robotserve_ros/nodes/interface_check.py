"""A peer built from other msg/srv files than this node.

ROS 2 names every interface by its type and a hash of its layout (RIHS01, REP 2011), and
shows both for each endpoint on the graph, a service's request topic (`rq<service>Request`)
included. So the interfaces carry their version already: the hash. What is added here is
someone who looks: the inference server, each diagnostics period, names a robot whose Infer
request differs from its own (in its log, once, and as the refusal kind `interface_mismatch`
with its last_error, which `up` and `status` print); a robot client waiting for a server
that is there under another hash says so instead of "is the server up?". Both hashes are
named, so the operator sees which side to rebuild (docs/nodes.md, upgrading a fleet)."""
from __future__ import annotations

CODE = "interface_mismatch"
UNKNOWN = "INVALID"  # rclpy's TypeHash as a string when the endpoint's hash is not known
UNKNOWN_NODE = "_NODE_NAME_UNKNOWN_"  # rmw's name of an endpoint whose node is not discovered yet


def request_topic(service: str) -> str:
    """The DDS topic of a service's requests (rmw's mangling: rq + name + Request)."""
    return f"rq{service}Request"


def foreign_peers(node, service: str, side: str) -> list:
    """(peer, type, hash) of every endpoint of the other side of `service` whose request type or
    hash differs from this node's own (`side`: "server" looks at clients, "client" at servers)."""
    topic = request_topic(service)
    writers = node.get_publishers_info_by_topic(topic, no_mangle=True)  # the clients' requests
    readers = node.get_subscriptions_info_by_topic(topic, no_mangle=True)  # the servers'
    mine, theirs = (readers, writers) if side == "server" else (writers, readers)
    me = (node.get_name(), node.get_namespace())
    own = {(e.topic_type, str(e.topic_type_hash)) for e in mine
           if (e.node_name, e.node_namespace) == me and str(e.topic_type_hash) != UNKNOWN}
    if not own:
        return []  # our own endpoint is not on the graph yet: nothing to compare with
    # A hash or node not (yet) known: discovery fills them in a moment later (and a peer of a ROS 2
    # older than Iron sends no hash); such an endpoint is not judged, so nobody is named twice or wrongly
    return sorted({(f"{e.node_namespace.rstrip('/')}/{e.node_name}", e.topic_type, str(e.topic_type_hash))
                   for e in theirs if (e.topic_type, str(e.topic_type_hash)) not in own
                   and str(e.topic_type_hash) != UNKNOWN and e.node_name != UNKNOWN_NODE})


def describe(peer: str, type_: str, hash_: str, own: str, side: str) -> str:
    """One line naming both types/hashes and what to do."""
    who = f"robot {peer} sends" if side == "server" else f"the server {peer} takes"
    return (f"{who} {_short(type_)} {hash_}, this node {'serves' if side == 'server' else 'sends'} {own}: "
            "built from other msg/srv files; rebuild one side on the other's interfaces")


def own_request(node, service: str, side: str) -> str:
    """This node's own request type and hash, as describe() names it."""
    topic = request_topic(service)
    infos = (node.get_subscriptions_info_by_topic if side == "server" else node.get_publishers_info_by_topic)(
        topic, no_mangle=True)
    me = (node.get_name(), node.get_namespace())
    mine = [e for e in infos if (e.node_name, e.node_namespace) == me]
    return f"{_short(mine[0].topic_type)} {mine[0].topic_type_hash}" if mine else "?"


def waiting_for(node, service: str) -> tuple:
    """A robot client's line while no server answers, and whether it is an error: the server is
    absent, or there under another hash."""
    foreign = foreign_peers(node, service, "client")
    if not foreign:
        return f"waiting for {service} (is the inference server up?)", False
    return f"waiting for {service}: " + describe(*foreign[0], own_request(node, service, "client"), "client"), True


def _short(dds_type: str) -> str:
    """robotserve_ros::srv::dds_::Infer_Request_ -> robotserve_ros/srv/Infer_Request."""
    return dds_type.replace("::dds_::", "::").replace("::", "/").rstrip("_")


__all__ = ["CODE", "describe", "foreign_peers", "own_request", "request_topic", "waiting_for"]
