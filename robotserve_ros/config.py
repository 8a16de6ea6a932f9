"""Configuration as frozen dataclasses: one tree per program, read alike by the ROS nodes
(nested ROS parameters), the LeRobot endpoint and the GPU server (command-line flags).

In the style of LeRobot's async_inference/configs.py: every field has a default and its help,
construction checks types and then `check()`; a bad value raises ConfigError, one line
naming the parameter (dotted path), the value and what is allowed. Sections nest as nav2's
params do: a plug-in section picks one implementation by `name` and keeps each
implementation's knobs in a sub-tree under its own name, e.g.

    engine: {name: lerobot, lerobot: {policy_dir: models/x, device: cpu}}

`from_tree(Cls, tree)` builds a config from such a nested dict (unknown keys are an error);
`flatten(cfg)` gives the dotted parameter names a node declares. Pure Python: low in the
package, imported by nodes/, transport/ and the CLI; registries are read only when checked.
"""
from __future__ import annotations

import math
import types
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional, TypeVar, Union, get_args, get_origin, get_type_hints

from .core import errors
from .core.knobs import bad, check, typed


ConfigError = errors.ConfigError  # `parameter 'engine.name': 'x' is not one of ...`: the dotted name and what is wrong


def check_one_of(name: str, value: Any, choices) -> None:
    choices = list(choices)
    check(value in choices, name, value, f"is not one of {', '.join(map(str, choices))}")


def check_image_transport(transport: str, quality: int) -> None:
    """image_transport / image_quality of a robot_client or a remote tier (transport/images.py)."""
    from .transport.images import TRANSPORTS, quality_range

    check_one_of("image_transport", transport, TRANSPORTS)
    lo, hi = quality_range(transport)
    check(lo <= quality <= hi, "image_quality", quality, f"is not in {lo}..{hi} for {transport}")


def param(default: Any, help: str, *, runtime: bool = False, beside: bool = False):
    """A config field: its default, its help (a ROS parameter's description), and whether it
    may be set while a node runs (read-only otherwise). `beside`: a dict whose sub-trees sit
    beside the section's fields under their own names (plug-in knobs, nav2's named sections).
    Dicts and sections are copied per use."""
    meta = {"help": help, "runtime": runtime, "beside": beside}
    if isinstance(default, (dict, Config)):
        value = default
        return field(default_factory=lambda: _copy(value), metadata=meta)
    return field(default=default, metadata=meta)


def _copy(v):
    return {k: _copy(x) for k, x in v.items()} if isinstance(v, dict) else v


class Config:
    """Base of a frozen config dataclass. Construction checks each field's type (ints serve
    floats, lists become tuples, a dict becomes a section), then `check()`."""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            object.__setattr__(self, f.name, _typed(f.name, hints[f.name], getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """A section's own rules (ranges, choices, combinations)."""

    @classmethod
    def extra_keys(cls, tree: Mapping, extra: dict) -> dict:
        """Keys of `tree` that are not fields: here an error; sections that take sub-trees
        named by a value (plug-ins, nav2's lists of names) return the field values they make."""
        k = sorted(extra)[0]
        raise ConfigError(k, f"is not a parameter here; allowed: {', '.join(f.name for f in fields(cls))}")


class PluginConfig(Config):
    """A section choosing one implementation by `name`; `params` holds each implementation's
    keyword parameters under its name (only the chosen one's are used: a file may keep
    several and a `-p x.name:=...` switches). Subclasses say which names exist."""

    name: str
    params: dict

    @classmethod
    def registry(cls):
        """The registry the names and each one's knobs come from."""
        raise NotImplementedError

    @classmethod
    def choices(cls) -> list:
        return cls.registry().names()

    @classmethod
    def extra_keys(cls, tree: Mapping, extra: dict) -> dict:
        names = cls.choices()
        for k, v in extra.items():
            check(k in names, k, v, f"is not a parameter here nor one of {', '.join(names)}")
            check(isinstance(v, Mapping), k, v, "is not a section of keyword parameters")
        return {"params": {**tree.get("params", {}), **extra}}

    def check(self) -> None:
        check_one_of("name", self.name, self.choices())
        # the chosen one's knobs, typed (30 -> 30.0 where a float is declared) before anything is built
        try:
            knobs = self.registry().check(self.name, self.params.get(self.name, {}))
        except ConfigError as e:
            raise e.under(self.name) from None
        object.__setattr__(self, "params", {**self.params, self.name: knobs})

    @property
    def chosen(self) -> dict:
        """The chosen implementation's keyword parameters."""
        return dict(self.params.get(self.name, {}))


C = TypeVar("C", bound=Config)


def from_tree(cls: type[C], tree: Optional[Mapping], prefix: str = "") -> C:
    """`cls` from a nested dict (ROS parameters, YAML, JSON): missing keys take their
    defaults, unknown keys are an error, errors name the dotted path under `prefix`."""
    tree = dict(tree or {})
    names = {f.name for f in fields(cls)}
    try:
        kw = cls.extra_keys(tree, {k: v for k, v in tree.items() if k not in names}) \
            if set(tree) - names else {}
        hints = get_type_hints(cls)
        for k in names & set(tree):
            if k in kw:
                continue
            hint = hints[k]
            if isinstance(hint, type) and issubclass(hint, Config):
                check(isinstance(tree[k], Mapping), k, tree[k], "is not a section")
                kw[k] = from_tree(hint, tree[k], k)
            else:
                kw[k] = tree[k]
        return cls(**kw)
    except ConfigError as e:
        raise e.under(prefix) from None


def flatten(cfg: Config, prefix: str = "") -> dict:
    """Dotted name -> (value, help) of every leaf, as a node declares them."""
    out = {}
    for f in fields(cfg):
        v, name = getattr(cfg, f.name), f"{prefix}{f.name}"
        if f.metadata.get("beside"):  # sub-trees beside the fields, each under its own name
            out.update(_flat_dict(v, prefix, f.metadata.get("help", "")))
        elif isinstance(v, Config):
            out.update(flatten(v, f"{name}."))
        elif isinstance(v, dict):
            out.update(_flat_dict(v, f"{name}.", f.metadata.get("help", "")))
        else:
            out[name] = (v, f.metadata.get("help", ""))
    return out


def _flat_dict(d: dict, prefix: str, help: str) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat_dict(v, f"{prefix}{k}.", help))
        else:
            out[f"{prefix}{k}"] = (v, help)
    return out


def unflatten(values: Mapping[str, Any]) -> dict:
    """{'engine.name': 'x', 'engine.x.k': 1} -> {'engine': {'name': 'x', 'x': {'k': 1}}}."""
    tree: dict = {}
    for name, v in values.items():
        *path, leaf = name.split(".")
        t = tree
        for p in path:
            t = t.setdefault(p, {})
            if not isinstance(t, dict):
                raise ConfigError(name, f"is inside '{p}', which is a value, not a section")
        t[leaf] = v
    return tree


def _section(name: str, hint, value):
    """A nested config section from its mapping (knobs.typed's hook); None where hint is no section."""
    if not (isinstance(hint, type) and issubclass(hint, Config)):
        return None
    if isinstance(value, hint):
        return value
    check(isinstance(value, Mapping), name, value, "is not a section")
    return from_tree(hint, value, name)


def _typed(name: str, hint, value):
    """value as the field's type (float, int, bool, str, dict, tuple[X, ...], Optional[X], a section)."""
    return typed(name, hint, value, _section)


def defaults_of(cls) -> dict:
    """Field name -> default of a config dataclass (its factory called)."""
    return {f.name: f.default if f.default is not MISSING else f.default_factory()
            for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}


# --- the sections every server shares ------------------------------------------------------
@dataclass(frozen=True)
class SchedulerConfig(PluginConfig):
    # docs/defaults.md: "remaining" measured best on this hardware; "kairos" is seed 000 §3.2.2
    name: str = param("remaining", "the scheduler (core/schedulers registry)")
    params: dict = param({}, "each scheduler's keyword parameters under its name, e.g. kairos: {buckets: 10}",
                         beside=True)

    @classmethod
    def registry(cls):
        from .core.schedulers import SCHEDULERS

        return SCHEDULERS

    def build(self, at: str = "scheduler"):
        """The scheduler; a bad knob is a ConfigError naming its section (under `at`)."""
        from .core.schedulers import make_scheduler

        try:
            return make_scheduler(self.name, **self.chosen)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{at}.{self.name}", f"no {self.name} scheduler with {self.chosen}: {e}") from None


@dataclass(frozen=True)
class EngineConfig(PluginConfig):
    """The model runner and its engine profile (latency vs batch) the scheduler plans with."""

    name: str = param("simulated", "the action engine (engines registry): simulated, lerobot, flow, oxygen, sampled, "
                     "remote, ray")
    params: dict = param({}, "each engine's keyword parameters under its name, e.g. lerobot: {policy_dir: D}",
                         beside=True)
    profile: str = param("", "an engine profile of record (robotserve_ros/profiles/NAME.json); '' = the engine's "
                         "own (a simulated engine: smolvla_tiny)")
    batch_sizes: tuple[int, ...] = param((), "an explicit engine profile instead of `profile`: batch sizes, "
                                         "1 first, increasing")
    latency_ms: tuple[float, ...] = param((), "the explicit profile's latency (ms) at each of batch_sizes")

    @classmethod
    def registry(cls):
        from .engines import ENGINES

        return ENGINES

    def check(self) -> None:
        super().check()
        from .core.profile import EngineProfile
        from .engines import ACTION_ENGINES, ROLES
        from .profiles import names as profile_names

        check(ROLES.get(self.name, "action") == "action", "name", self.name,
              f"is a {ROLES.get(self.name)} engine; action chunks come from one of {', '.join(ACTION_ENGINES)}")

        if self.profile:
            check_one_of("profile", self.profile, profile_names())
        b, ms = self.batch_sizes, self.latency_ms
        check(len(b) == len(ms), "latency_ms", ms, f"does not give one latency for each of the {len(b)} batch_sizes")
        if b:
            check(b[0] == 1 and all(x < y for x, y in zip(b, b[1:])), "batch_sizes", b,
                  "is not a list of increasing batch sizes starting at 1")
            try:
                EngineProfile(dict(zip(b, ms)))
            except ValueError as e:
                raise bad("latency_ms", ms, f"is not a profile: {e}") from None

    def engine_profile(self):
        """The explicit profile, else the named one of record, else None (the engine's own;
        smolvla_tiny for a simulated engine, which has none)."""
        from .core.profile import EngineProfile
        from .profiles import profile_of_record

        if self.batch_sizes:
            return EngineProfile(dict(zip(self.batch_sizes, self.latency_ms)))
        if self.profile or self.name == "simulated":
            return profile_of_record(self.profile or "smolvla_tiny")
        return None

    def build(self, at: str = "engine"):
        """The engine; a bad knob or a missing model is a ConfigError naming its section (under `at`)."""
        from .engines import make_engine

        try:
            return make_engine(self.name, self.engine_profile(), **self.chosen)
        except (TypeError, ValueError, OSError) as e:
            raise ConfigError(f"{at}.{self.name}", f"no {self.name} engine with {self.chosen}: {e}") from None


def engine_config(name: str, params: Mapping, profile_ms: Optional[Mapping] = None, **kw) -> EngineConfig:
    """An EngineConfig from the flat form of the command lines (--engine, --engine-params,
    a profile as batch -> ms): the same dataclass the nodes' `engine` section builds."""
    check(isinstance(params, Mapping), "engine_params", params, "is not an object of keyword parameters")
    if profile_ms:
        pts = sorted((int(b), float(ms)) for b, ms in profile_ms.items())
        kw.update(batch_sizes=tuple(b for b, _ in pts), latency_ms=tuple(ms for _, ms in pts))
    try:
        return EngineConfig(name=name, params={name: dict(params)}, **kw)
    except ConfigError as e:  # a knob of the chosen engine: named as the flat form names it
        if e.what is not None and e.name.startswith(f"{name}."):
            raise ConfigError(f"engine_params.{e.name[len(name) + 1:]}", e.what) from None
        raise


def relabel(e: ConfigError, names: Mapping[str, str]) -> ConfigError:
    """The error under the flat names of a command line or a flat config, e.g. the section's
    'name' -> '--engine'; names it does not map stay as they are."""
    root, dot, rest = e.name.partition(".")
    if e.what is None or root not in names:
        return e
    return ConfigError(names[root] + dot + rest, e.what)


__all__ = ["Config", "ConfigError", "EngineConfig", "PluginConfig", "SchedulerConfig", "bad", "check",
           "check_one_of", "defaults_of", "engine_config", "flatten", "from_tree", "param", "relabel", "unflatten"]


@dataclass(frozen=True)
class VLLMConfig(Config):
    """The vLLM backend of the LLM services (engines/llm/vllm_backend.py, docs/vllm.md)."""

    model: str = param("", "a vLLM-ready model folder ('' = .venv-vllm/models/smollm2-135m, made by `make vllm`)")
    python: str = param("", "the vLLM venv's python ('' = .venv-vllm/bin/python)")
    threads: int = param(1, "CPU threads of the vLLM engine (VLLM_CPU_OMP_THREADS_BIND: cores 0..N-1), >= 1")
    max_num_seqs: int = param(16, "vLLM's running batch bound, >= 1")
    kv_cache_gib: int = param(1, "KV cache space (VLLM_CPU_KVCACHE_SPACE), GiB, >= 1")
    block_size: int = param(32, "KV block size: the prefix cache's granularity (a multiple of 16)")
    max_model_len: int = param(2048, "context bound, >= 64")
    dtype: str = param("bfloat16", "bfloat16 or float32")
    start_timeout_s: float = param(300.0, "how long the engine may take to load, > 0")

    def check(self) -> None:
        for name in ("threads", "max_num_seqs", "kv_cache_gib"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "is not >= 1")
        check(self.block_size >= 16 and self.block_size % 16 == 0, "block_size", self.block_size,
              "is not a multiple of 16")
        check(self.max_model_len >= 64, "max_model_len", self.max_model_len, "is not >= 64")
        check_one_of("dtype", self.dtype, ("bfloat16", "float32"))
        check(self.start_timeout_s > 0, "start_timeout_s", self.start_timeout_s, "is not > 0")

    def host_params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
