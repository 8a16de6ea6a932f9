"""Dynamic execution horizon from diffusion confidence (seed 000 §3.1, Figure 7).

For each action, compare the norm of its final-step update with (1 + t) x the mean norm of
its earlier-step updates. Walking from A_1, the first action that exceeds it ends the
converged prefix: H = its index (actions before it), H = max(H, H_min).
"""
from __future__ import annotations


import numpy as np

from ..types import HorizonDecision
from .base import HorizonPolicy


def confidence_horizon(updates: np.ndarray, t: float) -> tuple[int, int]:
    """(H_thresh, index of the first unconverged action or -1) for updates [steps, chunk, dim]."""
    norms = np.linalg.norm(np.asarray(updates, dtype=np.float64), axis=-1)  # [steps, chunk]
    final, earlier = norms[-1], norms[:-1].mean(axis=0)
    over = final > (1.0 + t) * earlier
    if not over.any():
        return norms.shape[1], -1
    first = int(np.argmax(over))
    return first, first


class ConfidenceHorizon(HorizonPolicy):
    name = "confidence"
    knob, knob_above = "confidence threshold t", -1.0

    def __init__(self, t: float = 0.4, h_min: int = 10, fallback_h: int | None = None) -> None:
        # The rule needs (1 + t) > 0 only. With DDIM the final step's update is a small
        # fraction of the earlier ones (~0.16x on models/pushgust_diffusion), so there
        # the useful thresholds are negative (reports/horizon_study.md).
        # Policies without denoising steps (e.g. ACT) give no updates: they get fallback_h.
        self.t = self._set_bounds(t, h_min, fallback_h)

    def choose(self, result, param=None):
        n = len(result.actions)
        t = self.t if param is None else float(param)
        u = self.updates(result)
        if u is None:
            return self.fallback(n, "no per-step updates for this chunk")
        return self.decide(u, t, n)

    def updates(self, result):
        """The chunk's updates [steps >= 2, chunk, dim], None when there are none to judge."""
        u = result.updates
        if u is None or u.ndim != 3 or u.shape[0] < 2 or u.shape[1] != len(result.actions):
            return None
        return u

    def decide(self, u, t: float, n: int) -> HorizonDecision:
        h_thresh, first = confidence_horizon(u, t)
        h = self.clamp(h_thresh, n)
        if first < 0:
            return HorizonDecision(h, f"all {n} actions converged at t={t:g}")
        why = f"A{first + 1} final update exceeds (1+{t:g}) x its earlier mean: H_thresh={h_thresh}"
        if h_thresh < self.h_min:
            why += f", raised to H_min={self.h_min}"
        return HorizonDecision(h, why)
