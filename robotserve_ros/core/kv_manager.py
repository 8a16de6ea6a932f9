"""Unified KV cache manager for language requests beside actions (seed 001, OxyGen §3.2-3.3).

Model-agnostic: a request's KV cache is an opaque handle the engine made (torch tensors stay
in the engine); this module keeps the request lifecycle and the per-frame plan.

- A frame's observation is prefilled once; the action expert and that frame's language
  requests start from the same prefix KV (cross-task KV sharing, §3.2).
- Each request is a resumable state sigma = (K, y, delta) (§3.2 Eq. 7): handle, tokens,
  finished. STORE / RETRIEVE / UPDATE / REMOVE are the manager's four operations.
- Every frame, all active requests, whichever frame or robot they came from, advance
  together by up to k tokens (cross-frame continuous batching, §3.3 Alg. 1 lines 5-13); a
  finished request is removed and its KV handed back to the engine's `free` at once.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .errors import BadPrompt, Overloaded, RequestError  # noqa: F401 (BadPrompt, Overloaded: this module's errors too)


class NoObservation(RequestError):
    """A language request about a frame that was never observed."""

    code = "bad_observation"


@dataclass
class LanguageState:
    """sigma_t = (K_t, y_t, delta_t) of one language request (§3.2 Eq. 7), plus bookkeeping."""

    rid: str
    task_id: str
    max_tokens: int
    prompt_tokens: int
    kv: Any = None  # the engine's handle: its KV cache and whatever it needs to resume
    kv_bytes: int = 0
    tokens: list = field(default_factory=list)  # y_t: generated token ids
    finished: bool = False  # delta_t
    reason: str = ""  # "eos", "length", "cancelled", or an error code
    error: str = ""  # the message when it ended on an error
    sent: int = 0  # tokens already handed to the request's consumer
    frames: int = 0  # frames (decode rounds) it took part in

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)


def check_context(prefix_tokens: int, prompt_tokens: int, max_tokens: int, context_limit: int) -> None:
    """BadPrompt unless prefix + prompt + output fits the model's positions."""
    if prompt_tokens < 1:
        raise BadPrompt("the language prompt is empty")
    if max_tokens < 1:
        raise BadPrompt(f"max_tokens must be >= 1, got {max_tokens}")
    need = prefix_tokens + prompt_tokens + max_tokens
    if need > context_limit:
        raise BadPrompt(f"observation prefix ({prefix_tokens} tokens) + prompt ({prompt_tokens}) + max_tokens "
                        f"({max_tokens}) = {need} is over the model's context limit of {context_limit}")


class UnifiedKVManager:
    """The request table M of §3.2 and the per-frame plan of Alg. 1.

    tokens_per_frame: k, the tokens each active request advances per frame.
    max_active: requests held at once (each holds a KV cache); more are refused (Overloaded).
    free(handle): the engine releases a request's KV; called exactly once per stored request.
    Thread-safe: the action path stores, the decode worker plans and commits.
    """

    def __init__(self, *, tokens_per_frame: int = 5, max_active: int = 64,
                 free: Optional[Callable[[Any], None]] = None) -> None:
        if int(tokens_per_frame) < 1:
            raise ValueError(f"tokens_per_frame must be >= 1, got {tokens_per_frame}")
        if int(max_active) < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        self.k, self.max_active, self._free = int(tokens_per_frame), int(max_active), free
        self._states: dict[str, LanguageState] = {}
        self._ids = itertools.count()
        self.lock = threading.RLock()
        self.counts = {"stored": 0, "finished": 0, "removed": 0, "frames": 0, "decoded_tokens": 0,
                       "batch_sum": 0}

    # --- the four operations of §3.2 -------------------------------------------------------
    def store(self, state: LanguageState) -> str:
        """STORE: persist sigma, returning its request id (sequential, §3.2)."""
        with self.lock:
            if len(self._states) >= self.max_active:
                if self._free is not None and state.kv is not None:
                    self._free(state.kv)
                raise Overloaded(f"{len(self._states)} language requests are decoding (max_active "
                                 f"{self.max_active}); try again later")
            if not state.rid:
                state.rid = f"lang-{next(self._ids)}"
            if state.rid in self._states:
                raise RequestError(f"language id {state.rid!r} is in use")
            self._states[state.rid] = state
            self.counts["stored"] += 1
            return state.rid

    def retrieve(self, rid: str) -> LanguageState:
        with self.lock:
            try:
                return self._states[rid]
            except KeyError:
                raise RequestError(f"no language request {rid!r} (finished or never started)") from None

    def update(self, rid: str, state: LanguageState) -> None:
        with self.lock:
            self.retrieve(rid)
            self._states[rid] = state

    def remove(self, rid: str, reason: str = "") -> Optional[LanguageState]:
        """REMOVE: evict the state and free its KV (at once: the memory is back after this)."""
        with self.lock:
            st = self._states.pop(rid, None)
        if st is None:
            return None
        if reason and not st.reason:
            st.reason = reason
        st.finished = True
        handle, st.kv, st.kv_bytes = st.kv, None, 0
        if self._free is not None and handle is not None:
            self._free(handle)
        with self.lock:
            self.counts["removed"] += 1
        return st

    # --- per frame (Alg. 1) ----------------------------------------------------------------
    def active(self) -> list[LanguageState]:
        with self.lock:
            return [s for s in self._states.values() if not s.finished]

    def plan_frame(self) -> list[tuple[LanguageState, int]]:
        """The frame's decode batch: every active request with the tokens it takes this frame
        (k, or fewer where its budget ends sooner). Alg. 1 lines 5-7."""
        with self.lock:
            return [(s, min(self.k, s.remaining)) for s in self._states.values() if not s.finished and s.remaining > 0]

    def commit(self, rid: str, new_tokens: list, eos_id: Optional[int] = None) -> Optional[LanguageState]:
        """UPDATE with k decoded tokens (Alg. 1 lines 10-13): append, set delta on EOS or
        length, and REMOVE a finished request. None if the request was removed meanwhile
        (cancelled while its round ran)."""
        with self.lock:
            st = self._states.get(rid)
            if st is None:
                return None
            for t in new_tokens:
                st.tokens.append(int(t))
                if eos_id is not None and int(t) == eos_id:
                    st.finished, st.reason = True, "eos"
                    break
            if not st.finished and st.remaining <= 0:
                st.finished, st.reason = True, "length"
            st.frames += 1
            self.counts["decoded_tokens"] += len(new_tokens)
            if st.finished:
                self.counts["finished"] += 1
        if st.finished:
            self.remove(rid)
        return st

    def end_frame(self, batch_size: int) -> None:
        """One decode round ran with `batch_size` requests (the average decode batch)."""
        with self.lock:
            if batch_size > 0:
                self.counts["frames"] += 1
                self.counts["batch_sum"] += batch_size

    def cancel_task(self, task_id: str, reason: str = "cancelled") -> list[LanguageState]:
        """End every request of a task (it finished or was reaped)."""
        with self.lock:
            rids = [r for r, s in self._states.items() if s.task_id == task_id]
        return [s for s in (self.remove(r, reason) for r in rids) if s is not None]

    def close(self) -> None:
        with self.lock:
            rids = list(self._states)
        for r in rids:
            self.remove(r, "shutting_down")

    # --- accounting ------------------------------------------------------------------------
    def __len__(self) -> int:
        with self.lock:
            return len(self._states)

    def kv_bytes(self) -> int:
        with self.lock:
            return sum(s.kv_bytes for s in self._states.values())

    def avg_decode_batch(self) -> float:
        with self.lock:
            f = self.counts["frames"]
            return self.counts["batch_sum"] / f if f else 0.0
