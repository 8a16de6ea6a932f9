"""safe_pickle's opcodes, one small handler each, by family: framing and the mark, numbers,
text and bytes, containers, globals and objects, the memo. A handler takes the interpreter
(pickle_machine._Machine) and never runs anything a pickle names."""
from __future__ import annotations

import codecs
import pickle
from typing import Callable

from .pickle_allowlist import _MAX_INT_BYTES, _global, _Global, _Pending, _refuse


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


def _setitems(m, d: dict, items: list) -> None:
    if len(items) % 2:
        _refuse("odd number of items for a dict")
    m.keys(len(d), items[0::2])  # before any is hashed
    for i in range(0, len(items), 2):
        d[items[i]] = items[i + 1]


def _additems(m, s: set, items: list) -> None:
    m.keys(len(s), items)
    s.update(items)


@_op(P.DICT)
def _dict(m):
    d: dict = {}
    _setitems(m, d, m.pop_mark())
    m.push(d)


_ADD = {P.APPEND: (list, lambda m, lst, v: lst.append(v)), P.SETITEM: (dict, lambda m, d, kv: _setitems(m, d, list(kv)))}
_ADD_MARKED = {P.APPENDS: (list, lambda m, lst, items: lst.extend(items)), P.SETITEMS: (dict, _setitems),
               P.ADDITEMS: (set, _additems)}


@_op(*_ADD)
def _add(m):
    kind, add = _ADD[m.op]
    v = m.pop()
    if kind is dict:
        v = (m.pop(), v)  # SETITEM: key below value
    add(m, _target(m, kind), v)


@_op(*_ADD_MARKED)
def _add_marked(m):
    kind, add = _ADD_MARKED[m.op]
    items = m.pop_mark()
    add(m, _target(m, kind), items)


@_op(P.FROZENSET)
def _frozenset(m):
    items = m.pop_mark()
    m.keys(0, items)
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

