"""Schedule-normalised confidence horizon for DDPM/DDIM policies (seed 000 §3.1, adapted).

The §3.1 rule compares an action's final-step update with the mean of its earlier updates.
That suits flow matching's near-uniform Euler steps; a DDIM/DDPM schedule shrinks the last
steps by design (the final update is ~0.16x the earlier mean on models/pushgust_diffusion,
reports/horizon_study.md), so the raw ratio mostly measures the schedule. Here each step's
update is first divided by what the schedule makes that step move: the median update norm
over the chunk's actions at that step (most actions of a chunk are converged, so the median
is the schedule's own step size, measured on this very chunk and noise). A converged action
then has ratio ~1 at any step count or schedule, and the rule `ratio > 1 + t` cuts where an
action still moves more than the schedule predicts at the last step.
"""
from __future__ import annotations


import numpy as np

from ..types import HorizonDecision
from .base import checked_updates
from .confidence import ConfidenceHorizon


def schedule_normalised_ratio(updates: np.ndarray) -> np.ndarray:
    """Per action: final normalised update over the mean of its earlier normalised updates."""
    norms = np.linalg.norm(np.asarray(updates, dtype=np.float64), axis=-1)  # [steps, chunk]
    scale = np.maximum(np.median(norms, axis=1, keepdims=True), 1e-12)  # the schedule's step size
    z = norms / scale
    return z[-1] / np.maximum(z[:-1].mean(axis=0), 1e-12)


class ScheduleNormalisedHorizon(ConfidenceHorizon):
    """§3.1's rule on schedule-normalised updates; malformed updates are refused (BadUpdates)."""
    name = "schedule"
    knob, knob_above = "schedule-normalised threshold t", -1.0

    def __init__(self, t: float = 0.5, h_min: int = 1, fallback_h: int | None = None) -> None:
        super().__init__(t, h_min, fallback_h)

    def updates(self, result):
        return checked_updates(result)

    def decide(self, u, t: float, n: int) -> HorizonDecision:
        over = schedule_normalised_ratio(u) > 1.0 + t
        if not over.any():
            return HorizonDecision(n, f"all {n} actions within the schedule at t={t:g}")
        first = int(np.argmax(over))
        h = self.clamp(first, n)
        return HorizonDecision(h, f"A{first + 1} moves more than the schedule predicts at the last step "
                                  f"(t={t:g}): H={h}")
