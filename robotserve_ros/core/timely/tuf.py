"""Time-utility functions of robot LLM requests (seed 002 §2.3, §4.2)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import BadDeadline  # noqa: F401 (a TUF that cannot hold: beta <= 0, cutoff <= ERT, not finite)


# The paper's two TUFs (§7.1): normal tasks [beta 1, ERT 1 s, cutoff 1.5 s] (alpha -2),
# urgent ones (error handling) [2, 0.2 s, 0.5 s] (alpha -6.67).
NORMAL = (1.0, 1.0, 1.5)
URGENT = (2.0, 0.2, 0.5)


@dataclass(frozen=True)
class TUF:
    beta: float     # initial utility
    ert: float      # expected response time (deadline), s
    cutoff: float   # where utility reaches 0, s

    def __post_init__(self) -> None:
        vals = (self.beta, self.ert, self.cutoff)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
            raise BadDeadline(f"TUF values must be finite numbers, got {list(vals)}")
        if self.beta <= 0:
            raise BadDeadline(f"TUF beta must be > 0, got {self.beta}")
        if self.ert < 0:
            raise BadDeadline(f"TUF ERT must be >= 0 s, got {self.ert}")
        if self.cutoff <= self.ert:
            raise BadDeadline(f"TUF cutoff {self.cutoff} s must be after ERT {self.ert} s")

    @classmethod
    def from_list(cls, v) -> "TUF":
        try:
            beta, ert, cutoff = (float(x) for x in v)
        except (TypeError, ValueError):
            raise BadDeadline(f"TUF must be [beta, ert_s, cutoff_s], got {v!r}") from None
        return cls(beta, ert, cutoff)

    @property
    def alpha(self) -> float:
        """Utility decline slope after ERT (negative)."""
        return -self.beta / (self.cutoff - self.ert)

    def utility(self, t: float) -> float:
        """Eq. 1: TUF(t) = min(beta, alpha (t - ERT) + beta); negative past the cutoff."""
        return min(self.beta, self.alpha * (t - self.ert) + self.beta)

    def utility_suspended(self, w: float) -> float:
        """TUF_1 (§4.2) for a suspended generation's next segment: ERT 0, so any robot wait
        w > 0 (the segment arrives after the previous one's execution ended) costs utility;
        w <= 0 (ready in time) earns beta."""
        return min(self.beta, self.alpha * max(w, 0.0) + self.beta)
