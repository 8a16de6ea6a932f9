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
from test_security import send, served  # noqa: E402

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



def _let_go(release, futs, chans) -> None:
    """End an attack: its held calls released and cancelled, its channels closed."""
    release.set()
    for f in futs:
        f.cancel()
    for c in chans:
        c.close()

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


# --- the GPU server: workers cannot be held, tokens, fair share ----------------------------
from robotserve_ros.core import EngineProfile  # noqa: E402
from robotserve_ros.core.observation import Observation  # noqa: E402
from robotserve_ros.core.types import InferenceRequest  # noqa: E402
from robotserve_ros.engines.simulated import SimulatedEngine  # noqa: E402
from robotserve_ros.transport import stubs  # noqa: E402
from robotserve_ros.transport.call_guard import GuardLimits  # noqa: E402
from robotserve_ros.transport.gpu_server import GpuServer  # noqa: E402
from robotserve_ros.transport.tensors import request_to_pb  # noqa: E402

TOKENS = ["holder-a-token", "holder-b-token"]
GPU = "/robotserve.gpu.GpuServer/"


def _stall(release: threading.Event):
    release.wait(30)
    return
    yield  # a client stream that never sends


def gpu_infer_msg(n: int, tag: str):
    pbm = stubs()[0]
    obs = Observation(images=[], joints=np.zeros(3, np.float32), instruction="pick", timestep=0)
    return pbm.InferBatchRequest(requests=[request_to_pb(pbm, InferenceRequest(f"{tag}/{i}", 0, observation=obs))
                                           for i in range(n)])


def gpu_call(address: str, token: str, n: int = 1, timeout: float = 10.0, tag: str = "good"):
    pbm, pb_grpc = stubs()
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        stub = pb_grpc.GpuServerStub(ch)
        md = [("authorization", f"Bearer {token}")]
        assert stub.Health(pbm.HealthRequest(), metadata=md, timeout=timeout).serving
        return stub.InferBatch(gpu_infer_msg(n, tag), metadata=md, timeout=timeout)


class GoodHolder(GoodRobot):
    """A token holder served over and over (Health, then an InferBatch) during an attack."""

    def __init__(self, address: str, token: str) -> None:
        super().__init__(0)
        self.address, self.token = address, token

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                assert len(gpu_call(self.address, self.token, timeout=5).chunks) == 1
                self.rounds += 1
            except (grpc.RpcError, AssertionError) as e:
                self.errors.append(repr(e)[:200])
                time.sleep(0.1)


def open_stalled(address: str, method: str, n: int, release: threading.Event, token: str = None, conns: int = 4):
    """n calls that never send their request, over `conns` connections (as the probe did)."""
    chans = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(conns)]
    md = [("authorization", f"Bearer {token}")] if token else None
    futs = [chans[i % conns].stream_unary(method).future(_stall(release), metadata=md) for i in range(n)]
    return chans, futs


@pytest.fixture
def gpu():
    eng = SimulatedEngine(EngineProfile({1: 5.0, 4: 10.0, 16: 40.0}), chunk_size=4, action_dim=3, realtime=True)
    guard = GuardLimits(receive_timeout_s=1.0, max_calls=32, max_calls_per_peer=4, max_calls_per_token=4,
                        receive_slots=2)
    with GpuServer(eng, "127.0.0.1:0", token=TOKENS, workers=8, guard=guard) as srv:
        yield srv


@pytest.mark.parametrize("who", ["anonymous", "token holder"])
def test_gpu_stalled_calls_cannot_hold_the_workers(gpu, who):
    """32 calls (InferBatch, Health) that never send their request, re-opened as they end:
    anonymous ones refused UNAUTHENTICATED before any worker waits on them; a token holder's
    refused past max_calls_per_peer and receive_slots, or cancelled after receive_timeout_s.
    Another holder's Health and InferBatch are served throughout."""
    release = threading.Event()
    token = None if who == "anonymous" else TOKENS[0]
    chans, futs = [], []
    try:
        with GoodHolder(gpu.address, TOKENS[1]) as good:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:  # the probe re-opened its stalled calls as they ended
                live = [f for f in futs if not f.done()]
                for method in ("InferBatch", "Health"):
                    c, f = open_stalled(gpu.address, GPU + method, 16 - len(live) // 2, release, token)
                    chans += c
                    futs += f
                time.sleep(0.2)
        assert good.rounds >= 5, good.errors
        codes = {f.exception().code() for f in futs if f.done() and f.exception() is not None}
        if who == "anonymous":
            assert codes == {grpc.StatusCode.UNAUTHENTICATED}
            assert gpu.counts["unauthenticated"] >= 32
        else:
            assert codes <= {EXHAUSTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}, codes
            assert gpu.counts["peer_calls_refused"] + gpu.counts["receive_slots_full"] >= 10
    finally:
        _let_go(release, futs, chans)
    assert len(gpu_call(gpu.address, TOKENS[0]).chunks) == 1  # and after


def test_gpu_fair_share_between_token_holders(gpu):
    """Holder A queues 4 calls of 128 requests (32 batches of 16, max_calls_per_token of
    them); holder B's one request is served in the next batches, not after A's 512
    (round-robin between tokens), and A's fifth call is refused, not queued for a worker."""
    results = {}

    def big(i):
        results[i] = gpu_call(gpu.address, TOKENS[0], n=128, timeout=30, tag=f"a{i}")

    threads = [threading.Thread(target=big, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    end = time.monotonic() + 10
    while gpu.guard.in_flight[("token", 0)] < 4 or gpu.servicer.queued[0] < 4 * 128:  # A's calls all queued
        assert time.monotonic() < end
        time.sleep(0.01)
    with pytest.raises(grpc.RpcError) as e:
        gpu_call(gpu.address, TOKENS[0], tag="a5")
    assert e.value.code() == EXHAUSTED and "max_calls_per_token" in e.value.details()
    t0 = time.monotonic()
    assert len(gpu_call(gpu.address, TOKENS[1], tag="b").chunks) == 1
    b_s = time.monotonic() - t0
    b_done_batches = gpu.counts["batches"]
    for t in threads:
        t.join(60)
    assert len(results) == 4 and all(len(r.chunks) == 128 for r in results.values())
    total = gpu.counts["batches"]
    # B was answered while most of A's batches were still to run
    assert b_done_batches < total / 2, (b_done_batches, total, b_s)


def test_gpu_token_caps_and_empty_token_refused(gpu):
    with pytest.raises(ValueError, match="non-empty"):
        GpuServer(SimulatedEngine(EngineProfile({1: 1.0})), "127.0.0.1:0", token=["\n"])
    srv = GpuServer(SimulatedEngine(EngineProfile({1: 1.0, 4: 2.0}), chunk_size=4, action_dim=3), "127.0.0.1:0",
                    token="t", max_token_requests=8)
    try:
        with pytest.raises(grpc.RpcError) as e:
            gpu_call(srv.address, "t", n=9)
        assert e.value.code() == EXHAUSTED and "max_token_requests (8)" in e.value.details()
        assert srv.counts["token_overloaded"] == 1
        assert len(gpu_call(srv.address, "t", n=8).chunks) == 8
    finally:
        srv.stop(None)


@pytest.mark.parametrize("content", ["", "\n", "  \n\t\n"])
def test_gpu_server_empty_token_file_exits_2(tmp_path, content):
    import subprocess
    import sys

    f = tmp_path / "token"
    f.write_text(content)
    p = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "gpu-server", "--token-file", str(f),
                        "--address", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "is empty" in p.stderr
    env = {**__import__("os").environ, "ROBOTSERVE_GPU_TOKEN": content or " "}  # set, not blank: no token in it
    p = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "gpu-server", "--address", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "ROBOTSERVE_GPU_TOKEN is empty" in p.stderr, p.stderr


def test_gpu_server_without_token_or_tls_warns(tmp_path):
    import subprocess
    import sys

    ready = tmp_path / "ready"
    env = {k: v for k, v in __import__("os").environ.items() if k != "ROBOTSERVE_GPU_TOKEN"}
    p = subprocess.Popen([sys.executable, "-m", "robotserve_ros.cli", "gpu-server", "--address", "127.0.0.1:0",
                          "--ready-file", str(ready)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        end = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < end and p.poll() is None:
            time.sleep(0.1)
        assert ready.exists()
    finally:
        p.terminate()
        err = p.communicate(timeout=20)[1]
    assert "WARNING no token" in err and "WARNING no TLS" in err, err


# --- the LeRobot endpoint: stalled calls, sessions, logs, bounded state ---------------------------
LR = "/transport.AsyncInference/"


def test_lerobot_stalled_unary_calls_cannot_take_every_thread(server):
    """~32 anonymous Ready / SendPolicyInstructions calls that never send their message,
    over 4 connections, re-opened as they end (the probe: every round timed out, 0 of 119):
    past the grace each needs a receive slot or is cancelled, past max_calls_per_peer it is
    refused; a good robot is served throughout, and its session is never reaped."""
    release = threading.Event()
    chans, futs = [], []
    try:
        with GoodRobot(server.port) as good:
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                live = sum(not f.done() for f in futs)
                for method in ("Ready", "SendPolicyInstructions"):
                    c, f = open_stalled(f"127.0.0.1:{server.port}", LR + method, max(0, 16 - live // 2), release)
                    chans += c
                    futs += f
                time.sleep(0.2)
        assert good.rounds >= 5 and server.servicer.clients_reaped == 0, (good.rounds, good.errors)
        calls = server.servicer.stats()["calls"]
        assert calls["receive_slots_full"] + calls.get("peer_calls_refused", 0) >= 10, calls
        codes = {f.exception().code() for f in futs if f.done() and f.exception() is not None}
        assert codes <= {EXHAUSTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}, codes
    finally:
        _let_go(release, futs, chans)
    served(server.port)


def test_lerobot_session_belongs_to_its_creator(server):
    """The session id is issued by the server (Ready's initial metadata), never taken from
    client metadata: another connection naming a made-up id, or the id the old server
    derived from metadata, gets no session; naming the real id is the only way in, and it
    is never shown to anyone but its creator (not in stats, logs or task ids)."""
    victim = Client(server.port)
    _, call = victim.stub.Ready.with_call(pb.Empty())
    (sid,) = [v for k, v in call.initial_metadata() if k == "robotserve-session"]
    victim.stub.SendPolicyInstructions(policy_setup())
    (task,) = server.servicer.stats()["clients"]
    thief = Client(server.port)
    for forged in ("left-arm", "id:left-arm", sid[:-1] + ("A" if sid[-1] != "A" else "B")):
        md = [("robotserve-session", forged)]
        assert "no session" in _refused(lambda: thief.stub.Ready(pb.Empty(), metadata=md), grpc.StatusCode.FAILED_PRECONDITION)
        _refused(lambda: thief.stub.GetActions(pb.Empty(), metadata=md), grpc.StatusCode.FAILED_PRECONDITION)
    # the old header is ignored: the thief's Ready starts its own session, the victim's is untouched
    thief.stub.Ready(pb.Empty(), metadata=[("robotserve-client", "whatever")])
    st = server.servicer.stats()
    assert task in st["clients"] and len(st["clients"]) == 2 and sid not in str(st)
    victim.send(timed_obs(3))
    assert [a.timestep for a in victim.actions()] == [3, 4, 5, 6]
    assert server.servicer.stats()["protocol_errors"]["no_session"] == 6
    victim.close()
    thief.close()
    served(server.port)


def test_lerobot_logs_escape_control_characters(server, caplog, monkeypatch):
    """A policy path, a peer's strings, an unforeseen exception's text: every logged client
    string is escaped (a newline in the path forged whole lines in the server log)."""
    forged = "/policies/dp\n2026-01-01 00:00:00 robotserve.lerobot: client admin authenticated\x1b[2J"
    c = Client(server.port)
    c.stub.Ready(pb.Empty())
    with caplog.at_level(logging.INFO, logger="robotserve"):
        c.stub.SendPolicyInstructions(policy_setup(path=forged))
        _refused(lambda: c.stub.SendPolicyInstructions(pb.PolicySetup(data=b"\x80\x04\x8c\x03a\nb\x94.")), INVALID)
        def boom(spec):
            raise KeyError(spec.pretrained_name_or_path)  # a handler's fault, quoting the client

        monkeypatch.setattr(server.servicer.policies, "resolve", boom)
        _refused(lambda: c.stub.SendPolicyInstructions(policy_setup(path=forged)), grpc.StatusCode.INTERNAL)
        monkeypatch.undo()
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("robotserve")]
    assert any("KeyError" in m and "traceback" in m for m in msgs), msgs
    assert not any(r.exc_info for r in caplog.records)  # the traceback is in the one escaped line
    assert any("authenticated" in m for m in msgs), msgs  # the path was logged, escaped
    assert not any(ch in m for m in msgs for ch in "\n\r\x1b"), msgs
    c.close()
    served(server.port)


def test_lerobot_sessions_capped_with_lru_eviction():
    """max_sessions: a new session past it evicts the least recently used (counted); the
    sessions' observation bytes within max_session_bytes the same way."""
    srv = LeRobotCompatServer(lerobot_cfg(max_sessions=3, max_session_bytes=20_000))
    try:
        robots = [Client(srv.port) for _ in range(5)]
        for r in robots:
            r.start()
        st = srv.servicer.stats()
        assert len(st["clients"]) == 3 and st["evictions"] == {"sessions_evicted": 2}
        robots[0].send(timed_obs(1))  # evicted: its next call re-establishes its session (and evicts another)
        assert robots[0].actions() and srv.servicer.stats()["sessions_resumed"] == 1
        for i, r in enumerate(robots[2:]):  # each holds about 2.9 KB (its camera) per observation it keeps
            r.send(timed_obs(5 + i))
            assert r.actions()
        big = lerobot_cfg(max_sessions=3, max_session_bytes=8_000)
        srv2 = LeRobotCompatServer(big)
        try:
            rs = [Client(srv2.port) for _ in range(3)]
            for i, r in enumerate(rs):
                r.start()
                r.send(timed_obs(1, q=np.full(6, float(i))))
            assert srv2.servicer.stats()["evictions"].get("session_bytes_evicted", 0) >= 1
            rs[-1].actions()  # the newest is still served
            for r in rs:
                r.close()
        finally:
            srv2.stop(0)
        for r in robots:
            r.close()
        served(srv.port)
    finally:
        srv.stop(0)


def test_an_evicted_session_is_re_established_for_the_unchanged_client():
    """Issue 37 item 5: LeRobot's RobotClient calls Ready and SendPolicyInstructions once, so
    a session evicted under pressure used to lock it out for good (no_session on every call).
    Its next call now re-establishes it (a fresh task on the same policy), counted; the others
    are served throughout; an id the server never issued is still no_session."""
    srv = LeRobotCompatServer(lerobot_cfg(max_sessions=2, client_timeout_s=60.0))
    try:
        a, b, c = Client(srv.port), Client(srv.port), Client(srv.port)
        a.start()
        a.send(timed_obs(1))
        assert a.actions()
        b.start()
        c.start()  # past max_sessions: a, the least recently used, is evicted
        st = srv.servicer.stats()
        assert st["evictions"] == {"sessions_evicted": 1} and len(st["clients"]) == 2
        c.send(timed_obs(1))
        assert c.actions()
        a.send(timed_obs(2))  # unchanged client, no Ready: served again
        assert a.actions()
        assert srv.servicer.stats()["sessions_resumed"] == 1
        for step, r in enumerate((b, c, a, b), 3):  # whoever was evicted meanwhile comes back the same way
            r.send(timed_obs(step))
            assert r.actions()
        assert srv.servicer.stats()["sessions_resumed"] >= 3
        bogus = [("robotserve-session", "not-an-issued-id")]
        assert "no session" in _refused(lambda: a.stub.GetActions(pb.Empty(), metadata=bogus),
                                        grpc.StatusCode.FAILED_PRECONDITION)
        for r in (a, b, c):
            r.close()
        served(srv.port)
    finally:
        srv.stop(0)


def test_lerobot_policy_groups_bounded_and_unloaded_when_idle():
    """max_policy_groups: a new policy unloads the least recently used one no session is on,
    or is refused while all are in use; a policy idle for policy_idle_s is unloaded (its
    runner's threads end). Hundreds of distinct policies no longer mean hundreds of threads."""
    srv = LeRobotCompatServer(lerobot_cfg(max_policy_groups=2, policy_idle_s=1.0, client_timeout_s=60.0))
    try:
        threads0 = threading.active_count()
        a, b, c = Client(srv.port), Client(srv.port), Client(srv.port)
        a.start(path="/policies/p1")
        b.start(path="/policies/p2")
        assert "max_policy_groups" in _refused(lambda: c.start(path="/policies/p3"), EXHAUSTED)
        a.stub.Ready(pb.Empty())  # a's session restarts with no policy: p1 is free
        c.start(path="/policies/p3")  # p1 unloaded to make room
        assert len(srv.servicer.groups) == 2 and srv.servicer.stats()["policies_unloaded"] == 1
        for i in range(20):  # many distinct policies, one after another: threads stay bounded
            c.start(path=f"/policies/many{i}")
        assert len(srv.servicer.groups) == 2
        assert threading.active_count() <= threads0 + 2 * 2 + 4
        b.stub.Ready(pb.Empty())
        c.stub.Ready(pb.Empty())
        end = time.monotonic() + 10
        while srv.servicer.groups and time.monotonic() < end:  # idle past policy_idle_s: unloaded
            time.sleep(0.2)
        assert not srv.servicer.groups
        for r in (a, b, c):
            r.close()
        served(srv.port)
    finally:
        srv.stop(0)
