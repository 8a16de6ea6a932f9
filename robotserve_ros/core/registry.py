"""Config name -> implementation. Adding a scheduler or horizon policy is a file plus a line."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from .errors import UnknownName

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, role: str) -> None:
        self.role = role
        self._items: dict[str, Callable[..., T]] = {}

    def register(self, name: str, factory: Callable[..., T] | None = None):
        """Register `factory` under `name`; usable as a decorator. Names are unique."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._items and self._items[name] is not f:
                raise ValueError(f"{self.role} '{name}' is already registered")
            self._items[name] = f
            return f

        return add(factory) if factory is not None else add

    def create(self, name: str, **params) -> T:
        try:
            factory = self._items[name]
        except KeyError:
            raise UnknownName(f"unknown {self.role} '{name}'; known: {', '.join(self.names())}") from None
        return factory(**params)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
