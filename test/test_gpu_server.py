"""The GPU server's serving loop over real gRPC on 127.0.0.1: batching across callers,
splitting at the saturation batch, deadlines, and validation of every request on its own."""
from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from robotserve_ros.core import EngineProfile
from robotserve_ros.core.observation import Observation, ObservationSpec
from robotserve_ros.core.types import ChunkResult, InferenceRequest
from robotserve_ros.engines.simulated import SimulatedEngine
from robotserve_ros.transport import stubs
from robotserve_ros.transport.gpu_server import GpuServer
from robotserve_ros.transport.remote_engine import RemoteEngine
from robotserve_ros.transport.tensors import request_to_pb

FAST = {1: 1.0, 2: 1.5, 4: 2.0}  # saturation batch 4
pb, pb_grpc = stubs()


class GatedEngine(SimulatedEngine):
    """Records every batch it is given; holds each batch until the gate is open."""

    def __init__(self, **kw) -> None:
        super().__init__(EngineProfile(FAST), chunk_size=8, action_dim=3, updates=True, **kw)
        self.batches: list = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False

    def infer(self, batch):
        self.batches.append([(r.task_id, r.round_id) for r in batch])
        self.entered.set()
        assert self.gate.wait(10.0)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("CUDA out of memory at 0xdeadbeef")  # must not reach the client
        return super().infer(batch)


def obs(i: int, joints=None) -> Observation:
    rng = np.random.default_rng(i)
    q = rng.standard_normal(6).astype(np.float32) if joints is None else np.asarray(joints, np.float32)
    return Observation(images=[rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)], joints=q, instruction="pick", timestep=i)


def message(*ids) -> "pb.InferBatchRequest":
    return pb.InferBatchRequest(requests=[request_to_pb(pb, InferenceRequest(t, r, observation=obs(r))) for t, r in ids])


def until(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class Caller(threading.Thread):
    def __init__(self, stub, msg, timeout: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.stub, self.msg, self.timeout = stub, msg, timeout
        self.reply = self.error = None
        self.start()

    def run(self) -> None:
        try:
            self.reply = self.stub.InferBatch(self.msg, timeout=self.timeout)
        except grpc.RpcError as e:
            self.error = e


@pytest.fixture
def served():
    eng = GatedEngine()
    with GpuServer(eng, "127.0.0.1:0", max_message_bytes=4 << 20) as srv:
        with grpc.insecure_channel(srv.address, options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
            yield eng, srv, pb_grpc.GpuServerStub(ch)
    eng.gate.set()


def hold_engine(eng, stub) -> Caller:
    """Occupy the engine's one slot with a batch it holds until eng.gate is set."""
    eng.gate.clear()
    eng.entered.clear()
    blocker = Caller(stub, message(("blocker", 0)))
    assert eng.entered.wait(5.0)
    return blocker


def assert_clean(srv) -> None:
    core = srv.servicer.core
    assert until(lambda: not core.ledger.tasks and not core.pending and not core.inflight)


def assert_serves(eng, stub, tag: str) -> None:
    rep = stub.InferBatch(message((tag, 7)), timeout=5)
    assert [(c.task_id, c.round_id) for c in rep.chunks] == [(tag, 7)]
    assert eng.batches[-1] == [(tag, 7)]


def queued_together(eng, srv, stub, *msgs) -> list:
    """Calls of `msgs` queued while the engine is held, so they share its next batch; returns
    the blocker and their callers, all ended."""
    blocker = hold_engine(eng, stub)
    calls = [Caller(stub, m) for m in msgs]
    assert until(lambda: len(srv.servicer.core.pending) == sum(len(m.requests) for m in msgs))
    eng.gate.set()
    for c in [blocker] + calls:
        c.join(5.0)
    return [blocker] + calls


def test_two_concurrent_callers_share_one_batch(served):
    eng, srv, stub = served
    blocker, a, b = queued_together(eng, srv, stub, message(("edgeA/t", 0), ("edgeA/u", 3)), message(("edgeB/t", 5)))
    for c in (blocker, a, b):
        assert c.error is None, c.error
    assert sorted(eng.batches[1]) == [("edgeA/t", 0), ("edgeA/u", 3), ("edgeB/t", 5)]  # one batch, both callers
    assert len(eng.batches) == 2
    assert [(c.task_id, c.round_id) for c in a.reply.chunks] == [("edgeA/t", 0), ("edgeA/u", 3)]
    assert [(c.task_id, c.round_id) for c in b.reply.chunks] == [("edgeB/t", 5)]
    assert srv.counts["batches"] == 2 and srv.counts["requests"] == 4
    assert_clean(srv)


def test_same_task_id_from_two_edges_does_not_collide(served):
    eng, srv, stub = served
    blocker = hold_engine(eng, stub)
    a, b = Caller(stub, message(("robot/t", 0))), Caller(stub, message(("robot/t", 0)))
    assert until(lambda: len(srv.servicer.core.pending) == 2)
    eng.gate.set()
    for c in (blocker, a, b):
        c.join(5.0)
        assert c.error is None, c.error
        assert [(x.task_id, x.round_id) for x in c.reply.chunks] == [(c.msg.requests[0].task_id, 0)]
    assert eng.batches[1] == [("robot/t", 0), ("robot/t", 0)]
    assert srv.servicer.core.stats.errors == {}
    assert_clean(srv)


def test_call_bigger_than_saturation_batch_is_split_and_answered_whole(served):
    eng, srv, stub = served
    ids = [(f"r{i}", i) for i in range(10)]
    rep = stub.InferBatch(message(*ids), timeout=5)
    assert [len(b) for b in eng.batches] == [4, 4, 2]  # saturation batch of FAST is 4
    assert [(c.task_id, c.round_id) for c in rep.chunks] == ids
    want = SimulatedEngine(EngineProfile(FAST), chunk_size=8, action_dim=3, updates=True).infer(
        [InferenceRequest(t, r) for t, r in ids])
    for c, w in zip(rep.chunks, want):  # the engine's full chunk, untrimmed, with its updates
        np.testing.assert_array_equal(np.frombuffer(c.actions.data, np.float32).reshape(8, 3), w.actions)
        assert c.has_updates and list(c.updates.shape) == [10, 8, 3]
    assert_clean(srv)


def refused_while_a_good_call_waits(eng, srv, stub, bad_msg, *named):
    """`bad_msg` is refused (INVALID_ARGUMENT naming each of `named`) while a good call waits
    for the engine; the good call is served and nothing of the bad one reaches the engine."""
    blocker = hold_engine(eng, stub)
    good = Caller(stub, message(("good/t", 0)))
    with pytest.raises(grpc.RpcError) as e:
        stub.InferBatch(bad_msg, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert all(n in e.value.details() for n in named), e.value.details()
    eng.gate.set()
    for c in (blocker, good):
        c.join(5.0)
        assert c.error is None, c.error
    assert eng.batches[1] == [("good/t", 0)]
    assert not any(t.startswith("bad/") for b in eng.batches for t, _ in b)  # nothing of the bad call queued


def test_a_bad_call_is_refused_alone_and_its_neighbours_are_served(served):
    eng, srv, stub = served
    bad_msg = message(("bad/t", 0), ("bad/u", 0), ("bad/v", 0))
    bad_msg.requests[1].observation.joints.data = np.array([0, np.nan, 0, 0, 0, 0], np.float32).tobytes()
    refused_while_a_good_call_waits(eng, srv, stub, bad_msg, "requests[1].observation.joints[1]", "finite")
    assert srv.counts["bad_request"] == 1 and srv.servicer.core.stats.errors["bad_observation"] == 1
    assert_clean(srv)


def test_expired_deadline_drops_work_that_has_not_started(served):
    eng, srv, stub = served
    blocker = hold_engine(eng, stub)
    with pytest.raises(grpc.RpcError) as e:
        stub.InferBatch(message(("late/t", 0), ("late/u", 0)), timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert until(lambda: srv.counts["expired"] == 2)
    assert not srv.servicer.core.pending  # dropped from the queue before it ran
    eng.gate.set()
    blocker.join(5.0)
    assert blocker.error is None
    assert_serves(eng, stub, "next")
    assert not any(t.startswith("late/") for b in eng.batches for t, _ in b)  # it never ran
    assert srv.counts["expired_calls"] == 1
    assert_clean(srv)


def test_cancelled_call_drops_its_work(served):
    eng, srv, stub = served
    blocker = hold_engine(eng, stub)
    fut = stub.InferBatch.future(message(("gone/t", 0)), timeout=30)
    assert until(lambda: len(srv.servicer.core.pending) == 1)
    fut.cancel()
    assert until(lambda: srv.counts["expired"] == 1 and not srv.servicer.core.pending)
    eng.gate.set()
    blocker.join(5.0)
    assert_serves(eng, stub, "after-cancel")
    assert not any(t == "gone/t" for b in eng.batches for t, _ in b)
    assert_clean(srv)


@pytest.mark.parametrize("field,spoil,named", [
    ("huge shape", lambda m: m.requests[0].observation.images[0].ClearField("shape")
     or m.requests[0].observation.images[0].shape.extend([10**18, 10**18, 0]), "requests[0].observation.images[0].shape[0]"),
    ("many zero dims", lambda m: m.requests[0].observation.images[0].ClearField("shape")
     or m.requests[0].observation.images[0].shape.extend([1 << 20] * 7 + [0]), "requests[0].observation.images[0].shape"),
    ("1 MiB task id", lambda m: setattr(m.requests[0], "task_id", "\x1b[31m" + "A" * (1 << 20)), "requests[0].task_id"),
    ("long instruction", lambda m: setattr(m.requests[0].observation, "instruction", "x" * 5000), "requests[0].observation.instruction"),
    ("dtype", lambda m: setattr(m.requests[0].observation.joints, "dtype", "object\x00" + "Z" * 5000), "requests[0].observation.joints.dtype"),
    ("inf joint", lambda m: setattr(m.requests[0].observation.joints, "data", np.array([np.inf] * 6, np.float32).tobytes()), "requests[0].observation.joints[0]"),
    ("2-D joints", lambda m: m.requests[0].observation.joints.shape.append(1), "requests[0].observation.joints.shape"),
    ("empty image", lambda m: (m.requests[0].observation.images[0].ClearField("shape"), m.requests[0].observation.images[0].shape.extend([0, 8, 3]),
                               setattr(m.requests[0].observation.images[0], "data", b"")), "requests[0].observation.images[0].shape"),
    ("negative round", lambda m: setattr(m.requests[0], "round_id", -1), "requests[0].round_id"),
    ("empty call", lambda m: m.ClearField("requests"), "requests: empty"),
])
def test_bad_input_is_invalid_argument_naming_the_field_and_the_server_goes_on(served, field, spoil, named):
    eng, srv, stub = served
    m = message(("x", 0))
    spoil(m)
    with pytest.raises(grpc.RpcError) as e:
        stub.InferBatch(m, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, e.value.code(), e.value.details())
    d = e.value.details()
    assert named in d, d
    assert len(d) < 300 and "\x1b" not in d and "\x00" not in d and "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" not in d
    assert srv.counts["bad_request"] == 1 and not eng.batches  # counted; nothing reached the engine
    assert_serves(eng, stub, "after-" + field.replace(" ", "-"))
    assert_clean(srv)


def test_too_many_requests_in_one_call_refused(served):
    eng, srv, stub = served
    with pytest.raises(grpc.RpcError) as e:
        stub.InferBatch(message(*[(f"r{i}", 0) for i in range(1025)]), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 1024" in e.value.details()
    assert not eng.batches
    assert_serves(eng, stub, "ok")


def test_engine_failure_is_internal_without_detail_and_the_next_call_is_served(served):
    eng, srv, stub = served
    eng.fail_next = True
    with pytest.raises(grpc.RpcError) as e:
        stub.InferBatch(message(("boom", 0)), timeout=5)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "deadbeef" not in e.value.details() and "Traceback" not in e.value.details()
    assert srv.counts["engine_failure"] == 1
    assert_serves(eng, stub, "after-failure")
    assert [b for b in eng.batches if b[0][0] == "boom"] == [[("boom", 0)]]  # not retried behind the caller's back
    assert_clean(srv)


def test_unsendable_engine_output_is_internal():
    class Complex(SimulatedEngine):
        def infer(self, batch):
            return [ChunkResult(np.zeros((2, 2), np.complex64)) for _ in batch]

    with GpuServer(Complex(EngineProfile(FAST)), "127.0.0.1:0") as srv, grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.GpuServerStub(ch).InferBatch(message(("c", 0)), timeout=5)
        assert e.value.code() == grpc.StatusCode.INTERNAL and "complex" not in e.value.details()


def test_engine_observation_spec_refuses_what_the_policy_cannot_take():
    class Picky(GatedEngine):
        observation_spec = ObservationSpec(cameras=1, width=8, height=8, encodings=("rgb8",), joints=6)

    eng = Picky()
    with GpuServer(eng, "127.0.0.1:0") as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.GpuServerStub(ch)
        m = message(("ok", 0), ("short", 0))
        m.requests[1].observation.joints.CopyFrom(pb.Tensor(data=np.zeros(5, np.float32).tobytes(), shape=[5], dtype="float32"))
        with pytest.raises(grpc.RpcError) as e:
            stub.InferBatch(m, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "requests[1].observation.joints" in e.value.details()
        assert not eng.batches
        assert_serves(eng, stub, "fits")


def test_initial_noise_travels_to_the_remote_engine():
    class Noisy(SimulatedEngine):
        def infer(self, batch):
            return [ChunkResult(r.actions, r.updates, np.full(r.actions.shape, 0.25, np.float32)) for r in super().infer(batch)]

    eng = Noisy(EngineProfile(FAST), chunk_size=8, action_dim=3, updates=True)
    with GpuServer(eng, "127.0.0.1:0") as srv:
        remote = RemoteEngine(address=srv.address, ping_interval_s=0)
        try:
            (got,) = remote.infer([InferenceRequest("n/t", 2, observation=obs(2))])
        finally:
            remote.close()
    np.testing.assert_array_equal(got.initial_noise, np.full((8, 3), 0.25, np.float32))
    assert got.updates.shape == (10, 8, 3)


def test_many_calls_leave_no_tasks_behind(served):
    eng, srv, stub = served
    callers = [Caller(stub, message((f"e{k}/t", r), (f"e{k}/u", r))) for k in range(6) for r in range(3)]
    for c in callers:
        c.join(10.0)
        assert c.error is None, c.error
    assert srv.counts["requests"] == 36 and max(len(b) for b in eng.batches) <= 4
    assert_clean(srv)


# --- `robotserve gpu-server`: a wrong flag is one line and exit 2, before anything starts ----
@pytest.mark.parametrize("args,line", [
    (["--token-file", "/nonexistent"], "--token-file '/nonexistent' is not a readable file"),
    (["--address", "bad"], "--address 'bad' is not host:port (port 0..65535; 0: any free one)"),
    (["--engine-params", "notjson"], "--engine-params 'notjson' is not a JSON object of the engine's keyword parameters"),
    (["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"],
     "--tls-cert '/nonexistent/cert.pem' is not a readable file"),
    (["--tls-key", "KEY"], "--tls-key 'KEY' is not a readable file"),
    (["--engine", "nosuch"], "--engine 'nosuch' is not one of "),
    (["--engine-param", "nosuch=1"], "--engine-params nosuch: given 1, but engine 'simulated' has no such knob; "),
    (["--engine-param", "chunk_size=30.5"], "--engine-params chunk_size: 30.5 is not an integer"),
])
def test_gpu_server_refuses_a_wrong_flag_in_one_line(args, line, tmp_path):
    import subprocess
    import sys

    from rosutil import REPO_ROOT

    if "KEY" in args:  # a key that exists, without its certificate
        (tmp_path / "key.pem").write_text("k")
        args = [str(tmp_path / "key.pem") if a == "KEY" else a for a in args]
        line = "--tls-cert and --tls-key go together"
    out = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "gpu-server", "--address", "127.0.0.1:0", *args],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"robotserve gpu-server: {line}"), out.stderr


@pytest.mark.parametrize("d,says", [(5, "longer than the leftover"), (-1, "delay_steps must be >= 0")])
def test_an_rtc_delay_longer_than_its_leftover_is_refused_before_it_joins_a_batch(served, d, says):
    """Validated before batching: found only by the engine, it would fail every call batched with it."""
    from robotserve_ros.core.rtc import RtcGuide

    eng, srv, stub = served
    bad = InferenceRequest("bad/t", 0, observation=obs(0), rtc=RtcGuide(np.zeros((2, 3), np.float32), d))
    refused_while_a_good_call_waits(eng, srv, stub, pb.InferBatchRequest(requests=[request_to_pb(pb, bad)]),
                                    "requests[0].rtc_leftover", says)
    assert srv.counts["bad_request"] == 1  # counted
    assert_clean(srv)


def test_a_row_the_engine_fails_on_fails_only_its_own_call(served):
    """An engine that still raises on one row: the other caller's requests in the same batch
    are served, and the failing call gets the engine's refusal."""
    from robotserve_ros.core.observation import BadObservation

    eng, srv, stub = served
    real = eng.infer

    def picky(batch):
        if len(batch) > 1 and any(r.task_id == "bad/t" for r in batch) or [r.task_id for r in batch] == ["bad/t"]:
            eng.batches.append([(r.task_id, r.round_id) for r in batch])
            raise BadObservation("image 0 holds a value the policy cannot take")
        return real(batch)

    eng.infer = picky
    blocker, a, b = queued_together(eng, srv, stub, message(("edgeA/t", 0), ("edgeA/u", 1)), message(("bad/t", 0)))
    assert blocker.error is None and a.error is None, a.error
    assert [(c.task_id, c.round_id) for c in a.reply.chunks] == [("edgeA/t", 0), ("edgeA/u", 1)]
    assert b.error is not None and b.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bad_observation" in b.error.details()
    assert srv.servicer.fleet.core_stats()["rows_failed"] == 1
    assert_serves(eng, stub, "after")
    assert_clean(srv)
