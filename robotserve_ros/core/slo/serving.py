"""The SLO-aware serving core for disaggregated prefill and decode (seed 004).

Two worker slots: "prefill" (one prefill engine) and "decode" (one decode engine). The core
keeps the prefill queue, the requests whose KV is being handed over, the decode worker's
active set, and asks its prefill policy (§3.1) and decode policy (§3.2) what each worker
does next. `dispatch()` hands out items for the two slots; the worker reports back with
`complete(item, StepResult)` (or `fail`): core/contract.py's calls. `core/loop.py`'s
LiveDriver drives it live; the simulator calls the same methods on its virtual clock with
times from the profile.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..clock import Clock
from ..llm_profile import LLMProfile
from .decode import DecodePolicy
from .prefill import PrefillPolicy, select_chunks
from .request import BadPrompt, LLMRequest, Overloaded, SLODefaults, SLORequest, resolve_slo

PREFILL, DECODE = "prefill", "decode"


@dataclass
class StepResult:
    """What a worker's engine call gave back: per request id the new token(s) (prefill: one
    id, decode: a list), the ids that hit end of sequence, and the measured engine time
    (None: the time since dispatch on the core's clock)."""

    tokens: Optional[dict] = None
    eos: frozenset = frozenset()
    actual_s: Optional[float] = None


@dataclass
class PrefillItem:
    slot = PREFILL
    chunks: list            # (request, start, end)
    predicted_raw_s: float  # the profile's time before runtime correction
    dispatched_s: float

    @property
    def requests(self) -> list:
        return [c[0] for c in self.chunks]


@dataclass
class DecodeItem:
    slot = DECODE
    batch: list
    admitted: list          # requests joining the decode worker in this step (their KV to import)
    ctx: int                # the longest context in the batch: the LUT column
    predicted_s: float
    dispatched_s: float


@dataclass
class CoreStats:
    submitted: int = 0
    refused: dict = field(default_factory=dict)
    finished: int = 0
    failed: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    decode_busy_s: float = 0.0
    prefill_busy_s: float = 0.0


class SLOServingCore:
    def __init__(self, prefill_policy: PrefillPolicy, decode_policy: DecodePolicy, profile: LLMProfile, clock: Clock,
                 *, defaults: SLODefaults = SLODefaults(), max_decode_batch: int = 16, chunk_tokens: int = 0,
                 context_limit: int = 2048, max_queue: int = 100000, kv_handover_in_core: bool = True,
                 on_first_token: Optional[Callable] = None, on_done: Optional[Callable] = None) -> None:
        if max_decode_batch < 1:
            raise ValueError(f"max_decode_batch must be >= 1, got {max_decode_batch}")
        if context_limit < 2:
            raise ValueError(f"context_limit must be >= 2, got {context_limit}")
        self.prefill_policy, self.decode_policy = prefill_policy, decode_policy
        self.profile, self.clock, self.defaults = profile, clock, defaults
        self.max_decode_batch, self.chunk_tokens = int(max_decode_batch), int(chunk_tokens)
        self.context_limit, self.max_queue = int(context_limit), int(max_queue)
        # The simulator models the KV handover's time here; a live worker measures its own.
        self.kv_handover_in_core = kv_handover_in_core
        self.on_first_token, self.on_done = on_first_token, on_done
        self.lock = threading.RLock()
        self.requests: dict[str, LLMRequest] = {}
        self.prefill_queue: list[LLMRequest] = []
        self.decode_wait: list[LLMRequest] = []
        self.active: list[LLMRequest] = []
        self.prefill_busy = self.decode_busy = False
        self.stats = CoreStats()
        self._seq = itertools.count()

    slots = {PREFILL: 1, DECODE: 1}

    # --- admission ------------------------------------------------------------------------
    def submit(self, request: SLORequest) -> LLMRequest:
        """Queue one request; a RequestError (bad SLO, bad prompt, overloaded) refuses it alone."""
        with self.lock:
            try:
                return self._submit(request)
            except Exception as e:
                code = getattr(e, "code", "bad_request")
                self.stats.refused[code] = self.stats.refused.get(code, 0) + 1
                raise

    def _submit(self, q: SLORequest) -> LLMRequest:
        req_id, prompt_len, max_tokens = q.req_id, q.prompt_len, q.max_tokens
        ttft, tpot = resolve_slo(q.ttft_slo_s, q.tpot_slo_s, self.defaults)
        if not req_id or req_id in self.requests:
            raise BadPrompt(f"request id {req_id!r} is empty or already being served")
        if not isinstance(prompt_len, int) or prompt_len < 1:
            raise BadPrompt(f"the prompt must have >= 1 token, got {prompt_len!r}")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise BadPrompt(f"max_tokens must be an integer >= 0 (0 = default), got {max_tokens!r}")
        max_tokens = max_tokens or self.defaults.max_tokens
        if prompt_len + max_tokens > self.context_limit:
            raise BadPrompt(f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) is over the context "
                            f"limit of {self.context_limit}")
        if len(self.prefill_queue) >= self.max_queue:
            raise Overloaded(f"{len(self.prefill_queue)} requests already wait for prefill (max_queue)")
        r = LLMRequest(req_id, prompt_len, max_tokens, ttft, tpot, self.clock.now(), q.prompt_tokens, seq=next(self._seq))
        self.requests[req_id] = r
        self.prefill_queue.append(r)
        self.stats.submitted += 1
        return r

    # --- the two workers' next items ---------------------------------------------------------
    def dispatch(self) -> list:
        with self.lock:
            now, out = self.clock.now(), []
            if not self.prefill_busy and self.prefill_queue:
                ordered = self.prefill_policy.order(self.prefill_queue, now, self.profile.prefill)
                chunks = select_chunks(ordered, self.chunk_tokens)
                if chunks:
                    raw = sum(self.profile.prefill.chunk_s(a, b, corrected=False) for _, a, b in chunks)
                    for r, _, _ in chunks:
                        self.prefill_queue.remove(r)
                    self.prefill_busy = True
                    out.append(PrefillItem(chunks, raw, now))
            if not self.decode_busy:
                admitted = []
                for r in list(self.decode_wait):
                    if len(self.active) >= self.max_decode_batch:
                        break
                    if r.kv_ready_s is not None and r.kv_ready_s <= now + 1e-12:
                        self.decode_wait.remove(r)
                        r.admitted_s = now
                        self.active.append(r)
                        admitted.append(r)
                if self.active:
                    batch = self.decode_policy.select(self.active, now, self.profile.decode, self.max_decode_batch)
                    ctx = max(r.seq_len for r in batch)
                    self.decode_busy = True
                    out.append(DecodeItem(batch, admitted, ctx, self.profile.decode.step_s(len(batch), ctx), now))
            return out

    def next_kv_ready(self) -> Optional[float]:
        """When a handed-over request next becomes admissible (the simulator's wake-up)."""
        with self.lock:
            ts = [r.kv_ready_s for r in self.decode_wait if r.kv_ready_s is not None]
            return min(ts) if ts else None

    # --- completions --------------------------------------------------------------------------
    def complete(self, item, result: Optional[StepResult] = None) -> None:
        """A worker's step ended; `result` None: no tokens kept, timed on the core's clock."""
        result = result or StepResult()
        if isinstance(item, PrefillItem):
            self._prefill_done(item, result.tokens, result.eos, result.actual_s)
        else:
            self._decode_done(item, result.tokens, result.eos, result.actual_s)

    def fail(self, item, reason: str) -> None:
        """A worker's step raised: its requests fail (their senders get `reason`), others go on."""
        with self.lock:
            if isinstance(item, PrefillItem):
                self.prefill_busy = False
                failed = item.requests
            else:
                self.decode_busy = False
                failed = item.batch
                for r in failed:
                    if r in self.active:
                        self.active.remove(r)
            for r in failed:
                self._fail(r, reason)

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        """Its sender is gone: a queued request ends now; one inside a step ends with `reason`
        and its step's result is ignored for it. True if it was still being served."""
        with self.lock:
            r = self.requests.get(request_id)
            if r is None or r.finished or r.failed is not None:
                return False
            if r in self.active:
                self.active.remove(r)
            self._fail(r, reason)
            return True

    def _prefill_done(self, item: PrefillItem, first_tokens: Optional[dict], eos: frozenset,
                      actual_s: Optional[float]) -> None:
        with self.lock:
            now = self.clock.now()
            actual = now - item.dispatched_s if actual_s is None else actual_s
            self.profile.prefill.observe(item.predicted_raw_s, actual)
            self.stats.prefill_steps += 1
            self.stats.prefill_busy_s += actual
            self.prefill_busy = False
            for r, _, end in item.chunks:
                if r.failed is not None:
                    continue  # cancelled while its step ran
                r.prefilled = end
                if r.prefilled < r.prompt_len:
                    self.prefill_queue.append(r)
                    continue
                r.first_token_s, r.n_gen = now, 1
                if first_tokens is not None and r.req_id in first_tokens:
                    r.tokens.append(first_tokens[r.req_id])
                if self.on_first_token is not None:
                    self.on_first_token(r)
                if r.n_gen >= r.max_tokens or r.req_id in eos:
                    r.eos = r.req_id in eos
                    self._finish(r, now)
                    continue
                r.kv_ready_s = now + (self.profile.kv_handover_s(r.prompt_len) if self.kv_handover_in_core else 0.0)
                self.decode_wait.append(r)

    def _decode_done(self, item: DecodeItem, tokens: Optional[dict], eos: frozenset,
                     actual_s: Optional[float]) -> None:
        with self.lock:
            now = self.clock.now()
            actual = now - item.dispatched_s if actual_s is None else actual_s
            self.profile.decode.observe(len(item.batch), item.ctx, actual)
            self.stats.decode_steps += 1
            self.stats.decode_rows += len(item.batch)
            self.stats.decode_busy_s += actual
            self.decode_busy = False
            for r in item.batch:
                if r.finished or r.failed is not None:
                    continue
                r.n_gen += 1
                if tokens is not None and r.req_id in tokens:
                    r.tokens.extend(tokens[r.req_id])
                if r.n_gen >= r.max_tokens or r.req_id in eos:
                    r.eos = r.req_id in eos
                    self.active.remove(r)
                    self._finish(r, now)

    def close(self, reason: str = "shutting_down") -> list[LLMRequest]:
        """Fail everything not finished (the server answers them SHUTTING_DOWN)."""
        with self.lock:
            left = [r for r in self.requests.values() if not r.finished and r.failed is None]
            for r in left:
                self._fail(r, reason)
            self.prefill_queue.clear()
            self.decode_wait.clear()
            self.active.clear()
            return left

    def forget(self, req_id: str) -> None:
        """Drop a finished request's record (the live server, after answering it)."""
        with self.lock:
            r = self.requests.get(req_id)
            if r is not None and (r.finished or r.failed):
                del self.requests[req_id]

    def _finish(self, r: LLMRequest, now: float) -> None:
        r.done_s = now
        self.stats.finished += 1
        if self.on_done is not None:
            self.on_done(r)

    def _fail(self, r: LLMRequest, reason: str) -> None:
        if r.finished or r.failed is not None:
            return
        r.failed = reason
        for q in (self.prefill_queue, self.decode_wait):
            if r in q:
                q.remove(r)
        self.stats.failed += 1
        if self.on_done is not None:
            self.on_done(r)

    # --- what the server shows ---------------------------------------------------------------
    def snapshot(self) -> dict:
        with self.lock:
            s = self.stats
            return {"prefill_queue": len(self.prefill_queue), "kv_handover": len(self.decode_wait),
                    "decode_active": len(self.active), "submitted": s.submitted, "finished": s.finished,
                    "failed": s.failed, "refused": dict(s.refused), "prefill_steps": s.prefill_steps,
                    "decode_steps": s.decode_steps,
                    "mean_decode_batch": s.decode_rows / s.decode_steps if s.decode_steps else 0.0,
                    "prefill_ratio": self.profile.prefill.ratio}
