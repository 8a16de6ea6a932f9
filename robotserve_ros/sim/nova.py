"""Virtual-clock replay of a VLM workload on a measured stage profile (seed 003, §V).

The Nova core's own steps run on sim/loop.py's one virtual-clock loop (the simulator sets
the core's clock: it owns the time); the engine model is the profile: each op lasts what it
says for its stage, units, tiles, tokens and batch. Workloads: Poisson arrivals (§V-A4)
with request shapes drawn from a seeded generator.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..core.clock import VirtualClock
from ..core.nova.partition import StageProfile
from ..core.nova.serving import VLMCore, VLMRequest, op_time
from .loop import VirtualLoop


@dataclass(frozen=True)
class Workload:
    """Request shapes. `tiles`: vision-encoder images per request (a high-resolution frame
    is several tiles); `text_tokens`: the instruction; `out_tokens`: generated tokens."""
    name: str
    tiles: tuple = (1, 1)
    text_tokens: tuple = (16, 48)
    out_tokens: tuple = (40, 60)
    image_seq_len: int = 49  # prompt positions per tile (the engine's shape)

    def requests(self, rate: float, n: int, seed: int) -> list:
        rng = random.Random(f"{self.name}/{rate}/{n}/{seed}")
        t, out = 0.0, []
        for i in range(n):
            t += rng.expovariate(rate)
            tiles = rng.randint(*self.tiles)
            text = rng.randint(*self.text_tokens)
            out.append(VLMRequest(rid=f"{self.name}-{i}", arrival=t, tiles=tiles,
                                  prompt_tokens=1 + tiles * (self.image_seq_len + 2) + text,
                                  max_tokens=rng.randint(*self.out_tokens)))
        return out


def simulate(core: VLMCore, profile: StageProfile, requests: list, *, horizon_s: float = math.inf) -> VLMCore:
    """Run every request through `core` on a virtual clock; returns the core (done list filled)."""
    core.clock = VirtualClock()
    loop = VirtualLoop.for_core(core, lambda op: op_time(profile, op), settle_instant=True, until=horizon_s)
    for r in requests:
        loop.at(r.arrival, core.submit, r)
    loop.run()
    return core


def summarize(done: list, *, scheduler: str, workload: str, rate: float, extra: dict | None = None) -> dict:
    """The report row: avg / P95 / max end-to-end latency and request throughput (§V-A6),
    plus TTFT, TPOT and per-stage queueing."""
    ok = [r for r in done if r.error is None and r.t_done is not None]
    if not ok:
        return {"scheduler": scheduler, "workload": workload, "rate": rate, "completed": 0}
    lat = sorted(r.latency_s for r in ok)
    span = max(r.t_done for r in ok) - min(r.arrival for r in ok)

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]

    waits = [r.waits() for r in ok]
    ttft = [r.t_prefill[1] - r.arrival for r in ok]
    tpot = [(r.t_done - r.t_prefill[1]) / max(1, r.tokens_out - 1) for r in ok]
    row = {"scheduler": scheduler, "workload": workload, "rate": rate,
           "avg_latency_s": sum(lat) / len(lat), "p95_latency_s": pct(lat, 0.95), "max_latency_s": lat[-1],
           "throughput_rps": len(ok) / span if span > 0 else 0.0, "completed": len(ok),
           "avg_ttft_s": sum(ttft) / len(ttft), "avg_tpot_s": sum(tpot) / len(tpot),
           "queue_s": {s: sum(w[s] for w in waits) / len(waits) for s in ("vision", "prefill", "decode")}}
    row.update(extra or {})
    return row

