"""The HorizonPolicy role: map a generated chunk (and its denoising updates) to H."""
from __future__ import annotations

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


class HorizonPolicy(ABC):
    """Seed 000 §3.1: the policy sees the per-step per-action updates U and returns the
    execution horizon for this round. `param` is the client's knob for its request."""

    name = "?"

    def check_param(self, param: Optional[float]) -> Optional[str]:
        """A problem with a client's knob, or None when it is acceptable."""
        return None

    @abstractmethod
    def choose(self, result: ChunkResult, param: Optional[float] = None) -> HorizonDecision: ...
