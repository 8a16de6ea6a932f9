"""Read LeRobot's async-inference pickles as plain data, through an allow-list, and nothing else.

LeRobot's `transport.AsyncInference` service carries pickles (RemotePolicyConfig,
TimedObservation); `pickle.loads` on network input lets anyone who reaches the port run
code, and even an allow-list on `find_class` is not enough: BUILD and REDUCE on the allowed
numpy and torch internals let a 300-byte payload crash the process (a dtype whose field
lies outside its array), hang it (10^15 zero-size elements iterated in C) or make it
allocate gigabytes (`bytearray(2**30)`, an uninitialised 20000x20000x3 image).

So this module does not run pickle's machine at all. `loads` interprets the opcode stream
itself and builds only plain data: None, bool, int, float, complex, str, bytes, bytearray,
tuple, list, dict, set, frozenset, numpy arrays and scalars of plain numeric dtypes, the
LeRobot enums, and the LeRobot payload dataclasses. A global a pickle names is never
handed to it: it maps to a constructor here that checks its arguments (a dtype from
PLAIN_DTYPES with no fields or sub-arrays; an array only from exactly shape x itemsize
bytes, so never strided, offset or uninitialised); a dataclass is rebuilt field by field
through its own __init__ from the BUILD state, each field type-checked; BUILD on anything
else is refused. Every size is checked against `Limits` before it is allocated, and the
opcode count bounds the time one payload can take.

The pieces: pickle_allowlist.py (errors, Limits, the allow-list, field checks),
pickle_machine.py (the interpreter and the checked constructors), pickle_opcodes.py (one
handler per opcode); this module is the entry point callers use.
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Optional

from ..core.observation import PayloadTooLarge
# Public names live beside the allow-list; callers import them from here.
from .pickle_allowlist import ALLOWED, PLAIN_DTYPES, Limits, PickleLimit, UnsafePickle, _refuse
from .pickle_machine import _Machine

__all__ = ["ALLOWED", "PLAIN_DTYPES", "Limits", "PayloadTooLarge", "PickleLimit", "UnsafePickle", "dumps", "loads"]


def _kids(o):
    if type(o) in (list, tuple, set, frozenset):
        return o
    if type(o) is dict:
        return [*o.keys(), *o.values()]
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return [getattr(o, f.name) for f in dataclasses.fields(o)]
    return None


def _data_bytes(o) -> int:
    if type(o) in (str, bytes, bytearray):
        return len(o)
    return int(getattr(o, "nbytes", 0))  # numpy arrays and scalars


def _check_shape(obj: Any, lim: Limits) -> None:
    """No cycles, nothing nested past max_depth (mutable containers could be linked into a
    deep chain after they were made), and what the result expands into within
    max_expanded_items and max_bytes, a shared reference counted every time it is reached
    (the size of the tree whoever walks, prints or converts it sees, not of the DAG the
    memo built). Without recursion, each object visited once: the sizes are summed bottom-up."""
    size: dict = {}  # id -> (items, bytes) expanded below it
    keep = []  # the objects whose ids key `size` stay alive while it is used
    stack = [(obj, 1, False)]
    path: set = set()
    while stack:
        o, d, leaving = stack.pop()
        kids = _kids(o)
        if leaving:
            path.discard(id(o))
            items = len(kids) + sum(size[id(k)][0] for k in kids)
            nbytes = sum(size[id(k)][1] for k in kids)
            if items > lim.max_expanded_items:
                raise PickleLimit(f"payload expands past max_expanded_items ({lim.max_expanded_items} items, "
                                  "each shared reference counted where it is used)")
            if nbytes > lim.max_bytes:
                raise PickleLimit(f"payload expands past max_bytes ({lim.max_bytes} bytes of data, "
                                  "each shared reference counted where it is used)")
            size[id(o)] = (items, nbytes)
            continue
        if d > lim.max_depth:
            raise PickleLimit(f"containers nested deeper than max_depth ({lim.max_depth})")
        if id(o) in path:
            _refuse("a container that contains itself")
        if id(o) in size:
            continue
        if kids is None:
            size[id(o)] = (0, _data_bytes(o))
            keep.append(o)
            continue
        path.add(id(o))
        keep.append(o)
        stack.append((o, d, True))
        stack.extend((k, d + 1, False) for k in kids)


def loads(data: bytes, max_bytes: Optional[int] = None, limits: Optional[Limits] = None) -> Any:
    """Plain data from a LeRobot pickle. UnsafePickle for anything refused or malformed,
    PickleLimit (a PayloadTooLarge) past a limit, checked before it is allocated."""
    lim = limits or Limits()
    if max_bytes is not None:
        lim = dataclasses.replace(lim, max_bytes=max_bytes)
    if len(data) > lim.max_bytes:
        raise PayloadTooLarge(f"payload of {len(data)} bytes; the server accepts at most {lim.max_bytes}")
    try:
        obj = _Machine(bytes(data), lim).run()
        _check_shape(obj, lim)
        return obj
    except (UnsafePickle, PayloadTooLarge):
        raise
    except Exception as e:  # truncated, garbage: its type only, never the client's bytes
        raise UnsafePickle(f"payload refused: not a valid LeRobot pickle ({type(e).__name__})") from None


def dumps(obj: Any) -> bytes:
    """Pickle what the server sends back (its own objects), as LeRobot's client unpickles it."""
    return pickle.dumps(obj)
