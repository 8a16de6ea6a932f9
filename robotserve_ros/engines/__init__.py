"""Model runners behind core.Engine, chosen by name from configuration.

A new engine (the LeRobot/torch engine, the remote GPU engine) is one module plus one
registry line; its factory takes the engine profile and its own keyword parameters."""
from __future__ import annotations

from ..core.profile import EngineProfile
from ..core.registry import Registry
from .simulated import SimulatedEngine

ENGINES: Registry = Registry("engine")


def _remote(profile, **kw):
    """A GPU server over gRPC. Imported on use, so a server without remote tiers never
    loads the gRPC stubs."""
    from ..transport.remote_engine import RemoteEngine

    return RemoteEngine(profile, **kw)


def _lerobot(profile, **kw):
    """Imported on use: torch and LeRobot load only when a server asks for this engine."""
    from .lerobot_engine import LeRobotEngine

    return LeRobotEngine(profile, **kw)


def _oxygen(profile, **kw):
    """SmolVLA with a unified KV cache: actions and language from one prefill (seed 001)."""
    from .oxygen import OxyGenEngine

    return OxyGenEngine(profile, **kw)


ENGINES.register("simulated", lambda profile, **kw: SimulatedEngine(profile, **kw))
ENGINES.register("remote", _remote)
ENGINES.register("lerobot", _lerobot)
ENGINES.register("oxygen", _oxygen)


def make_engine(name: str, profile: EngineProfile, **params):
    return ENGINES.create(name, profile=profile, **params)


__all__ = ["ENGINES", "SimulatedEngine", "make_engine"]
