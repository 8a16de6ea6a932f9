"""`robotserve bench soak`: the inference server under a steady light fleet (live/light_fleet.py)
for minutes; does it stay flat and lose nothing?

One fleet-live run (--light) of `minutes`, the server's resident set sampled once a second
(reported every `rss_every_s`). Then the clients stop and the server is watched for
task_timeout_s + 5 s: its reaper must free every task's ledger entry, waiter and cached
reply (finished tasks are freed as they finish).

  rss_growth_fraction   (last RSS - RSS at the baseline) / RSS at the baseline; the baseline
                        is the first sample after `warmup_s` (2 min, or a quarter of a
                        shorter run): start-up and the first allocations are not growth
  lost_chunks, duplicate_chunks   as fleet-live counts them
  ledger_freed          after the drain: no task, no waiter, no cached reply left
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

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


def run_soak(out: Path, minutes: float = 20.0, robots: int = 50, config: Optional[str] = None, rss_every_s: float = 10.0,
             verbose: bool = True, memory_trace: bool = False) -> dict:
    """memory_trace: the server traces Python allocations (tracemalloc, slower) and the soak
    reports the sites that grew most after the warm-up (`python_memory_growth`)."""
    if minutes <= 0 or robots < 1:
        raise ValueError("minutes > 0 and robots >= 1 are needed")
    base = config or default_config()
    srv = (yaml.safe_load(Path(base).read_text()) or {}).get("inference_server", {}).get("ros__parameters", {})
    task_timeout = float(srv.get("task_timeout_s", 10.0))
    duration = 60.0 * minutes
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_soak_"))
    warmup = min(120.0, duration / 4)
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
                        "ledger_freed": "after the clients stopped and task_timeout_s + 5 s: no task, waiter, cached reply, "
                                        "queued or in-flight round left in the server"},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(soak, indent=1) + "\n")
    return soak


def cli(a) -> int:
    """`robotserve bench soak` (registered in cli.py)."""
    r = run_soak(Path(a.out), minutes=a.minutes, robots=a.robots, config=a.config, memory_trace=a.memory_trace)
    print(f"soak {a.minutes:g} min, {a.robots} robots: RSS growth {r['rss_growth_fraction']} "
          f"({r['rss_baseline_kb']} -> {r['rss_last_kb']} kB), lost {r['lost_chunks']}, duplicates {r['duplicate_chunks']}, "
          f"chunks {r['chunks_served']}, ledger freed {r['ledger_freed']}")
    print(f"wrote {a.out}")
    g = r["rss_growth_fraction"]
    bad = r["lost_chunks"] or r["duplicate_chunks"] or not r["ledger_freed"] or g is None or g >= 0.05
    return 1 if bad else 0
