"""Model runners behind core/engine.py's roles, chosen by name from configuration.

A new engine (the LeRobot/torch engine, the remote GPU engine) is one module plus one
registry line; its factory takes the engine profile and its own keyword parameters. Action
engines (core.Engine) and the language engines (core.engine.TextEngine: `llm`, `tiny_llm`;
VisionLanguageEngine: `vlm`) share the registry; ROLES says which role each name plays, and
test_engine_contract.py checks every registered engine against its role. vLLM's backend is
built from the services' own `engine: {name: vllm}` section (engines/llm/vllm_backend.py:
its config lives in config.py, which imports this registry)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..core.knobs import knob
from ..core.profile import EngineProfile
from ..core.registry import Registry, Wraps
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


@dataclass(frozen=True)
class SampledKnobs:
    """engine 'sampled': its own knobs; the rest of its section are the inner engine's."""

    inner: str = knob("lerobot", "the action engine it wraps (not sampled itself, not ray)")
    k: int = knob(3, "extra samples per request while spare slots exist", lo=1)
    saturation_batch: Optional[int] = knob(None, "spare slots are filled up to this batch (default: the inner "
                                                 "engine profile's saturation batch)", lo=1)


def _sampled(profile, inner: str = "lerobot", k: int = 3, saturation_batch=None, **kw):
    """Batch self-consistency (core/horizon/self_consistency.py): `inner` engine, plus up to k
    replicas per request in the batch's spare slots below the saturation batch, so the
    `self_consistency` horizon policy gets its samples. Every extra row is counted."""
    from ..core.horizon.self_consistency import SelfConsistencyEngine

    return SelfConsistencyEngine(ENGINES.create(inner, profile=profile, **kw), k, saturation_batch)


def _wrappable(*not_these: str):
    """The action engines a wrapper may wrap (known when asked: the registry is complete then)."""
    return lambda: [n for n in ACTION_ENGINES if n not in not_these]


def _ray(profile, **kw):
    """A Ray Serve pool of replicas of another engine (transport/ray_pool.py); ray loads on use."""
    from ..transport.ray_pool import RayPoolEngine

    return RayPoolEngine(profile, make=make_engine, **kw)


def _ray_knobs():
    """The pool engine's knobs and its RayPool's (the **pool it hands on), one list; ray loads on use."""
    from ..core.knobs import knobs_from_signature
    from ..transport.ray_pool import RayPool, RayPoolEngine

    return knobs_from_signature(RayPoolEngine, "engine", rest_to=RayPool)


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
ENGINES.register("sampled", _sampled, knobs=SampledKnobs, wraps=Wraps(_wrappable("sampled", "ray"), name_knob="inner"))
ENGINES.register("oxygen", _oxygen, knobs=_cls(".oxygen", "OxyGenEngine"))
# its knobs: the pool's (a ray tier's section: nodes/server_config.py RayTierConfig), engine_params the replicas'
ENGINES.register("ray", _ray, knobs=_ray_knobs,
                 wraps=Wraps(_wrappable("ray"), name_knob="engine", params_knob="engine_params"))
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
