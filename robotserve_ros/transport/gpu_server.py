"""`robotserve gpu-server`: engines behind a gRPC service, the cloud tier of seed 000 §3.2.3.

InferBatch runs one batch through the hosted engine (registry name + JSON params, as the
inference server node builds its own); Profile returns the engine profile the edge
dispatcher plans with; Health answers pings (the client times them: the measured round
trip). Every call must carry `authorization: Bearer <token>` when a token is set (checked
by a server interceptor; UNAUTHENTICATED otherwise); messages are capped at
max_message_bytes both ways (RESOURCE_EXHAUSTED past it); TLS is optional (cert + key).
"""
from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Optional

import grpc

from ..core.errors import RequestError
from ..core.profile import EngineProfile
from . import DEFAULT_MAX_MESSAGE, TOKEN_ENV, add_arguments, stubs  # noqa: F401 (re-exported)
from .tensors import request_from_pb, result_to_pb

log = logging.getLogger("robotserve.gpu_server")


def channel_options(max_message_bytes: int) -> list:
    return [
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        ("grpc.max_send_message_length", int(max_message_bytes)),
    ]


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose metadata lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str, counter: Counter) -> None:
        self._want = f"Bearer {token}".encode()
        self._counter = counter

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token (metadata 'authorization: Bearer <token>')")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        got = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(got.encode(), self._want):  # constant time: no token oracle
            return continuation(details)
        self._counter["unauthenticated"] += 1
        return self._deny


class GpuServicer:
    """The service over one engine. The engine runs one batch at a time (a model is not
    assumed thread-safe); calls queue on its lock."""

    def __init__(self, engine) -> None:
        self.pb, _ = stubs()
        self.engine = engine
        self.lock = threading.Lock()
        self.counts: Counter = Counter()

    def InferBatch(self, request, context):
        try:
            reqs = [request_from_pb(m) for m in request.requests]
        except RequestError as e:
            self.counts["bad_request"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{e.code}: {e.message}")
        if not reqs:
            self.counts["bad_request"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty batch")
        t = time.perf_counter()
        try:
            with self.lock:
                results = self.engine.infer(reqs)
        except Exception as e:  # the caller requeues; the server stays up for the next batch
            self.counts["engine_failure"] += 1
            log.exception("engine failed on a batch of %d", len(reqs))
            context.abort(grpc.StatusCode.INTERNAL, f"engine failed: {e!r}")
        engine_s = time.perf_counter() - t
        if len(results) != len(reqs):
            self.counts["engine_failure"] += 1
            context.abort(grpc.StatusCode.INTERNAL, f"engine returned {len(results)} results for {len(reqs)} requests")
        self.counts["batches"] += 1
        self.counts["requests"] += len(reqs)
        return self.pb.InferBatchReply(chunks=[result_to_pb(self.pb, q, r) for q, r in zip(reqs, results)], engine_s=engine_s)

    def Profile(self, request, context):
        prof: EngineProfile = self.engine.profile
        return self.pb.ProfileReply(
            engine=getattr(self.engine, "name", "?"),
            batch_sizes=[int(b) for b in prof.batches],
            latency_ms=[float(x) for x in prof.latencies_ms],
        )

    def Health(self, request, context):
        return self.pb.HealthReply(
            serving=True, engine=getattr(self.engine, "name", "?"),
            batches=self.counts["batches"], requests=self.counts["requests"],
        )


class GpuServer:
    """A started gRPC server; `port` is the bound one (0 asks for an ephemeral port)."""

    def __init__(
        self,
        engine,
        address: str = "127.0.0.1:0",
        *,
        token: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE,
        workers: int = 8,
    ) -> None:
        _, pb_grpc = stubs()
        self.servicer = GpuServicer(engine)
        self.counts = self.servicer.counts
        interceptors = [TokenInterceptor(token, self.counts)] if token else []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpu-server"),
            interceptors=interceptors,
            options=channel_options(max_message_bytes),
        )
        pb_grpc.add_GpuServerServicer_to_server(self.servicer, self.server)
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("TLS needs both a certificate and its key")
        if tls_cert:
            creds = grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
            self.port = self.server.add_secure_port(address, creds)
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
        self.address = f"{address.rsplit(':', 1)[0]}:{self.port}"
        self.server.start()

    def stop(self, grace: Optional[float] = 0.5) -> None:
        self.server.stop(grace).wait()

    def __enter__(self) -> "GpuServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(None)


def build_engine(name: str, params: dict, batch_sizes=None, latency_ms=None):
    from ..engines import make_engine

    profile = EngineProfile(dict(zip(batch_sizes, latency_ms))) if batch_sizes else None
    return make_engine(name, profile, **params)


def cli(a) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu-server %(levelname)s %(message)s")
    token = Path(a.token_file).read_text().strip() if a.token_file else os.environ.get(TOKEN_ENV) or None
    lat = a.latency_ms
    if lat is not None and len(lat) != len(a.batch_sizes):
        raise SystemExit("robotserve gpu-server: --latency-ms needs one value per --batch-sizes entry")
    if lat is None and a.engine == "simulated":
        from ..profiles import batch_latency_ms

        prof = batch_latency_ms("smolvla_tiny")  # a profile of record (robotserve_ros/profiles)
        a.batch_sizes, lat = list(prof), list(prof.values())
    engine = build_engine(a.engine, json.loads(a.engine_params), a.batch_sizes if lat else None, lat)
    srv = GpuServer(engine, a.address, token=token, tls_cert=a.tls_cert, tls_key=a.tls_key,
                    max_message_bytes=int(a.max_message_mb * (1 << 20)), workers=a.workers)
    log.info("serving %s on %s (%s, token %s)", a.engine, srv.address, "TLS" if a.tls_cert else "plaintext",
             "required" if token else "NOT required")
    if a.ready_file:
        Path(a.ready_file).write_text(srv.address + "\n")
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    srv.stop(1.0)
    engine.close()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="robotserve gpu-server", description=__doc__)
    add_arguments(p)
    return cli(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
