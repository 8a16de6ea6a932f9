"""Decode-side batch choice (seed 004 §3.2): continuous batching and slack-guided batching."""
from __future__ import annotations

from abc import ABC, abstractmethod

from .profile import DecodeLUT
from .request import LLMRequest


class DecodePolicy(ABC):
    name = "?"

    @abstractmethod
    def select(self, active: list[LLMRequest], now: float, lut: DecodeLUT, max_batch: int) -> list[LLMRequest]:
        """The active requests that decode one token in the next step."""


class ContinuousBatching(DecodePolicy):
    """vLLM's continuous batching: every admitted request decodes every step."""

    name = "continuous"

    def select(self, active, now, lut, max_batch):
        return list(active[:max_batch])


def tpot_slack(r: LLMRequest, now: float, lut: DecodeLUT) -> float:
    """Eq. 2: time left before this request's next token is due for its mean TPOT to hold,
    after one batch-1 step. Tokens decoded ahead of the SLO (buffered) add to it."""
    k = r.n_gen - 1  # tokens after the first so far
    return r.tpot_slo_s * (k + 1) - (now - r.first_token_s) - lut.step_s(1, r.seq_len)


class SlackGuided(DecodePolicy):
    """Slack-guided adaptive batching (§3.2, Algorithm 3).

    The tightest slack among the active requests (each against its own TPOT SLO) bounds the
    step: requests join shortest-context first while the LUT's step time at the new batch
    size and context fits in it and the step's tokens/s grows; the rest wait a step (their
    tokens are ahead of the SLO). With no slack to exploit, everyone decodes."""

    name = "slack"

    def __init__(self) -> None:
        self.last_slack_min = None

    def select(self, active, now, lut, max_batch):
        if not active:
            return []
        s_min = min(tpot_slack(r, now, lut) for r in active)
        self.last_slack_min = s_min
        batch, t_cur = [], 0.0
        for r in sorted(active, key=lambda r: (r.seq_len, r.seq)):
            if len(batch) >= max_batch:
                break
            t_step = lut.step_s(len(batch) + 1, r.seq_len)
            if t_step <= s_min and (not batch or (len(batch) + 1) / t_step > len(batch) / t_cur):
                batch.append(r)
                t_cur = t_step
        return batch if batch else list(active[:max_batch])
