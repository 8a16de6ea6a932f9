"""The live path of the VLM serving core: VLMCore's steps driven by core/loop.py's LiveDriver.

Slots are the scheduler's workers (`front` + `decode` for Nova's pipeline, one `worker` for
the sequential baselines); `execute(op)` is the engine side (it applies the op's partition
share on its own thread, then runs the stage). One bad op fails only its requests.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from ..loop import LiveDriver
from .serving import Op, VLMCore, VLMRequest


class NovaServer:
    def __init__(self, core: VLMCore, execute: Callable[[Op], None],
                 on_done: Optional[Callable[[VLMRequest], None]] = None) -> None:
        self.core, self.execute = core, execute
        self._events: dict = {}  # rid -> (request, event) until answered
        self._user_done = on_done
        self._lock = threading.Lock()
        self.errors = 0
        core.on_done = self._done
        self.driver = LiveDriver.for_core(core, self._run, on_crash=self._crash, poll_s=0.02, name="nova")

    def start(self) -> "NovaServer":
        self.driver.start()
        return self

    def submit(self, req: VLMRequest) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            if req.rid in self._events:
                raise ValueError(f"request id {req.rid!r} is already in progress")
            self._events[req.rid] = (req, ev)
        req.arrival = None  # arrives now, on the core's clock
        try:
            self.core.submit(req)
        except Exception:
            with self._lock:
                self._events.pop(req.rid, None)
            raise
        self.driver.kick()
        return ev

    def cancel(self, req: VLMRequest, reason: str) -> None:
        self.core.cancel(req.rid, reason)
        self.driver.kick()

    def _run(self, slot, op: Op) -> None:
        self.execute(op)
        self.core.complete(op)

    def _crash(self, slot, op: Op, exc: Exception) -> None:
        self.errors += 1
        self.core.fail(op, f"{type(exc).__name__}: {exc}")

    def _done(self, req: VLMRequest) -> None:
        with self._lock:
            got = self._events.pop(req.rid, None)
        if self._user_done is not None:
            self._user_done(req)
        if got is not None:
            got[1].set()

    def close(self, reason: str = "shutting_down") -> None:
        """Stop the workers; every request still in progress ends with `error = reason`."""
        self.driver.close()
        with self._lock:
            left, self._events = list(self._events.values()), {}
        for req, ev in left:
            req.error = req.error or reason
            ev.set()
