"""`openpi`: the openpi websocket endpoint on the inference server's own fleet.

`services: [openpi]`, `openpi: {port: 8000, api_key_file: ..., ...}` (EndpointConfig's
fields, transport/openpi/config.py): unchanged openpi clients connect to ws://host:port and
each becomes a task of the server's core, batched with the ROS robots' rounds on the same
engine (the node's Runner; replies come through Runner.listen)."""
from __future__ import annotations

from ...transport.openpi.config import EndpointConfig
from ...transport.openpi.endpoint import OpenPiEndpoint


class OpenPiService:
    def __init__(self, node, **params) -> None:
        cfg = EndpointConfig(**params)  # TypeError/ValueError name the parameter: the node exits 2
        eng = node.engine
        policy = {"type": getattr(eng, "policy_type", getattr(eng, "name", "engine")),
                  **({"path": eng.policy_dir} if getattr(eng, "policy_dir", None) else {})}
        self.endpoint = OpenPiEndpoint(cfg, node.runner, eng, node.clock, policy).start()
        node.get_logger().info(f"openpi endpoint on ws://{cfg.host}:{self.endpoint.port}")

    def stats(self) -> dict:
        s = self.endpoint.stats()
        out = {k: v for k, v in s.items() if not isinstance(v, dict)}
        out.update({f"refused/{k}": v for k, v in s["refused"].items()})
        out.update({f"batches/{k}": v for k, v in s["batches_by_protocols"].items()})
        return out

    def close(self) -> None:
        self.endpoint.close()
