"""Config name -> implementation. Adding a scheduler or horizon policy is a file plus a line."""
from __future__ import annotations

import inspect
import numbers
from typing import Callable, Generic, Mapping, TypeVar

from .errors import ConfigError, UnknownName

T = TypeVar("T")


def _knobs(factory: Callable) -> dict[str, inspect.Parameter] | None:
    """The keyword parameters `factory` takes; None when it takes any (**kw) or cannot be read."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return None
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name: p for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def _wrong_type(default, value) -> str | None:
    """What `value` should have been, judged by the knob's default; None when it fits, or
    the default says nothing (None, an object), or the value is None (the caller's "default")."""
    if value is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, (int, float)):
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        return None if ok else "a number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    return None


class Registry(Generic[T]):
    def __init__(self, role: str, entries: Mapping[str, Callable[..., T]] | None = None) -> None:
        """`entries`: the built-in implementations by config name (each registered as below)."""
        self.role = role
        self._items: dict[str, Callable[..., T]] = {}
        for name, factory in (entries or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: Callable[..., T] | None = None):
        """Register `factory` under `name`; usable as a decorator. Names are unique."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._items and self._items[name] is not f:
                raise ValueError(f"{self.role} '{name}' is already registered")
            self._items[name] = f
            return f

        return add(factory) if factory is not None else add

    def _factory(self, name: str) -> Callable[..., T]:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(f"unknown {self.role} '{name}'; known: {', '.join(self.names())}") from None

    def check(self, name: str, params: Mapping) -> None:
        """Refuse a name or knob the implementation does not take, before building anything:
        UnknownName / ConfigError name the wrong one and what is allowed, so
        the CLI, the nodes and the LeRobot endpoint all give the same one line."""
        knobs = _knobs(self._factory(name))
        if knobs is None:
            return
        allowed = f"its knobs: {', '.join(knobs)}" if knobs else "it takes none"
        for k, v in params.items():
            p = knobs.get(k)
            if p is None:
                raise ConfigError(f"{self.role} '{name}' has no knob '{k}'; {allowed}")
            want = None if p.default is inspect.Parameter.empty else _wrong_type(p.default, v)
            if want:
                raise ConfigError(f"{self.role} '{name}' knob '{k}' takes {want}, got {v!r}")

    def create(self, name: str, **params) -> T:
        self.check(name, params)
        return self._factory(name)(**params)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
