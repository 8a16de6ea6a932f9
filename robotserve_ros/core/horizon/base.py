"""The HorizonPolicy role: map a generated chunk (and its denoising updates) to H."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from ..types import ChunkResult, HorizonDecision


class HorizonPolicy(ABC):
    """Seed 000 §3.1: the policy sees the per-step per-action updates U and returns the
    execution horizon for this round. `param` is the client's knob for its request."""

    name = "?"

    def check_param(self, param: Optional[float]) -> Optional[str]:
        """A problem with a client's knob, or None when it is acceptable."""
        return None

    @abstractmethod
    def choose(self, result: ChunkResult, param: Optional[float] = None) -> HorizonDecision: ...
