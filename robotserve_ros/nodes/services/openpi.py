"""`openpi`: the openpi websocket endpoint on the inference server's own fleet.

`services: [openpi]`, `openpi: {port: 8000, api_key_file: ..., ...}` (EndpointConfig's
fields, transport/openpi/config.py): unchanged openpi clients connect to ws://host:port and
each becomes a task of the server's core, batched with the ROS robots' rounds on the same
engine (a session of the node's Fleet per connection, serve/)."""
from __future__ import annotations

from ...transport.openpi.config import EndpointConfig
from ...transport.openpi.endpoint import OpenPiEndpoint


class OpenPiService:
    def __init__(self, node, **params) -> None:
        cfg = EndpointConfig(**params)  # TypeError/ValueError name the parameter: the node exits 2
        eng = node.fleet.engine
        policy = {"type": eng.policy_type or eng.name, **({"path": eng.policy_dir} if eng.policy_dir else {})}
        self.endpoint = OpenPiEndpoint(cfg, node.fleet, policy).start()
        node.get_logger().info(f"openpi endpoint on ws://{cfg.host}:{self.endpoint.port}")

    def stats(self) -> dict:
        s = self.endpoint.stats()
        out = {k: v for k, v in s.items() if not isinstance(v, dict)}
        out.update({f"refused/{k}": v for k, v in s["refused"].items()})
        out.update({f"batches/{k}": v for k, v in s["batches_by_protocols"].items()})
        return out

    def close(self) -> None:
        self.endpoint.close()
