"""`robotserve gpu-server`: engines behind a gRPC service, the cloud tier of seed 000 §3.2.3.

InferBatch serves a call's requests on the hosted engine (registry name + JSON params), batched with other callers'
requests by the core's serving loop (GpuServicer: validation, deadlines, errors; transport/wire.py: versions).
Profile returns the engine profile the edge dispatcher plans with; Health answers pings (the client times them: the
measured round trip). Every call must carry `authorization: Bearer <token>` when a token is set (checked by a server
interceptor; UNAUTHENTICATED otherwise); messages are capped at max_message_bytes both ways (RESOURCE_EXHAUSTED past
it); TLS is optional (cert + key). The command line is transport/gpu_server_cli.py.
"""
from __future__ import annotations

import dataclasses
import functools
import hmac
import logging
import threading
import time
import itertools
import math
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Optional, Sequence

import grpc

from ..core.clock import WallClock
from ..core.errors import RequestError
from ..core.observation import ObservationSpec
from ..core.profile import EngineProfile
from ..core.schedulers import Scheduler, make_scheduler
from ..core.types import InferenceRequest
from ..serve import fleet_over
from . import DEFAULT_MAX_MESSAGE, TOKEN_ENV, add_arguments, channel_options, stubs, wire  # noqa: F401 (re-exported)
from .call_guard import CallGuard, GuardLimits
from .images import DecodeBudget
from .tensors import BadField, log_failure, Limits, check_rtc, check_spec, request_from_pb, result_to_pb

log = logging.getLogger("robotserve.gpu_server")


def token_holder(metadata, tokens) -> Optional[int]:
    """Which of `tokens` (its index) the call's `authorization: Bearer <t>` carries, None if
    none; each compared in constant time (no token oracle). Without tokens: 0, everyone."""
    if not tokens:
        return 0
    got = dict(metadata or ()).get("authorization", "")
    got = got.encode() if isinstance(got, str) else bytes(got)
    match = [hmac.compare_digest(got, f"Bearer {t}".encode()) for t in tokens]  # all compared
    return match.index(True) if any(match) else None


@dataclasses.dataclass
class _Call:
    """One InferBatch call's state, guarded by the fleet's lock."""

    cond: threading.Condition
    results: list
    expires_at: float = math.inf  # on the core's clock; inf: the caller set no deadline
    holder: int = 0  # the token it carried (its index): fair share between token holders
    keys: list = dataclasses.field(default_factory=list)  # its requests' task ids in the core
    n_queued: int = 0  # counted in GpuServicer.queued for its holder until it ends
    left: int = 0
    error: Optional[str] = None  # the engine failed a batch holding one of its requests
    refused: bool = False  # ... on one of its requests alone, as a bad request (INVALID_ARGUMENT)
    ended: bool = False  # answered, expired or cancelled: its tasks are gone from the core

    def live(self, now: float) -> bool:
        return not self.ended and self.error is None and now < self.expires_at


@dataclasses.dataclass
class _CallRequest(InferenceRequest):
    """A request as the core queues it: under a key unique to its call (two edge servers'
    task ids never collide, and a call's tasks are dropped with it), the request as sent
    kept for the engine (its task id keys the engine's per-task state and noise seed)."""

    call: Optional[_Call] = None
    index: int = 0
    sent: Optional[InferenceRequest] = None


class _LiveCallsFifo(Scheduler):
    """Round-robin between token holders, FIFO within each, over the requests whose call is
    still live: the edge server already ordered its batch by its own scheduler (wait ratio,
    seed 000 §3.2.2) and holds the robots' ledgers, so this server adds no policy of its
    own beyond arrival order and a fair share per token (one holder's large calls cannot
    starve another's: each batch takes each holder's oldest request in turn). A request
    whose call expired is never picked, so it cannot start past its deadline."""

    name = "fifo_live_calls"

    def __init__(self) -> None:
        self.fifo = make_scheduler("fifo")

    def select(self, pending, ctx, limit=None):
        by_holder: dict = {}
        for p in self.fifo.select([p for p in pending if p.request.call.live(ctx.now)], ctx, None):
            by_holder.setdefault(p.request.call.holder, []).append(p)
        turns = itertools.zip_longest(*by_holder.values())
        out = [p for turn in turns for p in turn if p is not None]
        return out if limit is None else out[:limit]


class _AsSent:
    """The hosted engine, fed the requests as their callers sent them."""

    def __init__(self, engine) -> None:
        self.engine, self.profile = engine, engine.profile

    def infer(self, batch):
        out = self.engine.infer([r.sent for r in batch])
        if len(out) != len(batch):  # fail the batch's calls rather than retry a broken engine
            raise RuntimeError(f"engine returned {len(out)} results for {len(batch)} requests")
        return out


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class GpuServicer:
    """The service over one engine, a codec plus a session of a one-tier Fleet (serve/): one
    slot (a model is not assumed thread-safe), batches up to the engine profile's
    saturation batch, built from the requests of every call waiting at that moment.

    InferBatch validates every request of the call (tensors.request_from_pb, and the
    engine's observation_spec where it has one) before any is queued: a bad one refuses the
    whole call with INVALID_ARGUMENT naming it, and nothing else is affected. The good ones
    are submitted one by one and the call waits for their results. A call whose deadline
    passes, or that is cancelled, has its requests that have not started dropped (counted
    `expired`); requests already running finish and their results are discarded (counted
    `discarded`). An engine failure answers the calls of that batch INTERNAL (the edge
    requeues them); any other fault is INTERNAL too, with no detail beyond the server log.
    """

    def __init__(self, engine, limits: Limits = Limits(), poll_s: float = 0.5, tokens: Sequence[str] = (),
                 max_token_requests: int = 4096) -> None:
        self.pb, _ = stubs()
        self.engine, self.limits, self.poll_s = engine, limits, poll_s
        self.tokens, self.max_token_requests = tuple(tokens), max_token_requests
        self.queued: Counter = Counter()  # requests in the core per token holder
        self.spec: Optional[ObservationSpec] = getattr(engine, "observation_spec", None)
        self.counts: Counter = Counter()
        # One slot, or one per replica where the engine is a pool (`--engine ray`: transport/ray_pool.py).
        # The fleet's lock is re-entrant: a call submits all its requests under one hold, so
        # the dispatcher sees the call whole (not its first request alone in a batch of one).
        self.fleet = fleet_over(engine, _LiveCallsFifo(), WallClock(), tier="engine", serve_with=_AsSent(engine),
                                on_error=self._on_error, retry_pause_s=0.0)
        self.fleet.batch_listeners.append(self._on_batch)
        self.fleet.start()
        if hasattr(engine, "attach"):  # a pool's slots follow its running replicas
            self.fleet.attach_pool(engine, "engine")
        self.lock = self.fleet.lock
        self.session = self.fleet.session("gpu", untrimmed=True)  # the engine's full results go back
        self._ids = itertools.count()

    core = property(lambda self: self.fleet._core)  # for tests that look inside (serve/ owns it)

    def close(self) -> None:
        self.fleet.close()

    # --- InferBatch --------------------------------------------------------------------
    def InferBatch(self, request, context):
        wire.refuse_call(request, context, self.counts, "edge server")  # another wire version it cannot serve
        try:
            return self._infer_batch(request, context)
        except RequestError as e:
            self.counts["bad_request"] += 1
            self.session.refuse(e)
            code, msg = grpc.StatusCode.INVALID_ARGUMENT, f"{e.code}: {e.message}"
        except _Refused as e:
            code, msg = e.code, e.message
        except Exception:  # never a traceback (nor UNKNOWN) to the client
            self.counts["internal"] += 1
            log_failure(log, "InferBatch failed")
            code, msg = grpc.StatusCode.INTERNAL, "internal error (see the server log)"
        context.abort(code, msg)

    def _infer_batch(self, request, context):
        t0 = time.perf_counter()
        n, lim = len(request.requests), self.limits
        if n == 0:
            raise BadField("requests: empty batch")
        if n > lim.max_call_requests:
            raise BadField(f"requests: {n} in one call, at most {lim.max_call_requests}")
        decoded = DecodeBudget(lim.max_call_decoded_bytes, "call")
        sent = [request_from_pb(m, i, lim, self.spec, decoded) for i, m in enumerate(request.requests)]
        if self.spec is not None:
            for i, q in enumerate(sent):
                check_spec(q.observation, self.spec, i)
        for i, q in enumerate(sent):  # a leftover the engine cannot take would fail its whole batch
            check_rtc(q, self.engine, i)
        remaining = context.time_remaining()
        clock = self.fleet.clock
        call = _Call(threading.Condition(self.lock), [None] * n, left=n, holder=token_holder(context.invocation_metadata(), self.tokens) or 0)
        if remaining is not None:
            call.expires_at = clock.now() + remaining
        context.add_callback(lambda: self._end(call))  # cancelled or expired: wake and drop now
        cid = next(self._ids)
        with self.lock:
            if self.queued[call.holder] + n > self.max_token_requests:
                self.counts["token_overloaded"] += 1
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"this token has {self.queued[call.holder]} requests in flight; {n} more would pass "
                               f"max_token_requests ({self.max_token_requests}): retry when some are answered")
            self.queued[call.holder] += n
            call.n_queued = n
            try:
                for i, q in enumerate(sent):
                    key = f"call{cid}/{i}"
                    call.keys.append(key)
                    fut = self.session.submit(_CallRequest(key, 0, observation=q.observation, call=call, index=i, sent=q))
                    fut.add_done_callback(functools.partial(self._on_result, call, i))
                while call.left and call.live(clock.now()) and context.is_active():
                    call.cond.wait(max(0.0, min(call.expires_at - clock.now(), self.poll_s)))
            finally:
                self._end(call)
            if call.error is not None:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT if call.refused else grpc.StatusCode.INTERNAL, call.error)
            if call.left:
                raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed or it was cancelled")
        try:
            chunks = [result_to_pb(self.pb, q, r) for q, r in zip(sent, call.results)]
        except Exception:  # the engine's output, not the caller's input, is at fault
            self.counts["engine_failure"] += 1
            log_failure(log, "engine results cannot be sent")
            raise _Refused(grpc.StatusCode.INTERNAL, "engine results cannot be sent (see the server log)") from None
        return self.pb.InferBatchReply(chunks=chunks, engine_s=time.perf_counter() - t0)

    def _end(self, call: _Call) -> None:
        """The call is over: its tasks leave the core (the ledger does not grow), the
        requests that never started are counted as expired."""
        with self.lock:
            if call.ended:
                return
            call.ended = True
            self.queued[call.holder] -= call.n_queued
            for key in call.keys:
                if call.error is None and self.fleet.queued(key):
                    self.counts["expired"] += 1
                self.fleet.drop(key, "task_dropped", "the call ended")
            call.cond.notify_all()
        if call.left and call.error is None:
            self.counts["expired_calls"] += 1

    # --- the fleet's callbacks (under its lock) -----------------------------------------
    def _on_result(self, call: _Call, i: int, fut) -> None:
        """A request's future: the engine's full result, untrimmed (or an error: the call ended)."""
        if fut.exception() is not None or call.ended or call.results[i] is not None:
            return
        call.results[i] = fut.result()
        call.left -= 1
        if not call.left:
            call.cond.notify_all()

    def _on_batch(self, _replies, dispatch, results) -> None:
        self.counts["batches"] += 1
        self.counts["requests"] += len(results)
        self.counts["discarded"] += sum(1 for p in dispatch.requests if p.request.call.ended)

    def _on_error(self, dispatch, exc: Exception) -> None:
        """The engine failed these requests (the Runner has carved out the ones that failed
        alone, so a batch-mate from another call is not among them): their calls fail."""
        refused = isinstance(exc, RequestError)
        self.counts["bad_request" if refused else "engine_failure"] += 1
        log.error("engine failed on %d request(s): %r", len(dispatch.requests), exc)
        with self.lock:
            for p in dispatch.requests:
                call = p.request.call
                if not call.ended and call.error is None:
                    call.refused = refused
                    call.error = (f"requests[{p.request.index}]: {exc.code}: {exc.message}" if refused
                                  else "engine failed on the batch (see the server log)")
                    call.cond.notify_all()

    def Profile(self, request, context):
        prof: EngineProfile = self.engine.profile
        return self.pb.ProfileReply(
            engine=getattr(self.engine, "name", "?"),
            batch_sizes=[int(b) for b in prof.batches],
            latency_ms=[float(x) for x in prof.latencies_ms], **wire.versions(),
        )

    def Health(self, request, context):
        return self.pb.HealthReply(
            serving=True, engine=getattr(self.engine, "name", "?"),
            batches=self.counts["batches"], requests=self.counts["requests"],
        )


def gpu_guard_limits(workers: int, **kw) -> GuardLimits:
    """The call guard's defaults for `workers` workers: a token holder gets half of them
    (fair share), calls still waiting for their request after the grace half; a connection
    may have every call the server takes in flight (an edge server bursts on one channel)."""
    half = max(1, workers // 2)
    kw = {k: v for k, v in kw.items() if v is not None}
    return GuardLimits(**{"max_calls": 4 * workers, "max_calls_per_peer": 4 * workers, "max_calls_per_token": half,
                          "receive_slots": half, **kw})


class GpuServer:
    """A started gRPC server; `port` is the bound one (0 asks for an ephemeral port)."""

    def __init__(
        self,
        engine,
        address: str = "127.0.0.1:0",
        *,
        token=None,  # a token, or a list: one per holder (fair share between them)
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE,
        workers: int = 8,
        limits: Optional[Limits] = None,
        guard: Optional[GuardLimits] = None,
        max_token_requests: int = 4096,
    ) -> None:
        _, pb_grpc = stubs()
        limits = limits or Limits()
        # No tensor can hold more elements than the message has bytes.
        limits = dataclasses.replace(limits, max_elements=min(limits.max_elements, int(max_message_bytes)))
        tokens = [token] if isinstance(token, str) else list(token or ())
        if any(not t or t != t.strip() or "\n" in t for t in tokens):
            raise ValueError("a token must be non-empty, without spaces around it or newlines in it")
        self.servicer = GpuServicer(engine, limits, tokens=tokens, max_token_requests=max_token_requests)
        self.counts = self.servicer.counts
        # Authentication, in-flight caps and receive deadlines before any worker waits on a
        # call's request (call_guard): a stalled or unauthenticated call cannot hold one.
        guard = guard or gpu_guard_limits(workers)
        self.guard = CallGuard(guard, (lambda md: token_holder(md, tokens)) if tokens else None, self.counts)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpu-server"),
            interceptors=[self.guard],
            options=channel_options(max_message_bytes),
            maximum_concurrent_rpcs=guard.max_calls,
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
        self.guard.close()
        self.servicer.close()

    def __enter__(self) -> "GpuServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(None)
