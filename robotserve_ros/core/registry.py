"""Config name -> implementation. Adding a scheduler or horizon policy is a file plus a line."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Generic, Mapping, Optional, Sequence, TypeVar, Union

from .errors import ConfigError, UnknownName
from .knobs import check, check_knobs, knobs_from_signature

T = TypeVar("T")


def _named_parameters(factory: Callable) -> set:
    try:
        return {p.name for p in inspect.signature(factory).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    except (TypeError, ValueError):
        return set()


@dataclasses.dataclass(frozen=True)
class Wraps:
    """A plug-in around another (a `sampled` engine's inner engine, a Ray pool's replicas'
    engine, a service's own engine): whose knobs are checked with its own, so a typo inside
    is found before anything is built. `name_knob`: its knob naming the wrapped one (None:
    always `fixed`); `params_knob`: its knob holding the wrapped one's knobs (None: they sit
    beside its own in the same section); `allowed()`: the names it may wrap; `registry()`: where
    they are registered (None: the same registry)."""

    allowed: Callable[[], Sequence[str]]
    name_knob: Optional[str] = None
    params_knob: Optional[str] = None
    fixed: str = ""
    registry: Optional[Callable[[], "Registry"]] = None


class Registry(Generic[T]):
    def __init__(self, role: str, entries: Mapping[str, Callable[..., T]] | None = None) -> None:
        """`entries`: the built-in implementations by config name (each registered as below)."""
        self.role = role
        self._items: dict[str, Callable[..., T]] = {}
        self._knobs: dict[str, Union[type, Callable[[], type], None]] = {}
        self._wraps: dict[str, Wraps] = {}
        for name, factory in (entries or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: Callable[..., T] | None = None, *, knobs=None,
                 wraps: Optional[Wraps] = None):
        """Register `factory` under `name`; usable as a decorator. Names are unique. `knobs`:
        its declared knobs (a dataclass of core.knobs.knob fields), or a function returning
        that dataclass or the class whose keyword parameters they are (imported on use: torch,
        grpc); without it, the factory's own keyword parameters. `wraps`: it wraps another
        plug-in, whose knobs are checked with its own (Wraps)."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._items and self._items[name] is not f:
                raise ValueError(f"{self.role} '{name}' is already registered")
            self._items[name] = f
            self._knobs[name] = knobs
            if wraps is not None:
                self._wraps[name] = wraps
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
        if self._knobs.get(name) is src or _declared(src):
            return src
        # a wrapper's **kw beside its own are the wrapped one's knobs, checked by check() through its Wraps
        w = self._wraps.get(name)
        return knobs_from_signature(src, self.role, rest_elsewhere=w is not None and w.params_knob is None)

    def check(self, name: str, params: Mapping) -> dict:
        """Refuse a name or knob the implementation does not take, before building anything:
        UnknownName / ConfigError name the wrong one, its value and what is allowed, so the
        CLI, the nodes and the LeRobot endpoint all give the same one line. Returns the
        knobs typed (an int where a float is declared becomes a float)."""
        knobs = self.knobs(name)
        if knobs is None:
            return dict(params)
        what, w = f"{self.role} '{name}'", self._wraps.get(name)
        if w is None:
            return {**params, **check_knobs(knobs, params, what)}
        fields = {f.name: f.default for f in dataclasses.fields(knobs)}
        rest = {k: v for k, v in params.items() if k not in fields} if w.params_knob is None else {}
        own = check_knobs(knobs, {k: v for k, v in params.items() if k not in rest}, what)
        inner = own.get(w.name_knob, fields.get(w.name_knob)) if w.name_knob else w.fixed
        allowed = list(w.allowed())
        if w.name_knob:
            check(inner in allowed, w.name_knob, inner, f"is not one of {', '.join(allowed)} (what {what} can wrap)")
        reg = w.registry() if w.registry else self
        if w.params_knob is not None:
            try:
                inner_params = reg.check(inner, own.get(w.params_knob) or {})
            except ConfigError as e:
                raise e.under(w.params_knob) from None
            return {**params, **own, w.params_knob: inner_params}
        inner_knobs = reg.knobs(inner)
        theirs = {f.name for f in dataclasses.fields(inner_knobs)} if inner_knobs else set(rest)
        for k, v in rest.items():
            if k not in theirs:
                raise ConfigError(k, f"given {v!r}, but neither {what} ({', '.join(fields)}) nor the "
                                     f"{reg.role} '{inner}' it wraps ({', '.join(sorted(theirs)) or 'none'}) has such a knob")
        return {**params, **own, **reg.check(inner, rest)}

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


def _declared(src) -> bool:
    """A knobs dataclass of core.knobs.knob fields (declared), not a class whose parameters are read."""
    fs = dataclasses.fields(src) if dataclasses.is_dataclass(src) and isinstance(src, type) else ()
    return bool(fs) and all("help" in f.metadata for f in fs)
