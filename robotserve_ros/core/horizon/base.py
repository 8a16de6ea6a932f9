"""The HorizonPolicy role: map a generated chunk (and its denoising updates) to H."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Optional

import numpy as np

from ..types import ChunkResult, HorizonDecision


class BadUpdates(ValueError):
    """A chunk's per-step updates (or extra samples) are present but malformed: the horizon
    policy refuses them, naming what is wrong, instead of guessing an H."""


def checked_updates(result: ChunkResult) -> Optional[np.ndarray]:
    """The chunk's updates [steps, chunk, dim] as float64, None when the policy gives none
    (e.g. ACT), or BadUpdates when they are there but cannot be read."""
    u = result.updates
    if u is None:
        return None
    u = np.asarray(u, dtype=np.float64)
    n = len(result.actions)
    if u.ndim != 3 or u.shape[1] != n or u.shape[0] < 2:
        raise BadUpdates(f"updates must be [steps >= 2, chunk={n}, action_dim], got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        raise BadUpdates("updates contain non-finite values")
    return u


def knob_problem(what: str, above: float, value) -> Optional[str]:
    """The one rule of a threshold knob, for the constructor and a client's `param` alike."""
    if not math.isfinite(value) or value <= above:
        return f"{what} must be a finite number > {above:g}, got {value}"
    return None


def respect_rtc_delay(decision: HorizonDecision, d: Optional[int], n: int) -> HorizonDecision:
    """The one clamp of every horizon policy under real-time chunking: d <= s <= H - d (RTC,
    arXiv 2506.07339 §4), s the executed horizon, H = n the chunk's length, d the delay the engine
    inpainted with (None: unguided, unchanged). s >= d: the robot starts the chunk at action d,
    so s < d would execute none of it; s <= H - d: the next chunk's d frozen actions must still
    be in this one. Where both cannot hold (d > H/2), s >= d wins."""
    if d is None:
        return decision
    s = min(max(min(decision.horizon, n - d), d), n)
    if s == decision.horizon:
        return decision
    return HorizonDecision(s, f"{decision.reason}; RTC d={d}: s={s} (d <= s <= H - d, H={n})")


class HorizonPolicy(ABC):
    """Seed 000 §3.1: the policy sees the per-step per-action updates U and returns the
    execution horizon for this round. `param` is the client's knob for its request."""

    name = "?"
    # The client's knob, where the policy has one: what it is and the bound it must exceed.
    knob: Optional[str] = None
    knob_above = 0.0
    h_min = 1
    fallback_h = 1

    def check_param(self, param: Optional[float]) -> Optional[str]:
        """A problem with a client's knob, or None when it is acceptable."""
        if param is None or self.knob is None:
            return None
        return knob_problem(self.knob, self.knob_above, param)

    def _set_bounds(self, value: float, h_min: int, fallback_h: Optional[int] = None) -> float:
        """Check the constructor's knob value and h_min; keep h_min and the static fallback H
        (h_min unless given). Returns the knob's value as a float."""
        problem = knob_problem(self.knob, self.knob_above, value)
        if problem:
            raise ValueError(problem)
        if int(h_min) < 1:
            raise ValueError("h_min must be >= 1")
        self.h_min = int(h_min)
        self.fallback_h = int(fallback_h) if fallback_h is not None else self.h_min
        return float(value)

    def clamp(self, h: float, n: int) -> int:
        """H within [h_min, n], n the chunk's length."""
        return int(min(max(h, self.h_min), n))

    def fallback(self, n: int, why: str) -> HorizonDecision:
        """The static fallback H where the chunk carries nothing to judge (e.g. ACT: no updates)."""
        h = min(self.fallback_h, n)
        return HorizonDecision(h, f"{why}: static fallback H={h}")

    @abstractmethod
    def choose(self, result: ChunkResult, param: Optional[float] = None) -> HorizonDecision: ...
