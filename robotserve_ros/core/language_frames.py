"""The live serving core of language beside actions (seed 001 §3.3): when a decode round runs.

Cross-frame continuous batching decodes every active language request, from any frame and
any robot, k tokens per frame (core/kv_manager.py plans the round; the engine runs it). The
action chunk keeps its per-frame deadline: a decode round is dispatched only while no action
batch is in flight, and one round is short (k tokens), so an arriving action round waits at
most one round. A frame is an action round served (`frame()`); without robots a standalone
question still advances every `idle_frame_s`.

The calls are core/contract.py's: `submit(request)` admits a standalone question (the
engine's `admit`) and counts as a frame; `dispatch()` returns at most one DecodeRound;
`complete(round, results)` publishes a round's results, `fail` ends a round that raised;
`cancel(rid)` drops a request (the engine's `drop`). Driven by core/loop.py's LiveDriver:
`run` is the slot's work (`decode_round()`, the engine, then `complete`). Pure Python: the
engine and the publisher are callables, the clock is injected.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .clock import Clock

SLOT = "decode"


@dataclass(frozen=True)
class LanguageRequest:
    """A standalone question (no action round carries it): about `observation`, else about
    the task's latest served frame."""

    task_id: str
    prompt: str
    max_tokens: int = 0
    observation: Any = None


@dataclass(frozen=True)
class DecodeRound:
    """One batched decode round of k tokens for every active language request."""

    frames: int  # frames since the last round (0: an idle round)
    slot: str = SLOT


class LanguageFrameCore:
    """has_work(): whether any language request is active; decode_round(): one batched round
    of k tokens, returning its results; publish(results): hand them to their consumers;
    admit(request) / drop(rid, reason): the engine's side of submit / cancel."""

    slots = {SLOT: 1}

    def __init__(self, clock: Clock, *, has_work: Callable[[], bool], decode_round: Callable[[], list],
                 publish: Callable[[list], None], idle_frame_s: float = 0.05,
                 admit: Optional[Callable[[LanguageRequest], Any]] = None,
                 drop: Optional[Callable[[str, str], Any]] = None,
                 kick: Optional[Callable[[], None]] = None) -> None:
        if not idle_frame_s > 0:
            raise ValueError(f"idle_frame_s must be > 0, got {idle_frame_s}")
        self.clock, self.idle_frame_s = clock, float(idle_frame_s)
        self._has_work, self._decode, self._publish, self._kick = has_work, decode_round, publish, kick
        self._admit, self._drop = admit, drop
        self.lock = threading.Lock()
        self._actions_in_flight = 0
        self._frames_pending = 0
        self._decoding = False
        self._last_round = clock.now()
        self.counts = {"frames": 0, "rounds": 0, "idle_rounds": 0, "deferred_for_actions": 0, "failed_rounds": 0,
                       "submitted": 0, "cancelled": 0}

    def set_kick(self, kick: Optional[Callable[[], None]]) -> None:
        """Whom to tell that work arrived (the LiveDriver built around this core)."""
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

    # --- the contract ------------------------------------------------------------------------
    def submit(self, request: LanguageRequest, then: Optional[Callable[[Any], None]] = None):
        """A standalone question: the engine admits it (its errors go to the sender) and it
        makes a frame, so it is decoded without waiting for the next action batch.
        `then(state)` runs before that frame: a caller registers its waiter there, so no
        output can come before it."""
        if self._admit is None:
            raise RuntimeError("this language core was built without an admit callable")
        state = self._admit(request)
        if then is not None:
            then(state)
        with self.lock:
            self.counts["submitted"] += 1
        self.frame()
        return state

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        if self._drop is None:
            return False
        self._drop(request_id, reason)
        with self.lock:
            self.counts["cancelled"] += 1
        return True

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
            return [DecodeRound(n)]

    def _round_ended(self) -> None:
        with self.lock:
            self._decoding = False
            self._last_round = self.clock.now()
            self.counts["rounds"] += 1

    def complete(self, item: DecodeRound, result: list) -> None:
        self._round_ended()
        self._publish(result)

    def fail(self, item: DecodeRound, reason: str) -> None:
        """The round raised: the next one may start; ending its requests is the caller's."""
        self._round_ended()
        with self.lock:
            self.counts["failed_rounds"] += 1

    def run(self, slot, item: DecodeRound) -> None:
        """The decode slot's work: the engine's round, then complete (fail, and re-raise for
        the driver's on_crash, if it raised)."""
        try:
            results = self._decode()
        except Exception as e:
            self.fail(item, f"{type(e).__name__}: {e}")
            raise
        self.complete(item, results)

    def snapshot(self) -> dict:
        with self.lock:
            return {**self.counts, "decoding": self._decoding, "frames_pending": self._frames_pending,
                    "actions_in_flight": self._actions_in_flight}
