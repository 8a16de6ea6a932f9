"""Segment schedulers of the LLM planner (seed 002): TimelyLLM and its baselines.

A scheduler says how a plan is generated and in which order waiting segments join the
running batch:
- `segmented`: suspend a plan after each segment (KV kept) and queue its next one (§4.1);
- `stream`: hand each segment to the robot as soon as it is generated (else the whole plan
  at the end, as vLLM returns a response);
- `order(plans, now, ctx)`: waiting plans, most urgent first (the priority is recomputed at
  every dispatch: §4.3 "dynamic priority adjustment");
- `admit(running, ordered, now, ctx)`: which of them join the running batch now.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..registry import Registry
from ..llm_profile import LLMProfile
from .plan import Plan

SEGMENT_SCHEDULERS: Registry = Registry("segment scheduler")


@dataclass
class Context:
    """What a scheduler may read about the engine."""
    profile: LLMProfile
    seg_tokens_est: float       # mean tokens per segment (profiling, §4.3 G)
    seg_tokens_max: int         # a segment's token bound (§4.4)
    max_batch: int              # memory bound of the running batch

    @property
    def g_ref(self) -> float:
        """A typical segment's decode time at batch 1 (the late segments' common G)."""
        return self.seg_tokens_est * self.profile.step_s(1, 128)

    def gen_time(self, p: Plan, batch: int) -> float:
        """G(s_k) (Eq. 4): prefill (segment 0) + a segment's decode steps at this batch."""
        g = self.profile.prefill_s(p.prefill_tokens) if not p.prefilled else 0.0
        return g + self.seg_tokens_est * self.profile.step_s(batch, p.context)


class SegmentScheduler:
    name = "base"
    segmented = True
    stream = True

    def order(self, plans: Sequence[Plan], now: float, ctx: Context) -> list[Plan]:
        raise NotImplementedError

    def admit(self, running: Sequence[Plan], ordered: Sequence[Plan], now: float, ctx: Context) -> list[Plan]:
        """Default (vLLM-like continuous batching): fill the batch up to its memory bound."""
        room = max(ctx.max_batch - len(running), 0)
        return list(ordered[:room])


class FCFS(SegmentScheduler):
    """vLLM: whole plans in arrival order, continuous batching, the response at the end."""
    name, segmented, stream = "fcfs", False, False

    def order(self, plans, now, ctx):
        return sorted(plans, key=lambda p: (p.arrival, str(p.id)))


class FCFSStream(FCFS):
    """vLLM-stream (§7.1): as FCFS, but each skill goes to the robot once generated."""
    name, segmented, stream = "fcfs_stream", False, True


class SegFCFS(FCFS):
    """Segmented generation, FCFS order: a suspended plan keeps its initial priority (§7.3.2)."""
    name, segmented, stream = "seg_fcfs", True, True


class SegEDF(SegmentScheduler):
    """Segmented generation, earliest deadline (arrival + ERT) first, kept for later segments (§7.3.2)."""
    name = "seg_edf"

    def order(self, plans, now, ctx):
        return sorted(plans, key=lambda p: (p.arrival + p.tuf.ert, p.arrival, str(p.id)))


class Timely(SegmentScheduler):
    """TimelyLLM: PUD priority (Eq. 4) and latency-guided batch size (§4.4)."""
    name = "timely"

    def __init__(self, min_slack_s: float = 0.01) -> None:
        if not min_slack_s > 0:
            raise ValueError(f"min_slack_s must be > 0, got {min_slack_s}")
        self.min_slack_s = float(min_slack_s)

    def priority(self, p: Plan, now: float, ctx: Context, batch: int) -> tuple:
        """Eq. 4: Pri = [delta_k TUF_0(W) + (1 - delta_k) TUF_1(W)] / (G L), with W the wait
        if generation starts now, G the segment's generation time, L the slack left until
        the segment's deadline once generated (floored: a segment past its deadline that can
        still earn utility is the most urgent). Sorted ascending: the key is -Pri.

        Eq. 1 keeps falling past the cutoff, where Eq. 4's numerator turns negative and would
        rank a late robot last forever. A segment that can no longer earn positive utility
        is ranked as one with its whole beta at stake over the time its TUF takes to lose
        it (cutoff - ERT): Pri = beta / (G_ref (cutoff - ERT)) = |alpha| / G_ref, the
        utility it loses per second of delay per second of a typical segment's generation:
        urgent late segments (alpha -6.67) before normal ones (-2), and among equals the
        earliest deadline first. (With each segment's own G, as Smith's rule has it, the
        longest prompts starved under overload: seen on the arm trace at this CPU's speed.)

        The same value caps Eq. 4 (whose slack floor makes it explode near a deadline): a
        segment not yet late is never more urgent than one of the same TUF already losing
        utility, and among those at the cap the earliest deadline goes first. Without the cap,
        under overload the segments of robots mid-plan (their slack always about to end)
        kept every new plan waiting: 34 s mean response on the arm trace at this CPU's speed,
        3.2 s with it (reports/timely); at the paper's engine speed it changes nothing."""
        g = ctx.gen_time(p, batch)
        u = p.potential_utility(now + g)
        cap = -p.tuf.alpha / ctx.g_ref
        if u <= 0:
            return (-cap, p.deadline(), p.arrival)
        slack = max(p.deadline() - (now + g), self.min_slack_s)
        return (-min(u / (g * slack), cap), p.deadline(), p.arrival)

    def order(self, plans, now, ctx):
        return sorted(plans, key=lambda p: (self.priority(p, now, ctx, 1), str(p.id)))

    def admit(self, running, ordered, now, ctx):
        """§4.4: take waiting generations in priority order while every generation in the
        pool that can still end its segment by its deadline (ERT, else the zero-utility
        point) keeps doing so in the grown batch: its worst case is the prefills the pool
        still owes plus its remaining tokens (segment bound minus tokens so far) at the
        grown batch's step latency. The binding one is the most urgent. One always runs."""
        pool = list(running)
        out: list[Plan] = []
        for cand in ordered:
            if len(pool) >= ctx.max_batch:
                break
            if pool and not self._fits(pool, cand, now, ctx):
                break
            pool.append(cand)
            out.append(cand)
        return out

    @staticmethod
    def _wcet(p: Plan, pool: list, ctx: Context) -> float:
        prefills = sum(ctx.profile.prefill_s(q.prefill_tokens) for q in pool if not q.prefilled)
        ctx_mean = sum(q.context for q in pool) / len(pool)
        left = max(ctx.seg_tokens_max - p.seg_tokens, 1)
        return prefills + left * ctx.profile.step_s(len(pool), ctx_mean)

    def _fits(self, pool: list, cand: Plan, now: float, ctx: Context) -> bool:
        grown = pool + [cand]
        for p in grown:
            alone = pool if p is not cand else grown
            w0 = self._wcet(p, alone, ctx)
            limit = next((lim for lim in (p.deadline(), p.zero_utility_at()) if w0 <= lim - now), None)
            if limit is not None and self._wcet(p, grown, ctx) > limit - now:
                return False
        return True


for _cls in (FCFS, FCFSStream, SegFCFS, SegEDF, Timely):
    SEGMENT_SCHEDULERS.register(_cls.name, _cls)

# the report's order: TimelyLLM first, then the baselines
SCHEDULER_NAMES = ["timely", "fcfs", "fcfs_stream", "seg_fcfs", "seg_edf"]
