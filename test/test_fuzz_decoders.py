"""Fuzzing the decoders of outside input (hypothesis): the LeRobot endpoint's pickle reader
(random opcode streams from the opcodes and globals it knows, and mutated real payloads)
and the GPU server's tensor decoder (random shapes, dtypes and byte lengths). Whatever
comes in: no crash, no other exception than the decoder's own refusal, no example slower
than a bound, nothing allocated past the limits, every array it returns a fresh C-ordered
one of exactly its bytes.

Bounded in the suite (ROBOTSERVE_FUZZ_EXAMPLES examples per fuzzer, 200 by default);
raise it for a longer run: ROBOTSERVE_FUZZ_EXAMPLES=20000 pytest test/test_fuzz_decoders.py
(docs/security.md)."""
from __future__ import annotations

import os
import pickle
import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robotserve_ros.core.errors import RequestError
from robotserve_ros.transport import safe_pickle
from robotserve_ros.transport.tensors import ALLOWED_DTYPES, Limits as TensorLimits, decode, request_from_pb

EXAMPLES = int(os.environ.get("ROBOTSERVE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
SLOW_S = 2.0  # one example's bound (the op limit keeps the worst far below it)
LIM = safe_pickle.Limits(max_bytes=1 << 16, max_array_elements=1 << 14, max_depth=16, max_string_bytes=256,
                         max_ops=5000, max_expanded_items=1 << 14, max_container_items=256)

P = pickle
NO_ARG = [P.MARK, P.POP, P.POP_MARK, P.DUP, P.NONE, P.NEWTRUE, P.NEWFALSE, P.EMPTY_TUPLE, P.TUPLE, P.TUPLE1,
          P.TUPLE2, P.TUPLE3, P.EMPTY_LIST, P.LIST, P.APPEND, P.APPENDS, P.EMPTY_DICT, P.DICT, P.SETITEM,
          P.SETITEMS, P.EMPTY_SET, P.ADDITEMS, P.FROZENSET, P.REDUCE, P.BUILD, P.NEWOBJ, P.NEWOBJ_EX,
          P.STACK_GLOBAL, P.MEMOIZE, P.STOP]
WORDS = sorted({w for key in safe_pickle.ALLOWED for w in key} | set(safe_pickle.PLAIN_DTYPES) | {
    "S0", "V8", "O", "b", "B", "C", "F", "<", ">", "|", "latin1", "rot13", "os", "system", "x", "names", "VISUAL",
    "timestamp", "timestep", "observation", "must_go", "__init__", "__dict__", "copy_reg", "__builtin__"})


@pytest.fixture(scope="module", autouse=True)
def _lerobot_imported():
    """The allowed LeRobot classes are imported on first use: not inside a timed example."""
    try:
        from robotserve_ros.engines.torch_env import import_lerobot_policies

        import_lerobot_policies()
        import lerobot.async_inference.helpers  # noqa: F401
        import lerobot.configs.types  # noqa: F401
    except ImportError:
        pass


def _short(prefix: bytes, payload: bytes) -> bytes:
    return prefix + bytes([len(payload)]) + payload


token = st.one_of(
    st.sampled_from(NO_ARG),
    st.builds(lambda v: P.BININT1 + bytes([v]), st.integers(0, 255)),
    st.builds(lambda v: P.BININT2 + struct.pack("<H", v), st.integers(0, 65535)),
    st.builds(lambda v: P.BININT + struct.pack("<i", v), st.integers(-2**31, 2**31 - 1)),
    st.builds(lambda v: P.BINFLOAT + struct.pack(">d", v), st.floats(allow_nan=True)),
    st.builds(lambda b: _short(P.LONG1, b), st.binary(max_size=12)),
    st.builds(lambda w: _short(P.SHORT_BINUNICODE, w.encode()), st.sampled_from(WORDS)),
    st.builds(lambda t: _short(P.SHORT_BINUNICODE, t.encode()[:255]), st.text(max_size=20)),
    st.builds(lambda b: _short(P.SHORT_BINBYTES, b), st.binary(max_size=64)),
    st.builds(lambda n, b: P.BINBYTES + struct.pack("<I", n) + b, st.integers(0, 2**32 - 1), st.binary(max_size=16)),
    st.builds(lambda m, n: P.GLOBAL + f"{m}\n{n}\n".encode(), st.sampled_from(WORDS), st.sampled_from(WORDS)),
    st.builds(lambda k: f"{k[0]}\n{k[1]}\n".encode(), st.sampled_from(sorted(safe_pickle.ALLOWED))).map(
        lambda g: P.GLOBAL + g),
    st.builds(lambda i: P.BINPUT + bytes([i]), st.integers(0, 7)),
    st.builds(lambda i: P.BINGET + bytes([i]), st.integers(0, 7)),
    st.binary(min_size=1, max_size=1),  # any opcode at all, known or not
)


def check_loads(data: bytes, lim: safe_pickle.Limits = LIM):
    tracemalloc.start()
    t = time.perf_counter()
    try:
        out = safe_pickle.loads(data, limits=lim)
    except (safe_pickle.UnsafePickle, safe_pickle.PayloadTooLarge) as e:
        assert e.message.startswith(("payload", "more than", "a string", "containers", "numpy array", "a dict or set"))
        out = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - t < SLOW_S
    # what a payload may build is bounded by the limits, not by what its bytes claim
    assert peak < 4 * lim.max_bytes + 8 * lim.max_array_elements + (1 << 20), peak
    if out is not None:  # what whoever walks the result sees is within the limits too
        items, nbytes = _expanded(out)
        assert items <= lim.max_expanded_items and nbytes <= lim.max_bytes, (items, nbytes)
    stack = [out]
    while stack:  # every array a fresh C-ordered one holding its own bytes
        o = stack.pop()
        if isinstance(o, np.ndarray):
            assert o.flags.c_contiguous and o.flags.owndata and o.dtype.fields is None and o.size <= lim.max_array_elements
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
    return out


@FUZZ
@given(st.integers(0, 5), st.lists(token, max_size=60))
def test_fuzz_pickle_opcode_streams(proto, tokens):
    check_loads(bytes([P.PROTO[0], proto]) + b"".join(tokens) + P.STOP)


def _expanded(out) -> tuple:
    """(items, bytes) of `out` as a tree: a shared reference counted each time it is reached."""
    memo: dict = {}

    def size(o):
        if id(o) in memo:
            return memo[id(o)]
        if isinstance(o, dict):
            kids = [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            kids = list(o)
        else:
            kids = [getattr(o, f) for f in getattr(o, "__dataclass_fields__", ())]
            if not kids:
                nb = len(o) if isinstance(o, (str, bytes, bytearray)) else int(getattr(o, "nbytes", 0))
                memo[id(o)] = (0, nb)
                return memo[id(o)]
        sub = [size(k) for k in kids]  # depth is bounded by max_depth
        memo[id(o)] = (len(kids) + sum(a for a, _ in sub), sum(b for _, b in sub))
        return memo[id(o)]

    return size(out)


def shared_refs(width: int, levels: int, leaf: bytes) -> bytes:
    """Lists of `width` references to the list below, `levels` deep, through the memo: a few
    bytes of pickle for width**levels leaves."""
    out = b"\x80\x04" + leaf + P.BINPUT + b"\x00"
    for lvl in range(1, levels + 1):
        out += P.EMPTY_LIST + P.MARK + (P.BINGET + bytes([lvl - 1])) * width + P.APPENDS + P.BINPUT + bytes([lvl])
    return out + P.STOP


@FUZZ
@given(width=st.integers(1, 40), levels=st.integers(1, 12),
       leaf=st.sampled_from([P.NONE, P.BININT1 + b"\x07", _short(P.SHORT_BINBYTES, b"x" * 200),
                             _short(P.SHORT_BINUNICODE, b"y" * 100)]))
def test_fuzz_shared_references(width, levels, leaf):
    """Shared references: refused past the expansion budget, never expanded by the reader."""
    out = check_loads(shared_refs(width, levels, leaf))
    if out is None:
        assert width ** levels > LIM.max_expanded_items // 2 or width ** levels * 200 > LIM.max_bytes // 2 or levels > 15


HASH_MOD = (1 << 61) - 1  # CPython's int hash is n mod this: these all hash alike
colliding = st.one_of(
    st.lists(st.integers(0, 10**6).map(lambda i: i * HASH_MOD), min_size=1, max_size=300),
    st.lists(st.integers(-50, 50).map(lambda i: float(i)), min_size=1, max_size=50),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=50),
)


@FUZZ
@given(keys=colliding, kind=st.sampled_from(["set", "frozenset", "dict", "dict_global", "set_global"]),
       proto=st.integers(2, 5))
def test_fuzz_colliding_keys(keys, kind, proto):
    """Keys anyone can make collide (integers, floats, tuples) never go into a dict or set."""
    if kind == "set" and proto >= 4:
        obj = set(keys)
    elif kind == "frozenset" and proto >= 4:
        obj = frozenset(keys)
    elif kind.startswith("dict"):
        obj = {k: 0 for k in keys}
    else:
        obj = [set(keys)]
    data = pickle.dumps(obj, protocol=proto)
    with pytest.raises(safe_pickle.UnsafePickle, match="only str and bytes"):
        safe_pickle.loads(data, limits=LIM)


def _observation(proto: int) -> bytes:
    from robotserve_ros.engines.torch_env import import_lerobot_policies

    import_lerobot_policies()
    from lerobot.async_inference.helpers import TimedObservation

    raw = {"j0.pos": 0.5, "j1.pos": np.float32(1.0), "cam0": np.arange(48, dtype=np.uint8).reshape(4, 4, 3),
           "f": np.asfortranarray(np.ones((2, 3))), "task": "pick", "s": {"a", b"b"}, "t": (1, b"x")}
    return pickle.dumps(TimedObservation(1.5, 3, raw, True), protocol=proto)


@pytest.fixture(scope="module")
def payloads():
    pytest.importorskip("lerobot")
    return [_observation(p) for p in range(6)]


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_observations(payloads, data):
    base = bytearray(data.draw(st.sampled_from(payloads)))
    for pos, byte in data.draw(st.lists(st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255)), max_size=8)):
        base[pos] = byte
    cut = data.draw(st.integers(1, len(base)))
    check_loads(bytes(base[:cut]))


def test_unmutated_observations_decode(payloads):
    for p in payloads:
        obs = check_loads(p)
        assert obs.timestep == 3 and obs.observation["cam0"].shape == (4, 4, 3)


# --- the gRPC tensor decoder ------------------------------------------------------------------
pb = None


def _pb():
    global pb
    if pb is None:
        from robotserve_ros.transport import stubs

        pb = stubs()[0]
    return pb


TLIM = TensorLimits(max_elements=1 << 14, max_id_bytes=64, max_text_bytes=128, max_images=4)
dims = st.one_of(st.integers(0, 8), st.integers(-3, 2**40), st.sampled_from([0, 1, 2**31, 2**62, 2**63 - 1]))


@FUZZ
@given(dtype=st.one_of(st.sampled_from(ALLOWED_DTYPES), st.text(max_size=12)),
       shape=st.lists(dims, max_size=10), nbytes=st.one_of(st.integers(0, 256), st.none()))
def test_fuzz_tensor_decoder(dtype, shape, nbytes):
    pbm = _pb()
    if nbytes is None and dtype in ALLOWED_DTYPES and all(0 <= d <= 64 for d in shape) and len(shape) <= 8:
        nbytes = int(np.prod(shape, dtype=object) or 0) * np.dtype(dtype).itemsize  # the right length
        nbytes = min(nbytes, 1 << 16)
    t = pbm.Tensor(data=bytes(nbytes or 0), shape=shape, dtype=dtype) if all(-2**63 <= d < 2**63 for d in shape) else None
    if t is None:
        return
    tracemalloc.start()
    try:
        a = decode(t, "x", TLIM)
    except RequestError as e:
        assert e.message.startswith("x.") and len(e.message) < 300
        a = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < (1 << 20)
    if a is not None:
        assert a.shape == tuple(shape) and a.nbytes == len(t.data) and a.size <= TLIM.max_elements


@FUZZ
@given(task=st.text(max_size=100), text=st.text(max_size=200), n_images=st.integers(0, 6),
       shape=st.lists(st.integers(0, 40), max_size=4), dtype=st.sampled_from(ALLOWED_DTYPES),
       joints=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=8), rnd=st.integers(-5, 5))
def test_fuzz_request_decoder(task, text, n_images, shape, dtype, joints, rnd):
    pbm = _pb()
    m = pbm.Request(task_id=task, round_id=rnd)
    m.has_observation = True
    o = m.observation
    o.instruction = text
    nb = int(np.prod(shape)) * np.dtype(dtype).itemsize
    for _ in range(n_images):
        o.images.add(data=bytes(nb), shape=shape, dtype=dtype)
    o.joints.CopyFrom(pbm.Tensor(data=np.asarray(joints, np.float32).tobytes(), shape=[len(joints)], dtype="float32"))
    try:
        req = request_from_pb(m, 2, TLIM)
    except RequestError as e:
        assert e.message.startswith("requests[2].") and len(e.message) < 400
        return
    assert 0 < len(req.task_id.encode("utf-8", "surrogatepass")) <= TLIM.max_id_bytes
    assert len(req.observation.images) <= TLIM.max_images and np.all(np.isfinite(req.observation.joints))
