"""Issue 29, the network endpoints: each class of the second probe as a regression test
(shared-reference amplification, hash-colliding containers, stalled calls, session hijack,
control characters in the log, unbounded state, token files, fairness between token
holders), each with a good client served by the same server during the attack and after."""
from __future__ import annotations

import logging
import pickle
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("lerobot")

from test_lerobot_compat import Client, _refused, policy_setup, timed_obs  # noqa: E402
from test_security import in_observation, send, served  # noqa: E402

from lerobot.transport import services_pb2 as pb  # noqa: E402

from robotserve_ros.transport import safe_pickle  # noqa: E402
from robotserve_ros.transport.lerobot.config import CompatConfig  # noqa: E402
from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer  # noqa: E402

P = pickle
INVALID, EXHAUSTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
HASH_MOD = (1 << 61) - 1  # CPython hashes an int n as n mod this: i * HASH_MOD all collide


def lerobot_cfg(**kw) -> CompatConfig:
    base = dict(port=0, engine="simulated", engine_params={"chunk_size": 8}, profile_ms={1: 5.0},
                get_actions_timeout_s=2.0, max_payload_bytes=4 << 20, policy_dirs=("/policies",), threads=16,
                upload_timeout_s=1.0)
    return CompatConfig(**{**base, **kw})


@pytest.fixture
def server():
    srv = LeRobotCompatServer(lerobot_cfg())
    yield srv
    srv.stop(0)


class GoodRobot:
    """A good robot served over and over in a thread while an attack runs: `rounds` counts
    the chunks it got, `errors` what went wrong."""

    def __init__(self, port: int) -> None:
        self.port, self.rounds, self.errors = port, 0, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                served(self.port)
                self.rounds += 1
            except (grpc.RpcError, AssertionError) as e:
                self.errors.append(repr(e)[:200])
                time.sleep(0.1)

    def __enter__(self) -> "GoodRobot":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(30)


# --- the pickle reader bounds what it builds -------------------------------------------------
def shared_refs(width: int, levels: int) -> bytes:
    """Lists of `width` references to the list below, `levels` deep, through the memo (keys
    from 9000, clear of the pickler's own): a few hundred bytes of pickle for width**levels
    floats to whoever walks or converts it."""
    def key(i: int) -> bytes:
        return (9000 + i).to_bytes(4, "little")

    out = P.BINFLOAT + b"\x3f\xf0" + b"\0" * 6 + P.LONG_BINPUT + key(0)
    for lvl in range(1, levels + 1):
        out += (P.POP + P.EMPTY_LIST + P.MARK + (P.LONG_BINGET + key(lvl - 1)) * width + P.APPENDS
                + P.LONG_BINPUT + key(lvl))
    return out


def with_joint(value_ops: bytes) -> bytes:
    """A good observation whose first joint's value is the pickle fragment `value_ops`
    (protocol 2: its memo keys are explicit, so the fragment's own keys shift none)."""
    obs = timed_obs(0)
    obs.observation["j0.pos"] = "@@X@@"
    obs = pickle.dumps(obs, protocol=2)
    out = obs.replace(b"X\x05\x00\x00\x00@@X@@", value_ops, 1)
    assert out != obs
    return out


def test_shared_reference_amplification_refused(server):
    """A few hundred bytes whose lists share references through the memo: 8**7 = 2 Mi floats
    to whoever converts the joint (the probe's stall of every client, +3 GB). Refused by the
    expansion budget (max_expanded_items) with each shared reference counted where it is used."""
    bomb = with_joint(shared_refs(8, 7))
    assert len(bomb) - len(pickle.dumps(timed_obs(0), protocol=2)) < 600
    assert safe_pickle.loads(with_joint(shared_refs(2, 2))).observation["j0.pos"] == [[1.0] * 2] * 2
    t = time.perf_counter()
    with pytest.raises(safe_pickle.PickleLimit, match="max_expanded_items"):
        safe_pickle.loads(bomb)
    assert time.perf_counter() - t < 1.0
    # the same through bytes: a 255-byte string referenced 1024 times is 261 KB expanded
    text = P.SHORT_BINUNICODE + b"\xff" + b"y" * 255 + P.BINPUT + b"\x00"
    many = P.EMPTY_LIST + P.MARK + (P.BINGET + b"\x00") * 1024 + P.APPENDS
    with pytest.raises(safe_pickle.PickleLimit, match="max_bytes"):
        safe_pickle.loads(b"\x80\x04" + text + many + P.STOP, limits=safe_pickle.Limits(max_bytes=100_000))
    # a small sharing is data like any other: the list below shared 3 x 3 times
    with GoodRobot(server.port) as good:
        c = Client(server.port)
        c.start()
        for _ in range(3):
            assert "max_expanded_items" in _refused(lambda: send(c, bomb), EXHAUSTED)
        c.close()
        time.sleep(0.5)
    assert good.rounds >= 1, good.errors
    assert server.servicer.stats()["protocol_errors"]["payload_too_large"] == 3
    served(server.port)


def colliding_set(n: int) -> bytes:
    """A set of n integers that all hash alike: inserting them is quadratic."""
    items = b"".join(P.LONG1 + bytes([12]) + (i * HASH_MOD).to_bytes(12, "little", signed=True) for i in range(n))
    return P.EMPTY_SET + P.MARK + items + P.ADDITEMS


def test_hash_colliding_containers_refused(server):
    """Integers chosen to share one hash (the probe: a 0.7 MB set stalled the server ~19 s)
    are never hashed into a dict or set: keys and members are str or bytes only, whose
    hashes are randomised per process, and one dict or set holds max_container_items."""
    flood = b"\x80\x04" + colliding_set(30_000) + P.STOP
    t = time.perf_counter()
    with pytest.raises(safe_pickle.UnsafePickle, match="only str and bytes"):
        safe_pickle.loads(flood, limits=safe_pickle.Limits(max_ops=100_000))
    assert time.perf_counter() - t < 1.0
    colliding_dict = {i * HASH_MOD: 0 for i in range(50)}
    with pytest.raises(safe_pickle.UnsafePickle, match="only str and bytes"):
        safe_pickle.loads(pickle.dumps(colliding_dict))
    with pytest.raises(safe_pickle.PickleLimit, match="max_container_items"):
        safe_pickle.loads(pickle.dumps({f"k{i}": i for i in range(5000)}))
    assert safe_pickle.loads(pickle.dumps({"a", b"b"})) == {"a", b"b"}
    with GoodRobot(server.port) as good:
        c = Client(server.port)
        c.start()
        for _ in range(3):
            assert "only str and bytes" in _refused(lambda: send(c, with_joint(colliding_set(20_000))), INVALID)
        c.close()
        time.sleep(0.5)
    assert good.rounds >= 1, good.errors
    served(server.port)
