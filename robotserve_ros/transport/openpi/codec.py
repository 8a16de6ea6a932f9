"""openpi's msgpack wire format (openpi_client/msgpack_numpy.py), read with limits checked
before anything is allocated.

A frame is first walked header by header (`scan`: no object is built, only lengths read):
the whole frame is one map, its nesting, item count, string and binary lengths are within
the limits, it holds no ext types, and it ends where the frame ends. Only then does msgpack
build it, arrays (`{__ndarray__, data, dtype, shape}`) becoming read-only views on their
bytes after their dtype is checked against an allow-list of plain numeric dtypes (no object,
void, string or datetime dtypes: nothing that could run code or hide a pickle) and their
shape against the element budget and the byte count. Every refusal is a `Refusal` with one
line naming the limit.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import msgpack
import numpy as np

from ..tensors import shown

# dtype.str of what openpi clients send (numpy's byte-order prefix + kind + size).
_KINDS = ("b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8")
ALLOWED_DTYPES = frozenset(p + k for k in _KINDS for p in ("<", ">", "|"))
MAX_DIMS = 8


class Refusal(Exception):
    """A frame or observation refused: `key` is what is counted, `message` the one line sent back."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 16 << 20  # one frame (websockets refuses larger ones before reading them)
    max_array_elements: int = 16 << 20  # elements of all arrays in one frame together
    max_nesting_depth: int = 16  # maps/arrays within maps/arrays
    max_items: int = 100_000  # msgpack objects in one frame (bounds the decoding time)
    max_string_bytes: int = 64 << 10  # one str (a key, the prompt)


# Header byte -> (kind, size of its length field or payload). Fixed-size scalars: ("s", n).
_SCALAR = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
           0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_LEN = {1: ">B", 2: ">H", 4: ">I"}
_BIN = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_STR = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_ARR = {0xDC: 2, 0xDD: 4}
_MAP = {0xDE: 2, 0xDF: 4}


def _length(buf: bytes, at: int, size: int) -> int:
    if at + size > len(buf):
        raise Refusal("bad_message", "truncated msgpack message")
    return struct.unpack_from(_LEN[size], buf, at)[0]


def _header(buf: bytes, i: int, lim: Limits) -> tuple:
    """The msgpack object whose header starts at buf[i]: (where the next object starts, how many
    children it opens). Strings are checked against max_string_bytes here."""
    b = buf[i]
    if b <= 0x7F or b >= 0xE0:
        return i + 1, 0
    if b in _SCALAR:
        return i + 1 + _SCALAR[b], 0
    if 0xA0 <= b <= 0xBF or b in _STR:
        size = 0 if b <= 0xBF else _STR[b]
        ln = (b & 0x1F) if size == 0 else _length(buf, i + 1, size)
        if ln > lim.max_string_bytes:
            raise Refusal("too_long_string", f"string of {ln} bytes is over max_string_bytes ({lim.max_string_bytes})")
        return i + 1 + size + ln, 0
    if b in _BIN:
        return i + 1 + _BIN[b] + _length(buf, i + 1, _BIN[b]), 0
    if 0x90 <= b <= 0x9F or b in _ARR:
        count = (b & 0x0F) if b <= 0x9F else _length(buf, i + 1, _ARR[b])
        return i + 1 + (0 if b <= 0x9F else _ARR[b]), count
    if 0x80 <= b <= 0x8F or b in _MAP:
        count = 2 * ((b & 0x0F) if b <= 0x8F else _length(buf, i + 1, _MAP[b]))
        return i + 1 + (0 if b <= 0x8F else _MAP[b]), count
    # 0xC1 (never used) and the ext types, which openpi never sends
    raise Refusal("bad_message", f"msgpack type 0x{b:02x} is not accepted (no ext types)")


def scan(buf: bytes, lim: Limits) -> None:
    """Walk the frame's msgpack headers without building anything; Refusal if it breaks a limit."""
    n, i, items = len(buf), 0, 0
    if n > lim.max_message_bytes:
        raise Refusal("too_large", f"message of {n} bytes is over max_message_bytes ({lim.max_message_bytes})")
    stack: list = []  # objects still owed by each open container
    first = True
    while True:
        if i >= n:
            raise Refusal("bad_message", "truncated msgpack message")
        b = buf[i]
        items += 1
        if items > lim.max_items:
            raise Refusal("too_many_items", f"message of more than max_items ({lim.max_items}) msgpack objects")
        if first and not (0x80 <= b <= 0x8F or b in _MAP):
            raise Refusal("bad_message", "an observation must be a msgpack map (a dict)")
        first = False
        i, count = _header(buf, i, lim)  # count: children this object opens
        if i > n:
            raise Refusal("bad_message", "truncated msgpack message")
        if count:
            if items + count > lim.max_items:  # a header claiming more objects than the budget
                raise Refusal("too_many_items", f"message of more than max_items ({lim.max_items}) msgpack objects")
            stack.append(count)
            if len(stack) > lim.max_nesting_depth:
                raise Refusal("too_deep", f"message nested deeper than max_nesting_depth ({lim.max_nesting_depth})")
            continue
        while stack:  # this object completes its container (and maybe those above)
            stack[-1] -= 1
            if stack[-1]:
                break
            stack.pop()
        if not stack:
            break
    if i != n:
        raise Refusal("bad_message", f"{n - i} bytes after the message's end")


def _array(obj: dict, budget: list) -> np.ndarray:
    data, dt, shape = obj.get(b"data"), obj.get(b"dtype"), obj.get(b"shape")
    if not isinstance(dt, str) or dt not in ALLOWED_DTYPES:
        raise Refusal("bad_dtype", f"array dtype {shown(str(dt))} is not accepted; plain numeric dtypes only "
                      f"(bool, int, uint, float; no object dtypes)")
    if (not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise Refusal("bad_array", f"array shape must be at most {MAX_DIMS} integers >= 0")
    elements = math.prod(shape)
    budget[0] -= elements
    if budget[0] < 0:
        raise Refusal("too_many_elements", f"arrays of more than max_array_elements ({budget[1]}) elements together")
    dtype = np.dtype(dt)
    if not isinstance(data, bytes) or len(data) != elements * dtype.itemsize:
        raise Refusal("bad_array", f"array data is not shape x itemsize ({elements} x {dtype.itemsize}) bytes")
    return np.frombuffer(data, dtype).reshape(shape)


def _generic(obj: dict):
    dt, data = obj.get(b"dtype"), obj.get(b"data")
    if not isinstance(dt, str) or dt not in ALLOWED_DTYPES or isinstance(data, (bytes, str, dict, list)):
        raise Refusal("bad_dtype", f"numpy scalar of dtype {shown(str(dt))} is not accepted")
    try:
        return np.dtype(dt).type(data)
    except (TypeError, ValueError, OverflowError):
        raise Refusal("bad_array", "numpy scalar value does not fit its dtype") from None


def unpack(buf: bytes, lim: Limits) -> dict:
    """One openpi frame -> its dict (arrays as read-only numpy views), or Refusal."""
    scan(buf, lim)
    budget = [lim.max_array_elements, lim.max_array_elements]

    def hook(obj: dict):
        if b"__ndarray__" in obj:
            return _array(obj, budget)
        if b"__npgeneric__" in obj:
            return _generic(obj)
        return obj

    try:
        return msgpack.unpackb(buf, object_hook=hook, raw=False, strict_map_key=False)
    except Refusal:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # invalid UTF-8, unhashable keys, ...
        raise Refusal("bad_message", f"not a valid msgpack message ({type(e).__name__})") from None


def _pack_default(obj):
    """openpi_client.msgpack_numpy.pack_array, for what the server sends."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "VOcSUMm":
            raise TypeError(f"cannot send dtype {obj.dtype}")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__}")


def pack(obj) -> bytes:
    return msgpack.packb(obj, default=_pack_default)
