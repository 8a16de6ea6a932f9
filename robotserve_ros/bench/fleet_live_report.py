"""What a live fleet run reports (`robotserve bench fleet-live`, chaos, soak): every robot's
account merged into lost / duplicated chunks, lateness and control-tick rates, the server's
own numbers from its diagnostics, and the engine's busy fraction while it was backlogged;
the server's cost (`server_profile`) and executors side by side (`compare_executors`)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..live.processes import pct
from ..core.rtc_account import merge_rtc


def _num(v):
    try:
        f = float(v)
        return int(f) if f.is_integer() and "." not in str(v) else f
    except (TypeError, ValueError):
        return v


def _server_summary(d: dict) -> dict:
    """The server's diagnostics, numbers as numbers, per-task wait ratios summarised."""
    wr = [float(v) for k, v in d.items() if k.startswith("wait_ratio/")]
    out = {k: _num(v) for k, v in d.items() if not k.startswith("wait_ratio/")}
    out["wait_ratio_tasks"] = len(wr)
    out["wait_ratio_mean"] = float(np.mean(wr)) if wr else None
    out["wait_ratio_max"] = float(np.max(wr)) if wr else None
    return out


def _hist_pct(hist: Counter, q: float) -> float:
    n = sum(hist.values())
    if not n:
        return float("nan")
    k, acc = q / 100 * n, 0
    for v in sorted(hist):
        acc += hist[v]
        if acc >= k:
            return float(v)
    return float(max(hist))


def _in(sec_counts: dict, t0: float, t1: float) -> int:
    """Sum of per-second counts whose whole second lies in [t0, t1)."""
    return sum(v for k, v in sec_counts.items() if t0 <= int(k) and int(k) + 1 <= t1)


# The server's own numbers, from its last diagnostics (recent-sample percentiles).
HEADLINE = ("dispatch_ms_p50", "dispatch_ms_p99", "in_server_ms_p50", "in_server_ms_p99", "gap_to_dispatch_ms_p99",
            "gap_refresh_ms_p50", "gap_refresh_ms_p99", "engine_utilization", "backlog_threshold", "refreshes",
            "refresh_failures", "resent_requests", "replies_replayed", "given_up")


def backlog_window(series: list, t0: float, t1: float) -> dict:
    """Engine busy fraction over the time the server's queue held more than the saturation
    batch, within [t0, t1], from the differences of its cumulative diagnostics
    (backlogged_s, busy_while_backlogged_s) between the first and last sample there."""
    pts = [(t, d) for t, d in series if t0 <= t <= t1 and "backlogged_s" in d]
    if len(pts) < 2:
        return {"engine_utilization_when_backlogged": None, "backlogged_s_in_window": 0.0}
    (_, a), (_, b) = pts[0], pts[-1]
    wall = float(b["backlogged_s"]) - float(a["backlogged_s"])
    busy = float(b["busy_while_backlogged_s"]) - float(a["busy_while_backlogged_s"])
    eb = float(b["engine_busy_s"]) - float(a["engine_busy_s"])
    span = pts[-1][0] - pts[0][0]
    return {"engine_utilization_when_backlogged": round(busy / wall, 4) if wall > 0.5 else None,
            "backlogged_s_in_window": round(wall, 2),
            "engine_utilization_in_window": round(eb / span, 4) if span > 0 else None}


def aggregate(accounts: list[dict], t_ready: float, t_stop: float, lost_after_s: float, hz: float) -> dict:
    """Fleet totals from the robots' accounts (t_ready..t_stop: the window, CLOCK_MONOTONIC)."""
    tot = Counter()
    errors = Counter()
    late_all, late_after0, late_win, reply, reply_win = [], [], [], [], []
    unanswered_ages = []
    resent_rounds = Counter()  # rounds asked for more than once: the first round of a task, or a later one
    tick_hist = Counter()
    idle_per_robot = []
    win_ticks = win_late = 0
    win_full_s = max(0, int(t_stop) - int(np.ceil(t_ready)))
    for a in accounts:
        for k in ("requests", "resent", "chunks", "duplicates", "answers_to_resent", "mismatched", "left_task_answers"):
            tot[k] += a.get(k, 0)
        errors.update(a["errors"])
        for task, rnd, t, ms, late in a["chunk_log"]:
            late_all.append(late)
            reply.append(ms)
            if rnd > 0:
                late_after0.append(late)
            if t_ready <= t <= t_stop:
                late_win.append(late)
                reply_win.append(ms)
        unanswered_ages += [age for _, _, age in a["unanswered"]]
        resent_rounds.update("round_0" if k == 0 else "later_rounds" for k in a.get("resent_rounds", ()))
        tick_hist.update({int(k): v for k, v in a["tick_interval_ms"].items()})
        tk = a["ticks"]
        in_task = tk.get("commanded", 0) + tk.get("holding", 0)
        idle_per_robot.append(tk.get("holding", 0) / in_task if in_task else float("nan"))
        for key in ("commanded", "holding", "waiting"):
            tot[f"ticks_{key}"] += tk.get(key, 0)
        win_ticks += _in(a["ticks_per_s"], t_ready, t_stop)
        win_late += _in(a["late_ticks_per_s"], t_ready, t_stop)
    lost = sum(1 for age in unanswered_ages if age > lost_after_s)
    ticks_in_task = tot["ticks_commanded"] + tot["ticks_holding"]
    n = len(accounts)
    period_ms = 1000.0 / hz

    def dist(xs):
        return {"n": len(xs), "p50_ms": pct(xs, 50), "p90_ms": pct(xs, 90), "p99_ms": pct(xs, 99),
                "max_ms": float(max(xs)) if xs else float("nan"), "mean_ms": float(np.mean(xs)) if xs else float("nan"),
                "late_fraction": float(np.mean(np.asarray(xs) > 0)) if xs else float("nan")}

    return {
        "robot_accounts": n,
        "requests": tot["requests"],
        "chunks_served": tot["chunks"],
        "lost_chunks": lost,
        "in_flight_at_stop": len(unanswered_ages) - lost,
        "unanswered_age_max_s": float(max(unanswered_ages)) if unanswered_ages else 0.0,
        "duplicate_chunks": tot["duplicates"],
        "mismatched_chunks": tot["mismatched"],
        "resent_requests": tot["resent"],
        "resent_share": round(tot["resent"] / tot["requests"], 4) if tot["requests"] else None,  # issue 38's <= 5 %
        "resent_rounds": {"round_0": resent_rounds["round_0"], "later_rounds": resent_rounds["later_rounds"]},
        "answers_to_resent_requests": tot["answers_to_resent"],  # a round sent twice, answered twice, used once
        "answers_for_left_tasks": tot["left_task_answers"],
        "errors": dict(errors),
        # 0 when every round sent was answered once or is still unanswered (resends counted once).
        "answered_requests_check": (tot["requests"] - tot["resent"] - len(unanswered_ages)
                                    - (tot["chunks"] - tot["answers_to_resent"]) - sum(errors.values())),
        "lateness_p50_ms": pct(late_all, 50),
        "lateness_p99_ms": pct(late_all, 99),
        "lateness": {"all_chunks": dist(late_all), "rounds_after_first": dist(late_after0), "in_window": dist(late_win)},
        "reply_latency": {"all_chunks": dist(reply), "in_window": dist(reply_win)},
        "idle_fraction": tot["ticks_holding"] / ticks_in_task if ticks_in_task else float("nan"),
        "idle_fraction_per_robot": {"min": float(np.nanmin(idle_per_robot)) if n else None,
                                    "median": float(np.nanmedian(idle_per_robot)) if n else None,
                                    "max": float(np.nanmax(idle_per_robot)) if n else None},
        "control_ticks": {
            "target_hz": hz,
            "ticks": {"commanded": tot["ticks_commanded"], "holding": tot["ticks_holding"], "waiting_to_start": tot["ticks_waiting"]},
            "achieved_hz_in_window": win_ticks / (n * win_full_s) if n and win_full_s else float("nan"),
            "window_whole_seconds": win_full_s,
            "late_tick_fraction_in_window": win_late / win_ticks if win_ticks else float("nan"),
            "late_means": f"interval > 1.5 periods ({1.5 * period_ms:.1f} ms)",
            "interval_p50_ms": _hist_pct(tick_hist, 50),
            "interval_p99_ms": _hist_pct(tick_hist, 99),
            "interval_p999_ms": _hist_pct(tick_hist, 99.9),
            "interval_max_ms": float(max(tick_hist)) if tick_hist else float("nan"),
            "intervals_over_2_periods": sum(v for k, v in tick_hist.items() if k > 2 * period_ms),
            "intervals_total": sum(tick_hist.values()),
        },
        # robots with rtc on (docs/rtc_serving.md): the d they were served with, how far off it was
        **({"rtc": merge_rtc([a["rtc"] for a in accounts if "rtc" in a])} if any("rtc" in a for a in accounts) else {}),
    }


def summary_lines(res: dict) -> list[str]:
    ct, cpu = res["control_ticks"], res.get("cpu", {})
    srv = res.get("server", {})
    return [
        f"robots {res['robots']} x {res['control_hz']:g} Hz for {res['window_s']} s (start-up {res['startup_s']} s)",
        f"requests {res['requests']}, chunks {res['chunks_served']}, lost {res['lost_chunks']}, "
        f"in flight at stop {res['in_flight_at_stop']}, duplicates {res['duplicate_chunks']}, errors {res['errors']}",
        f"lateness p50 {res['lateness_p50_ms']:.1f} ms, p99 {res['lateness_p99_ms']:.1f} ms; "
        f"idle fraction {res['idle_fraction']:.3f}; chunks/s {res['chunks_per_s_in_window']}",
        f"control ticks: {ct['achieved_hz_in_window']:.2f} Hz achieved (target {ct['target_hz']:g}), "
        f"late {ct['late_tick_fraction_in_window']:.3%}, interval p99 {ct['interval_p99_ms']:.0f} ms, max {ct['interval_max_ms']:.0f} ms",
        f"server: served {srv.get('served')}, engine utilization when backlogged {res['engine_utilization_when_backlogged']} "
        f"(backlogged {res['server_headline']['backlogged_s_in_window']} s), dispatch p99 {srv.get('dispatch_ms_p99')} ms, "
        f"in-server p99 {srv.get('in_server_ms_p99')} ms, replayed {res['replies_replayed']}, resent {res['resent_requests']} "
        f"({res.get('resent_share')} of requests; server attached {res['server_headline'].get('resent_requests')})",
        f"cpu: machine busy mean {cpu.get('machine_busy_fraction_mean')}, max 1 s {cpu.get('machine_busy_fraction_max_1s')}, "
        f"by role {cpu.get('process_cores_used_by_role')}",
    ]


def server_profile(cpu: dict, samples: list, spin_cpu: list, served_per_s: float, window: float, robots: int,
                   server: dict, reaped_alive) -> dict:
    """The server's cost (issue 26): CPU seconds per served round and per robot-second over
    the window, the executor's share of it (the main thread's spin), tasks reaped while their
    robot was alive, and the refresh figures."""
    used = None
    if len(samples) >= 2:
        a, b = samples[0][2].get("inference_server"), samples[-1][2].get("inference_server")
        used = (b - a) if a is not None and b is not None else None
    spins = [x for x in spin_cpu if x is not None]
    rounds = served_per_s * window if served_per_s == served_per_s else None  # nan: no served counts
    ok, failed = _num(server.get("refreshes")), _num(server.get("refresh_failures"))
    ahead_ok, ahead_failed = _num(server.get("refreshed_ahead")), _num(server.get("refresh_ahead_failures"))
    tries = [x for x in (ok, failed, ahead_ok, ahead_failed) if isinstance(x, (int, float))]
    return {
        "server_cpu_s": round(used, 2) if used is not None else None,
        "server_cpu_s_per_round": round(used / rounds, 5) if used is not None and rounds else None,
        "server_cpu_s_per_robot_s": round(used / (robots * window), 6) if used is not None and window > 0 else None,
        "executor_time_share": round((spins[-1] - spins[0]) / used, 3) if len(spins) >= 2 and used else None,
        "tasks_reaped_alive": reaped_alive,
        "refresh": {
            "at_dispatch_ok": ok, "at_dispatch_failed": failed, "ahead_ok": ahead_ok, "ahead_failed": ahead_failed,
            "skipped": _num(server.get("refresh_skipped")),
            "success_rate": round((ok + ahead_ok) / sum(tries), 4) if len(tries) == 4 and sum(tries) else None,
            "call_ms_p50": _num(server.get("refresh_ms_p50")), "call_ms_p99": _num(server.get("refresh_ms_p99")),
            "clients": _num(server.get("refresh_clients")),
            "from_topic": _num(server.get("refresh_topic_used")), "topic_refused": _num(server.get("refresh_topic_refused")),
            "age_at_dispatch_ms_p50": _num(server.get("refresh_age_ms_p50")),
            "age_at_dispatch_ms_p99": _num(server.get("refresh_age_ms_p99")),
        },
    }


EXECUTOR_FIELDS = ("server_cpu_s_per_round", "server_cpu_s_per_robot_s", "executor_time_share",
                   "engine_utilization_when_backlogged", "lost_chunks", "duplicate_chunks", "tasks_reaped_alive")


def compare_executors(results: dict) -> dict:
    """Side by side, per executor: the server's cost, its engine use when backlogged, and the
    slot-to-dispatch gap p99 (the same fleet, one run after another)."""
    return {name: {**{k: r.get(k) for k in EXECUTOR_FIELDS},
                   "gap_to_dispatch_ms_p99": r["server_headline"].get("gap_to_dispatch_ms_p99"),
                   "loadavg_at_start": r["machine"].get("loadavg_at_start")} for name, r in results.items()}
