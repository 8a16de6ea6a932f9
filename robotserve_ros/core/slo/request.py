"""One LLM request of the SLO-aware serving core (seed 004): its SLOs, its progress through
prefill, the KV handover and decode, and the metrics it is judged by (§4.1)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ..errors import BadDeadline as BadSLO, BadPrompt, Overloaded  # noqa: F401 (the SLO core's errors)


@dataclass(frozen=True)
class SLODefaults:
    """What a request that names no SLO (0) inherits; paper §4.1 uses 8 s TTFT / 50 ms TPOT."""

    ttft_slo_s: float = 8.0
    tpot_slo_s: float = 0.05
    max_tokens: int = 64

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "tpot_slo_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"default {name} must be a positive number of seconds, got {v!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"default max_tokens must be an integer >= 1, got {self.max_tokens!r}")


def resolve_slo(ttft_slo_s: float, tpot_slo_s: float, defaults: SLODefaults) -> tuple[float, float]:
    """0 means "the server's default"; anything else must be a finite positive time."""
    out = []
    for name, v, d in (("ttft_slo_s", ttft_slo_s, defaults.ttft_slo_s), ("tpot_slo_s", tpot_slo_s, defaults.tpot_slo_s)):
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise BadSLO(f"{name} must be a number of seconds, got {v!r}") from None
        if v == 0:
            v = d
        if not math.isfinite(v) or v <= 0:
            raise BadSLO(f"{name} must be > 0 seconds (0 = the server's default {d}), got {v!r}")
        out.append(v)
    return out[0], out[1]


@dataclass(frozen=True)
class SLORequest:
    """What a sender asks the SLO core for: a prompt and its SLOs (0 = the server's default)."""

    req_id: str
    prompt_len: int
    max_tokens: int = 0
    ttft_slo_s: float = 0.0
    tpot_slo_s: float = 0.0
    prompt_tokens: Optional[list] = None  # live path: the token ids the engine prefills


@dataclass(eq=False)
class LLMRequest:
    req_id: str
    prompt_len: int
    max_tokens: int
    ttft_slo_s: float
    tpot_slo_s: float
    arrival_s: float
    prompt_tokens: Optional[list] = None  # live path: the token ids the engine prefills
    # progress
    prefilled: int = 0                        # prompt tokens prefilled so far (chunked prefill)
    first_token_s: Optional[float] = None     # prefill finished: the first token exists
    kv_ready_s: Optional[float] = None        # KV handed over to the decode worker
    admitted_s: Optional[float] = None        # joined the decode worker's active set
    n_gen: int = 0                            # output tokens so far, the first included
    done_s: Optional[float] = None
    tokens: list = field(default_factory=list)
    eos: bool = False
    failed: Optional[str] = None
    seq: int = 0                              # arrival order (ties)

    @property
    def seq_len(self) -> int:
        """Context the next decode step attends over."""
        return self.prompt_len + self.n_gen

    @property
    def remaining_prefill(self) -> int:
        return self.prompt_len - self.prefilled

    @property
    def ttft_deadline_s(self) -> float:
        return self.arrival_s + self.ttft_slo_s

    @property
    def finished(self) -> bool:
        return self.done_s is not None

    # --- metrics of §4.1 -------------------------------------------------------------------
    @property
    def ttft_s(self) -> Optional[float]:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> Optional[float]:
        """Mean time per output token after the first (0 for a one-token answer)."""
        if self.done_s is None or self.first_token_s is None:
            return None
        return (self.done_s - self.first_token_s) / (self.n_gen - 1) if self.n_gen > 1 else 0.0

    @property
    def decode_tokens_per_s(self) -> Optional[float]:
        """Per-request decode speed (§4.5): tokens after the first over the time they took."""
        if self.done_s is None or self.first_token_s is None or self.n_gen < 2:
            return None
        dt = self.done_s - self.first_token_s
        return (self.n_gen - 1) / dt if dt > 0 else None

    def ttft_met(self) -> bool:
        return self.ttft_s is not None and self.ttft_s <= self.ttft_slo_s + 1e-12

    def tpot_met(self) -> bool:
        return self.tpot_s is not None and self.tpot_s <= self.tpot_slo_s + 1e-12
