"""Paired statistics of the closed-loop fleet study (issue 34 items 4-5): rows of one regime run
the same episode seeds, so they are compared episode by episode.

- McNemar's exact test on success (the discordant pairs are binomial(n, 1/2) under H0;
  scipy's binomtest);
- the paired bootstrap of a reduction in mean time to success on the episodes both rows solved
  (scipy.stats.bootstrap, paired, BCa);
- the baseline of a regime: the fastest FIFO + static row whose success is not below the best
  static row's (success at least as high, or McNemar p >= 0.05); "fastest" is the lowest mean
  time to success on the episodes every such candidate solved;
- the restricted mean: time to success with a failure counted at the cap.
Episodes are keyed by their seed; every function takes {seed: (success, time_to_success_s)}.
"""
from __future__ import annotations

import warnings
from typing import Mapping, Optional

import numpy as np

Outcomes = Mapping[int, tuple]  # seed -> (success, time to success in s or None)

ALPHA = 0.05


def mcnemar_p(a: Outcomes, b: Outcomes) -> float:
    """Two-sided exact McNemar p of success, over the seeds both rows ran (1.0 with no discordant pair)."""
    from scipy.stats import binomtest

    seeds = sorted(set(a) & set(b))
    only_a = sum(1 for s in seeds if a[s][0] and not b[s][0])
    only_b = sum(1 for s in seeds if b[s][0] and not a[s][0])
    n = only_a + only_b
    return 1.0 if n == 0 else float(binomtest(only_a, n, 0.5).pvalue)


def co_solved(*rows: Outcomes) -> list:
    """Seeds every row solved, in order."""
    common = set(rows[0]).intersection(*rows[1:])
    return sorted(s for s in common if all(r[s][0] for r in rows))


def mean_time(row: Outcomes, seeds) -> Optional[float]:
    return float(np.mean([row[s][1] for s in seeds])) if seeds else None


def reduction(row: Outcomes, base: Outcomes, resamples: int = 10_000, seed: int = 0) -> dict:
    """1 - mean(row) / mean(base) of time to success on the co-solved episodes, with its paired
    bootstrap 95 % CI (BCa; percentile where BCa is undefined, e.g. a constant ratio)."""
    from scipy.stats import bootstrap

    seeds = co_solved(row, base)
    out = {"co_solved": len(seeds), "reduction": None, "ci95": None}
    if len(seeds) < 2:
        return out
    x = np.array([row[s][1] for s in seeds], float)
    y = np.array([base[s][1] for s in seeds], float)

    def stat(a, b, axis=-1):
        return 1.0 - np.mean(a, axis=axis) / np.mean(b, axis=axis)

    out["reduction"] = float(stat(x, y))
    ci = None
    for method in ("BCa", "percentile"):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a degenerate BCa falls back to the percentile interval below
            res = bootstrap((x, y), stat, paired=True, vectorized=True, n_resamples=resamples, method=method,
                            confidence_level=0.95, rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if np.isfinite(lo) and np.isfinite(hi):
            ci = [lo, hi]
            break
    out["ci95"] = ci
    return out


def restricted_mean(row: Outcomes, cap_s: float) -> float:
    """Mean of min(time to success, cap) with a failure counted at the cap."""
    return float(np.mean([min(t, cap_s) if ok else cap_s for ok, t in row.values()]))


def pick_baseline(static: Mapping[str, Outcomes]) -> dict:
    """The baseline among FIFO + static rows (label -> outcomes): see the module docstring.
    Returns {"baseline", "best", "eligible", "p_vs_best", "mean_time_s" (co-solved by the eligible)}."""
    rate = {k: float(np.mean([ok for ok, _ in v.values()])) for k, v in static.items()}
    top = max(rate.values())
    best = next(k for k, v in rate.items() if v == top)  # (the first listed among ties)
    p = {k: (1.0 if k == best else mcnemar_p(v, static[best])) for k, v in static.items()}
    eligible = [k for k in static if rate[k] >= top or p[k] >= ALPHA]
    seeds = co_solved(*(static[k] for k in eligible))
    times = {k: mean_time(static[k], seeds) for k in eligible}
    base = min(eligible, key=lambda k: (times[k] if times[k] is not None else np.inf, -rate[k]))
    return {"baseline": base, "best": best, "eligible": eligible, "p_vs_best": p, "success": rate,
            "co_solved_by_eligible": len(seeds), "mean_time_s": times}
