"""A plug-in's knobs (an engine's, a scheduler's, a horizon policy's, a placement's, a service's)
typed and checked the way config.py checks node parameters, before anything is built.

A plug-in declares its knobs where it is: a frozen dataclass whose fields are `knob(default,
help, lo=..., gt=...)`, registered with it (`Registry.register(name, factory, knobs=K)`);
without one, its knobs are the keyword parameters of its factory, typed by their annotations
(or defaults). Either way there is one list, and `check_knobs` refuses a key not in it, a value
of the wrong type or out of range with ConfigError naming the key, the value and what is
allowed, e.g. `parameter 'chunk_size': 30.5 is not an integer`; sections put it under their
dotted path (`engine.simulated.chunk_size`). Pure Python: core, nodes and the CLI share it."""
from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional, Union, get_args, get_origin

from .errors import ConfigError


def bad(name: str, value: Any, what: str) -> ConfigError:
    """`parameter 'rate': 0.0 is not > 0`: the parameter, its value, what is allowed."""
    if isinstance(value, (list, tuple)):
        value = list(value)
    return ConfigError(name, f"{value!r} {what}")


def check(ok: bool, name: str, value: Any, what: str) -> None:
    if not ok:
        raise bad(name, value, what)


KINDS = {  # type: (accepts, "is not ...", "is not a list of ...")
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            "a finite number", "finite numbers"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", "integers"),
    bool: (lambda v: isinstance(v, bool), "true or false", "booleans"),
    str: (lambda v: isinstance(v, str), "a string", "strings"),
}


def typed(name: str, hint, value, section: Optional[Callable] = None):
    """value as the hint's type (float, int, bool, str, dict, tuple[X, ...], Optional[X], Any);
    `section(name, hint, value)` builds a nested section where the hint is one (config.py's)."""
    if get_origin(hint) in (Union, types.UnionType):  # Optional[X]: None means "not set"
        if value is None:
            return None
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) != 1:
            return value  # a union of several: the plug-in decides
        (hint,) = args
    if hint is Any:
        return value
    if section is not None:
        built = section(name, hint, value)
        if built is not None:
            return built
    if hint is dict or get_origin(hint) in (dict, Mapping):
        check(isinstance(value, Mapping), name, value, "is not a section (a mapping)")
        return _copy(dict(value))
    if get_origin(hint) is tuple:
        item = get_args(hint)[0]
        listed = not isinstance(value, (str, bytes, Mapping)) and isinstance(value, Iterable)
        value = list(value) if listed else value
        check(listed and all(KINDS[item][0](x) for x in value), name, value, f"is not a list of {KINDS[item][2]}")
        return tuple(float(x) if item is float else x for x in value)
    ok, one, _ = KINDS[hint]
    check(ok(value), name, value, f"is not {one}")
    return float(value) if hint is float else value


def _copy(v):
    return {k: _copy(x) for k, x in v.items()} if isinstance(v, dict) else v


def knob(default: Any, help: str, *, lo: Optional[float] = None, gt: Optional[float] = None,
         hi: Optional[float] = None, choices: Optional[tuple] = None):
    """A plug-in knob: its default, its help, and its range (>= lo, > gt, <= hi, one of choices)."""
    return dataclasses.field(default=default, metadata={"help": help, "lo": lo, "gt": gt, "hi": hi,
                                                        "choices": choices})


def in_range(name: str, value, meta: Mapping) -> None:
    """The range of a knob's metadata (knob(lo=, gt=, hi=, choices=)); None is "not set"."""
    if value is None:
        return
    lo, gt, hi, choices = (meta.get(k) for k in ("lo", "gt", "hi", "choices"))
    if choices is not None:
        check(value in choices, name, value, f"is not one of {', '.join(map(str, choices))}")
    if lo is not None:
        check(value >= lo, name, value, f"is not >= {lo}")
    if gt is not None:
        check(value > gt, name, value, f"is not > {gt}")
    if hi is not None:
        check(value <= hi, name, value, f"is not <= {hi}")


# Parameters a caller wires, never a config: a service's node.
WIRING = ("node",)
# Annotations a config can give a value of; a parameter of any other type (a clock, a profile,
# a callable) is wiring, not a knob.
_CONFIGURABLE = (int, float, bool, str, dict, Any)


def _configurable(hint) -> bool:
    if get_origin(hint) in (Union, types.UnionType):
        return all(_configurable(a) for a in get_args(hint) if a is not type(None))
    if get_origin(hint) is tuple:
        return get_args(hint)[0] in KINDS
    return hint in _CONFIGURABLE or get_origin(hint) in (dict, Mapping)


def knobs_from_signature(factory: Callable, role: str = "plug-in", rest_elsewhere: bool = False,
                         rest_to: Optional[Callable] = None) -> Optional[type]:
    """The knobs of a factory without declared ones: a dataclass of its keyword parameters of a
    configurable type (annotated, or judged by the default; unannotated without a default: any
    value). None when it takes **kw it does not name, or has no readable signature. Its **kw
    are its base class's knobs, or `rest_to`'s (the class it hands them to); `rest_elsewhere`:
    they are checked elsewhere (a wrapper's: the wrapped one's knobs)."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve here: judge every knob by its default
        hints = {}
    rows = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD and rest_elsewhere:
            continue
        if p.kind is p.VAR_KEYWORD:  # a class handing **kw to its base's __init__: the base's knobs too
            base = rest_to or next((b for b in (factory.__mro__[1:] if inspect.isclass(factory) else ())
                                    if "__init__" in vars(b)), object)
            more = None if base is object else knobs_from_signature(base, role)
            if more is None:
                return None
            seen = {r[0] for r in rows}
            rows += [(f.name, f.type, _same(f)) for f in dataclasses.fields(more) if f.name not in seen]
            continue
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.name in WIRING:
            continue
        has_default = p.default is not p.empty
        hint = hints.get(p.name)
        if hint is None:  # judged by the default: 25 -> int, 0.4 -> float, None or none -> any value
            d = p.default
            if has_default and d is not None and type(d) not in KINDS:
                continue  # an object (a clock, a callable): wiring, not a knob
            hint = type(d) if has_default and d is not None else Any
        if not _configurable(hint):
            continue
        f = dataclasses.field(default=p.default if has_default else None,
                              metadata={"help": "", "required": not has_default})
        rows.append((p.name, hint, f))
    return dataclasses.make_dataclass(f"{getattr(factory, '__name__', role)}Knobs", rows, frozen=True)


def _same(f: dataclasses.Field) -> dataclasses.Field:
    return dataclasses.field(default=f.default, metadata=f.metadata)


def check_knobs(knobs: type, params: Mapping, what: str, complete: bool = False) -> dict:
    """`params` typed and range-checked against the dataclass `knobs` (declared, or from a
    signature); a key it does not have, a wrong type or range is a ConfigError naming the key
    (relative: the caller's section puts it under its path). `complete`: every knob without a
    default must be given (a config may leave one to the wiring: a placement's links). Returns
    the typed values given."""
    fs = {f.name: f for f in dataclasses.fields(knobs)}
    hints = typing.get_type_hints(knobs)
    out = {}
    for k, v in params.items():
        if k not in fs:
            allowed = f"its knobs: {', '.join(fs)}" if fs else "it takes none"
            raise ConfigError(k, f"given {v!r}, but {what} has no such knob; {allowed}")
        out[k] = typed(k, hints[k], v)
        in_range(k, out[k], fs[k].metadata)
    missing = [n for n, f in fs.items() if f.metadata.get("required") and n not in out]
    if complete and missing:
        raise ConfigError(missing[0], f"is required by {what} (no default)")
    return out


def knob_help(knobs: type) -> dict:
    """knob -> (default, help) of a knobs dataclass, as a node's parameters are described."""
    return {f.name: (f.default, f.metadata.get("help", "")) for f in dataclasses.fields(knobs)}


__all__ = ["KINDS", "bad", "check", "check_knobs", "in_range", "knob", "knob_help", "knobs_from_signature", "typed"]
