"""The LLM engine profile the segment scheduler and the simulator read (pure Python).

Format (`robotserve llm-profile` writes it; profiles/smollm2_135m_llm.json is the one of record):
    "llm_profile": {
      "prefill_ms": {"tokens": [16, 32, ...], "ms": [...]},           one prompt, batch 1
      "decode_step_ms": {"batch": [1, 2, 4, ...], "context": [64, 256, ...],
                         "ms": [[ms at each context] for each batch]},   one step, every row
      "regather_ms": {"batch": [...], "context": [...], "ms": [[...]]},   rebuilding the batch KV
                                                                        when the running set changes
      "stop_check_us": float,                                           per token
      "kv_bytes_per_token": int }
plus "engine_profile": {"batch_latency_ms": decode step ms at the reference context}, the
latency-vs-batch block every profile of record carries.
Between measured points latencies are interpolated linearly, past them extrapolated along
the last segment (prefill grows with the prompt, a step with batch and context).
"""
from __future__ import annotations

import bisect
from typing import Mapping, Sequence


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) == 1:
        return float(ys[0])
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(float(y), min(ys) if x < xs[0] else 0.0, 1e-6)


class LLMProfile:
    def __init__(self, block: Mapping) -> None:
        try:
            pf = block["prefill_ms"]
            self.prefill_tokens = [float(t) for t in pf["tokens"]]
            self.prefill_ms = [float(m) for m in pf["ms"]]
            ds = block["decode_step_ms"]
            self.batches = [float(b) for b in ds["batch"]]
            self.contexts = [float(c) for c in ds["context"]]
            self.step_ms = [[float(m) for m in row] for row in ds["ms"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"llm_profile: missing or bad field ({e})") from None
        if len(self.prefill_tokens) != len(self.prefill_ms) or not self.prefill_ms:
            raise ValueError("llm_profile.prefill_ms: tokens and ms must be non-empty lists of one length")
        if len(self.step_ms) != len(self.batches) or any(len(r) != len(self.contexts) for r in self.step_ms):
            raise ValueError("llm_profile.decode_step_ms.ms must be [batch][context]")
        rg = block.get("regather_ms") or {}
        self.regather_batch = [float(b) for b in rg.get("batch", [])]
        self.regather_contexts = [float(c) for c in rg.get("context", [])]
        self.regather_ms = [[float(m) for m in (row if isinstance(row, list) else [row])] for row in rg.get("ms", [])]
        self.stop_check_us = float(block.get("stop_check_us", 0.0))
        self.kv_bytes_per_token = int(block.get("kv_bytes_per_token", 0))
        self.block = dict(block)
        self._prefill_memo: dict = {}
        self._step_memo: dict = {}

    def prefill_s(self, tokens: int) -> float:
        v = self._prefill_memo.get(tokens)
        if v is None:
            v = self._prefill_memo[tokens] = _interp(float(tokens), self.prefill_tokens, self.prefill_ms) / 1000.0
        return v

    def step_s(self, batch: int, context: float) -> float:
        """One decode step for `batch` rows at mean context length `context` tokens (memoised
        per whole token: the scheduler asks for every waiting segment at every decision)."""
        key = (batch, int(context))
        v = self._step_memo.get(key)
        if v is None:
            per_batch = [_interp(float(key[1]), self.contexts, row) for row in self.step_ms]
            v = self._step_memo[key] = _interp(float(max(batch, 1)), self.batches, per_batch) / 1000.0
        return v

    def regather_s(self, batch: int, context: float = 128.0) -> float:
        """Rebuilding the batch KV for `batch` rows at mean context `context` (the copy grows
        with both)."""
        if not self.regather_ms:
            return 0.0
        xs = self.regather_contexts or [0.0]
        per_batch = [_interp(float(context), xs, row) for row in self.regather_ms]
        return _interp(float(max(batch, 1)), self.regather_batch, per_batch) / 1000.0

    @classmethod
    def from_record(cls, record: Mapping) -> "LLMProfile":
        if "llm_profile" not in record:
            raise ValueError("not an LLM profile: no 'llm_profile' block (write one with `robotserve llm-profile`)")
        return cls(record["llm_profile"])
