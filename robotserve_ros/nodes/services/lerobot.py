"""`lerobot`: the LeRobot endpoint (transport/lerobot/) on the inference server's own fleet.

`services: [lerobot]`, `lerobot: {port: 8080, policy_dirs: [...], allow_hub: [...]}`
(CompatConfig's endpoint fields): unchanged LeRobot robot_clients connect by gRPC and each
becomes a task of the server's core, batched with the ROS robots' rounds (and the openpi
robots') on the same engine. A client must name the policy the server's engine serves."""
from __future__ import annotations

from ...transport.lerobot.config import CompatConfig
from ...transport.lerobot.fleet import Fleet

# What a client may set; the engine, scheduler and profile are the server's own.
FIELDS = ("host", "port", "fps", "policy_dirs", "allow_hub", "get_actions_timeout_s", "client_timeout_s",
          "similarity_atol", "max_payload_bytes", "max_array_elements", "max_nesting_depth", "max_string_bytes",
          "max_pickle_ops", "upload_timeout_s", "max_upload_pieces", "max_uploads", "threads", "rtc",
          "replan_held")


class LeRobotService:
    def __init__(self, node, **params) -> None:
        bad = sorted(set(params) - set(FIELDS))
        if bad:
            raise ValueError(f"lerobot: no parameter {bad[0]!r}; allowed: {', '.join(FIELDS)}")
        for k in ("policy_dirs", "allow_hub"):
            if k in params:
                params[k] = tuple(params[k])
        from ...transport.lerobot.protocol import LeRobotCompatServer

        cfg = CompatConfig(engine="simulated", **params)  # engine: a placeholder, never built (the node's serves)
        self.server = LeRobotCompatServer(cfg, clock=node.clock, fleet=Fleet(node.fleet))
        node.get_logger().info(f"LeRobot endpoint on {cfg.host}:{self.server.port}")

    def stats(self) -> dict:
        s = self.server.servicer.stats()
        out = {"clients": len(s["clients"]), "clients_reaped": s["clients_reaped"]}
        out.update({f"refused/{k}": v for k, v in s["protocol_errors"].items()})
        return out

    def close(self) -> None:
        self.server.stop(0)
