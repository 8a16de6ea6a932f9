"""The call guard (transport/call_guard.py) never hangs on itself: a client stream the handler
leaves unfinished is a suspended generator that the garbage collector may finalise on any
thread, the one holding the guard's lock included. Its `finally` used to take that
(non-reentrant) lock: the LeRobot endpoint then hung every call after ~150 refused streams."""
from __future__ import annotations

import gc
import threading
import time

import pytest

pytest.importorskip("grpc")

from robotserve_ros.transport.call_guard import CallGuard, GuardLimits  # noqa: E402


class _Context:
    """What the guard reads of a grpc ServicerContext."""

    def __init__(self) -> None:
        self.cancelled = False

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def abort(self, code, message):
        raise RuntimeError(f"{code}: {message}")

    def cancel(self) -> None:
        self.cancelled = True


def _refusing_stream_call(guard: CallGuard, kept: list):
    """A client-streaming call whose handler reads one message, refuses, and keeps the stream
    (a suspended generator) alive past its own return, as a handler that stores it would."""

    def handler(stream, context):
        next(stream)
        kept.append(stream)
        return "refused"

    behavior = guard._guarded(handler, True, guard.limits.stream_timeout_s, None)
    return behavior(iter([b"chunk0", b"chunk1", b"chunk2"]), _Context())


def _on_thread(fn, timeout_s: float = 5.0) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout_s)
    return not t.is_alive()


@pytest.mark.parametrize("finalise", ["refcount", "gc"])
def test_a_stream_finalised_by_the_thread_holding_the_lock_does_not_hang(finalise):
    guard = CallGuard(GuardLimits(), tick_s=0.01)
    try:
        kept: list = []
        assert _refusing_stream_call(guard, kept) == "refused"
        assert len(kept) == 1 and not guard.in_flight  # the call is over, its stream is not

        def finalise_under_the_lock():
            with guard.lock:  # e.g. an allocation inside the guard triggered a collection
                if finalise == "refcount":
                    kept.clear()  # the last reference: finalised here, on this thread
                else:
                    stream = kept.pop()
                    cycle = [stream]
                    cycle.append(cycle)  # only the cyclic collector can free it
                    del stream, cycle
                    gc.collect()

        assert _on_thread(finalise_under_the_lock), "the guard deadlocked on its own lock"
        # the guard goes on: new calls are accepted and counted out again
        for _ in range(3):
            assert _refusing_stream_call(guard, kept) == "refused"
        kept.clear()
        gc.collect()
        deadline = time.monotonic() + 2.0
        while guard.stats()["receiving"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert guard.stats() == {"calls_in_flight": 0, "receiving": 0, "receive_slots_used": 0}
    finally:
        guard.close()


def test_an_ended_stream_frees_its_receive_slot_and_is_never_cut():
    """A stream that ended is no longer watched: its slot frees and the deadline cannot cancel
    the handler still working on what it read."""
    guard = CallGuard(GuardLimits(grace_s=0.01, receive_slots=1, stream_timeout_s=0.2), tick_s=0.01)
    try:
        seen: dict = {}

        def handler(stream, context):
            time.sleep(0.05)  # past the grace: the watch takes the one receive slot
            seen["items"] = list(stream)  # the stream ends here
            time.sleep(0.4)  # past stream_timeout_s: an ended stream must not be cut
            seen["cancelled"] = context.cancelled
            return "ok"

        behavior = guard._guarded(handler, True, guard.limits.stream_timeout_s, None)
        assert behavior(iter([b"a", b"b"]), _Context()) == "ok"
        assert seen == {"items": [b"a", b"b"], "cancelled": False}
        assert guard.stats()["receive_slots_used"] == 0 and not guard.counts["receive_timeouts"]
    finally:
        guard.close()
