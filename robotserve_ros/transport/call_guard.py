"""No client can hold a gRPC server's workers: a server interceptor both gRPC servers
(lerobot-server, gpu-server) install.

grpc's synchronous server waits for a unary call's request message on a pool worker,
before any handler (or any authentication in a handler) runs; a client that opens calls and
never sends their message takes every worker (issue 29: ~32 stalled `Ready` calls starved
every robot; unauthenticated streams held the gpu-server's workers before the token check).
So, for every method:

- authentication (`authorize`, from the metadata) is checked in the interceptor, before a
  worker is given the call; a refused call is answered by a handler that never reads;
- each call is a stream-request handler here, so the worker runs our code at once: a
  peer with `max_calls_per_peer` calls in flight is refused at once (RESOURCE_EXHAUSTED);
- a call whose request has not arrived after `grace_s` (a good client sends it with the
  call) needs one of `receive_slots`, or is cancelled;
- with `identify`, a token holder with `max_calls_per_token` calls in flight is refused too
  (one holder's calls cannot take every worker from another's); one holding a slot is cancelled when
  `receive_timeout_s` (unary) or `stream_timeout_s` (a client stream) has passed;
- the total in flight is grpc's own `maximum_concurrent_rpcs` (`max_calls`, set by the server).

A peer is what grpc reports (`ipv4:ADDR:PORT`): one connection. Counts: `counts`.
A response-streaming method would leave the in-flight counts when its generator is
returned, not when it ends: neither server has one.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import grpc


@dataclass(frozen=True)
class GuardLimits:
    receive_timeout_s: float = 5.0  # a unary call's request must have arrived by then
    stream_timeout_s: float = 10.0  # a client stream must have ended by then
    max_calls_per_peer: int = 8  # calls in flight from one connection
    max_calls_per_token: int = 4  # calls in flight per token holder (with `identify`): fair share of the workers
    max_calls: int = 64  # calls in flight in total (grpc's maximum_concurrent_rpcs)
    receive_slots: int = 4  # calls still waiting for their request after grace_s, at once
    grace_s: float = 0.1  # a good client's request arrives with its call

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{f.name} must be > 0, got {v!r}")
            if f.type == "int" and not isinstance(v, int):
                raise ValueError(f"{f.name} must be an integer > 0, got {v!r}")


def _deny(code: grpc.StatusCode, message: str):
    """A handler that answers at once and never waits for the request (stream-request)."""

    def behavior(request_iterator, context):
        context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(behavior)


class _Watch:
    """One call waiting for its request. `ended` is set without the guard's lock (a plain
    attribute store): the client stream's generator may be finalised by the garbage collector
    on whatever thread runs it, the one holding the lock included, so its `finally` must not
    take the lock (a non-reentrant lock taken twice by one thread hangs every call after it).
    The watch loop and the call's own end (`_done`) retire an ended watch under the lock."""
    __slots__ = ("grace_end", "end", "context", "slot", "cut", "ended")

    def __init__(self, grace_end: float, end: float, context) -> None:
        self.grace_end, self.end, self.context, self.slot, self.cut = grace_end, end, context, False, None
        self.ended = False


class CallGuard(grpc.ServerInterceptor):
    """See the module docstring. `identify(metadata)`: the caller's token holder, or None to
    refuse the call (UNAUTHENTICATED); None for `identify`: every call, no holders."""

    def __init__(self, limits: GuardLimits = GuardLimits(), identify: Optional[Callable] = None,
                 counts: Optional[Counter] = None, tick_s: float = 0.05) -> None:
        self.limits, self.identify = limits, identify
        self.counts = counts if counts is not None else Counter()
        self.lock = threading.Lock()
        self.in_flight: Counter = Counter()  # ("peer", peer) / ("token", holder) -> calls
        self.watches: set = set()
        self.slots_used = 0
        self._denied = _deny(grpc.StatusCode.UNAUTHENTICATED,
                             "missing or wrong token (metadata 'authorization: Bearer <token>')")
        self._stop = threading.Event()
        self._tick = tick_s
        self._t = threading.Thread(target=self._watch_loop, name="call-guard", daemon=True)
        self._t.start()

    def close(self) -> None:
        self._stop.set()

    # --- the interceptor (grpc's polling thread: cheap, never blocks) ------------------------
    def intercept_service(self, continuation, details):
        holder = None
        if self.identify is not None:
            holder = self.identify(details.invocation_metadata or ())
            if holder is None:
                with self.lock:
                    self.counts["unauthenticated"] += 1
                return self._denied
        h = continuation(details)
        if h is None:
            return None
        if h.request_streaming:
            inner = h.stream_unary or h.stream_stream
            timeout = self.limits.stream_timeout_s
        else:
            inner = h.unary_unary or h.unary_stream
            timeout = self.limits.receive_timeout_s
        behavior = self._guarded(inner, h.request_streaming, timeout, holder)
        make = grpc.stream_stream_rpc_method_handler if h.response_streaming else grpc.stream_unary_rpc_method_handler
        return make(behavior, request_deserializer=h.request_deserializer, response_serializer=h.response_serializer)

    # --- in the worker ------------------------------------------------------------------------
    def _guarded(self, inner, streaming: bool, timeout: float, holder):
        lim = self.limits

        def behavior(request_iterator, context):
            peer = context.peer()
            keys = [("peer", peer)] + ([("token", holder)] if holder is not None else [])
            with self.lock:
                full = [k for k in keys if self.in_flight[k] >= (lim.max_calls_per_peer if k[0] == "peer"
                                                                  else lim.max_calls_per_token)]
                if full:
                    self.counts[f"{full[0][0]}_calls_refused"] += 1
                else:
                    for k in keys:
                        self.in_flight[k] += 1
            if full:
                name = "max_calls_per_peer" if full[0][0] == "peer" else "max_calls_per_token"
                where = "on this connection" if full[0][0] == "peer" else "for this token"
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{getattr(lim, name)} calls already in flight "
                              f"{where} ({name}); retry when one ends")
            now = time.monotonic()
            w = _Watch(now + self.limits.grace_s, now + timeout, context)
            with self.lock:
                self.watches.add(w)
            try:
                if streaming:
                    return inner(self._receiving(request_iterator, w), context)
                try:
                    request = next(request_iterator)
                except StopIteration:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
                except Exception:  # noqa: BLE001 - cancelled: by us (w.cut) or by the client
                    self._cut(w, context)
                    raise
                self._done(w)
                return inner(request, context)
            finally:
                self._done(w)
                with self.lock:
                    for k in keys:
                        self.in_flight[k] -= 1
                        if not self.in_flight[k]:
                            del self.in_flight[k]

        return behavior

    @staticmethod
    def _receiving(it, w: _Watch):
        """The client stream, watched until it ends (or the handler stops reading it). Its
        `finally` takes no lock (see _Watch): it only marks the watch ended."""
        try:  # cut by the guard, the read fails: the handler answers as for any broken stream
            for item in it:
                yield item
        finally:
            w.ended = True

    def _cut(self, w: _Watch, context) -> None:
        """The read failed: say why if it was the guard (the call is cancelled already)."""
        if w.cut is not None:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED if w.cut == "receive_timeouts"
                          else grpc.StatusCode.RESOURCE_EXHAUSTED, f"request not received in time ({w.cut})")

    def _done(self, w: _Watch) -> None:
        with self.lock:
            if w in self.watches:
                self.watches.discard(w)
                if w.slot:
                    self.slots_used -= 1

    def _watch_loop(self) -> None:
        while not self._stop.wait(self._tick):
            now, cut = time.monotonic(), []
            with self.lock:
                for w in list(self.watches):
                    if w.ended:  # its stream ended (or was dropped): nothing left to watch
                        self.watches.discard(w)
                        if w.slot:
                            self.slots_used -= 1
                        continue
                    if not w.slot and now >= w.grace_end:
                        if self.slots_used < self.limits.receive_slots:
                            w.slot = True
                            self.slots_used += 1
                        else:
                            w.cut = "receive_slots_full"
                    if w.slot and now >= w.end:
                        w.cut = "receive_timeouts"
                    if w.cut is not None:
                        self.watches.discard(w)
                        if w.slot:
                            self.slots_used -= 1
                        self.counts[w.cut] += 1
                        cut.append(w)
            for w in cut:  # frees the worker: the read it waits in fails
                w.context.cancel()

    def stats(self) -> dict:
        with self.lock:
            return {"calls_in_flight": sum(v for (kind, _), v in self.in_flight.items() if kind == "peer"),
                    "receiving": len(self.watches),
                    "receive_slots_used": self.slots_used}
