"""Fuzzing the openpi endpoint's msgpack reader (hypothesis), as test_fuzz_decoders.py fuzzes
the pickle reader: random bytes, random msgpack documents, mutated real observations and
random ndarray headers. Whatever comes in: a dict or the reader's own Refusal, nothing else;
no example slower than a bound; every array within the element budget, of exactly its bytes.

ROBOTSERVE_FUZZ_EXAMPLES examples per fuzzer (200 by default)."""
from __future__ import annotations

import os
import time

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robotserve_ros.transport.openpi.codec import ALLOWED_DTYPES, Limits, Refusal, unpack

EXAMPLES = int(os.environ.get("ROBOTSERVE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
LIM = Limits(max_message_bytes=1 << 16, max_array_elements=1 << 12, max_nesting_depth=8, max_items=2000,
             max_string_bytes=256)
SLOW_S = 1.0


def _arrays(x):
    if isinstance(x, np.ndarray):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _arrays(v)
    elif isinstance(x, list):
        for v in x:
            yield from _arrays(v)


def check(buf: bytes) -> None:
    t = time.perf_counter()
    try:
        out = unpack(buf, LIM)
    except Refusal as r:
        assert r.message and "\n" not in r.message
        return
    finally:
        assert time.perf_counter() - t < SLOW_S
    assert isinstance(out, dict)
    arrays = list(_arrays(out))
    assert sum(a.size for a in arrays) <= LIM.max_array_elements
    for a in arrays:
        assert a.dtype.str in ALLOWED_DTYPES and a.dtype.kind in "biuf"


leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 64 - 1), st.floats(), st.text(max_size=300),
                 st.binary(max_size=300))
doc = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=6),
                                                st.dictionaries(st.one_of(st.text(max_size=20), st.binary(max_size=12)),
                                                                kids, max_size=6)), max_leaves=20)
header = st.fixed_dictionaries({b"__ndarray__": st.just(True),
                                b"data": st.binary(max_size=200),
                                b"dtype": st.one_of(st.sampled_from(sorted(ALLOWED_DTYPES)),
                                                    st.sampled_from(["|O", "<U4", "|S3", "|V8", "<M8[s]", "<c8"]),
                                                    st.text(max_size=6), st.integers(-(2 ** 63), 2 ** 63 - 1)),
                                b"shape": st.one_of(st.lists(st.integers(-3, 70), max_size=10), st.integers(-5, 5),
                                                    st.text(max_size=3))})


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes(buf):
    check(buf)


@FUZZ
@given(st.dictionaries(st.text(max_size=20), doc, max_size=8))
def test_random_documents(d):
    check(msgpack.packb(d))


@FUZZ
@given(st.dictionaries(st.text(max_size=10), header, min_size=1, max_size=4))
def test_random_array_headers(d):
    check(msgpack.packb(d))


@FUZZ
@given(st.data())
def test_mutated_observations(data):
    from openpi_client import msgpack_numpy

    real = bytearray(msgpack_numpy.packb({"observation/image": np.zeros((8, 8, 3), np.uint8),
                                           "observation/state": np.arange(6, dtype=np.float32), "prompt": "go"}))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(real) - 1))
        real[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(real)))
    check(bytes(real[:cut]) if data.draw(st.booleans()) else bytes(real))
