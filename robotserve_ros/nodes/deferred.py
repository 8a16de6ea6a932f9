"""Deferred service replies: a call whose answer comes later holds no executor thread.

rclpy's executors call `service.send_response(response, header)` with whatever the callback
returned. A callback that defers its answer returns the response object it was given after
registering it here; the executor's send_response call then only records the request header,
and the reply goes out when `finish` is called (from any thread: an engine thread, a timer).
Whichever of the two comes second sends. rclpy Kilted has no deferred-response API of its
own, and its coroutine callbacks are no substitute here: its Python executors resume every
waiting coroutine on every spin (a busy loop), and its EventsExecutor deadlocks when a reply
is sent from another thread (measured, docs/scale.md).

`queued_requests` / `queued_messages` take what is already queued on a service or
subscription from inside its callback: rclpy's executors rebuild their whole wait set in Python
for every single request or message they dispatch (half the server's CPU, docs/scale.md), so
a burst (a light fleet's progress slice, several robots' rounds in one control tick) is taken in
one wake-up instead of one wake-up each."""
from __future__ import annotations

import threading

DRAIN_LIMIT = 64  # taken per callback at most: timers and other entities still get their turn
_resolving = threading.local()  # resolve_queued_responses is running in this thread


class DeferredReplies:
    """Replies of one rclpy Service that may be sent after its callback returned."""

    def __init__(self, service) -> None:
        self._send = service.send_response  # the bound method: the real send
        self._lock = threading.Lock()
        self._slots: dict = {}  # id(response) -> [header or None, finished]
        self.unsent = 0  # replies whose service was gone by the time they were ready
        service.send_response = self._executor_send  # what the executor calls after the callback

    def defer(self, response) -> None:
        """In the callback, before returning `response`: its reply is sent by finish()."""
        with self._lock:
            self._slots[id(response)] = [None, False]

    def finish(self, response) -> None:
        """`response` is filled in: send it now if its header is known, else when it is."""
        with self._lock:
            slot = self._slots.get(id(response))
            if slot is None:
                return
            slot[1] = True
            header = slot[0]
            if header is not None:
                del self._slots[id(response)]
        if header is not None:
            self._sent(response, header)

    def pending(self) -> int:
        with self._lock:
            return len(self._slots)

    def _executor_send(self, response, header) -> None:
        with self._lock:
            slot = self._slots.get(id(response))
            if slot is not None:
                slot[0] = header
                if not slot[1]:
                    return  # not finished yet: finish() sends it
                del self._slots[id(response)]
        self._sent(response, header)

    def _sent(self, response, header) -> None:
        try:
            self._send(response, header)
        except Exception:  # the service was destroyed meanwhile (deactivate, shutdown): the robot re-sends
            self.unsent += 1


def queued_requests(service, limit: int = DRAIN_LIMIT):
    """(request, header) of the calls already waiting on `service` (rclpy Service), up to
    `limit`; answer each with service.send_response(response, header), as the executor would."""
    for _ in range(limit):
        try:
            with service.handle:
                request, header = service.handle.service_take_request(service.srv_type.Request)
        except Exception:  # destroyed meanwhile (deactivate, shutdown): nothing more to take
            return
        if header is None:
            return
        yield request, header


def queued_messages(subscription, limit: int = DRAIN_LIMIT):
    """The messages already waiting on `subscription` (rclpy Subscription), up to `limit`."""
    for _ in range(limit):
        try:
            with subscription.handle:
                got = subscription.handle.take_message(subscription.msg_type, subscription.raw)
        except Exception:  # destroyed meanwhile
            return
        if got is None:
            return
        yield got[0]


def resolve_queued_responses(client, limit: int = DRAIN_LIMIT) -> int:
    """From a done callback of one of `client`'s calls: take the replies already queued behind
    it and resolve their futures here (their done callbacks run in this thread), instead of a
    wake-up each plus one for each future's callbacks (rclpy runs them as executor tasks).
    Returns how many were resolved."""
    if getattr(_resolving, "on", False):  # called back from a future it resolves: its loop takes the rest
        return 0
    _resolving.on = True
    try:
        return _resolve(client, limit)
    finally:
        _resolving.on = False


def _resolve(client, limit: int) -> int:
    n = 0
    for _ in range(limit):
        try:
            with client.handle:
                header, response = client.handle.take_response(client.srv_type.Response)
        except Exception:  # destroyed meanwhile (the refresher reaped it)
            return n
        if header is None:
            return n
        try:
            future = client.get_pending_request(header.request_id.sequence_number)
        except KeyError:  # given up on (timed out and removed): nobody waits for it
            continue
        future.set_result(response)
        n += 1
    return n


def serve_queued(service_of, callback):
    """A service callback: `callback(request, response)` for this call, then for each call
    queued behind it on service_of() (None once withdrawn), each answered as the executor would."""
    def serve(request, response):
        out = callback(request, response)
        service = service_of()
        if service is not None:
            for req, header in queued_requests(service):
                service.send_response(callback(req, service.srv_type.Response()), header)
        return out
    return serve


def with_queued(subscription_of, callback):
    """A subscription callback: `callback(msg)` for this message, then for those queued behind it."""
    def take(msg) -> None:
        callback(msg)
        for queued in queued_messages(subscription_of()):
            callback(queued)
    return take
