"""The long-tail request mix of `robotserve bench slo` (seed 004 §2.2: most requests short,
a small fraction very long; output length independent of prompt length).

No public serving trace ships in a PyPI package we may use here, so the mix is generated and
documented (a seed gives the same requests):
- prompt tokens: with probability `p_long` a long request, log-uniform in
  [long_min, long_max]; otherwise log-normal with median `short_median` and shape
  `short_sigma`, cut to [min_prompt, long_min);
- output tokens: log-normal with median `out_median`, shape `out_sigma`, cut to
  [min_out, max_out], drawn independently of the prompt (a short prompt may answer at
  length and a long one briefly, §3.2);
- arrivals: a Poisson process at the given rate (requests/s).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LengthMix:
    short_median: int = 96
    short_sigma: float = 0.8
    min_prompt: int = 8
    p_long: float = 0.1
    long_min: int = 512
    long_max: int = 1536
    out_median: int = 24
    out_sigma: float = 0.8
    min_out: int = 2
    max_out: int = 96

    def scaled(self, f: float) -> "LengthMix":
        """The same shapes at `f` times the prompt lengths (the simulator's larger scale)."""
        return LengthMix(max(1, round(self.short_median * f)), self.short_sigma, max(1, round(self.min_prompt * f)),
                         self.p_long, max(2, round(self.long_min * f)), max(3, round(self.long_max * f)),
                         self.out_median, self.out_sigma, self.min_out, self.max_out)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Req:
    req_id: str
    arrival_s: float
    prompt_len: int
    out_len: int


def draw_lengths(mix: LengthMix, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    long = rng.random(n) < mix.p_long
    lp = np.exp(rng.uniform(math.log(mix.long_min), math.log(mix.long_max), n))
    sp = np.exp(rng.normal(math.log(mix.short_median), mix.short_sigma, n))
    sp = np.clip(sp, mix.min_prompt, mix.long_min - 1)
    prompt = np.where(long, lp, sp).round().astype(int)
    out = np.clip(np.exp(rng.normal(math.log(mix.out_median), mix.out_sigma, n)), mix.min_out, mix.max_out)
    return prompt, out.round().astype(int)


def poisson_requests(mix: LengthMix, rate: float, n: int, seed: int) -> list[Req]:
    """`n` requests arriving at `rate`/s; the lengths depend on the seed only (not the rate),
    so every rate and scheduler sees the same requests."""
    if rate <= 0 or n < 1:
        raise ValueError(f"rate must be > 0 and n >= 1, got rate={rate}, n={n}")
    prompt, out = draw_lengths(mix, n, np.random.default_rng(seed))
    gaps = np.random.default_rng(seed + 7919).exponential(1.0 / rate, n)
    t = np.cumsum(gaps) - gaps[0]
    return [Req(f"r{i}", float(t[i]), int(prompt[i]), int(out[i])) for i in range(n)]


def summary(reqs: list[Req]) -> dict:
    p = np.array([r.prompt_len for r in reqs])
    o = np.array([r.out_len for r in reqs])
    return {"n": len(reqs), "prompt_p50": float(np.median(p)), "prompt_p90": float(np.percentile(p, 90)),
            "prompt_p99": float(np.percentile(p, 99)), "prompt_max": int(p.max()),
            "share_of_prompt_tokens_in_top10pct": float(np.sort(p)[-max(1, len(p) // 10):].sum() / p.sum()),
            "out_p50": float(np.median(o)), "out_p90": float(np.percentile(o, 90)), "out_max": int(o.max())}
