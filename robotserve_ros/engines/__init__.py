"""Model runners behind core/engine.py's roles, chosen by name from configuration.

A new engine (the LeRobot/torch engine, the remote GPU engine) is one module plus one
registry line; its factory takes the engine profile and its own keyword parameters. Action
engines (core.Engine) and the language engines (core.engine.TextEngine: `llm`, `tiny_llm`;
VisionLanguageEngine: `vlm`) share the registry; ROLES says which role each name plays, and
test_engine_contract.py checks every registered engine against its role. vLLM's backend is
built from the services' own `engine: {name: vllm}` section (engines/llm/vllm_backend.py:
its config lives in config.py, which imports this registry)."""
from __future__ import annotations

from ..core.profile import EngineProfile
from ..core.registry import Registry
from .simulated import SimulatedEngine, SimulatedKnobs

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


def _flow(profile, **kw):
    """The flow-matching action head (flow_engine.py); torch loads on use."""
    from .flow_engine import FlowEngine

    return FlowEngine(profile, **kw)


def _sampled(profile, inner: str = "lerobot", k: int = 3, saturation_batch=None, **kw):
    """Batch self-consistency (core/horizon/self_consistency.py): `inner` engine, plus up to k
    replicas per request in the batch's spare slots below the saturation batch, so the
    `self_consistency` horizon policy gets its samples. Every extra row is counted."""
    from ..core.horizon.self_consistency import SelfConsistencyEngine

    if inner == "sampled":
        raise ValueError("engine 'sampled' cannot wrap itself")
    return SelfConsistencyEngine(ENGINES.create(inner, profile=profile, **kw), k, saturation_batch)


def _ray(profile, **kw):
    """A Ray Serve pool of replicas of another engine (transport/ray_pool.py); ray loads on use."""
    from ..transport.ray_pool import RayPoolEngine

    return RayPoolEngine(profile, make=make_engine, **kw)


def _oxygen(profile, **kw):
    """SmolVLA with a unified KV cache: actions and language from one prefill (seed 001)."""
    from .oxygen import OxyGenEngine

    return OxyGenEngine(profile, **kw)


def _cls(module: str, name: str):
    """knobs=: the engine class whose keyword parameters are its knobs, imported when asked."""
    def load():
        import importlib

        return getattr(importlib.import_module(module, __name__), name)
    return load


def _llm(profile=None, model: str = "", threads: int = 1, dtype: str = ""):
    """A Hugging Face causal LM with per-request KV caches (engines/llm; seed 002 §4.1)."""
    from .llm.engine import LLMEngine

    return LLMEngine.load(model or None, dtype=dtype or None, threads=threads)


def _tiny_llm(profile=None, seed: int = 0, name: str = "tiny-llama"):
    """The tiny random LLaMA the tests and the `tiny` planner run (a byte tokenizer)."""
    from .llm.tiny import tiny_engine

    eng = tiny_engine(seed)
    eng.name = name
    return eng


def _vlm(profile=None, shape: str = "tiny", seed: int = 0, threads: int = 0):
    """SmolVLM split into stages for the Nova core (engines/vlm.py, seed 003)."""
    from .vlm import StagedVLM

    return StagedVLM(shape, seed=seed, threads=threads)


ENGINES.register("simulated", lambda profile, **kw: SimulatedEngine(profile, **kw), knobs=SimulatedKnobs)
ENGINES.register("remote", _remote, knobs=_cls("..transport.remote_engine", "RemoteEngine"))
ENGINES.register("lerobot", _lerobot, knobs=_cls(".lerobot_engine", "LeRobotEngine"))
ENGINES.register("flow", _flow, knobs=_cls(".flow_engine", "FlowEngine"))
ENGINES.register("sampled", _sampled)  # its knobs: inner, k, saturation_batch and the inner engine's
ENGINES.register("oxygen", _oxygen, knobs=_cls(".oxygen", "OxyGenEngine"))
ENGINES.register("ray", _ray)  # its knobs: a ray tier's section (nodes/server_config.py RayTierConfig)
ENGINES.register("llm", _llm)
ENGINES.register("tiny_llm", _tiny_llm)
ENGINES.register("vlm", _vlm)

# The role each registered engine plays (core/engine.py): what the serving path may call on it.
ROLES = {"simulated": "action", "remote": "action", "lerobot": "action", "flow": "action", "sampled": "action",
         "oxygen": "action", "ray": "action", "llm": "text", "tiny_llm": "text", "vlm": "vision"}
ACTION_ENGINES = tuple(n for n, r in ROLES.items() if r == "action")


def make_engine(name: str, profile: EngineProfile, **params):
    return ENGINES.create(name, profile=profile, **params)


__all__ = ["ACTION_ENGINES", "ENGINES", "ROLES", "SimulatedEngine", "make_engine"]
