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
"""
from __future__ import annotations

import codecs
import dataclasses
import enum
import importlib
import math
import pickle
import struct
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional

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

    def tuple_(self, items) -> tuple:
        return self.nest(tuple(items), items)

    # --- constructors of the allowed globals ------------------------------------------------
    def call(self, g, args) -> Any:
        if type(g) is not _Global:
            _refuse(f"REDUCE on a {type(g).__name__}, not an allowed global")
        if type(args) is not tuple:
            _refuse(f"{g.name}: arguments are not a tuple")
        k = g.kind
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
        if k == "scalar":
            if len(args) != 2 or not isinstance(args[0], np.dtype) or type(args[1]) is not bytes:
                _refuse("numpy scalar: expected (plain dtype, bytes)")
            if len(args[1]) != args[0].itemsize:
                _refuse(f"numpy scalar: {len(args[1])} bytes for a {args[0].itemsize}-byte {args[0].name}")
            return np.frombuffer(args[1], args[0])[0]
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
            try:
                if k == "dict":
                    return dict(items)
                return set(items) if k == "set" else self.nest(frozenset(items), items)
            except (TypeError, ValueError):
                _refuse(f"{g.name}: items are not hashable plain data")
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


_STOP = object()
_OPS: dict[bytes, Callable] = {}


def _op(*codes: bytes):
    def reg(fn):
        for c in codes:
            _OPS[c] = fn
        return fn
    return reg


P = pickle


@_op(P.PROTO)
def _proto(m):
    if m.read(1)[0] > 5:
        _refuse("unsupported pickle protocol")


@_op(P.FRAME)
def _frame(m):
    m.read(8)


@_op(P.STOP)
def _stop(m):
    return _STOP


@_op(P.MARK)
def _mark(m):
    m.marks.append(m.stack)
    m.stack = []


@_op(P.POP)
def _pop(m):
    if m.stack:
        m.stack.pop()
    else:
        m.pop_mark()


@_op(P.POP_MARK)
def _pop_mark(m):
    m.pop_mark()


@_op(P.DUP)
def _dup(m):
    if not m.stack:
        _refuse("stack underflow")
    m.push(m.stack[-1])


@_op(P.NONE)
def _none(m):
    m.push(None)


@_op(P.NEWTRUE, P.NEWFALSE)
def _bool(m):
    m.push(m.op == P.NEWTRUE)


@_op(P.INT)
def _int(m):
    s = m.readline()
    m.push({b"00": False, b"01": True}.get(s) if s in (b"00", b"01") else int(s))


@_op(P.LONG)
def _long(m):
    m.push(int(m.readline().rstrip(b"L")))


@_op(P.BININT, P.BININT1, P.BININT2)
def _binint(m):
    op = m.op
    m.push(m.sized({P.BININT: "<i", P.BININT1: "<B", P.BININT2: "<H"}[op]))


@_op(P.LONG1, P.LONG4)
def _long_n(m):
    n = m.sized("<B") if m.op == P.LONG1 else m.sized("<i")
    if not 0 <= n <= _MAX_INT_BYTES:
        _refuse(f"an integer of {n} bytes (at most {_MAX_INT_BYTES})")
    m.push(int.from_bytes(m.read(n), "little", signed=True))


@_op(P.FLOAT)
def _float(m):
    m.push(float(m.readline()))


@_op(P.BINFLOAT)
def _binfloat(m):
    m.push(m.sized(">d"))


@_op(P.STRING, P.BINSTRING, P.SHORT_BINSTRING)
def _py2_string(m):  # Python 2 str: decoded as ASCII, as pickle.loads does by default
    op = m.op
    if op == P.STRING:
        raw = m.readline()
        if len(raw) < 2 or raw[0] != raw[-1] or raw[:1] not in (b'"', b"'"):
            _refuse("malformed STRING")
        raw = codecs.escape_decode(raw[1:-1])[0]
    else:
        n = m.sized("<i" if op == P.BINSTRING else "<B")
        m.text(max(n, 0))
        raw = m.read(n)
    m.push(raw.decode("ascii"))


@_op(P.UNICODE)
def _unicode(m):
    raw = m.readline()
    m.text(len(raw))
    m.push(raw.decode("raw-unicode-escape"))


@_op(P.BINUNICODE, P.SHORT_BINUNICODE, P.BINUNICODE8)
def _binunicode(m):
    op = m.op
    n = m.sized({P.BINUNICODE: "<I", P.SHORT_BINUNICODE: "<B", P.BINUNICODE8: "<Q"}[op])
    m.text(n)
    m.push(m.read(n).decode("utf-8", "surrogatepass"))


@_op(P.BINBYTES, P.SHORT_BINBYTES, P.BINBYTES8, P.BYTEARRAY8)
def _bytes(m):
    op = m.op
    n = m.sized({P.BINBYTES: "<I", P.SHORT_BINBYTES: "<B", P.BINBYTES8: "<Q", P.BYTEARRAY8: "<Q"}[op])
    b = m.read(n)
    m.spend(n)
    m.push(bytearray(b) if op == P.BYTEARRAY8 else b)


@_op(P.EMPTY_TUPLE)
def _empty_tuple(m):
    m.push(())


@_op(P.TUPLE)
def _tuple(m):
    m.push(m.tuple_(m.pop_mark()))


@_op(P.TUPLE1, P.TUPLE2, P.TUPLE3)
def _tuple_n(m):
    n = {P.TUPLE1: 1, P.TUPLE2: 2, P.TUPLE3: 3}[m.op]
    items = [m.pop() for _ in range(n)][::-1]
    m.push(m.tuple_(items))


@_op(P.EMPTY_LIST)
def _empty_list(m):
    m.push([])


@_op(P.LIST)
def _list(m):
    m.push(m.pop_mark())


@_op(P.EMPTY_DICT)
def _empty_dict(m):
    m.push({})


@_op(P.EMPTY_SET)
def _empty_set(m):
    m.push(set())


def _target(m, kind: type):
    if not m.stack or type(m.stack[-1]) is not kind:
        _refuse(f"items added to something that is not a {kind.__name__}")
    return m.stack[-1]


def _setitems(d: dict, items: list) -> None:
    if len(items) % 2:
        _refuse("odd number of items for a dict")
    for i in range(0, len(items), 2):
        d[items[i]] = items[i + 1]


@_op(P.DICT)
def _dict(m):
    d: dict = {}
    _setitems(d, m.pop_mark())
    m.push(d)


_ADD = {P.APPEND: (list, list.append), P.SETITEM: (dict, lambda d, kv: _setitems(d, list(kv)))}
_ADD_MARKED = {P.APPENDS: (list, list.extend), P.SETITEMS: (dict, _setitems), P.ADDITEMS: (set, set.update)}


@_op(*_ADD)
def _add(m):
    kind, add = _ADD[m.op]
    v = m.pop()
    if kind is dict:
        v = (m.pop(), v)  # SETITEM: key below value
    add(_target(m, kind), v)


@_op(*_ADD_MARKED)
def _add_marked(m):
    kind, add = _ADD_MARKED[m.op]
    items = m.pop_mark()
    add(_target(m, kind), items)


@_op(P.FROZENSET)
def _frozenset(m):
    items = m.pop_mark()
    m.push(m.nest(frozenset(items), items))


@_op(P.GLOBAL)
def _global_op(m):
    module = m.readline().decode("utf-8")
    m.push(_global(module, m.readline().decode("utf-8")))


@_op(P.STACK_GLOBAL)
def _stack_global(m):
    name, module = m.pop(), m.pop()
    m.push(_global(module, name))


@_op(P.REDUCE)
def _reduce(m):
    args = m.pop()
    m.push(m.call(m.pop(), args))


@_op(P.NEWOBJ, P.NEWOBJ_EX)
def _newobj(m):
    kwargs = m.pop() if m.op == P.NEWOBJ_EX else {}
    args, cls = m.pop(), m.pop()
    if type(cls) is not _Global or cls.kind != "dataclass" or args != () or kwargs != {}:
        _refuse("NEWOBJ: only the allowed LeRobot dataclasses, without arguments")
    m.push(_Pending("dataclass", cls.target))


@_op(P.BUILD)
def _build(m):
    state = m.pop()
    if not m.stack or type(m.stack[-1]) is not _Pending or m.stack[-1].built is not None:
        what = type(m.stack[-1]).__name__ if m.stack else "nothing"
        _refuse(f"BUILD on a {what}: only a new LeRobot dataclass, numpy array or dtype is built")
    p = m.stack[-1]
    p.built = m.build(p, state)
    m.stack[-1] = p.built


@_op(P.PUT, P.BINPUT, P.LONG_BINPUT, P.MEMOIZE)
def _put(m):
    op = m.op
    if op == P.MEMOIZE:
        key = len(m.memo)
    elif op == P.PUT:
        key = int(m.readline())
    else:
        key = m.sized("<B" if op == P.BINPUT else "<I")
    if not m.stack:
        _refuse("memo of an empty stack")
    m.memo[key] = m.stack[-1]


@_op(P.GET, P.BINGET, P.LONG_BINGET)
def _get(m):
    op = m.op
    key = int(m.readline()) if op == P.GET else m.sized("<B" if op == P.BINGET else "<I")
    if key not in m.memo:
        _refuse("memo key not found")
    m.push(m.memo[key])


def _check_shape(obj: Any, max_depth: int) -> None:
    """No cycles, nothing nested past max_depth (mutable containers could be linked into a
    deep chain after they were made): checked without recursion."""
    done: dict = {}
    stack = [(obj, 1, False)]
    path: set = set()
    while stack:
        o, d, leaving = stack.pop()
        if leaving:
            path.discard(id(o))
            done[id(o)] = o
            continue
        if d > max_depth:
            raise PickleLimit(f"containers nested deeper than max_depth ({max_depth})")
        if type(o) in (list, tuple, set, frozenset):
            kids = o
        elif type(o) is dict:
            kids = [*o.keys(), *o.values()]
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            kids = [getattr(o, f.name) for f in dataclasses.fields(o)]
        else:
            continue
        if id(o) in path:
            _refuse("a container that contains itself")
        if id(o) in done:
            continue
        path.add(id(o))
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
        _check_shape(obj, lim.max_depth)
        return obj
    except (UnsafePickle, PayloadTooLarge):
        raise
    except Exception as e:  # truncated, garbage: its type only, never the client's bytes
        raise UnsafePickle(f"payload refused: not a valid LeRobot pickle ({type(e).__name__})") from None


def dumps(obj: Any) -> bytes:
    """Pickle what the server sends back (its own objects), as LeRobot's client unpickles it."""
    return pickle.dumps(obj)
