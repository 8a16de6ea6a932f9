"""The allow-list of safe_pickle (see its docstring): the errors and Limits, the globals a
LeRobot pickle may name and what each maps to, and the check of a dataclass field's value."""
from __future__ import annotations

import dataclasses
import enum
import importlib
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import RequestError
from ..core.observation import PayloadTooLarge
from .tensors import shown


class UnsafePickle(RequestError):
    """A payload that names a global outside the allow-list, or is not a pickle of plain data."""

    code = "unsafe_pickle"


class PickleLimit(PayloadTooLarge):
    """A payload that would expand past one of the Limits (named in the message)."""


@dataclass(frozen=True)
class Limits:
    """What one payload may expand into. Defaults fit LeRobot's observations (a few cameras,
    a few dozen joints) with a wide margin; the endpoint sets them from its CompatConfig."""

    max_bytes: int = 32 << 20  # the pickle itself, and all bytes/str/array data it builds together
    max_array_elements: int = 32 << 20  # elements of all arrays together
    max_depth: int = 32  # containers within containers
    max_string_bytes: int = 64 << 10  # one str (task, key, path); bytes are bounded by max_bytes
    max_ops: int = 200_000  # opcodes interpreted: bounds the time one payload takes
    # What the result expands into, a shared reference counted each time it is reached (a
    # few KB of lists referencing each other through the memo otherwise stand for gigabytes
    # to whoever walks, prints or converts them): container items, and bytes of data.
    max_expanded_items: int = 1 << 20
    max_container_items: int = 4096  # one dict or set: far below max_ops, and keyed only by str/bytes

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{f.name} must be an integer > 0, got {v!r}")


# numpy's pickled dtype codes of plain numbers (dtype.str without the byte order)
PLAIN_DTYPES = frozenset({"b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"})
MAX_DIMS = 8
_MAX_INT_BYTES = 64  # LONG1/LONG4: a timestep never needs more


def _refuse(msg: str):
    raise UnsafePickle(f"payload refused: {msg}")


class _Global:
    """What a pickle gets for an allowed global: a name and a checked constructor, never the
    object itself (so BUILD, setattr or a call can never reach a class or a function)."""

    __slots__ = ("name", "kind", "target")

    def __init__(self, name: str, kind: str, target: Any = None) -> None:
        self.name, self.kind, self.target = name, kind, target


class _Pending:
    """An object between NEWOBJ/REDUCE and its BUILD (a dataclass, an array, a dtype)."""

    __slots__ = ("kind", "arg", "built")

    def __init__(self, kind: str, arg: Any) -> None:
        self.kind, self.arg, self.built = kind, arg, None


_HELPERS = "lerobot.async_inference.helpers"
_TYPES = "lerobot.configs.types"
# (module, name) -> kind. Only what LeRobot's robot_client sends (its observations are
# floats and numpy arrays; it never sends tensors, so torch is not here).
ALLOWED: dict = {
    (_HELPERS, "TimedObservation"): "dataclass",
    (_HELPERS, "RemotePolicyConfig"): "dataclass",
    (_TYPES, "PolicyFeature"): "dataclass",
    (_TYPES, "FeatureType"): "enum",
    (_TYPES, "NormalizationMode"): "enum",
    ("numpy", "ndarray"): "marker",
    ("numpy", "dtype"): "dtype",
    ("builtins", "object"): "marker",
    ("copyreg", "_reconstructor"): "reconstructor",
    ("builtins", "set"): "set",
    ("builtins", "frozenset"): "frozenset",
    ("builtins", "complex"): "complex",
    ("builtins", "bytearray"): "bytearray",
    ("_codecs", "encode"): "encode",
    ("collections", "OrderedDict"): "dict",
}
for _np in ("numpy._core", "numpy.core"):  # numpy 2 names, and numpy 1 names for clients on 1.x
    ALLOWED[(f"{_np}.multiarray", "_reconstruct")] = "reconstruct"
    ALLOWED[(f"{_np}.multiarray", "scalar")] = "scalar"
    ALLOWED[(f"{_np}.numeric", "_frombuffer")] = "frombuffer"


def _global(module: Any, name: Any) -> _Global:
    if not isinstance(module, str) or not isinstance(name, str):
        _refuse("a global's module and name must be strings")
    if (module, name) in _COMPAT_NAMES:  # protocols 0-2 write Python 2 names (copy_reg, __builtin__)
        module, name = _COMPAT_NAMES[(module, name)]
    module = _COMPAT_MODULES.get(module, module)
    kind = ALLOWED.get((module, name))
    if kind is None:
        _refuse(f"its pickle refers to the global {shown(module + '.' + name, 80)}, which is not on the "
                "allow-list of LeRobot async-inference types (nothing in it was run)")
    target = getattr(importlib.import_module(module), name) if kind in ("dataclass", "enum") else None
    return _Global(f"{module}.{name}", kind, target)


def _compat_tables():
    import _compat_pickle

    return _compat_pickle.NAME_MAPPING, _compat_pickle.IMPORT_MAPPING


_COMPAT_NAMES, _COMPAT_MODULES = _compat_tables()


def _key_ok(k) -> bool:
    """A dict key or set member: str or bytes only, whose hashes Python randomises per
    process, so no payload can choose keys that collide (integers, floats and tuples hash
    to values anyone can compute: a set of them built by a client inserts in quadratic
    time). LeRobot's messages key their dicts by strings only."""
    return type(k) in (str, bytes)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _field_ok(value, tp) -> bool:
    """A dataclass field's value against its declared type (the simple types LeRobot uses)."""
    origin = typing.get_origin(tp) or tp
    if tp is float:
        return isinstance(value, (float, np.floating)) or _is_int(value)
    if tp is int:
        return _is_int(value)
    if tp is bool:
        return isinstance(value, (bool, np.bool_))
    if tp is str:
        return isinstance(value, str)
    if origin in (dict, tuple, list):
        return type(value) is origin
    if isinstance(origin, type) and issubclass(origin, enum.Enum):
        return isinstance(value, origin)
    return False  # anything else (a tensor, a callable) is never taken from a client

