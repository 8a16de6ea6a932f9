"""Prefill-side order (seed 004 §3.1): FCFS (DistServe, vLLM) and urgency-based priority."""
from __future__ import annotations

import heapq
from abc import ABC, abstractmethod

from ..llm_profile import PrefillProfile
from .request import LLMRequest


def fcfs(queue) -> list:
    return sorted(queue, key=lambda r: (r.arrival_s, r.seq))


class PrefillPolicy(ABC):
    name = "?"

    @abstractmethod
    def order(self, queue: list[LLMRequest], now: float, profile: PrefillProfile) -> list[LLMRequest]:
        """The queued requests, most deserving first."""


class FcfsPrefill(PrefillPolicy):
    """First come, first served: a long prompt ahead blocks every short one behind it."""

    name = "fcfs"

    def order(self, queue, now, profile):
        return fcfs(queue)


class UrgencyPrefill(PrefillPolicy):
    """Urgency-based priority scheduling (§3.1, Algorithms 1-2), made to keep TTFT SLOs met.

    1. Algorithm 2: each request's prefill finish under FCFS, from the profile (its remaining
       tokens, the running throughput correction); its slack to the TTFT deadline, urgency
       (Eq. 1) and urgency normalised by its length (Algorithm 1 line 8).
    2. A request that misses its TTFT SLO even if prefilled right now can no longer make it:
       deprioritised (served after the others, in arrival order), never dropped.
    3. Of the rest, the largest set whose deadlines all hold back to back is kept
       (Moore-Hodgson: EDF, dropping the longest whenever one would be late); the dropped
       are deprioritised too. This maximises the TTFT SLOs met among the queued requests.
    4. The head is the kept request of highest normalised urgency (short ones first,
       Algorithm 1 line 11) whose going first still keeps every kept deadline (EDF after it);
       the other kept requests follow in EDF order.
    """

    name = "urgency"

    def __init__(self, head_candidates: int = 16) -> None:
        self.head_candidates = max(1, int(head_candidates))
        self.last_scores: dict = {}

    def order(self, queue, now, profile):
        if len(queue) <= 1:
            return list(queue)
        q = fcfs(queue)
        dur = {r: profile.chunk_s(r.prefilled, r.prompt_len) for r in q}
        # Algorithm 2: predicted finish under FCFS; Eq. 1 and Algorithm 1 line 8.
        cursor, score = now, {}
        for r in q:
            cursor = max(cursor, r.arrival_s) + dur[r]
            urgency = (r.ttft_slo_s - (cursor - r.arrival_s)) / r.ttft_slo_s
            score[r] = urgency / max(1, r.remaining_prefill)
        self.last_scores = {r.req_id: s for r, s in score.items()}
        late = [r for r in q if now + dur[r] > r.ttft_deadline_s]
        # Moore-Hodgson over the ones that can still make it.
        kept, heap, t = [], [], now
        for r in sorted((r for r in q if now + dur[r] <= r.ttft_deadline_s), key=lambda r: (r.ttft_deadline_s, r.seq)):
            heapq.heappush(heap, (-dur[r], r.seq, r))
            kept.append(r)
            t += dur[r]
            if t > r.ttft_deadline_s + 1e-12:
                _, _, longest = heapq.heappop(heap)
                kept.remove(longest)
                late.append(longest)
                t -= dur[longest]
        edf = sorted(kept, key=lambda r: (r.ttft_deadline_s, r.seq))
        head = edf[0] if edf else None
        for c in sorted(kept, key=lambda r: (-score[r], r.seq))[: self.head_candidates]:
            if self._keeps_all(c, edf, dur, now):
                head = c
                break
        ordered = ([head] + [r for r in edf if r is not head]) if head is not None else []
        return ordered + fcfs(late)

    @staticmethod
    def _keeps_all(first, edf, dur, now) -> bool:
        t = now + dur[first]
        if t > first.ttft_deadline_s + 1e-12:
            return False
        for r in edf:
            if r is first:
                continue
            t += dur[r]
            if t > r.ttft_deadline_s + 1e-12:
                return False
        return True


def select_chunks(ordered: list[LLMRequest], chunk_tokens: int) -> list[tuple]:
    """Algorithm 1 lines 12-20: fill a step of `chunk_tokens` prompt tokens from the order,
    the last request cut to what is left (chunked prefill). 0: one whole prompt per step
    (an engine without chunked prefill). Returns (request, start, end) chunks."""
    if not ordered:
        return []
    if chunk_tokens <= 0:
        r = ordered[0]
        return [(r, r.prefilled, r.prompt_len)]
    out, budget = [], chunk_tokens
    for r in ordered:
        n = min(r.remaining_prefill, budget)
        if n <= 0:
            break
        out.append((r, r.prefilled, r.prefilled + n))
        budget -= n
    return out
