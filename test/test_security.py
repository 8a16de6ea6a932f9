"""The LeRobot endpoint against hostile clients: each probe of the security review (crash,
class poisoning, hang, amplification, thread exhaustion, errors escaping as UNKNOWN or
echoing the client's bytes) as a regression test, each followed by a good robot served by
the same server. The crash and the hang run against a server in a subprocess: on unfixed
code the first kills it and the second stalls it past every signal but SIGKILL."""
from __future__ import annotations

import io
import pickle
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("lerobot")

from test_lerobot_compat import Client, _refused, policy_setup, timed_obs  # noqa: E402

from lerobot.transport import services_pb2 as pb  # noqa: E402

from robotserve_ros.transport import safe_pickle  # noqa: E402
from robotserve_ros.transport.lerobot.config import CompatConfig  # noqa: E402
from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer  # noqa: E402

from numpy._core.multiarray import _reconstruct  # noqa: E402

INVALID, EXHAUSTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


class R:
    """Pickles as fn(*args), then BUILD with `state` if given: how the probes were made."""

    def __init__(self, fn, *args, state=None) -> None:
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def in_observation(value, key="j0.pos") -> bytes:
    obs = timed_obs(0)
    obs.observation[key] = value
    return pickle.dumps(obs, protocol=4)


def crash_payload() -> bytes:
    """An array whose dtype (allowed numpy.dtype + BUILD) puts its float64 field 2 GiB past
    its 8-byte buffer: reading it as a joint value segfaulted the server."""
    dt = R(np.dtype, "V8", False, True, state=(3, "|", None, ("x",), {"x": (np.dtype("f8"), (1 << 31) - 64)}, 8, 1, 16))
    return in_observation(R(_reconstruct, np.ndarray, (0,), b"b", state=(1, (1,), dt, False, b"\0" * 8)))


def hang_payload() -> bytes:
    """frozenset over 10^15 zero-size elements: a C loop holding the GIL, deaf to SIGINT."""
    arr = R(_reconstruct, np.ndarray, (0,), b"b", state=(1, (10**15,), np.dtype("S0"), False, b""))
    return in_observation(R(frozenset, arr))


def served(port: int, policy_path: str = "/policies/dp") -> None:
    """A good robot, start to chunk."""
    c = Client(port)
    try:
        c.stub.Ready(pb.Empty(), timeout=10)
        c.stub.SendPolicyInstructions(policy_setup(path=policy_path), timeout=10)
        c.stub.SendObservations(iter([pb.Observation(transfer_state=pb.TRANSFER_END, data=pickle.dumps(timed_obs(3)))]),
                                timeout=10)
        acts = pickle.loads(c.stub.GetActions(pb.Empty(), timeout=10).data)
        assert [a.timestep for a in acts] == [3, 4, 5, 6]
    finally:
        c.close()


def send(c: Client, data: bytes, timeout: float = 30.0):
    return c.stub.SendObservations(iter([pb.Observation(transfer_state=pb.TRANSFER_END, data=data)]), timeout=timeout)


# --- in a subprocess: the crash and the hang ---------------------------------------------------
@pytest.fixture(scope="module")
def server_process(tmp_path_factory):
    policies = tmp_path_factory.mktemp("policies")  # --policy-dir must exist: checked at start
    p = subprocess.Popen([sys.executable, "-m", "robotserve_ros.cli", "lerobot-server", "--port", "0", "--engine",
                          "simulated", "--engine-param", "chunk_size=8", "--latency-ms", "1:5", "--policy-dir",
                          str(policies)], cwd=tmp_path_factory.mktemp("srv"), stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        yield p, int(line.split(" on ")[1].split()[0].rpartition(":")[2]), f"{policies}/dp"
    finally:
        p.kill()  # SIGKILL: a server stuck in C ignores anything else
        p.wait(10)


@pytest.mark.parametrize("probe", [crash_payload, hang_payload])
def test_crash_and_hang_probes_refused_and_the_server_lives(server_process, probe):
    p, port, policy_path = server_process
    c = Client(port)
    c.start(path=policy_path)
    with pytest.raises(grpc.RpcError) as e:
        send(c, probe(), timeout=30)
    assert e.value.code() == INVALID, (e.value.code(), e.value.details())
    assert "plain numeric dtypes" in e.value.details()
    assert p.poll() is None, "the server died"
    c.close()
    served(port, policy_path)


# --- in process ----------------------------------------------------------------------------------
@pytest.fixture
def server():
    cfg = CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8}, profile_ms={1: 5.0},
                       get_actions_timeout_s=2.0, max_payload_bytes=1 << 20, policy_dirs=("/policies",),
                       threads=8, upload_timeout_s=1.0)
    srv = LeRobotCompatServer(cfg)
    yield srv
    srv.stop(0)


def test_build_on_an_allowed_class_refused_and_nothing_poisoned(server):
    from lerobot.async_inference.helpers import TimedObservation

    # BUILD with slot state on the class: setattr(TimedObservation, "__init__", None); the
    # server rebuilds every observation through that __init__
    poison = b"\x80\x02clerobot.async_inference.helpers\nTimedObservation\nN}X\x08\x00\x00\x00__init__Ns\x86b."
    c = Client(server.port)
    c.start()
    assert "BUILD on a _Global" in _refused(lambda: send(c, poison), INVALID)
    assert TimedObservation.__dict__["__init__"] is not None
    c.close()
    served(server.port)  # GetActions builds TimedActions: still works


def test_bytearray_of_a_gigabyte_refused_before_allocation(server):
    tiny = b"\x80\x02c__builtin__\nbytearray\nJ\x00\x00\x00\x40\x85R."  # bytearray(2**30)
    tracemalloc.start()
    try:
        with pytest.raises(safe_pickle.UnsafePickle, match="bytearray: only from bytes"):
            safe_pickle.loads(tiny)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    c = Client(server.port)
    c.start()
    _refused(lambda: send(c, tiny), INVALID)
    c.close()
    served(server.port)


def test_uninitialised_giant_camera_image_refused(server):
    # _reconstruct(ndarray, shape, dtype) alone makes an empty 20000x20000x3 array: 1.2 GB from 121 bytes
    huge = R(_reconstruct, np.ndarray, (20000, 20000, 3), b"B")
    c = Client(server.port)
    c.start()
    assert "_reconstruct" in _refused(lambda: send(c, in_observation(huge, "cam0")), INVALID)
    # a real image past the limit: refused by its element count before its bytes are copied
    lim = safe_pickle.Limits(max_array_elements=1000)
    with pytest.raises(safe_pickle.PickleLimit, match="max_array_elements"):
        safe_pickle.loads(pickle.dumps(np.zeros((24, 40, 3), np.uint8)), limits=lim)
    c.close()
    served(server.port)


def test_legacy_torch_storage_never_loaded(server, monkeypatch):
    import torch
    import torch.storage

    buf = io.BytesIO()
    torch.save(torch.zeros(1).storage(), buf, _use_new_zipfile_serialization=False)
    legacy = bytearray(buf.getvalue())
    legacy[-12:-4] = (1 << 30).to_bytes(8, "little")  # its float storage now claims 4 GiB
    data = pickle.dumps(R(torch.storage._load_from_bytes, bytes(legacy)), protocol=2)
    calls = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(1))
    with pytest.raises(safe_pickle.UnsafePickle, match=r"torch\.storage\._load_from_bytes"):
        safe_pickle.loads(data)
    c = Client(server.port)
    c.start()
    _refused(lambda: send(c, in_observation(R(torch.storage._load_from_bytes, bytes(legacy)))), INVALID)
    assert not calls
    monkeypatch.undo()  # the good client's own pickle.loads of its actions uses torch.load
    c.close()
    served(server.port)


def test_stalled_uploads_cannot_take_every_thread(server):
    """40 streams that never finish: at most max_uploads are taken (threads // 2 = 4), each
    cancelled after upload_timeout_s; the rest refused at once, and a good robot is served."""
    release = threading.Event()

    def stalled():
        yield pb.Observation(transfer_state=pb.TRANSFER_BEGIN, data=b"\x80")
        release.wait(30)

    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=[("grpc.use_local_subchannel_pool", 1)])
    from lerobot.transport import services_pb2_grpc as pb_grpc

    stub = pb_grpc.AsyncInferenceStub(ch)
    stub.Ready(pb.Empty())
    stub.SendPolicyInstructions(policy_setup())
    futs = [stub.SendObservations.future(stalled()) for _ in range(40)]
    try:
        c = Client(server.port)
        c.start()
        end = time.monotonic() + 15
        while True:  # uploads may be full for up to upload_timeout_s: a retry gets through
            try:
                send(c, pickle.dumps(timed_obs(3)), timeout=5)
                break
            except grpc.RpcError as e:
                assert e.code() == EXHAUSTED and "max_uploads" in e.details(), e.details()
                assert time.monotonic() < end
                time.sleep(0.2)
        assert [a.timestep for a in c.actions()] == [3, 4, 5, 6]
        c.close()
        codes = {f.exception().code() for f in futs}
        assert codes <= {EXHAUSTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}
        st = server.servicer.stats()
        assert st["uploads_cancelled"] >= 1 and st["uploads_open"] == 0
        assert st["protocol_errors"]["too_many_uploads"] >= 30
    finally:
        release.set()
        for f in futs:
            f.cancel()
        ch.close()
    served(server.port)


def test_piece_count_bounded():
    cfg = CompatConfig(port=0, engine="simulated", profile_ms={1: 5.0}, policy_dirs=("/policies",), max_upload_pieces=5)
    srv = LeRobotCompatServer(cfg)
    try:
        c = Client(srv.port)
        c.start()
        many = [pb.Observation(transfer_state=pb.TRANSFER_MIDDLE, data=b"") for _ in range(10)]
        assert "max_upload_pieces (5)" in _refused(lambda: c.stub.SendObservations(iter(many)), EXHAUSTED)
        c.close()
        served(srv.port)
    finally:
        srv.stop(0)


def deep(n: int) -> bytes:
    """n nested lists (built without recursion: pickle's own dumps would recurse)."""
    return b"\x80\x04" + b"]" * n + b"a" * (n - 1) + b"."


def test_deep_nesting_refused_with_the_limit_named(server):
    c = Client(server.port)
    c.start()
    obs = in_observation("@@DEEP@@")
    # the joint value: 50000 nested lists (was a RecursionError escaping as UNKNOWN)
    nested = obs.replace(b"\x8c\x08@@DEEP@@", deep(50_000)[2:-1], 1)
    assert nested != obs
    assert "max_depth (32)" in _refused(lambda: send(c, nested), EXHAUSTED)
    with pytest.raises(safe_pickle.PickleLimit, match="max_depth"):
        safe_pickle.loads(deep(100))
    assert safe_pickle.loads(deep(30)) == eval("[" * 30 + "]" * 30)
    tup = b"\x80\x04" + b")" + b"\x85" * 100 + b"."  # nested 1-tuples: hashing them recurses in C
    with pytest.raises(safe_pickle.PickleLimit, match="max_depth"):
        safe_pickle.loads(tup)
    cyc = b"\x80\x04]\x94h\x00a."  # a list containing itself
    with pytest.raises(safe_pickle.UnsafePickle, match="contains itself"):
        safe_pickle.loads(cyc)
    c.close()
    served(server.port)


def test_string_and_op_limits():
    with pytest.raises(safe_pickle.PickleLimit, match="max_string_bytes"):
        safe_pickle.loads(pickle.dumps("x" * 70000))
    with pytest.raises(safe_pickle.PickleLimit, match="max_ops"):
        safe_pickle.loads(b"\x80\x04" + b"N0" * 200_001 + b"N.")
    with pytest.raises(safe_pickle.PickleLimit, match="max_bytes"):
        # a protocol-3 bytearray is bytes copied once more: 638 bytes of pickle, 1200 of data
        safe_pickle.loads(pickle.dumps(bytearray(b"x" * 600), protocol=3), limits=safe_pickle.Limits(max_bytes=1000))


def test_errors_never_echo_the_clients_bytes(server, monkeypatch):
    c = Client(server.port)
    c.stub.Ready(pb.Empty())
    from lerobot.async_inference.helpers import RemotePolicyConfig

    ptype = "\x1b[31m" + "A" * 50_000
    bad = pb.PolicySetup(data=pickle.dumps(RemotePolicyConfig(ptype, "/policies/x", {}, 4)))
    details = _refused(lambda: c.stub.SendPolicyInstructions(bad), INVALID)
    assert len(details) < 400 and "\x1b" not in details and "50005 long" in details
    # anything unforeseen in a handler: INTERNAL naming the exception's type, not UNKNOWN
    def boom(*a):
        raise RuntimeError("secret \x1b client bytes")

    monkeypatch.setattr(server.servicer.policies, "resolve", boom)
    details = _refused(lambda: c.stub.SendPolicyInstructions(policy_setup()), grpc.StatusCode.INTERNAL)
    assert "RuntimeError" in details and "secret" not in details
    assert server.servicer.stats()["protocol_errors"]["internal"] == 1
    monkeypatch.undo()
    c.close()
    served(server.port)


def test_limits_come_from_the_config():
    cfg = CompatConfig(max_payload_bytes=1000, max_nesting_depth=5, max_string_bytes=10, max_array_elements=7,
                       max_pickle_ops=99)
    assert cfg.pickle_limits() == safe_pickle.Limits(1000, 7, 5, 10, 99)
    with pytest.raises(ValueError, match="max_nesting_depth must be an integer > 0"):
        CompatConfig(max_nesting_depth=0)
    with pytest.raises(ValueError, match="max_uploads must be < threads"):
        CompatConfig(threads=4, max_uploads=4)
    assert CompatConfig(threads=8).upload_slots == 4
