"""`robotserve bench soak`: the inference server under a steady light fleet (live/light_fleet.py)
for minutes; does it stay flat and lose nothing?

One fleet-live run (--light) of `minutes`, the server's resident set sampled once a second
(reported every `rss_every_s`). Then the clients stop and the server is watched for
task_timeout_s + 5 s: its reaper must free every task's ledger entry, waiter and cached
reply (finished tasks are freed as they finish).

  rss_growth_fraction   (last RSS - RSS at the baseline) / RSS at the baseline; the baseline
                        is the first sample after `warmup_s` (2 min, or a quarter of a
                        shorter run): start-up and the first allocations are not growth
  rss_slope_mb_per_min_after_warmup   least-squares slope of the RSS samples (MB against
                        minutes) after `slope_warmup_s` (5 min, or a quarter of a shorter run);
                        what a slow leak costs per minute, where the total growth also holds the
                        warm-up's last steps
  rss_slope_ci95        its 95 % confidence interval: the once-a-second samples are
                        autocorrelated, so it is taken on their effective number
                        (Santer et al. 2008); an OLS interval on them would be far too narrow
  lost_chunks, duplicate_chunks   as fleet-live counts them
  ledger_freed          after the drain: no task, no waiter, no cached reply left
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from ..launch_description import default_config
from .fleet_live import run_fleet_live


def rss_growth(rss: list, warmup_s: float, end_s: float) -> dict:
    """rss: [(s since the window began, kB, ...)]; growth after warmup_s up to end_s."""
    run = [(x[0], x[1]) for x in rss if 0 <= x[0] <= end_s]
    after = [(t, kb) for t, kb in run if t >= warmup_s]
    if len(after) < 2:
        return {"rss_growth_fraction": None, "rss_baseline_kb": None, "rss_last_kb": None, "rss_max_kb": None}
    base, last = after[0][1], after[-1][1]
    return {"rss_growth_fraction": round((last - base) / base, 4), "rss_baseline_kb": base, "rss_last_kb": last,
            "rss_max_kb": max(kb for _, kb in after), "rss_max_growth_fraction": round((max(kb for _, kb in after) - base) / base, 4)}


def rss_slope(rss: list, warmup_s: float, end_s: float) -> dict:
    """rss: [(s since the window began, kB, ...)]; the least-squares slope in MB/min of the
    samples in [warmup_s, end_s] and its 95 % CI. The samples are autocorrelated (RSS moves in
    slow steps), so the interval uses the effective sample size n (1 - r1) / (1 + r1), r1 the
    residuals' lag-1 autocorrelation, and Student's t on n_eff - 2 degrees of freedom (Santer
    et al. 2008, "adjusted standard errors"): an OLS interval on n samples would be far too narrow."""
    from scipy.stats import t as student_t

    pts = np.array([(x[0] / 60.0, x[1] / 1024.0) for x in rss if warmup_s <= x[0] <= end_s], dtype=float)
    if len(pts) < 4 or np.ptp(pts[:, 0]) == 0:
        return {"rss_slope_mb_per_min_after_warmup": None, "rss_slope_ci95": None, "rss_slope_samples": len(pts),
                "rss_slope_effective_samples": None}
    t, mb = pts[:, 0] - pts[:, 0].mean(), pts[:, 1] - pts[:, 1].mean()
    slope = float(np.dot(t, mb) / np.dot(t, t))
    resid = mb - slope * t
    den = float(np.dot(resid[:-1], resid[:-1]))
    r1 = min(max(float(np.dot(resid[1:], resid[:-1])) / den if den > 0 else 0.0, 0.0), 0.999)
    n_eff = len(pts) * (1 - r1) / (1 + r1)
    if n_eff > 3:
        half = float(student_t.ppf(0.975, n_eff - 2)) * float(np.sqrt(np.dot(resid, resid) / (n_eff - 2) / np.dot(t, t)))
        ci = [round(slope - half, 5), round(slope + half, 5)]
    else:  # too few independent samples for an interval
        ci = None
    return {"rss_slope_mb_per_min_after_warmup": round(slope, 5), "rss_slope_ci95": ci, "rss_slope_samples": len(pts),
            "rss_slope_effective_samples": round(n_eff, 1)}


def run_soak(out: Path, minutes: float = 20.0, robots: int = 50, config: Optional[str] = None, rss_every_s: float = 10.0,
             verbose: bool = True, memory_trace: bool = False, slope_warmup_min: Optional[float] = None) -> dict:
    """memory_trace: the server traces Python allocations (tracemalloc, slower) and the soak
    reports the sites that grew most after the warm-up (`python_memory_growth`).
    slope_warmup_min: minutes left out of the RSS slope (default 5, or a quarter of a shorter run)."""
    if minutes <= 0 or robots < 1:
        raise ValueError("minutes > 0 and robots >= 1 are needed")
    import scipy.stats  # noqa: F401  (the slope's interval: missing, say so before an hour's run)
    base = config or default_config()
    srv = (yaml.safe_load(Path(base).read_text()) or {}).get("inference_server", {}).get("ros__parameters", {})
    task_timeout = float(srv.get("task_timeout_s", 10.0))
    duration = 60.0 * minutes
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_soak_"))
    warmup = min(120.0, duration / 4)
    slope_warmup = 60.0 * slope_warmup_min if slope_warmup_min is not None else min(300.0, duration / 4)
    if not 0 <= slope_warmup < duration:
        raise ValueError("the slope's warm-up must be >= 0 and shorter than the run")
    mem_file = tmp / "memory_trace.json"
    if memory_trace:
        cfg = yaml.safe_load(Path(base).read_text()) or {}
        sp = cfg.setdefault("inference_server", {}).setdefault("ros__parameters", {})
        sp.update(memory_trace_file=str(mem_file), memory_trace_after_s=warmup)
        base = str(tmp / "soak_config.yaml")
        Path(base).write_text(yaml.safe_dump(cfg))
    res = run_fleet_live(tmp / "fleet_live.json", robots=robots, duration=duration, per_process=robots, config=base,
                         light=True, drain_s=task_timeout + 5.0, verbose=verbose)
    rss = res["server_rss_kb"]
    every = [list(x) for i, x in enumerate(rss) if i == 0 or int(x[0] // rss_every_s) != int(rss[i - 1][0] // rss_every_s)]
    after = res["server_after_stop"]
    freed = bool(after) and all(after.get(k) == 0 for k in ("tasks", "waiters", "reply_cache", "queue_length", "in_flight"))
    soak = {
        "benchmark": "soak",
        "minutes": minutes,
        "robots": robots,
        "warmup_s": warmup,
        **rss_growth(rss, warmup, res["window_s"]),
        "slope_warmup_s": slope_warmup,
        **rss_slope(rss, slope_warmup, res["window_s"]),
        "lost_chunks": res["lost_chunks"],
        "duplicate_chunks": res["duplicate_chunks"],
        "mismatched_chunks": res["mismatched_chunks"],
        "chunks_served": res["chunks_served"],
        "answered_requests_check": res["answered_requests_check"],
        "ledger_freed": freed,
        "server_after_stop": after,
        "finished_tasks": after.get("finished_tasks"),
        "engine_utilization_when_backlogged": res["engine_utilization_when_backlogged"],
        "server_headline": res["server_headline"],
        "errors": res["errors"],
        "server_rss_kb_every": every,
        "rss_every_s": rss_every_s,
        "python_memory_growth": json.loads(mem_file.read_text()) if memory_trace and mem_file.exists() else None,
        "cpu": {k: res["cpu"].get(k) for k in ("machine_busy_fraction_mean", "process_cores_used_by_role",
                                                "loadavg_1m_samples", "loadavg_at_end")},
        "machine": res["machine"],
        "processes_failed_during_run": res["processes_failed_during_run"],
        "definitions": {"rss_growth_fraction": "(last - baseline) / baseline, the server's VmRSS; baseline: first sample "
                                               "after warmup_s",
                        "rss_slope_mb_per_min_after_warmup": "least-squares slope of VmRSS (MB) against minutes over the "
                                                             "samples after slope_warmup_s; rss_slope_ci95: its 95 % CI "
                                                             "(lag-1 autocorrelation adjusted, Santer et al. 2008)",
                        "ledger_freed": "after the clients stopped and task_timeout_s + 5 s: no task, waiter, cached reply, "
                                        "queued or in-flight round left in the server"},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(soak, indent=1) + "\n")
    return soak


def cli(a) -> int:
    """`robotserve bench soak` (registered in cli.py)."""
    from ..cli_types import UsageError

    if a.warmup_minutes is not None and a.warmup_minutes >= a.minutes:
        raise UsageError(f"--warmup-minutes {a.warmup_minutes:g} must be shorter than --minutes {a.minutes:g}")
    r = run_soak(Path(a.out), minutes=a.minutes, robots=a.robots, config=a.config, memory_trace=a.memory_trace,
                 slope_warmup_min=a.warmup_minutes)
    print(f"soak {a.minutes:g} min, {a.robots} robots: RSS growth {r['rss_growth_fraction']} "
          f"({r['rss_baseline_kb']} -> {r['rss_last_kb']} kB), slope after {r['slope_warmup_s']:g} s "
          f"{r['rss_slope_mb_per_min_after_warmup']} MB/min (95 % CI {r['rss_slope_ci95']}), "
          f"lost {r['lost_chunks']}, duplicates {r['duplicate_chunks']}, "
          f"chunks {r['chunks_served']}, ledger freed {r['ledger_freed']}")
    print(f"wrote {a.out}")
    g = r["rss_growth_fraction"]
    bad = r["lost_chunks"] or r["duplicate_chunks"] or not r["ledger_freed"] or g is None or g >= 0.05
    return 1 if bad else 0
