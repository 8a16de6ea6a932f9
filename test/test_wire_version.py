"""The gRPC wire's version (transport/wire.py): a peer of another version is refused with one
line naming both versions, a peer from before versions is served (the change is additive)."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from robotserve_ros.core import EngineProfile
from robotserve_ros.core.observation import Observation
from robotserve_ros.core.types import InferenceRequest
from robotserve_ros.engines.simulated import SimulatedEngine
from robotserve_ros.transport import stubs, wire
from robotserve_ros.transport.gpu_server import GpuServer
from robotserve_ros.transport.remote_engine import RemoteEngine, RemoteEngineError
from robotserve_ros.transport.tensors import request_to_pb

pb, pb_grpc = stubs()


def test_which_peers_can_talk():
    assert wire.refusal(0, 0, "edge server") is None  # from before versions: version 1, served
    assert wire.refusal(wire.WIRE_VERSION, wire.MIN_WIRE_VERSION, "x") is None
    newer = wire.refusal(wire.WIRE_VERSION + 5, wire.WIRE_VERSION + 5, "edge server")
    assert f"wire version {wire.WIRE_VERSION + 5}" in newer and f"speaks {wire.WIRE_VERSION}" in newer


@pytest.fixture
def server():
    with GpuServer(SimulatedEngine(EngineProfile({1: 1.0}), chunk_size=4, action_dim=3), "127.0.0.1:0") as srv:
        yield srv


def call(srv, **versions):
    req = request_to_pb(pb, InferenceRequest("a", 0, observation=Observation(joints=np.zeros(3, np.float32))))
    with grpc.insecure_channel(srv.address) as ch:
        return pb_grpc.GpuServerStub(ch).InferBatch(pb.InferBatchRequest(requests=[req], **versions), timeout=10)


def test_a_server_refuses_a_caller_it_cannot_serve_and_serves_an_unversioned_one(server):
    assert len(call(server).chunks) == 1  # an edge server from before versions
    assert len(call(server, wire_version=wire.WIRE_VERSION, min_wire_version=wire.MIN_WIRE_VERSION).chunks) == 1
    v = wire.WIRE_VERSION + 1
    with pytest.raises(grpc.RpcError) as e:
        call(server, wire_version=v, min_wire_version=v)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"wire version {v}" in e.value.details() and f"speaks {wire.WIRE_VERSION}" in e.value.details()
    assert server.counts["wire_version"] == 1 and server.counts["requests"] == 2


def test_an_edge_refuses_a_gpu_server_that_cannot_serve_it(monkeypatch):
    from robotserve_ros.transport.gpu_server import GpuServicer

    def unversioned_profile(self, request, context):  # a GPU server from before versions (version 1)
        return pb.ProfileReply(engine="old", batch_sizes=[1], latency_ms=[1.0])

    monkeypatch.setattr(GpuServicer, "Profile", unversioned_profile)
    with GpuServer(SimulatedEngine(EngineProfile({1: 1.0})), "127.0.0.1:0") as srv:
        RemoteEngine(address=srv.address, ping_interval_s=0).close()  # version 1 is served by this edge
        monkeypatch.setattr(wire, "MIN_WIRE_VERSION", 2)  # an edge that no longer talks to version 1
        with pytest.raises(RemoteEngineError) as e:
            RemoteEngine(address=srv.address, ping_interval_s=0)
    assert "speaks wire version 1" in str(e.value) and f"this one speaks {wire.WIRE_VERSION}" in str(e.value)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
