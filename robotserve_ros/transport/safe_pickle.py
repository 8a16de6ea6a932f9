"""Unpickle LeRobot's async-inference payloads through an allow-list, and nothing else.

LeRobot's `transport.AsyncInference` service carries pickles (RemotePolicyConfig,
TimedObservation, list[TimedAction]); `pickle.loads` on network input lets anyone who
reaches the port run code. Here every global a pickle names goes through
`find_class`, which returns only the LeRobot dataclasses, the numpy and torch functions
that rebuild arrays and CPU tensors, and a few harmless builtins; any other name raises
UnsafePickle naming it, before anything is called. torch's own tensor pickle stores the
storage as a nested `torch.load(weights_only=False)`; that one entry is replaced by a
loader that reads it with `weights_only=True` (torch's restricted unpickler).
"""
from __future__ import annotations

import _compat_pickle
import importlib
import io
import pickle
from typing import Any, Callable, Optional

from ..core.errors import RequestError
from ..core.observation import PayloadTooLarge


class UnsafePickle(RequestError):
    """A payload that names a global outside the allow-list, or is not a pickle at all."""

    code = "unsafe_pickle"


def _load_storage_weights_only(b: bytes):
    """Stands in for torch.storage._load_from_bytes, which would unpickle with weights_only=False."""
    import torch

    return torch.load(io.BytesIO(b), weights_only=True)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """Protocols 0-2 write bytes as _codecs.encode(text, "latin1"); no other codec is let through."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise UnsafePickle(f"payload refused: _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


_HELPERS = "lerobot.async_inference.helpers"
# (module, name) -> what the pickle gets. None: the named object itself, imported on first use.
ALLOWED: dict[tuple[str, str], Optional[Callable]] = {
    # LeRobot's payload dataclasses and what they contain
    (_HELPERS, "TimedObservation"): None,
    (_HELPERS, "TimedAction"): None,
    (_HELPERS, "TimedData"): None,
    (_HELPERS, "RemotePolicyConfig"): None,
    ("lerobot.configs.types", "PolicyFeature"): None,
    ("lerobot.configs.types", "FeatureType"): None,
    ("lerobot.configs.types", "NormalizationMode"): None,
    # numpy arrays and scalars (numpy 2 names, and numpy 1 names for clients on numpy 1.x)
    ("numpy", "ndarray"): None,
    ("numpy", "dtype"): None,
    ("numpy._core.multiarray", "_reconstruct"): None,
    ("numpy._core.multiarray", "scalar"): None,
    ("numpy._core.numeric", "_frombuffer"): None,
    ("numpy.core.multiarray", "_reconstruct"): None,
    ("numpy.core.multiarray", "scalar"): None,
    ("numpy.core.numeric", "_frombuffer"): None,
    # CPU torch tensors: the rebuild function, its hooks dict, the storage read weights-only
    ("torch._utils", "_rebuild_tensor_v2"): None,
    ("torch._utils", "_rebuild_tensor"): None,
    ("torch.storage", "_load_from_bytes"): _load_storage_weights_only,
    ("collections", "OrderedDict"): None,
    # plain containers pickle has no opcode for, and protocol 0/1 object rebuilding
    ("builtins", "set"): None,
    ("builtins", "frozenset"): None,
    ("builtins", "complex"): None,
    ("builtins", "bytearray"): None,
    ("copyreg", "_reconstructor"): None,
    ("builtins", "object"): None,
    ("_codecs", "encode"): _latin1_encode,
}


def _resolve(module: str, name: str):
    if (module, name) in ALLOWED:
        sub = ALLOWED[(module, name)]
        return sub if sub is not None else getattr(importlib.import_module(module), name)
    raise UnsafePickle(
        f"payload refused: its pickle refers to the global '{module}.{name}', which is not on the "
        f"allow-list of LeRobot async-inference types (nothing in it was run)"
    )


class AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Protocols 0-2 write Python 2 names (copy_reg, __builtin__): map them as pickle does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        return _resolve(module, name)

    def persistent_load(self, pid):
        raise UnsafePickle("payload refused: persistent ids are not accepted")


def loads(data: bytes, max_bytes: int = 32 << 20) -> Any:
    """Unpickle `data` through the allow-list. UnsafePickle for a refused global or a malformed
    pickle, PayloadTooLarge past `max_bytes` (checked before anything is read)."""
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"payload of {len(data)} bytes; the server accepts at most {max_bytes}")
    try:
        return AllowListUnpickler(io.BytesIO(data)).load()
    except UnsafePickle:
        raise
    except Exception as e:  # truncated, garbage, or an allowed callable given bad arguments
        raise UnsafePickle(f"payload refused: not a valid LeRobot pickle ({type(e).__name__}: {e})") from None


def dumps(obj: Any) -> bytes:
    """Pickle what the server sends back (its own objects), as LeRobot's client unpickles it."""
    return pickle.dumps(obj)
