"""Decode-side batch choice (seed 004 §3.2): continuous batching and slack-guided batching."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..llm_profile import DecodeLUT
from .request import LLMRequest


class DecodePolicy(ABC):
    name = "?"

    @abstractmethod
    def select(self, active: list[LLMRequest], now: float, lut: DecodeLUT, max_batch: int) -> list[LLMRequest]:
        """The active requests that decode one token in the next step."""


class ContinuousBatching(DecodePolicy):
    """vLLM's continuous batching: every admitted request decodes every step (the first
    `max_batch` in admission order when more are admitted)."""

    name = "continuous"

    def select(self, active, now, lut, max_batch):
        return list(active[:max_batch])


def due_in(r: LLMRequest, now: float) -> float:
    """Time until this request's next token is due for its mean TPOT to hold; tokens decoded
    ahead of the SLO (buffered, §2.3) add to it, a request behind has a negative one."""
    return r.tpot_slo_s * r.n_gen - (now - r.first_token_s)  # (N + 1) x TPOT, N = tokens after the first


def tpot_slack(r: LLMRequest, now: float, lut: DecodeLUT) -> float:
    """Eq. 2: the slack left after one batch-1 step."""
    return due_in(r, now) - lut.step_s(1, r.seq_len)


def hopeless(r: LLMRequest, now: float, lut: DecodeLUT) -> bool:
    """Even decoding alone at batch-1 speed for all of its max_tokens (the request's own cap,
    no output-length prediction), its mean TPOT would end over the SLO. With fewer tokens
    (EOS) it has less time to catch up, so this never gives up on one that could make it."""
    left = r.max_tokens - r.n_gen
    if left <= 0:
        return False
    return due_in(r, now) + r.tpot_slo_s * (left - 1) - left * lut.step_s(1, r.seq_len) < 0


class SlackGuided(DecodePolicy):
    """Slack-guided adaptive batching (§3.2, Algorithm 3), deprioritising requests already
    behind their TPOT SLO as the prefill side does (§3.1).

    Each step, over the requests still on time (slack >= 0; all of them if none is):
    1. Algorithm 3 lines 3-18: the tightest slack s_min bounds the step; requests join
       shortest context first while LUT[batch, context] <= s_min and the step's tokens/s
       grows. This batch B runs if it holds the most urgent request, or if that request can
       wait one B step and still decode alone in time.
    2. Otherwise (Algorithm 3 lines 19-21: no slack to exploit) the most urgent request
       decodes, joined, shortest context first, by every request whose joining raises the
       step's tokens/s: "decode all" except a straggler whose context would cost the batch
       more than its token is worth (§2.2).
    A request that can no longer meet its TPOT SLO (`hopeless`) is left out of the slack and
    urgency above and decodes only in steps whose tokens/s it raises: deprioritised, never
    dropped, as the prefill side treats a TTFT it cannot meet (§3.1)."""

    name = "slack"

    def __init__(self, literal: bool = False, deprioritise: bool = True) -> None:
        self.literal = literal            # True: Algorithm 3 exactly as printed (decode all when no slack)
        self.deprioritise = deprioritise  # requests that can no longer meet their TPOT SLO go last
        self.last_slack_min = None

    def select(self, active, now, lut, max_batch):
        if not active:
            return []
        slack = {r: tpot_slack(r, now, lut) for r in active}
        if self.literal:
            return self._alg3(active, slack, min(slack.values()), lut, max_batch) or list(active[:max_batch])
        on_time = ([r for r in active if not hopeless(r, now, lut)] or list(active)) if self.deprioritise else list(active)
        s_min = min(slack[r] for r in on_time)
        self.last_slack_min = s_min
        batch = self._alg3(on_time, slack, s_min, lut, max_batch)
        urgent = min(on_time, key=lambda r: (slack[r], r.seq))
        if batch and (urgent in batch or slack[urgent] - lut.step_s(len(batch), max(r.seq_len for r in batch)) >= 0):
            late = [r for r in active if r not in on_time]
            return self._fill(batch, late, lut, max_batch, bound=s_min) if late else batch
        return self._fill([urgent], active, lut, max_batch)

    @staticmethod
    def _alg3(cands, slack, s_min, lut, max_batch) -> list:
        batch, t_cur = [], 0.0
        for r in sorted(cands, key=lambda r: (r.seq_len, r.seq)):
            if len(batch) >= max_batch:
                break
            t_step = lut.step_s(len(batch) + 1, r.seq_len)
            if t_step <= s_min and (not batch or (len(batch) + 1) / t_step > len(batch) / t_cur):
                batch.append(r)
                t_cur = t_step
        return batch

    @staticmethod
    def _fill(batch, active, lut, max_batch, bound: float = float("inf")) -> list:
        """Add the others, shortest context first, while the step's tokens/s grows (a
        straggler whose context would slow everyone more than its token is worth waits) and
        the step stays within `bound`."""
        batch = list(batch)
        ctx = max(r.seq_len for r in batch)
        t_cur = lut.step_s(len(batch), ctx)
        for r in sorted((r for r in active if r not in batch), key=lambda r: (r.seq_len, r.seq)):
            if len(batch) >= max_batch:
                break
            c = max(ctx, r.seq_len)
            t = lut.step_s(len(batch) + 1, c)
            if t <= bound and (len(batch) + 1) / t > len(batch) / t_cur:
                batch.append(r)
                ctx, t_cur = c, t
        return batch
