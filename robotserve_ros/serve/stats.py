"""What a fleet shows of its core and Runner, as plain data (the inference server's
/diagnostics and the benches read it): queue, served, load integrals, stage gaps."""
from __future__ import annotations

import numpy as np


def ms_pct(samples, q: float):
    """The q-th percentile of recent durations (s) in ms; None for none."""
    xs = list(samples)
    return round(1000 * float(np.percentile(xs, q)), 3) if xs else None


def pcts(name: str, samples) -> dict:
    return {f"{name}_ms_p50": ms_pct(samples, 50), f"{name}_ms_p99": ms_pct(samples, 99)}


def load_stats(fleet, started_at: float, robots: dict) -> dict:
    """The core's and Runner's figures since `started_at` (core clock); `robots` maps task
    ids to robot namespaces (wait ratios are shown by robot, never by task id)."""
    with fleet.lock:
        core, r = fleet._core, fleet._runner
        s, now = core.stats, core.clock.now()
        r.account()  # the backlog integrals up to now
        edge = r.busy_backlogged_s["edge"]
        return {
            "queue_length": len(core.pending), "in_flight": len(core.inflight), "tasks": len(core.ledger.tasks),
            "served": s.completed, "batches": s.batches,
            "engine_utilization": r.busy_s["edge"] / max(1e-9, now - started_at),
            "tier_failures": dict(r.failures), "rows_failed": r.rows_failed, "late_replies_discarded": r.late_replies,
            "resent_requests": s.resent_requests, "replies_replayed": s.replies_replayed, "given_up": s.given_up,
            "errors": dict(s.errors), "last_error": dict(s.last_error), "refreshes": s.refreshes, "refresh_failures": s.refresh_failures,
            "refresh_skipped": s.refresh_skipped, "refresh_success_recent": round(core.refresh_gate.success, 3),
            "mean_obs_age_s": s.obs_age_sum / s.obs_age_n if s.obs_age_n else 0.0,
            "engine_busy_s": r.busy_s["edge"], "backlog_threshold": r.backlog_threshold,
            "backlogged_s": r.backlogged_s, "busy_while_backlogged_s": edge,
            "engine_utilization_when_backlogged": edge / r.backlogged_s if r.backlogged_s > 0 else None,
            **pcts("dispatch", r.dispatch_s), **pcts("gap_to_dispatch", r.gap_dispatch_s),
            **pcts("gap_handoff", r.gap_handoff_s), **pcts("gap_refresh", r.gap_refresh_s),
            "waiters": len(fleet._calls), "reply_cache": len(core.last_reply),
            "admitted": fleet.admission.admitted() if fleet.admission is not None else None,
            "admission_refused": fleet.admission.refused if fleet.admission is not None else 0,
            "refreshed_ahead": r.prefreshes["ok"], "refresh_ahead_failures": r.prefreshes["failed"],
            "wait_ratio": robot_wait_ratios(core.ledger, robots, now),
        }


def robot_wait_ratios(ledger, robots: dict, now: float) -> dict:
    out: dict = {}
    for t in ledger.tasks:
        key = (robots.get(t) or "").lstrip("/") or "(anonymous)"
        out[key] = max(out.get(key, 0.0), ledger.wait_ratio(t, now))
    return out
