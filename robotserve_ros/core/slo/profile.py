"""Measured engine profiles the SLO schedulers predict with (seed 004 §2.3, §3.1, §3.2).

- `PrefillProfile`: whole-prompt prefill latency vs prompt tokens. A chunk of tokens
  [a, b) of a prompt costs P(b) - P(a), so attention's growth with the prefix is kept.
  A running actual/predicted ratio follows the worker's real speed (Algorithm 1 line 22).
- `DecodeLUT`: per-step decode latency vs batch size and context length (the longest in the
  batch: every row waits for it, §2.2). Bilinear between measured cells, the last slope past
  them. After each step the nearest cell's running mean of actual/predicted is updated
  (Algorithm 3 line 24), so drift on a loaded machine moves the schedule; a cell not
  observed yet takes the mean ratio of all observations.
"""
from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Mapping, Optional


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


class LLMProfile:
    """The engine profile of one model on one worker pair: prefill, decode LUT, KV handover."""

    def __init__(self, prefill_s: Mapping, decode_step_s: Mapping, kv_handover_s_per_token: float = 0.0,
                 kv_handover_fixed_s: float = 0.0, meta: Optional[dict] = None) -> None:
        self.prefill = PrefillProfile(prefill_s)
        self.decode = DecodeLUT(decode_step_s)
        self.kv_s_per_token = max(0.0, float(kv_handover_s_per_token))
        self.kv_fixed_s = max(0.0, float(kv_handover_fixed_s))
        self.meta = dict(meta or {})

    def kv_handover_s(self, tokens: int) -> float:
        return self.kv_fixed_s + self.kv_s_per_token * tokens

    def fresh(self) -> "LLMProfile":
        """The same measurements without runtime corrections (one per run)."""
        return LLMProfile.from_json(self.to_json())

    def to_json(self) -> dict:
        return {"kind": "llm_slo_profile", "prefill_s": self.prefill.to_json(), "decode_step_s": self.decode.to_json(),
                "kv_handover_s_per_token": self.kv_s_per_token, "kv_handover_fixed_s": self.kv_fixed_s,
                "meta": self.meta}

    @classmethod
    def from_json(cls, d: Mapping) -> "LLMProfile":
        if d.get("kind") != "llm_slo_profile":
            raise ValueError(f"not an LLM SLO profile (kind {d.get('kind')!r}, expected 'llm_slo_profile')")
        return cls(d["prefill_s"], d["decode_step_s"], d.get("kv_handover_s_per_token", 0.0),
                   d.get("kv_handover_fixed_s", 0.0), d.get("meta"))

    @classmethod
    def load(cls, path) -> "LLMProfile":
        return cls.from_json(json.loads(Path(path).read_text()))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")
