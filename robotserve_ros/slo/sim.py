"""Virtual-clock simulator of disaggregated prefill/decode serving (seed 004 §4 at scale).

It drives `core/slo`'s SLOServingCore on sim/loop.py's one virtual-clock loop, through the
same calls the live workers make (submit, dispatch, complete); the engine model: each
engine call takes the time the measured
profile gives (prefill: P(end) - P(start) per chunk; decode: LUT[batch, longest context];
KV handover: the measured per-token cost; the batch-KV regather the engine does when the
running set changes, where the profile measured it), times a seeded log-normal noise so the
schedulers' runtime corrections have something to follow. Same seed, same numbers.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import numpy as np

from ..core.clock import VirtualClock
from ..core.slo import PREFILL, DecodeLUT, LLMProfile, SLODefaults, SLORequest, make_slo_core
from ..sim.loop import VirtualLoop
from .workload import Req


def metrics(reqs: Iterable, tokens_after_first_s: Optional[float] = None) -> dict:
    """§4.1's metrics over finished or failed LLMRequests: a request that never finished
    meets nothing. decode_tokens_per_s is the paper's per-request decode speed (median,
    §4.5); decode_tokens_per_s_system is every token after the first over the decode span."""
    reqs = list(reqs)
    n = len(reqs)
    if n == 0:
        return {"requests": 0}
    ttft = [r.ttft_met() for r in reqs]
    tpot = [r.finished and r.tpot_met() for r in reqs]
    e2e = [a and b for a, b in zip(ttft, tpot)]
    tps = [r.decode_tokens_per_s for r in reqs if r.decode_tokens_per_s is not None]
    done = [r for r in reqs if r.finished and r.first_token_s is not None]
    toks = sum(r.n_gen - 1 for r in done)
    span = (max(r.done_s for r in done) - min(r.first_token_s for r in done)) if done else 0.0
    ttfts = [r.ttft_s for r in reqs if r.ttft_s is not None]
    tpots = [r.tpot_s for r in done if r.n_gen > 1]
    return {
        "requests": n, "finished": len(done), "failed": sum(1 for r in reqs if r.failed),
        "ttft_attainment": sum(ttft) / n, "tpot_attainment": sum(tpot) / n, "e2e_attainment": sum(e2e) / n,
        "decode_tokens_per_s": float(np.median(tps)) if tps else 0.0,
        "decode_tokens_per_s_system": toks / span if span > 0 else 0.0,
        "ttft_p50_s": float(np.median(ttfts)) if ttfts else None,
        "ttft_p90_s": float(np.percentile(ttfts, 90)) if ttfts else None,
        "tpot_p50_s": float(np.median(tpots)) if tpots else None,
        "tpot_p90_s": float(np.percentile(tpots, 90)) if tpots else None,
    }


def simulate(profile: LLMProfile, scheduler: str, requests: list[Req], *, ttft_slo_s: float, tpot_slo_s: float,
             max_decode_batch: int = 16, chunk_tokens: int = 0, noise: float = 0.05, seed: int = 0,
             context_limit: int = 1 << 20, true_profile: Optional[LLMProfile] = None) -> dict:
    """Serve `requests` once; returns metrics() plus the core's counters. The scheduler
    predicts with a fresh copy of `profile`; engine times come from `true_profile` (default
    the same measurements) times noise."""
    clock = VirtualClock()
    truth = (true_profile or profile).fresh()
    core = make_slo_core(scheduler, profile.fresh(), clock, defaults=SLODefaults(ttft_slo_s, tpot_slo_s),
                         max_decode_batch=max_decode_batch, chunk_tokens=chunk_tokens, context_limit=context_limit)
    rng = np.random.default_rng(seed + 104729)
    # The live engine regathers its batch KV when the running set changes (measured apart).
    rg = truth.meta.get("regather_s")
    regather = DecodeLUT({b: {c: max(v, 1e-9) for c, v in row.items()} for b, row in rg.items()}) if rg else None
    last_set: frozenset = frozenset()

    def jitter() -> float:
        return float(math.exp(rng.normal(0.0, noise) - noise * noise / 2)) if noise > 0 else 1.0

    def engine_s(item) -> float:  # the engine model
        nonlocal last_set
        if item.slot == PREFILL:
            dt = sum(truth.prefill.chunk_s(a, b, corrected=False) for _, a, b in item.chunks)
        else:
            dt = truth.decode.raw(len(item.batch), item.ctx)
            ids = frozenset(r.req_id for r in item.batch)
            if regather is not None and ids != last_set:
                dt += regather.raw(len(item.batch), item.ctx)
            last_set = ids
        return dt * jitter()

    # A handed-over request becomes admissible with no event of its own: the loop wakes then.
    loop = VirtualLoop.for_core(core, engine_s, settle_instant=True, done_prio=1,
                                wake=lambda: None if core.decode_busy else core.next_kv_ready())
    for r in requests:
        loop.at(r.arrival_s, core.submit, SLORequest(r.req_id, r.prompt_len, r.out_len))
    loop.run()
    out = metrics(core.requests.values())
    snap = core.snapshot()
    out.update({"mean_decode_batch": snap["mean_decode_batch"], "decode_steps": snap["decode_steps"],
                "makespan_s": clock.now()})
    return out
