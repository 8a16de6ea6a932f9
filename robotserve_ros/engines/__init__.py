"""Model runners behind core.Engine, chosen by name from configuration.

A new engine (the LeRobot/torch engine, the remote GPU engine) is one module plus one
registry line; its factory takes the engine profile and its own keyword parameters."""
from __future__ import annotations

from ..core.profile import EngineProfile
from ..core.registry import Registry
from .simulated import SimulatedEngine

ENGINES: Registry = Registry("engine")
ENGINES.register("simulated", lambda profile, **kw: SimulatedEngine(profile, **kw))
ENGINES.register("remote", lambda profile, **kw: __import__(f"{__package__.rpartition('.')[0]}.transport.remote_engine", fromlist=["_"]).RemoteEngine(profile, **kw))  # a GPU server over gRPC
# Imported on use: torch and LeRobot load only when a server asks for this engine.
ENGINES.register("lerobot", lambda profile, **kw: __import__(f"{__name__}.lerobot_engine", fromlist=["_"]).LeRobotEngine(profile, **kw))


def make_engine(name: str, profile: EngineProfile, **params):
    return ENGINES.create(name, profile=profile, **params)


__all__ = ["ENGINES", "SimulatedEngine", "make_engine"]
