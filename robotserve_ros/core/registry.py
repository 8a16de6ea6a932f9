"""Config name -> implementation. Adding a scheduler or horizon policy is a file plus a line."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Generic, Mapping, Optional, TypeVar, Union

from .errors import UnknownName
from .knobs import check_knobs, knobs_from_signature

T = TypeVar("T")


def _named_parameters(factory: Callable) -> set:
    try:
        return {p.name for p in inspect.signature(factory).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    except (TypeError, ValueError):
        return set()


class Registry(Generic[T]):
    def __init__(self, role: str, entries: Mapping[str, Callable[..., T]] | None = None) -> None:
        """`entries`: the built-in implementations by config name (each registered as below)."""
        self.role = role
        self._items: dict[str, Callable[..., T]] = {}
        self._knobs: dict[str, Union[type, Callable[[], type], None]] = {}
        for name, factory in (entries or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: Callable[..., T] | None = None, *, knobs=None):
        """Register `factory` under `name`; usable as a decorator. Names are unique. `knobs`:
        its declared knobs (a dataclass of core.knobs.knob fields), or a function returning
        the class whose keyword parameters they are (imported on use: torch, grpc); without
        it, the factory's own keyword parameters."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._items and self._items[name] is not f:
                raise ValueError(f"{self.role} '{name}' is already registered")
            self._items[name] = f
            self._knobs[name] = knobs
            return f

        return add(factory) if factory is not None else add

    def _factory(self, name: str) -> Callable[..., T]:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(f"unknown {self.role} '{name}'; known: {', '.join(self.names())}") from None

    def _source(self, name: str) -> Callable:
        """What declares `name`'s knobs: its knobs dataclass, the class it builds, or the factory."""
        factory, k = self._factory(name), self._knobs.get(name)
        if k is None or (isinstance(k, type) and hasattr(k, "__dataclass_fields__")):
            return k or factory
        return k()  # the class it builds, imported now

    def knobs(self, name: str) -> Optional[type]:
        """The knobs dataclass of `name`; None when they cannot be known (a factory taking **kw)."""
        src = self._source(name)
        if self._knobs.get(name) is src:
            return src
        return knobs_from_signature(src, self.role)

    def check(self, name: str, params: Mapping) -> dict:
        """Refuse a name or knob the implementation does not take, before building anything:
        UnknownName / ConfigError name the wrong one, its value and what is allowed, so the
        CLI, the nodes and the LeRobot endpoint all give the same one line. Returns the
        knobs typed (an int where a float is declared becomes a float)."""
        knobs = self.knobs(name)
        if knobs is None:
            return dict(params)
        return {**params, **check_knobs(knobs, params, f"{self.role} '{name}'")}

    def create(self, name: str, **params) -> T:
        """Build `name` from its knobs, checked; the factory's parameters that are no knobs (an
        engine's profile, a placement's links: wiring the caller supplies) pass as they are."""
        factory, knobs = self._factory(name), self.knobs(name)
        if knobs is None:
            return factory(**params)
        own = {f.name for f in dataclasses.fields(knobs)}
        named = _named_parameters(factory) | _named_parameters(self._source(name))  # an engine's link, a clock
        wiring = {k: v for k, v in params.items() if k not in own and k in named}
        return factory(**wiring, **self.check(name, {k: v for k, v in params.items() if k not in wiring}))

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
