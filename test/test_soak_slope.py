"""bench soak's RSS slope after the warm-up (bench/soak.py rss_slope) on synthetic series:
the slope a leak has, warm-up left out, and a 95 % interval that holds with autocorrelated
samples (no processes: the live soak is test_bench_live's)."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.bench.soak import rss_slope


def series(minutes: float, leak_mb_per_min: float, noise, warmup_ramp_mb: float = 40.0, base_mb: float = 300.0):
    """Once a second: (s, kB, threads); a ramp of warmup_ramp_mb over the first 3 minutes
    (start-up allocations), then the leak, plus `noise` (MB, one per sample)."""
    t = np.arange(0, 60 * minutes, 1.0)
    mb = base_mb + warmup_ramp_mb * np.minimum(t / 180.0, 1.0) + leak_mb_per_min * t / 60.0 + noise
    return [(float(s), int(v * 1024), 40) for s, v in zip(t, mb)]


def ar1(n: int, phi: float, sd: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e, x = rng.normal(0, sd, n), np.zeros(n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def test_a_leak_is_its_slope_and_the_interval_holds_it():
    n = 20 * 60
    rss = series(20, 0.35, np.random.default_rng(1).normal(0, 0.5, n))
    r = rss_slope(rss, 300.0, 20 * 60.0)
    lo, hi = r["rss_slope_ci95"]
    assert r["rss_slope_mb_per_min_after_warmup"] == pytest.approx(0.35, abs=0.02)
    assert 0 < lo < 0.35 < hi and r["rss_slope_samples"] == n - 300


def test_the_warm_up_is_left_out():
    n = 20 * 60
    rss = series(20, 0.0, np.random.default_rng(2).normal(0, 0.5, n))
    lo, hi = rss_slope(rss, 300.0, 1e9)["rss_slope_ci95"]
    assert lo < 0 < hi  # flat after the warm-up
    with_ramp = rss_slope(rss, 0.0, 1e9)["rss_slope_mb_per_min_after_warmup"]
    assert with_ramp > 0.5  # the start-up ramp alone looks like a leak


def test_the_interval_covers_the_slope_with_autocorrelated_samples():
    """RSS sampled once a second moves in slow steps (arena growth, trims): AR(1) noise with
    phi 0.98. An OLS interval would cover the true slope far less than 95 % of the time."""
    n, true = 15 * 60, 0.05
    covered, widths = 0, []
    for seed in range(60):
        rss = series(15, true, ar1(n, 0.98, 0.3, seed))
        r = rss_slope(rss, 180.0, 1e9)
        lo, hi = r["rss_slope_ci95"]
        covered += lo <= true <= hi
        widths.append(hi - lo)
    assert covered >= 0.85 * 60, covered
    # The naive OLS interval of the same kind of series: narrower than the HAC one.
    t = np.arange(180, n) / 60.0
    y = true * t + ar1(n, 0.98, 0.3, 0)[180:]
    resid = y - np.polyval(np.polyfit(t, y, 1), t)
    ols_se = np.sqrt(resid.var(ddof=2) / ((t - t.mean()) ** 2).sum())
    assert 2 * 1.96 * ols_se < 0.5 * float(np.median(widths))


def test_too_few_samples_give_no_slope():
    r = rss_slope([(0.0, 1000, 1), (1.0, 1001, 1)], 0.0, 10.0)
    assert r["rss_slope_mb_per_min_after_warmup"] is None and r["rss_slope_ci95"] is None
