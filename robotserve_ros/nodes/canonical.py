"""A ROS message as canonical bytes: what a task MAC covers (core/task_auth.py).

CDR cannot be signed: the serializer leaves its alignment padding uninitialised, so the same
message serializes to different bytes (seen: 4 bytes after a bool differ between a robot and
the server). This walks the message by its declared field types instead: every scalar packed
little-endian at its declared width (a float32 field as float32, so a Python double set on the
robot and the float32 the server receives give the same bytes), every string and sequence
length-prefixed. Both ends run this same code over the same message type."""
from __future__ import annotations

import re
import struct

import numpy as np

_DTYPES = {"boolean": "?", "octet": "u1", "byte": "u1", "char": "u1", "uint8": "u1", "int8": "i1",
           "uint16": "<u2", "int16": "<i2", "uint32": "<u4", "int32": "<i4", "uint64": "<u8", "int64": "<i8",
           "float": "<f4", "double": "<f8"}
_SEQ = re.compile(r"^sequence<(.+?)(?:, \d+)?>$|^(.+)\[(\d+)\]$")
_LEN = struct.Struct("<I")


def canonical(msg) -> bytes:
    out = bytearray()
    _message(msg, out)
    return bytes(out)


def _message(msg, out: bytearray) -> None:
    for name, typ in msg.get_fields_and_field_types().items():
        _value(getattr(msg, name), typ, out)


def _bare(typ: str) -> str:
    """`string<=32` -> `string`: a bound changes nothing in the bytes."""
    return typ.split("<=", 1)[0]


def _value(v, typ: str, out: bytearray) -> None:
    seq = _SEQ.match(typ)
    if seq is not None:
        elem = _bare(seq.group(1) or seq.group(2))
        out += _LEN.pack(len(v))
        if elem in _DTYPES:
            out += np.asarray(_plain(v), dtype=_DTYPES[elem]).tobytes()
        else:
            for x in v:
                _value(x, elem, out)
        return
    typ = _bare(typ)
    if typ in _DTYPES:
        out += np.asarray(_plain(v), dtype=_DTYPES[typ]).tobytes()
    elif typ in ("string", "wstring"):
        b = v.encode("utf-8")
        out += _LEN.pack(len(b)) + b
    else:  # a nested message
        _message(v, out)


def _plain(v):
    """rclpy's octet values are bytes (one, or a list of them), its char values 1-char str."""
    if isinstance(v, (bytes, bytearray)):
        return np.frombuffer(bytes(v), np.uint8)
    if isinstance(v, str):
        return [ord(ch) for ch in v]
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], (bytes, str)):
        return [x for item in v for x in _plain(item)]
    return v
