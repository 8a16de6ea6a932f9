"""Static execution horizon: execute the first H actions of every chunk (the state of the
practice the paper's baselines use, seed 000 §5.1)."""
from __future__ import annotations

import math

from ..types import HorizonDecision
from .base import HorizonPolicy


class StaticHorizon(HorizonPolicy):
    name = "static"

    def __init__(self, h: int = 25) -> None:
        if int(h) < 1:
            raise ValueError("static horizon h must be >= 1")
        self.h = int(h)

    def check_param(self, param):
        if param is None:
            return None
        if not math.isfinite(param) or param < 1 or param != int(param):
            return f"static horizon must be a whole number of actions >= 1, got {param}"
        return None

    def choose(self, result, param=None):
        n = len(result.actions)
        h = self.h if param is None else int(param)
        if h > n:
            return HorizonDecision(n, f"static H={h} capped at chunk length {n}")
        return HorizonDecision(h, f"static H={h}")
