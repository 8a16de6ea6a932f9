"""Services beside srv/Infer on the one inference server (docs/architecture.md: the wire contract grows by
new msg/srv/action types, never by a second server).

Each entry is a class built as `cls(node, **params)` when the server's `services` parameter
names it (its params from the section of that name beside it, nav2-like:
`services: [planner]`, `planner: {max_batch: 8}`). It creates its own ROS entities on the node
(an action server, a srv/Generate service, topics), serves through its own serving core in
`core/` driven by `core/loop.py`'s LiveDriver, and offers:
- `stats() -> dict`: what /diagnostics shows under `services/<name>/...`;
- `close()`: answer what is waiting with SHUTTING_DOWN, stop its threads, free its engine.
What a service may use of the server node (its public face, nothing else): the rclpy Node
calls that make entities, `engine` and `spec` (the action engine and the observation checks),
`fleet` and `clock` (the action fleet, serve.Fleet: front ends of other client protocols open
sessions on it),
and `serve_language(handler)`, the hook through which a service decodes srv/Infer's
`language_prompt` with the round (handler.attach / handler.cancel; None withdraws it).
A bad parameter raises ValueError/TypeError naming it; the server turns that into one line
and exit 2.

The registry maps names to loaders so that a server without a service never imports its
engine (torch, transformers).
"""
from __future__ import annotations

import importlib

from ...core.registry import Registry, Wraps

SERVICES: Registry = Registry("service")


def _lazy(module: str, cls: str):
    def make(node, **params):
        return _class(module, cls)()(node, **params)

    return make


def _engines():
    from ...engines import ENGINES

    return ENGINES


def _class(module: str, cls: str):
    """The service class, imported when asked: its keyword parameters are the section's knobs."""
    return lambda: getattr(importlib.import_module(module, __name__), cls)


# name -> (module relative to this package, class). One line per service.
for _name, (_module, _cls) in {
    "vlm": (".vlm", "VlmService"),
    "planner": (".planner", "PlannerService"),  # LLM plans by segment (seed 002)
    "vla_language": (".vla_language", "VlaLanguageService"),
    "generate": (".generate", "GenerateService"),  # srv/Generate, SLO-aware disaggregated LLM (seed 004)
    "openpi": (".openpi", "OpenPiService"),  # unchanged openpi clients on this fleet (transport/openpi)
    "lerobot": (".lerobot", "LeRobotService"),  # unchanged LeRobot robot_clients on this fleet (transport/lerobot)
}.items():
    # openpi and lerobot take **params into their own config dataclass, which checks them
    SERVICES.register(_name, _lazy(_module, _cls), knobs=None if _name in ("openpi", "lerobot") else _class(_module, _cls),
                      # vla_language's knobs beyond its own build an oxygen engine of its own: that engine's
                      wraps=Wraps(lambda: ["oxygen"], fixed="oxygen", registry=_engines) if _name == "vla_language" else None)
