"""Batch self-consistency horizon (seed 000 §3.1 discusses and rejects self-consistency [28]
as too costly; with batching it is nearly free while the batch is below saturation).

The server adds K extra samples of a request (same observation, other noise) to the batch,
but only into spare slots: never past the engine profile's saturation batch, where each
extra row would cost latency for nothing (core/profile.py). The policy then executes the
prefix of the chunk on which the samples agree: H = the first action whose spread (RMS
distance of the samples to their mean, in action units divided by `scale`) exceeds the
threshold. A request that got no extra sample (a full batch) falls back to `fallback_h`.
Every extra row is counted (`SelfConsistencyEngine.stats`), so benchmarks charge it.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from ..engine import Engine
from ..types import ChunkResult, HorizonDecision, InferenceRequest
from .base import BadUpdates, HorizonPolicy


def extra_sample_plan(n: int, k: int, saturation_batch: int) -> list[int]:
    """Extra samples per request for a batch of n requests: up to k each, only into the slots
    between n and the saturation batch, spread evenly (earlier requests first)."""
    if n <= 0:
        return []
    spare = max(0, int(saturation_batch) - n)
    total = min(max(0, int(k)) * n, spare)
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


def sample_spread(actions: np.ndarray, samples: np.ndarray, scale=None) -> np.ndarray:
    """Per action: RMS distance of the chunks (the request's and its samples) to their mean."""
    a = np.concatenate([np.asarray(actions, np.float64)[None], np.asarray(samples, np.float64)])
    if scale is not None:
        a = a / np.asarray(scale, np.float64)
    dev = a - a.mean(axis=0, keepdims=True)
    return np.sqrt((dev ** 2).sum(-1).mean(0))


class SelfConsistencyHorizon(HorizonPolicy):
    name = "self_consistency"
    knob, knob_above = "self-consistency spread threshold", 0.0

    def __init__(self, tau: float = 10.0, h_min: int = 1, fallback_h: int | None = None, scale=None) -> None:
        self.tau = self._set_bounds(tau, h_min, fallback_h)
        self.scale = None if scale is None else np.asarray(scale, np.float64)

    def choose(self, result, param=None):
        n = len(result.actions)
        tau = self.tau if param is None else float(param)
        s = result.samples
        if s is None or len(s) == 0:
            return self.fallback(n, "no spare batch slot for extra samples")
        s = np.asarray(s, np.float64)
        a = np.asarray(result.actions)
        if s.ndim != 3 or s.shape[1:] != a.shape:
            raise BadUpdates(f"samples must be [K, {a.shape[0]}, {a.shape[1] if a.ndim == 2 else '?'}], got {s.shape}")
        if not np.all(np.isfinite(s)):
            raise BadUpdates("samples contain non-finite values")
        over = sample_spread(a, s, self.scale) > tau
        if not over.any():
            return HorizonDecision(n, f"{len(s) + 1} samples agree on all {n} actions (spread <= {tau:g})")
        first = int(np.argmax(over))
        h = self.clamp(first, n)
        return HorizonDecision(h, f"{len(s) + 1} samples disagree from A{first + 1} (spread > {tau:g}): H={h}")


@dataclasses.dataclass
class SampleStats:
    batches: int = 0
    rows: int = 0  # every row the engine ran, extra samples included
    extra_rows: int = 0
    requests: int = 0


class SelfConsistencyEngine(Engine):
    """Wrap an engine: add up to k replicas per request into the batch's spare slots below
    the saturation batch, and hand each request its replicas' chunks as `samples`."""

    def __init__(self, inner: Engine, k: int, saturation_batch: Optional[int] = None) -> None:
        if int(k) < 1:
            raise ValueError("self-consistency needs k >= 1 extra samples")
        self.inner, self.k = inner, int(k)
        self.profile = inner.profile
        self.name = f"{inner.name}+sc{self.k}"
        self.saturation_batch = int(saturation_batch or inner.profile.saturation_batch)
        if self.saturation_batch < 1:
            raise ValueError("saturation batch must be >= 1")
        self.stats = SampleStats()
        self.supports_rtc = inner.supports_rtc  # replicas keep their request's guide (dataclasses.replace)

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        batch = list(batch)
        plan = extra_sample_plan(len(batch), self.k, self.saturation_batch)
        rows, owner = list(batch), []
        for i, (req, m) in enumerate(zip(batch, plan)):
            for j in range(1, m + 1):
                rows.append(dataclasses.replace(req, sample=j))
                owner.append(i)
        res = self.inner.infer(rows)
        out = list(res[: len(batch)])
        extra: list[list] = [[] for _ in batch]
        for i, r in zip(owner, res[len(batch):]):
            extra[i].append(np.asarray(r.actions))
        for i, e in enumerate(extra):
            if e:
                out[i] = dataclasses.replace(out[i], samples=np.stack(e))
        st = self.stats
        st.batches += 1
        st.rows += len(rows)
        st.extra_rows += len(rows) - len(batch)
        st.requests += len(batch)
        return out

    def forget(self, task_id: str) -> None:
        self.inner.forget(task_id)

    def close(self) -> None:
        self.inner.close()
