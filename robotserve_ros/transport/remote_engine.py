"""RemoteEngine: a core.Engine whose batches run on a `robotserve gpu-server` (gRPC).

Its profile is fetched from the server (Profile). Each call carries the token and a
deadline; a failure or an expired deadline raises RemoteEngineError (the caller requeues
the batch: ServingCore.requeue) and marks the link down until a ping answers again. The
link's round trip and bandwidth are measured as it runs (core.placement.LinkEstimate):
Health pings every ping_interval_s, and every call's wall time minus the server's engine
time, against the bytes it moved.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import grpc

from ..core.engine import Engine
from ..core.placement import LinkEstimate, payload_bytes
from ..core.profile import EngineProfile
from ..core.types import ChunkResult, InferenceRequest
from . import DEFAULT_MAX_MESSAGE, channel_options, stubs, wire
from .tensors import request_to_pb, result_from_pb

log = logging.getLogger("robotserve.remote_engine")


# What the GPU server answers when a request of the call (not the server) is at fault: the
# Runner then looks for that row instead of requeueing the batch elsewhere (core/runner.py).
ROW_FAULT_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL,
                             grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.FAILED_PRECONDITION})


class RemoteEngineError(RuntimeError):
    """The remote tier did not serve the batch (unreachable, deadline, refused, failed).
    `tier_failure`: the server or the link failed, not a request of the batch."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.code = code
        self.tier_failure = code not in ROW_FAULT_CODES


class RemoteEngine(Engine):
    name = "remote"
    # The guide goes with the request (tensors.request_to_pb); the remote engine's reply says
    # whether it inpainted (rtc_delay_steps), so an engine there without RTC reports none.
    supports_rtc = True

    def __init__(
        self,
        profile: Optional[EngineProfile] = None,
        *,
        address: str,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        root_cert: Optional[str] = None,
        server_name: Optional[str] = None,
        deadline_s: float = 2.0,
        connect_timeout_s: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE,
        ping_interval_s: float = 1.0,
        link: Optional[LinkEstimate] = None,
        clock=time.monotonic,
        image_transport: str = "raw",
        image_quality: int = 90,
    ) -> None:
        self.pb, pb_grpc = stubs()
        # jpeg/png: cameras cross the link compressed (transport/images.py), where bandwidth matters most
        self.image_transport, self.image_quality = image_transport, int(image_quality)
        if token is None and token_file:
            token = Path(token_file).read_text().strip()
        self.address, self.deadline_s = address, float(deadline_s)
        self._meta = (("authorization", f"Bearer {token}"),) if token else ()
        opts = channel_options(max_message_bytes)
        if root_cert:
            creds = grpc.ssl_channel_credentials(root_certificates=Path(root_cert).read_bytes())
            if server_name:
                opts.append(("grpc.ssl_target_name_override", server_name))
            self.channel = grpc.secure_channel(address, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = pb_grpc.GpuServerStub(self.channel)
        self.link = link or LinkEstimate()
        self._clock = clock
        self.calls = self.failures = 0
        try:
            grpc.channel_ready_future(self.channel).result(timeout=connect_timeout_s)
            rep = self.stub.Profile(self.pb.ProfileRequest(), timeout=connect_timeout_s, metadata=self._meta)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise RemoteEngineError(f"GPU server {address} not reachable within {connect_timeout_s} s") from None
        except grpc.RpcError as e:
            self.channel.close()
            raise RemoteEngineError(f"GPU server {address}: {e.code().name}: {e.details()}", e.code()) from None
        refused = wire.refusal(rep.wire_version, rep.min_wire_version, f"GPU server {address}")
        if refused is not None:  # another wire version that cannot talk to this one: both named
            self.channel.close()
            raise RemoteEngineError(refused, grpc.StatusCode.FAILED_PRECONDITION)
        self.profile = EngineProfile(dict(zip(rep.batch_sizes, rep.latency_ms)))
        self.remote_engine = rep.engine
        self._stop = threading.Event()
        self._pinger = None
        if ping_interval_s > 0:
            self.ping()
            self._pinger = threading.Thread(target=self._ping_loop, args=(ping_interval_s,), name=f"ping-{address}", daemon=True)
            self._pinger.start()

    # --- the link --------------------------------------------------------------------
    def ping(self) -> Optional[float]:
        """One Health call; its round trip goes into the link estimate. None if it failed."""
        t = time.perf_counter()
        try:
            self.stub.Health(self.pb.HealthRequest(), timeout=max(1.0, 4 * self.link.rtt_s), metadata=self._meta)
        except grpc.RpcError:
            self.link.mark_down(self._clock())
            return None
        rtt = time.perf_counter() - t
        self.link.observe_rtt(rtt)
        self.link.mark_up()
        return rtt

    def _ping_loop(self, every: float) -> None:
        while not self._stop.wait(every):
            self.ping()

    # --- Engine --------------------------------------------------------------------
    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        msg = self.pb.InferBatchRequest(requests=[request_to_pb(self.pb, r, self.image_transport, self.image_quality)
                                                  for r in batch], **wire.versions())
        self.calls += 1
        t = time.perf_counter()
        try:
            rep = self.stub.InferBatch(msg, timeout=self.deadline_s, metadata=self._meta)
        except grpc.RpcError as e:
            self.failures += 1
            err = RemoteEngineError(f"GPU server {self.address}: {e.code().name}: {e.details()}", e.code())
            if err.tier_failure:  # a refused request says nothing about the link
                self.link.mark_down(self._clock())
            raise err from None
        wall = time.perf_counter() - t
        if len(rep.chunks) != len(batch):
            raise RemoteEngineError(f"GPU server {self.address} returned {len(rep.chunks)} chunks for {len(batch)} requests")
        for q, c in zip(batch, rep.chunks):
            if c.task_id != q.task_id or c.round_id != q.round_id:
                raise RemoteEngineError(f"GPU server {self.address} answered ({c.task_id}, {c.round_id}) for ({q.task_id}, {q.round_id})")
        self.link.observe_call(msg.ByteSize() + rep.ByteSize(), wall - rep.engine_s)
        if self.image_transport != "raw":  # the placement prices requests at their compressed size
            self.link.observe_payload(msg.ByteSize(), sum(payload_bytes(r) for r in batch))
        self.link.mark_up()
        return [result_from_pb(c, i) for i, c in enumerate(rep.chunks)]

    def close(self) -> None:
        self._stop.set()
        if self._pinger is not None:
            self._pinger.join(timeout=2.0)
        self.channel.close()
