"""The LLM engine profile (pure Python), one class for every LLM scheduler: the SLO schedulers
(seed 004 §2.3, §3.1, §3.2) and the segment scheduler (seed 002 §4.4) read the same profile,
measured once by `robotserve llm-profile` (engines/llm/profile.py).

- `PrefillProfile`: whole-prompt prefill latency vs prompt tokens. A chunk of tokens
  [a, b) of a prompt costs P(b) - P(a), so attention's growth with the prefix is kept.
  A running actual/predicted ratio follows the worker's real speed (Algorithm 1 line 22).
- `DecodeLUT`: per-step decode latency vs batch size and context length (the longest in the
  batch: every row waits for it, §2.2). Bilinear between measured cells, the last slope past
  them. After each step the nearest cell's running mean of actual/predicted is updated
  (Algorithm 3 line 24), so drift on a loaded machine moves the schedule; a cell not
  observed yet takes the mean ratio of all observations.
- `LLMProfile`: both, the KV handover between a prefill and a decode engine, the batch-KV
  regather and the stop check; `prefill_s` / `step_s` / `regather_s` are the segment
  scheduler's reading of the same tables (never below the smallest measured point).

Two formats, one class: a record of `robotserve llm-profile` (profiles/smollm2_135m_llm.json):
    "llm_profile": {
      "prefill_ms": {"tokens": [16, 32, ...], "ms": [...]},           one prompt, batch 1
      "decode_step_ms": {"batch": [1, 2, 4, ...], "context": [64, 256, ...],
                         "ms": [[ms at each context] for each batch]},   one step, every row
      "regather_ms": {"batch": [...], "context": [...], "ms": [[...]]},   rebuilding the batch KV
      "stop_check_us": float, "kv_bytes_per_token": int,               when the running set changes
      "kv_handover_s_per_token": float, "kv_handover_fixed_s": float }  prefill -> decode engine
plus "engine_profile": {"batch_latency_ms": ...}, the block every profile of record carries;
and the seconds form `to_json` writes ("kind": "llm_slo_profile"; profiles/smollm2_135m_slo.json).
"""
from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence


def _pos_number(v, what: str) -> float:
    v = float(v)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a positive number, got {v!r}")
    return v


def _interp(xs: list, ys: list, x: float) -> float:
    """Piecewise-linear, extending the end segments' slopes (never below a tenth of the first point)."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0]) if xs[0] > 0 else ys[0]
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(y, 0.1 * ys[0])


class PrefillProfile:
    def __init__(self, seconds_by_tokens: Mapping, ema: float = 0.2) -> None:
        pts = sorted((int(k), _pos_number(v, f"prefill latency at {k} tokens")) for k, v in seconds_by_tokens.items())
        if not pts or pts[0][0] < 1:
            raise ValueError("a prefill profile needs latencies at >= 1 positive token counts")
        self.tokens = [p[0] for p in pts]
        self.seconds = [p[1] for p in pts]
        self.ema, self.ratio = ema, 1.0

    def raw(self, n: float) -> float:
        return 0.0 if n <= 0 else _interp(self.tokens, self.seconds, float(n))

    def chunk_s(self, start: int, end: int, corrected: bool = True) -> float:
        """Predicted time to prefill prompt tokens [start, end)."""
        if end <= start:
            return 0.0
        s = max(self.raw(end) - self.raw(start), 1e-6)
        return s * (self.ratio if corrected else 1.0)

    def predict(self, n: int) -> float:
        return self.chunk_s(0, n)

    def observe(self, predicted_raw_s: float, actual_s: float) -> None:
        """Running throughput estimate (Algorithm 1 line 22): follow actual/predicted."""
        if predicted_raw_s > 0 and actual_s > 0 and math.isfinite(actual_s):
            self.ratio += self.ema * (actual_s / predicted_raw_s - self.ratio)

    def to_json(self) -> dict:
        return {str(k): v for k, v in zip(self.tokens, self.seconds)}


class DecodeLUT:
    def __init__(self, seconds: Mapping) -> None:
        """`seconds[batch][context] = step seconds`; every batch row must have the same contexts."""
        batches = sorted(int(b) for b in seconds)
        if not batches or batches[0] < 1:
            raise ValueError("a decode LUT needs batch sizes >= 1")
        rows = {int(b): {int(c): _pos_number(s, f"decode step at batch {b}, context {c}") for c, s in row.items()}
                for b, row in seconds.items()}
        ctxs = sorted(rows[batches[0]])
        for b in batches:
            if sorted(rows[b]) != ctxs:
                raise ValueError(f"decode LUT row for batch {b} has contexts {sorted(rows[b])}, expected {ctxs}")
        if not ctxs:
            raise ValueError("a decode LUT needs >= 1 context length")
        self.batches, self.ctxs = batches, ctxs
        self.table = [[rows[b][c] for c in ctxs] for b in batches]
        self._obs: dict = {}  # (bi, ci) -> (count, mean actual/predicted)
        self._all = (0, 1.0)  # every observation: the ratio for cells not observed yet

    def raw(self, batch: int, ctx: int) -> float:
        col = [_interp(self.ctxs, row, float(ctx)) for row in self.table]
        return _interp(self.batches, col, float(batch))

    def _cell(self, batch: int, ctx: int) -> tuple:
        bi = min(range(len(self.batches)), key=lambda i: abs(self.batches[i] - batch))
        ci = min(range(len(self.ctxs)), key=lambda i: abs(self.ctxs[i] - ctx))
        return bi, ci

    def step_s(self, batch: int, ctx: int) -> float:
        """LUT[bsz, seq_len] of Algorithm 3, with the runtime correction of its cell."""
        r = self._obs.get(self._cell(batch, ctx))
        return self.raw(batch, ctx) * (r[1] if r else self._all[1])

    def observe(self, batch: int, ctx: int, actual_s: float) -> None:
        """UpdateLUT (Algorithm 3 line 24): the cell's historical mean of observed steps."""
        pred = self.raw(batch, ctx)
        if pred <= 0 or not (actual_s > 0 and math.isfinite(actual_s)):
            return
        key = self._cell(batch, ctx)
        n, m = self._obs.get(key, (0, 1.0))
        x = actual_s / pred
        self._obs[key] = (n + 1, x if n == 0 else m + (x - m) / (n + 1))
        n, m = self._all
        self._all = (n + 1, m + (x - m) / (n + 1))

    def to_json(self) -> dict:
        return {str(b): {str(c): s for c, s in zip(self.ctxs, row)} for b, row in zip(self.batches, self.table)}


def _floor_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """The segment scheduler's reading: linear, the last slope past the points, never below the
    smallest measured point under the first one (seed 002's engine only grows with the work)."""
    if len(xs) == 1:
        return float(ys[0])
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(float(y), min(ys) if x < xs[0] else 0.0, 1e-6)


class LLMProfile:
    """The engine profile of one model on one worker pair: prefill, decode LUT, KV handover,
    batch-KV regather and stop check."""

    def __init__(self, prefill_s: Mapping, decode_step_s: Mapping, kv_handover_s_per_token: float = 0.0,
                 kv_handover_fixed_s: float = 0.0, meta: Optional[dict] = None, *, regather_ms: Optional[Mapping] = None,
                 stop_check_us: float = 0.0, kv_bytes_per_token: int = 0) -> None:
        self.prefill = PrefillProfile(prefill_s)
        self.decode = DecodeLUT(decode_step_s)
        self.kv_s_per_token = max(0.0, float(kv_handover_s_per_token))
        self.kv_fixed_s = max(0.0, float(kv_handover_fixed_s))
        self.meta = dict(meta or {})
        rg = regather_ms or {}
        self.regather_batch = [float(b) for b in rg.get("batch", [])]
        self.regather_contexts = [float(c) for c in rg.get("context", [])]
        self.regather_ms = [[float(m) for m in (row if isinstance(row, list) else [row])] for row in rg.get("ms", [])]
        self.stop_check_us = float(stop_check_us)
        self.kv_bytes_per_token = int(kv_bytes_per_token)
        # the same tables in ms, as the segment scheduler reads them (memoised: it asks at every decision)
        self._prefill_ms = [1000.0 * s for s in self.prefill.seconds]
        self._step_ms = [[1000.0 * s for s in row] for row in self.decode.table]
        self._prefill_memo: dict = {}
        self._step_memo: dict = {}

    def kv_handover_s(self, tokens: int) -> float:
        return self.kv_fixed_s + self.kv_s_per_token * tokens

    def prefill_s(self, tokens: int) -> float:
        v = self._prefill_memo.get(tokens)
        if v is None:
            v = self._prefill_memo[tokens] = _floor_interp(float(tokens), self.prefill.tokens, self._prefill_ms) / 1000.0
        return v

    def step_s(self, batch: int, context: float) -> float:
        """One decode step for `batch` rows at mean context length `context` tokens (memoised
        per whole token)."""
        key = (batch, int(context))
        v = self._step_memo.get(key)
        if v is None:
            per_batch = [_floor_interp(float(key[1]), self.decode.ctxs, row) for row in self._step_ms]
            v = self._step_memo[key] = _floor_interp(float(max(batch, 1)), self.decode.batches, per_batch) / 1000.0
        return v

    def regather_s(self, batch: int, context: float = 128.0) -> float:
        """Rebuilding the batch KV for `batch` rows at mean context `context` (the copy grows
        with both)."""
        if not self.regather_ms:
            return 0.0
        xs = self.regather_contexts or [0.0]
        per_batch = [_floor_interp(float(context), xs, row) for row in self.regather_ms]
        return _floor_interp(float(max(batch, 1)), self.regather_batch, per_batch) / 1000.0

    def fresh(self) -> "LLMProfile":
        """The same measurements without runtime corrections (one per run)."""
        return LLMProfile.from_json(self.to_json())

    def to_json(self) -> dict:
        d = {"kind": "llm_slo_profile", "prefill_s": self.prefill.to_json(), "decode_step_s": self.decode.to_json(),
             "kv_handover_s_per_token": self.kv_s_per_token, "kv_handover_fixed_s": self.kv_fixed_s, "meta": self.meta}
        if self.regather_ms:
            d["regather_ms"] = {"batch": self.regather_batch, "context": self.regather_contexts, "ms": self.regather_ms}
        if self.stop_check_us or self.kv_bytes_per_token:
            d.update(stop_check_us=self.stop_check_us, kv_bytes_per_token=self.kv_bytes_per_token)
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "LLMProfile":
        """Either format: a `robotserve llm-profile` record or the seconds form of `to_json`."""
        if isinstance(d, Mapping) and "llm_profile" in d:
            return cls.from_block(d["llm_profile"], meta={k: v for k, v in d.items() if k != "llm_profile"})
        if not isinstance(d, Mapping) or d.get("kind") != "llm_slo_profile":
            kind = d.get("kind") if isinstance(d, Mapping) else type(d).__name__
            raise ValueError(f"not an LLM profile (kind {kind!r}, expected 'llm_slo_profile' or a record with an "
                             "'llm_profile' block: write one with `robotserve llm-profile`)")
        return cls(d["prefill_s"], d["decode_step_s"], d.get("kv_handover_s_per_token", 0.0),
                   d.get("kv_handover_fixed_s", 0.0), d.get("meta"), regather_ms=d.get("regather_ms"),
                   stop_check_us=d.get("stop_check_us", 0.0), kv_bytes_per_token=d.get("kv_bytes_per_token", 0))

    from_record = from_json

    @classmethod
    def from_block(cls, block: Mapping, meta: Optional[dict] = None) -> "LLMProfile":
        """An `llm_profile` block (milliseconds, tables as lists; the module docstring)."""
        try:
            pf, ds = block["prefill_ms"], block["decode_step_ms"]
            if len(pf["tokens"]) != len(pf["ms"]) or not pf["ms"]:
                raise ValueError("llm_profile.prefill_ms: tokens and ms must be non-empty lists of one length")
            if len(ds["ms"]) != len(ds["batch"]) or any(len(r) != len(ds["context"]) for r in ds["ms"]):
                raise ValueError("llm_profile.decode_step_ms.ms must be [batch][context]")
            prefill = {int(t): float(m) / 1000.0 for t, m in zip(pf["tokens"], pf["ms"])}
            step = {int(b): {int(c): float(m) / 1000.0 for c, m in zip(ds["context"], row)}
                    for b, row in zip(ds["batch"], ds["ms"])}
        except (KeyError, TypeError) as e:
            raise ValueError(f"llm_profile: missing or bad field ({e})") from None
        return cls(prefill, step, block.get("kv_handover_s_per_token", 0.0), block.get("kv_handover_fixed_s", 0.0), meta,
                   regather_ms=block.get("regather_ms"), stop_check_us=block.get("stop_check_us", 0.0),
                   kv_bytes_per_token=block.get("kv_bytes_per_token", 0))

    @classmethod
    def load(cls, path) -> "LLMProfile":
        return cls.from_json(json.loads(Path(path).read_text()))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")
