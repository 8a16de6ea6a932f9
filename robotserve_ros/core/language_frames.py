"""The live serving core of language beside actions (seed 001 §3.3): when a decode round runs.

Cross-frame continuous batching decodes every active language request, from any frame and
any robot, k tokens per frame (core/kv_manager.py plans the round; the engine runs it). The
action chunk keeps its per-frame deadline: a decode round is dispatched only while no action
batch is in flight, and one round is short (k tokens), so an arriving action round waits at
most one round. A frame is an action round served (`frame()`); without robots a standalone
question still advances every `idle_frame_s`.

Driven by core/loop.py's LiveDriver: `dispatch()` returns at most one ("decode", frames)
item; `run` calls `decode_round()` (the engine) and `publish(results)`. Pure Python: the
engine and the publisher are callables, the clock is injected.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from .clock import Clock

SLOT = "decode"


class LanguageFrameCore:
    """has_work(): whether any language request is active; decode_round(): one batched round
    of k tokens, returning its results; publish(results): hand them to their consumers."""

    def __init__(self, clock: Clock, *, has_work: Callable[[], bool], decode_round: Callable[[], list],
                 publish: Callable[[list], None], idle_frame_s: float = 0.05,
                 kick: Optional[Callable[[], None]] = None) -> None:
        if not idle_frame_s > 0:
            raise ValueError(f"idle_frame_s must be > 0, got {idle_frame_s}")
        self.clock, self.idle_frame_s = clock, float(idle_frame_s)
        self._has_work, self._decode, self._publish, self._kick = has_work, decode_round, publish, kick
        self.lock = threading.Lock()
        self._actions_in_flight = 0
        self._frames_pending = 0
        self._decoding = False
        self._last_round = clock.now()
        self.counts = {"frames": 0, "rounds": 0, "idle_rounds": 0, "deferred_for_actions": 0}

    def set_kick(self, kick: Optional[Callable[[], None]]) -> None:
        """What wakes the loop driving this core (its driver is made after the core)."""
        self._kick = kick

    def _poke(self) -> None:
        if self._kick is not None:
            self._kick()

    # --- the action path tells the core ------------------------------------------------------
    def action_started(self) -> None:
        with self.lock:
            self._actions_in_flight += 1

    def action_ended(self) -> None:
        """An action batch was served: that is a frame for the language requests."""
        with self.lock:
            self._actions_in_flight = max(0, self._actions_in_flight - 1)
            self._frames_pending += 1
            self.counts["frames"] += 1
        self._poke()

    def frame(self) -> None:
        """A frame without an action batch (a standalone question arrived)."""
        with self.lock:
            self._frames_pending += 1
        self._poke()

    # --- LiveDriver steps -------------------------------------------------------------------
    def dispatch(self) -> list:
        with self.lock:
            if self._decoding or not self._has_work():
                return []
            now = self.clock.now()
            idle = now - self._last_round >= self.idle_frame_s
            if not self._frames_pending and not idle:
                return []
            if self._actions_in_flight:  # the action chunk's deadline first (§3.1)
                self.counts["deferred_for_actions"] += 1
                return []
            n, self._frames_pending = self._frames_pending, 0
            self._decoding = True
            if not n:
                self.counts["idle_rounds"] += 1
            return [(SLOT, n)]

    def run(self, slot, item) -> None:
        try:
            results = self._decode()
        finally:
            with self.lock:
                self._decoding = False
                self._last_round = self.clock.now()
                self.counts["rounds"] += 1
        self._publish(results)

    def next_wakeup_s(self) -> float:
        """How long until an idle round is due (the driver polls at least this often)."""
        with self.lock:
            return max(0.0, self._last_round + self.idle_frame_s - self.clock.now())
