"""safe_pickle's opcode interpreter: the stack, the accounting against Limits, and the
checked constructors of the allowed globals (see safe_pickle's docstring for why)."""
from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import numpy as np

from .pickle_allowlist import (MAX_DIMS, PLAIN_DTYPES, Limits, PickleLimit, _field_ok, _Global, _is_int, _key_ok,
                               _Pending, _refuse)
from .pickle_opcodes import _OPS, _STOP
from .tensors import shown


class _Machine:
    """The opcode interpreter (pickle protocols 0-5, without extensions, persistent ids or
    out-of-band buffers). Values on the stack are plain data, _Global or _Pending."""

    def __init__(self, data: bytes, lim: Limits) -> None:
        self.data, self.pos, self.lim = memoryview(data), 0, lim
        self.stack: list = []
        self.op = b""  # the opcode being run
        self.marks: list = []
        self.memo: dict = {}
        self.spent = 0  # bytes of bytes/str/array data built
        self.elements = 0
        self.depth: dict = {}  # id -> (tuple/frozenset, nesting depth): immutable containers only

    # --- reading and accounting -----------------------------------------------------------
    def read(self, n: int) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            _refuse("truncated (a length runs past the end of the payload)")
        b = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return b

    def readline(self) -> bytes:
        end = bytes(self.data[self.pos:self.pos + self.lim.max_string_bytes + 2]).find(b"\n")
        if end < 0:
            _refuse(f"a text line longer than max_string_bytes ({self.lim.max_string_bytes}) or not ended")
        line = bytes(self.data[self.pos:self.pos + end])
        self.pos += end + 1
        return line

    def spend(self, nbytes: int, elements: int = 0) -> None:
        self.spent += nbytes
        self.elements += elements
        if self.spent > self.lim.max_bytes:
            raise PickleLimit(f"payload expands past max_bytes ({self.lim.max_bytes} bytes of data)")
        if self.elements > self.lim.max_array_elements:
            raise PickleLimit(f"payload's arrays hold more than max_array_elements ({self.lim.max_array_elements})")

    def text(self, n: int) -> int:
        if n > self.lim.max_string_bytes:
            raise PickleLimit(f"a string of {n} bytes; max_string_bytes is {self.lim.max_string_bytes}")
        self.spend(n)
        return n

    def sized(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.read(size))[0]

    # --- the stack ------------------------------------------------------------------------
    def val(self, v):
        """A value taken off the stack for use: a built object, never a half-made one."""
        if type(v) is _Pending:
            if v.built is not None:
                return v.built
            if v.kind == "dtype":  # a dtype BUILD never set: numpy's default state
                v.built = np.dtype(v.arg)
                return v.built
            _refuse(f"an object used before it was built ({v.kind})")
        return v

    def pop(self):
        if not self.stack:
            _refuse("stack underflow")
        return self.val(self.stack.pop())

    def pop_mark(self) -> list:
        if not self.marks:
            _refuse("no MARK to pop to")
        items = [self.val(v) for v in self.stack]
        self.stack = self.marks.pop()
        return items

    def push(self, v) -> None:
        self.stack.append(v)

    def nest(self, c, items) -> Any:
        """A new tuple or frozenset: its depth is fixed now (hashing it recurses that deep)."""
        d = 1 + max((self.depth[id(x)][1] for x in items if id(x) in self.depth), default=0)
        if d > self.lim.max_depth:
            raise PickleLimit(f"containers nested deeper than max_depth ({self.lim.max_depth})")
        self.depth[id(c)] = (c, d)
        return c

    def keys(self, have: int, keys) -> None:
        """Before keys go into a dict or set (hashing them is the cost): at most
        max_container_items in one, each a str or bytes (pickle_allowlist._key_ok)."""
        keys = list(keys)
        for k in keys:
            if not _key_ok(k):
                _refuse(f"a dict key or set member of type {type(k).__name__} (only str and bytes are accepted)")
        if have + len(keys) > self.lim.max_container_items:
            raise PickleLimit(f"a dict or set of more than max_container_items ({self.lim.max_container_items})")

    def tuple_(self, items) -> tuple:
        return self.nest(tuple(items), items)

    # --- constructors of the allowed globals ------------------------------------------------
    def call(self, g, args) -> Any:
        if type(g) is not _Global:
            _refuse(f"REDUCE on a {type(g).__name__}, not an allowed global")
        if type(args) is not tuple:
            _refuse(f"{g.name}: arguments are not a tuple")
        if g.kind in ("dtype", "reconstruct", "frombuffer", "scalar"):
            return self.call_numpy(g.kind, args)
        return self.call_builtin(g, g.kind, args)

    def call_numpy(self, k: str, args: tuple) -> Any:
        """REDUCE of the numpy globals an ndarray or a numpy scalar pickles to."""
        if k == "dtype":
            if len(args) != 3 or args[0] not in PLAIN_DTYPES or args[1] is not False:
                _refuse(f"numpy.dtype: only plain numeric dtypes ({', '.join(sorted(PLAIN_DTYPES))}) are accepted")
            return _Pending("dtype", args[0])
        if k == "reconstruct":
            if (len(args) != 3 or type(args[0]) is not _Global or args[0].name != "numpy.ndarray"
                    or args[1] != (0,) or args[2] not in (b"b", "b")):
                _refuse("numpy _reconstruct: only the form numpy itself writes (ndarray, (0,), b'b')")
            return _Pending("array", None)
        if k == "frombuffer":
            if len(args) != 4:
                _refuse("numpy _frombuffer: expected (buffer, dtype, shape, order)")
            buf, dt, shape, order = args
            if order not in ("C", "F"):
                _refuse("numpy _frombuffer: order must be 'C' or 'F'")
            return self.array(shape, dt, order == "F", buf)
        # k == "scalar"
        if len(args) != 2 or not isinstance(args[0], np.dtype) or type(args[1]) is not bytes:
            _refuse("numpy scalar: expected (plain dtype, bytes)")
        if len(args[1]) != args[0].itemsize:
            _refuse(f"numpy scalar: {len(args[1])} bytes for a {args[0].itemsize}-byte {args[0].name}")
        return np.frombuffer(args[1], args[0])[0]

    def call_builtin(self, g, k: str, args: tuple) -> Any:
        """REDUCE of the allowed builtins, enums and LeRobot dataclasses."""
        if k == "enum":
            if len(args) != 1 or not isinstance(args[0], (str, int)) or isinstance(args[0], bool):
                _refuse(f"{g.name}: expected one member value")
            try:
                return g.target(args[0])
            except ValueError:
                _refuse(f"{g.name}: {shown(str(args[0]))} is not a member")
        if k == "reconstructor":  # copyreg._reconstructor(cls, object, None): protocols 0-1
            if (len(args) != 3 or type(args[0]) is not _Global or args[0].kind != "dataclass"
                    or type(args[1]) is not _Global or args[1].name != "builtins.object" or args[2] is not None):
                _refuse("copyreg._reconstructor: only for the allowed LeRobot dataclasses")
            return _Pending("dataclass", args[0].target)
        if k in ("set", "frozenset", "dict"):
            if len(args) > 1 or args and type(args[0]) not in (list, tuple):
                _refuse(f"{g.name}: expected nothing or a list")
            items = args[0] if args else ()
            if k == "dict":
                if not all(type(kv) in (list, tuple) and len(kv) == 2 for kv in items):
                    _refuse(f"{g.name}: items are not (key, value) pairs")
                self.keys(0, (kv[0] for kv in items))
                return dict(items)
            self.keys(0, items)
            return set(items) if k == "set" else self.nest(frozenset(items), items)
        if k == "complex":
            if len(args) > 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
                _refuse("complex: expected up to two numbers")
            return complex(*args)
        if k == "bytearray":  # never bytearray(n): a 31-byte pickle would allocate n bytes
            if args == ():
                return bytearray()
            if len(args) == 1 and type(args[0]) is bytes:
                self.spend(len(args[0]))
                return bytearray(args[0])
            if len(args) == 2 and type(args[0]) is str and args[1] in ("latin-1", "latin1"):
                return bytearray(self.latin1(args[0]))
            _refuse("bytearray: only from bytes or a latin-1 string")
        if k == "encode":  # protocols 0-2 write bytes as _codecs.encode(text, "latin1")
            if len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1"):
                return self.latin1(args[0])
            _refuse("_codecs.encode: only a string with encoding 'latin1'")
        _refuse(f"{g.name} cannot be called")

    def latin1(self, s: str) -> bytes:
        try:
            b = s.encode("latin1")
        except UnicodeEncodeError:
            _refuse("_codecs.encode: text is not latin-1")
        self.spend(len(b))
        return b

    def array(self, shape, dt, fortran, raw) -> np.ndarray:
        """A fresh C-ordered array from exactly shape x itemsize bytes: never a view, a stride
        or an offset, and its size checked against the limits before it is allocated."""
        if not isinstance(dt, np.dtype):
            _refuse("numpy array: its dtype is not a plain numeric dtype")
        if type(shape) is not tuple or len(shape) > MAX_DIMS or not all(_is_int(d) and d >= 0 for d in shape):
            _refuse(f"numpy array: shape must be a tuple of at most {MAX_DIMS} sizes >= 0")
        if type(fortran) is not bool or type(raw) not in (bytes, bytearray):
            _refuse("numpy array: expected raw bytes (object arrays are not accepted)")
        cap = self.lim.max_array_elements
        n = math.prod(int(d) for d in shape)
        if math.prod(max(int(d), 1) for d in shape) > cap:
            raise PickleLimit(f"numpy array of shape {list(map(int, shape))[:MAX_DIMS]}: more than max_array_elements ({cap})")
        if len(raw) != n * dt.itemsize:
            _refuse(f"numpy array: {len(raw)} bytes for {n} elements of {dt.itemsize} bytes")
        self.spend(n * dt.itemsize, n)
        a = np.frombuffer(raw, dt).reshape(tuple(int(d) for d in shape), order="F" if fortran else "C")
        return np.array(a, order="C")  # writable, owns its memory

    def build(self, p: _Pending, state) -> Any:
        if p.kind == "dtype":
            if (type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4)
                    or state[1] not in ("<", ">", "|", "=") or state[2:5] != (None, None, None)
                    or state[5:8] != (-1, -1, 0) or state[8:] not in ((), (None,))):
                _refuse("numpy.dtype state: only plain numeric dtypes (no fields, offsets or sub-arrays)")
            dt = np.dtype(p.arg)
            return dt.newbyteorder(state[1]) if state[1] in "<>" and dt.itemsize > 1 else dt
        if p.kind == "array":
            if type(state) is not tuple or len(state) not in (4, 5) or len(state) == 5 and state[0] != 1:
                _refuse("numpy array state: expected (1, shape, dtype, is_fortran, bytes)")
            shape, dt, fortran, raw = state[-4:]
            return self.array(shape, dt, fortran, raw)
        # a LeRobot dataclass: field by field through its own __init__, each field checked
        cls = p.arg
        if type(state) is tuple and len(state) == 2 and state[1] is None:
            state = state[0]
        if type(state) is not dict or not all(type(k) is str for k in state):
            _refuse(f"{cls.__name__}: its state must be a dict of field names")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for k in state:
            if k not in fields:
                _refuse(f"{cls.__name__}: no field {shown(k)}")
        for name, f in fields.items():
            if name in state:
                if not _field_ok(state[name], f.type):
                    _refuse(f"{cls.__name__}.{name}: a {type(state[name]).__name__} is not accepted")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                _refuse(f"{cls.__name__}.{name}: missing")
        return cls(**state)

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> Any:
        ops = 0
        while True:
            ops += 1
            if ops > self.lim.max_ops:
                raise PickleLimit(f"more than max_ops ({self.lim.max_ops}) pickle opcodes")
            op = self.op = self.read(1)
            fn = _OPS.get(op)
            if fn is None:
                _refuse(f"opcode {op!r} is not accepted")
            if fn(self) is _STOP:
                return self.pop()

