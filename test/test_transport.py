"""The remote GPU server over real gRPC on 127.0.0.1 (ephemeral ports), and the netns link."""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter

import grpc
import numpy as np
import pytest

from robotserve_ros.core import EngineProfile, ServingCore, Tier, make_scheduler
from robotserve_ros.core.clock import WallClock
from robotserve_ros.core.observation import Observation
from robotserve_ros.core.types import ExecInfo, InferenceRequest
from robotserve_ros.engines import make_engine
from robotserve_ros.engines.simulated import SimulatedEngine
from robotserve_ros.transport import stubs
from robotserve_ros.transport.gpu_server import GpuServer
from robotserve_ros.transport.remote_engine import RemoteEngine, RemoteEngineError
from robotserve_ros.core.runner import Runner

TOKEN = "s3cret-token"
FAST = {1: 1.0, 2: 1.5, 4: 2.0}


def obs(i: int, side: int = 32) -> Observation:
    rng = np.random.default_rng(i)
    return Observation(images=[rng.integers(0, 255, (side, side, 3), dtype=np.uint8)],
                       joints=rng.standard_normal(6).astype(np.float32), instruction="pick", timestep=i)


@pytest.fixture
def server():
    eng = SimulatedEngine(EngineProfile(FAST), chunk_size=8, action_dim=3, updates=True)
    with GpuServer(eng, "127.0.0.1:0", token=TOKEN, max_message_bytes=256 << 10) as srv:
        yield srv


def test_round_trip_equals_local_engine(server):
    remote = make_engine("remote", None, address=server.address, token=TOKEN, ping_interval_s=0)
    try:
        assert remote.profile.to_dict() == EngineProfile(FAST).to_dict()  # fetched from the server
        batch = [InferenceRequest(f"r{i}/t", i, observation=obs(i)) for i in range(3)]
        got = remote.infer(batch)
        want = SimulatedEngine(EngineProfile(FAST), chunk_size=8, action_dim=3, updates=True).infer(batch)
        assert len(got) == 3
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.actions, w.actions)
            np.testing.assert_array_equal(g.updates, w.updates)
        assert server.counts["requests"] == 3 and server.counts["batches"] == 1
        assert remote.link.rtt_samples >= 1  # the call itself measured the round trip
    finally:
        remote.close()


def test_unauthenticated_calls_refused(server):
    with pytest.raises(RemoteEngineError) as e:
        RemoteEngine(address=server.address, token="wrong", ping_interval_s=0)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    pb, pb_grpc = stubs()
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.GpuServerStub(ch)
        for call, msg in ((stub.Health, pb.HealthRequest()), (stub.InferBatch, pb.InferBatchRequest())):
            with pytest.raises(grpc.RpcError) as e:
                call(msg, timeout=5)  # no token at all
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.counts["unauthenticated"] == 3 and server.counts["requests"] == 0


def test_oversized_and_malformed_calls_refused(server):
    remote = RemoteEngine(address=server.address, token=TOKEN, ping_interval_s=0)
    try:
        big = InferenceRequest("big", 0, observation=obs(0, side=320))  # 300 KiB > 256 KiB limit
        with pytest.raises(RemoteEngineError) as e:
            remote.infer([big])
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        pb, _ = stubs()
        bad = pb.InferBatchRequest(requests=[pb.Request(task_id="x", round_id=0, has_observation=True)])
        bad.requests[0].observation.images.add(data=b"\0" * 10, shape=[2, 2, 3], dtype="uint8")  # 10 != 12 bytes
        with pytest.raises(grpc.RpcError) as e:
            remote.stub.InferBatch(bad, timeout=5, metadata=remote._meta)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "12" in e.value.details()
        bad.requests[0].observation.images[0].dtype = "object"
        with pytest.raises(grpc.RpcError) as e:
            remote.stub.InferBatch(bad, timeout=5, metadata=remote._meta)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "object" in e.value.details()
        assert server.counts["bad_request"] == 2
        assert len(remote.infer([InferenceRequest("ok", 0, observation=obs(1))])) == 1  # still serving
    finally:
        remote.close()


def test_deadline_expiry_requeues_and_late_reply_is_discarded():
    slow = SimulatedEngine(EngineProfile({1: 400.0}), chunk_size=8, action_dim=3, realtime=True)
    with GpuServer(slow, "127.0.0.1:0") as srv:
        remote = RemoteEngine(address=srv.address, deadline_s=0.1, ping_interval_s=0)
        edge = SimulatedEngine(EngineProfile({1: 5.0}), chunk_size=8, action_dim=3, realtime=True)
        # The cloud tier first, so the one request goes there and misses its deadline.
        tiers = [Tier("cloud", remote.profile, max_batch=1), Tier("edge", edge.profile, max_batch=1)]
        core = ServingCore(make_scheduler("fifo"), tiers, WallClock())
        lock, replies, done = threading.Lock(), [], threading.Event()
        first = {}

        def on_replies(rs, _d, _res):
            replies.extend(rs)
            done.set()

        runner = Runner(core, {"cloud": remote, "edge": edge}, on_replies, lock=lock, retry_pause_s=1.0,
                        on_error=lambda d, e: first.setdefault("dispatch", d)).start()
        try:
            runner.submit(InferenceRequest("robot/t", 0, observation=obs(0)))
            assert done.wait(5.0)
            time.sleep(0.5)  # the server finishes the timed-out batch meanwhile: nothing more arrives
            assert [(r.task_id, r.round_id, r.tier) for r in replies] == [("robot/t", 0, "edge")]
            assert core.stats.requeued == 1 and runner.failures["cloud"] == 1
            assert srv.counts["requests"] == 1  # the server did run it: only its reply was lost
            # A late reply for the requeued batch (as a slow transport would bring it) is dropped.
            late = edge.infer([first["dispatch"].requests[0].request])
            assert runner.finish(first["dispatch"], late, core.clock.now()) is False
            assert runner.late_replies == 1 and len(replies) == 1 and core.stats.completed == 1
        finally:
            runner.close()
            remote.close()


def test_failed_server_requests_served_elsewhere_once():
    """Kill the remote server under load: every round is answered exactly once."""
    eng = SimulatedEngine(EngineProfile({1: 20.0, 4: 30.0}), chunk_size=8, action_dim=3, realtime=True)
    srv = GpuServer(eng, "127.0.0.1:0")
    remote = RemoteEngine(address=srv.address, deadline_s=1.0, ping_interval_s=0)
    edge = SimulatedEngine(EngineProfile({1: 20.0, 4: 30.0}), chunk_size=8, action_dim=3, realtime=True)
    tiers = [Tier("edge", edge.profile, max_batch=2), Tier("cloud", remote.profile, max_batch=4)]
    core = ServingCore(make_scheduler("fifo"), tiers, WallClock())
    lock, got = threading.Lock(), Counter()
    cond = threading.Condition(lock)

    def on_replies(rs, _d, _res):
        for r in rs:
            got[(r.task_id, r.round_id)] += 1
            got[r.tier] += 1
        cond.notify_all()

    runner = Runner(core, {"edge": edge, "cloud": remote}, on_replies, lock=lock, retry_pause_s=0.2).start()
    n_tasks, rounds = 6, 6
    try:
        for k in range(rounds):
            for i in range(n_tasks):
                info = None if k == 0 else ExecInfo(time.monotonic(), 0, 10.0)
                runner.submit(InferenceRequest(f"t{i}", k, info))
            if k == 2:
                srv.stop(None)  # mid-run: batches in flight there fail
            with cond:
                assert cond.wait_for(lambda: all(got[(f"t{i}", k)] for i in range(n_tasks)), 10.0)
    finally:
        runner.close()
        remote.close()
    assert all(got[(f"t{i}", k)] == 1 for i in range(n_tasks) for k in range(rounds))
    assert core.stats.completed == n_tasks * rounds and got["cloud"] > 0 and got["edge"] > 0
    assert runner.failures["cloud"] >= 1 and core.stats.requeued >= 1  # the kill did cost batches


def test_call_across_veth_tbf_and_relay_pays_the_configured_delay(tmp_path):
    """Two namespaces, veth + tbf, the GPU server on one side and the delaying relay on the
    other: a Health round trip through the relay is slower than the direct one by at least
    the relay's 2 x one-way delay."""
    import sys

    from robotserve_ros.net.netns import NetnsLink, netns_available

    why = netns_available()
    if why:
        pytest.skip(why)
    delay = 0.04  # one way: +80 ms per round trip
    with NetnsLink(rate_mbit=100) as link:
        ready = tmp_path / "ready"
        link.popen("b", [sys.executable, "-m", "robotserve_ros.transport.gpu_server_cli", "--address", f"{link.addr_b}:50061",
                         "--latency-ms", "1", "1", "1", "1", "1", "--ready-file", str(ready)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < end, "gpu-server did not start"
            time.sleep(0.05)
        probe = f"""
import json, statistics
from robotserve_ros.net.relay import DelayRelay
from robotserve_ros.transport.remote_engine import RemoteEngine
def med(addr):
    eng = RemoteEngine(address=addr, ping_interval_s=0, connect_timeout_s=10)
    rtts = [eng.ping() for _ in range(6)][1:]
    eng.close()
    return statistics.median(rtts)
with DelayRelay("127.0.0.1:0", "{link.addr_b}:50061", {delay}) as relay:
    print(json.dumps({{"direct": med("{link.addr_b}:50061"), "relayed": med(relay.address), "conns": relay.connections}}))
"""
        r = link.run("a", [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        got = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert got["conns"] >= 1
    assert got["relayed"] - got["direct"] >= 2 * delay, got
    assert shutil.which("ip") and link.ns_a not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_relay_closes_quietly_with_a_connection_open():
    """close() lets the relay's open connections unwind: no 'Task was destroyed but it is
    pending', no unclosed sockets or loop (run in a child so GC-time warnings are seen)."""
    import sys

    probe = """
import socket, threading, warnings, gc
warnings.simplefilter("always")
from robotserve_ros.net.relay import DelayRelay
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
def echo():
    c, _ = srv.accept()
    with c:
        while (d := c.recv(100)):
            c.sendall(d)
threading.Thread(target=echo, daemon=True).start()
r = DelayRelay("127.0.0.1:0", f"127.0.0.1:{srv.getsockname()[1]}", 0.01)
s = socket.create_connection(("127.0.0.1", r.port))
s.sendall(b"hi")
assert s.recv(10) == b"hi"
r.close()
del r
gc.collect()
s.close(); srv.close()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    assert r.stderr == "", r.stderr[-2000:]
