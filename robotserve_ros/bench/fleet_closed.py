"""`robotserve study fleet-closed`: what execution-aware serving pays in closed loop, where a fleet
has a queue (issue 34 items 4-5), on sim/closed_loop.py's virtual-clock fleet of Meta-World robots.

Every factor apart, paired episode seeds, in each regime (robots x engine profile):
FIFO + static H in STATIC_H; then FIFO, Kairos and remaining x {the baseline's H, agreement,
schedule}. The baseline of a regime is bench/paired_stats.pick_baseline's (the fastest FIFO +
static row whose success is not below the best static row's). The primary test is PRIMARY,
fixed here before any run; every other cell is exploratory.

Each finished configuration is appended to a runs file (JSON lines, one per configuration with
its episodes), so a stopped study resumes where it was; the report of record
(reports/closed_loop/fleet.json + fleet.md) is rebuilt from the runs file and names every row of
the grid that did not run.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from . import paired_stats as ps

STATIC_H = (1, 2, 3, 4, 6, 8, 12, 16)
SCHEDULERS = ("fifo", "kairos", "remaining")
DYNAMIC = ("agreement", "schedule")
REGIMES = ((100, "gpu_like"), (10, "gpu_like"), (40, "gpu_like"), (100, "cpu"), (10, "cpu"), (40, "cpu"))

# With --rtc (issue 39 item 4): these rows again with every robot on real-time chunking (RTC soft guidance,
# the d the loaded fleet's dispatcher sets), each against its plain twin: (scheduler, horizon, static H; None:
# the baseline's). "s=d" is the arms study's winning cell (reports/rtc): the whole chunk (H=16) delivered and
# the next round sent once the fleet's expected delay d0 of it ran (trigger 16 - d0), so a round every ~d
# actions; it has no plain twin (without RTC that is the naive arm), only the baseline.
RTC_ROWS = (("fifo", "static", None), ("fifo", "static", "s=d"), ("remaining", "agreement", None))
CHUNK = 16  # models/metaworld_flow's chunk

# The primary test, fixed before any run (issue 34 item 5). Every other cell is exploratory.
PRIMARY = {
    "robots": 100, "profile": "gpu_like", "scheduler": "remaining", "horizon": "agreement",
    "against": "the regime's baseline (FIFO + static H=k, bench/paired_stats.pick_baseline)",
    "ordering_share": "remaining + the baseline's H vs FIFO + the baseline's H",
    "metric": "mean time to success on the episodes both rows solved; 1 - mean(row) / mean(baseline), "
              "paired bootstrap 95 % CI (BCa, 10,000 resamples); success by McNemar's exact test",
    "targets": {"time_reduction_min": 0.30, "ci_excludes_0": True, "mcnemar_p_min_if_lower": 0.05,
                "baseline_engine_utilization_min": 0.9, "ordering_share_min": 0.10},
}


def label(scheduler: str, horizon: str) -> str:
    return f"{scheduler} + {horizon}"


def static_label(h: int) -> str:
    return f"static H={int(h)}"


def configs_for(robots: int, profile: str, episodes: int, seed: int, baseline_h=None, rtc: bool = False) -> list:
    """The regime's static rows, then (once the baseline's H is known) its execution-aware rows,
    the primary ones first, then (rtc) RTC_ROWS with RTC on."""
    from ..sim.closed_loop import FleetConfig

    per = max(1, math.ceil(episodes / robots))
    mk = lambda s, h, p: FleetConfig(robots, profile, s, h, p, episodes=per, seed=seed)  # noqa: E731
    if baseline_h is None:
        return [mk("fifo", "static", h) for h in STATIC_H]
    out = [mk("remaining", "agreement", 0), mk("remaining", "static", baseline_h)]
    for s in SCHEDULERS:
        for h, p in (("static", baseline_h), ("agreement", 0), ("schedule", 0)):
            c = mk(s, h, p)
            if c not in out and not (s == "fifo" and h == "static"):
                out.append(c)
    if rtc:
        from ..sim.closed_loop import engine_profile, fleet_trigger

        d0 = fleet_trigger(engine_profile(profile), robots, FleetConfig.control_hz)
        for s, h, p in RTC_ROWS:
            param = (CHUNK if p == "s=d" else baseline_h) if h == "static" else 0
            out.append(FleetConfig(robots, profile, s, h, param, episodes=per, seed=seed, rtc=True,
                                   trigger=max(0, CHUNK - d0) if p == "s=d" else None))
    return out


# --- the runs file ---------------------------------------------------------------------------
def read_runs(path: Path) -> list:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _key(cfg: dict) -> tuple:
    return (cfg["robots"], cfg["profile"], cfg["scheduler"], cfg["horizon"], float(cfg["param"]), cfg["episodes"],
            cfg["seed"], cfg["max_steps"], bool(cfg.get("rtc")), cfg.get("trigger"))


def run_study(regimes, episodes: int, seed: int, runs_path: Path, max_wall_s: float = math.inf, log=print,
              rtc: bool = False) -> list:
    """Run every configuration not yet in the runs file, regime by regime; stop starting new ones
    after max_wall_s. Returns the runs file's records."""
    from dataclasses import asdict

    from ..sim.closed_loop import EnvPool, ClosedLoopFleet, load_policy

    runs_path.parent.mkdir(parents=True, exist_ok=True)
    done = {_key(r["config"]) for r in read_runs(runs_path)}
    t0 = time.monotonic()
    engine, pools = load_policy(seed=seed), {}
    for robots, profile in regimes:
        for stage in ("static", "aware"):
            bh = None
            if stage == "aware":
                reg = regime_runs(read_runs(runs_path), robots, profile)
                if not all(static_label(h) in reg["fifo"] for h in STATIC_H):
                    break
                bh = int(ps.pick_baseline({k: outcomes(v) for k, v in static_rows(reg["fifo"]).items()})
                         ["baseline"].split("=")[1])
            for cfg in configs_for(robots, profile, episodes, seed, bh, rtc):
                if _key(asdict(cfg)) in done:
                    continue
                if time.monotonic() - t0 > max_wall_s:
                    log(f"[fleet-closed] wall budget of {max_wall_s:.0f} s spent: stopping (re-run to resume)")
                    return read_runs(runs_path)
                pool = pools.setdefault(cfg.max_steps, EnvPool(cfg.max_steps))
                res = ClosedLoopFleet(cfg, engine, pool).run()
                rec = res.to_dict()
                with runs_path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                done.add(_key(rec["config"]))
                ok = sum(e["success"] for e in rec["episodes"])
                log(f"[fleet-closed] {robots} robots {profile} {label(cfg.scheduler, cfg.horizon_label)}: "
                    f"{ok}/{len(rec['episodes'])} solved, makespan {res.makespan_s:.1f} s virtual, "
                    f"wall {res.wall_s:.1f} s (total {time.monotonic() - t0:.0f} s)")
    return read_runs(runs_path)


# --- the report --------------------------------------------------------------------------------
def horizon_label(cfg: dict) -> str:
    base = static_label(cfg["param"]) if cfg["horizon"] == "static" else cfg["horizon"]
    t = cfg.get("trigger")
    return base + (f", trigger {t}" if t is not None else "") + (" + rtc" if cfg.get("rtc") else "")


def rtc_rows_named() -> str:
    return ", ".join(label(s, h if h != "static" else "static H=" + ("the baseline's" if p is None else
                                                                     f"{CHUNK} sent every ~d actions"))
                     for s, h, p in RTC_ROWS)


def static_rows(fifo: dict) -> dict:
    """A regime's FIFO + static H rows without RTC: the baseline is picked among these."""
    return {k: v for k, v in fifo.items() if k.startswith("static") and not k.endswith(" + rtc")}


def outcomes(run: dict) -> dict:
    return {e["seed"]: (bool(e["success"]), e["time_to_success_s"]) for e in run["episodes"]}


def regime_runs(runs: list, robots: int, profile: str) -> dict:
    """scheduler -> horizon label -> run, for one regime (the last run of a configuration wins)."""
    out: dict = {s: {} for s in SCHEDULERS}
    for r in runs:
        c = r["config"]
        if c["robots"] == robots and c["profile"] == profile:
            out.setdefault(c["scheduler"], {})[horizon_label(c)] = r
    return out


def row_of(run: dict, base: dict | None, cap_s: float, is_base: bool) -> dict:
    c, eps = run["config"], run["episodes"]
    o = outcomes(run)
    ok = [e for e in eps if e["success"]]
    steps = sum(e["steps"] for e in eps)
    rounds = sum(e["rounds"] for e in eps)
    row = {"robots": c["robots"], "profile": c["profile"], "scheduler": c["scheduler"], "horizon": horizon_label(c),
           "baseline": is_base, "episodes": len(eps), "success": len(ok) / len(eps),
           "success_ci95": _wilson(len(ok), len(eps))}
    if base is not None and not is_base:
        bo = outcomes(base)
        red = ps.reduction(o, bo)
        row["time_to_success_mean_s"] = ps.mean_time(o, ps.co_solved(o, bo))
        row["co_solved_with_baseline"] = red["co_solved"]
        row["time_reduction_vs_baseline"] = red["reduction"]
        row["time_reduction_ci95"] = red["ci95"]
        row["mcnemar_p_vs_baseline"] = ps.mcnemar_p(o, bo)
    else:
        row["time_to_success_mean_s"] = float(np.mean([e["time_to_success_s"] for e in ok])) if ok else None
    row.update({
        "restricted_mean_s": ps.restricted_mean(o, cap_s),
        "time_to_success_p95_s": float(np.percentile([e["time_to_success_s"] for e in ok], 95)) if ok else None,
        "idle_per_episode_s": float(np.mean([e["idle_s"] for e in eps])),
        "rounds_per_episode": rounds / len(eps),
        "actions_per_round": steps / rounds if rounds else None,
        "engine_utilization": run["engine_busy_s"] / run["makespan_s"] if run["makespan_s"] > 0 else None,
        "mean_batch": run["dispatched"] / run["batches"] if run["batches"] else None,
        "backlogged_share": run.get("backlogged_s", 0.0) / run["makespan_s"] if run["makespan_s"] > 0 else None,
        "episode_mean_s": float(np.mean([e["duration_s"] for e in eps])),  # solved or not: Little's law's T
        "chunks_per_s": run["dispatched"] / run["makespan_s"] if run["makespan_s"] > 0 else None,
        "makespan_s": run["makespan_s"], "wall_s": round(run["wall_s"], 1),
    })
    if c.get("rtc"):
        row["rtc"] = rtc_summary(run.get("rtc") or {})
    return row


def rtc_summary(acct: dict) -> dict:
    """The delays a loaded fleet's dispatcher set (core/rtc_account.merge_rtc of the robots): chunks
    guided / unguided (round 0 has no leftover), d's median and mean, and the share that came after
    the leftover ran out (the robot held)."""
    delays = {int(k): v for k, v in acct.get("delays", {}).items()}
    n = sum(delays.values())
    ds = np.repeat(list(delays), list(delays.values())) if n else np.zeros(0)
    return {"guided": acct.get("guided", 0), "unguided": acct.get("unguided", 0), "delays": delays,
            "d_p50": float(np.median(ds)) if n else None, "d_mean": float(ds.mean()) if n else None,
            "held_share": acct.get("held", 0) / n if n else None}


def _wilson(k: int, n: int) -> list:
    from ..study.horizon_report import wilson_ci

    return wilson_ci(k, n)


def build_report(runs: list, regimes=REGIMES, episodes: int = 200, seed: int = 0, rtc: bool = False) -> dict:
    rows, eps_out, regime_out, not_run = [], [], [], []
    for robots, profile in regimes:
        reg = regime_runs(runs, robots, profile)
        fifo_static = static_rows(reg["fifo"])
        missing = [static_label(h) for h in STATIC_H if static_label(h) not in fifo_static]
        runs_here = [r for s in reg.values() for r in s.values()]
        if not runs_here:
            not_run.append({"robots": robots, "profile": profile, "rows": "all"})
            continue
        cap = max(e["duration_s"] for r in runs_here for e in r["episodes"])
        info = {"robots": robots, "profile": profile, "restricted_cap_s": cap,
                "trigger_actions": runs_here[0].get("trigger")}
        base = None
        if not missing:
            pick = ps.pick_baseline({k: outcomes(v) for k, v in fifo_static.items()})
            base = fifo_static[pick["baseline"]]
            info.update({"baseline": "fifo + " + pick["baseline"], "best_static": "fifo + " + pick["best"],
                         "eligible": pick["eligible"], "static_p_vs_best": pick["p_vs_best"],
                         "co_solved_by_eligible": pick["co_solved_by_eligible"]})
            bh = int(pick["baseline"].split("=")[1])
            want = [(c.scheduler, c.horizon_label) for c in configs_for(robots, profile, episodes, seed, bh, rtc)]
        else:
            info["baseline"] = None
            want = []  # the execution-aware rows need the baseline's H
        miss = [("fifo", h) for h in missing] + [(s, h) for s, h in want if h not in reg.get(s, {})]
        if missing:
            miss.append(("fifo, kairos, remaining", "{the baseline's H, agreement, schedule} (they need the baseline)"))
        if miss:
            not_run.append({"robots": robots, "profile": profile, "rows": [label(s, h) for s, h in miss]})
        for s in SCHEDULERS:
            for h, r in reg.get(s, {}).items():
                rows.append(row_of(r, base, cap, r is base))
                twin = reg[s].get(h[:-len(" + rtc")]) if h.endswith(" + rtc") else None
                if twin is not None:  # RTC on vs the same row without it, paired
                    o, to = outcomes(r), outcomes(twin)
                    red = ps.reduction(o, to)
                    rows[-1]["rtc"].update({"vs_plain": label(s, horizon_label(twin["config"])),
                                            "time_reduction_vs_plain": red["reduction"], "ci95": red["ci95"],
                                            "co_solved": red["co_solved"], "mcnemar_p_vs_plain": ps.mcnemar_p(o, to),
                                            "success_plain": sum(x for x, _ in to.values()) / len(to)})
                for e in r["episodes"]:
                    eps_out.append({"robots": robots, "profile": profile, "scheduler": s, "horizon": h,
                                    "seed": e["seed"], "task": e["task"], "success": e["success"],
                                    "time_to_success_s": None if e["time_to_success_s"] is None
                                    else round(e["time_to_success_s"], 6)})  # (virtual time: µs is exact enough)
        regime_out.append(info)
    return {"primary": primary_result(rows, regime_out), "regimes": regime_out, "not_run": not_run,
            "rows": rows, "episodes": eps_out}


def _find(rows: list, robots: int, profile: str, scheduler: str, horizon: str):
    return next((r for r in rows if (r["robots"], r["profile"], r["scheduler"], r["horizon"])
                 == (robots, profile, scheduler, horizon)), None)


def primary_result(rows: list, regimes: list) -> dict:
    p = dict(PRIMARY)
    reg = next((g for g in regimes if (g["robots"], g["profile"]) == (p["robots"], p["profile"])), None)
    if reg is None or not reg.get("baseline"):
        p["result"] = "not run"
        return p
    bh = reg["baseline"].split(" + ")[1]
    base = _find(rows, p["robots"], p["profile"], "fifo", bh)
    row = _find(rows, p["robots"], p["profile"], p["scheduler"], p["horizon"])
    order = _find(rows, p["robots"], p["profile"], p["scheduler"], bh)
    t = p["targets"]
    p["baseline"] = reg["baseline"]
    if row is None:
        p["result"] = "not run"
        return p
    red, ci = row["time_reduction_vs_baseline"], row["time_reduction_ci95"]
    checks = {
        "time_reduction": red is not None and red >= t["time_reduction_min"],
        "ci_excludes_0": ci is not None and ci[0] > 0,
        "success_not_lower": row["success"] >= base["success"] or row["mcnemar_p_vs_baseline"] >= t["mcnemar_p_min_if_lower"],
        "baseline_engine_utilization": base["engine_utilization"] >= t["baseline_engine_utilization_min"],
    }
    p["result"] = {"time_reduction": red, "ci95": ci, "co_solved": row["co_solved_with_baseline"],
                   "time_to_success_mean_s": {"row": row["time_to_success_mean_s"],
                                              "baseline": _co_mean_base(row, base)},
                   "success": {"row": row["success"], "baseline": base["success"]},
                   "mcnemar_p": row["mcnemar_p_vs_baseline"],
                   "baseline_engine_utilization": base["engine_utilization"], "checks": checks,
                   "met": all(checks.values()),
                   "evidence": {k: {"row": row[k], "baseline": base[k]} for k in
                                ("rounds_per_episode", "actions_per_round", "engine_utilization", "mean_batch")}}
    if order is not None:
        ok = order["time_reduction_vs_baseline"]
        oci = order["time_reduction_ci95"]
        p["ordering_result"] = {
            "time_reduction": ok, "ci95": oci, "co_solved": order["co_solved_with_baseline"],
            "mcnemar_p": order["mcnemar_p_vs_baseline"],
            "met": ok is not None and ok >= t["ordering_share_min"] and oci is not None and oci[0] > 0,
            "evidence": {"mean_batch": base["mean_batch"], "saturation_batch": 32,
                         "backlogged_share_baseline": base["backlogged_share"],
                         "rounds_per_episode_baseline": base["rounds_per_episode"],
                         # A closed fleet of N on a saturated engine: episodes end at the engine's
                         # chunk rate / rounds per episode, so by Little's law the mean episode time is
                         # N x rounds per episode / chunk rate whatever the order (only who waits moves).
                         "little_law_episode_s": {k: r["robots"] * r["rounds_per_episode"] / r["chunks_per_s"]
                                                  for k, r in (("row", order), ("baseline", base))},
                         "episode_mean_s": {"row": order["episode_mean_s"], "baseline": base["episode_mean_s"]},
                         "time_to_success_p95_s": {"row": order["time_to_success_p95_s"],
                                                   "baseline": base["time_to_success_p95_s"]}}}
    else:
        p["ordering_result"] = "not run"
    return p


def _co_mean_base(row: dict, base: dict):
    """The baseline's mean time on the same co-solved episodes (from the row's reduction)."""
    red, m = row.get("time_reduction_vs_baseline"), row.get("time_to_success_mean_s")
    return None if red is None or m is None or red == 1 else m / (1 - red)


def write_report(runs: list, out: Path, meta: dict, regimes=REGIMES, episodes: int = 200, seed: int = 0,
                 rtc: bool = False) -> list:
    rep = build_report(runs, regimes, episodes, seed, rtc)
    rep["meta"] = meta
    out.mkdir(parents=True, exist_ok=True)
    j = out / "fleet.json"
    # One line per row and per episode: anyone can recompute, and the file stays diffable.
    body = {k: v for k, v in rep.items() if k not in ("rows", "episodes")}
    text = json.dumps(body, indent=1)[:-2] + ',\n "rows": [\n' + ",\n".join(json.dumps(r) for r in rep["rows"]) \
        + '\n ],\n "episodes": [\n' + ",\n".join(json.dumps(e, separators=(",", ":")) for e in rep["episodes"]) + "\n ]\n}\n"
    json.loads(text)  # the record must stay one valid JSON document
    j.write_text(text)
    from ..sim.closed_loop_report import markdown

    (out / "fleet.md").write_text(markdown(rep, meta))
    return [j, out / "fleet.md"]


def cmd_fleet_closed(a) -> int:
    from ..cli_types import UsageError
    from ..machine import machine_info
    from ..study.metaworld_task import metaworld_missing

    why = metaworld_missing()
    if why:
        raise UsageError(f"study fleet-closed: {why}")
    if a.live_demo:
        return live_demo_check(Path(a.live_demo))
    regimes = [(n, p) for n in a.robots for p in a.profiles]
    if a.primary_first:
        regimes.sort(key=lambda g: g != (PRIMARY["robots"], PRIMARY["profile"]))
    runs_path = Path(a.runs)
    try:  # a file that is not this study's runs is refused before any configuration runs
        bad = next((r for r in read_runs(runs_path) if not (isinstance(r, dict) and {"config", "wall_s"} <= set(r))), None)
    except (OSError, ValueError) as e:
        raise UsageError(f"--runs {str(runs_path)!r}: not a runs file of this study (JSON lines): {e}") from None
    if bad is not None:
        raise UsageError(f"--runs {str(runs_path)!r}: not a runs file of this study (a line without config, wall_s)")
    if not a.report_only:
        run_study(regimes, a.episodes, a.seed, runs_path, a.max_wall_s, rtc=a.rtc)
    runs = read_runs(runs_path)
    # The configurations' own wall time (all sessions of a resumed study; loading envs and the policy not counted).
    wall = sum(r["wall_s"] for r in runs)
    meta = {"episodes_per_row": a.episodes, "seed": a.seed, "wall_s": round(wall, 1),
            "machine": f"{machine_info().get('cores')} shared cores ({machine_info().get('cpu')})",
            "policy": "models/metaworld_flow", "profiles": {"cpu": "robotserve_ros/profiles/pushgust_flow.json",
                                                             "gpu_like": "28 ms x (1 + 0.08 (b - 1)), b = 1..32"},
            "horizon_knobs": {"agreement": "tau 0.6", "schedule": "t 0"}, "runs_file": str(runs_path),
            "configurations_run": len(runs)}
    if a.rtc:
        meta["rtc"] = ("RTC rows: " + rtc_rows_named() + " with every robot "
                       "on real-time chunking: the paper's soft guidance (engines/flow_engine.py rtc_form paper), d set at dispatch")
    paths = write_report(runs, Path(a.out), meta, regimes, a.episodes, a.seed, a.rtc)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def live_demo_check(out_dir: Path) -> int:
    """Add the virtual fleet's rows to a live demo record (sim/closed_loop_live.virtual_check) and re-render its Markdown."""
    from ..cli_types import UsageError
    from ..live.demo import POLICY, write_metaworld_report
    from ..sim.closed_loop_live import virtual_check

    path = out_dir / "live_demo.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--live-demo {str(out_dir)!r}: no readable live_demo.json there ({e})") from None
    if results.get("demo") != "metaworld":
        raise UsageError(f"--live-demo {str(out_dir)!r}: not a Meta-World demo record (robotserve demo --out DIR)")
    results["sim_vs_live"] = virtual_check(results, str(POLICY))
    path.write_text(json.dumps(results, indent=1) + "\n")
    write_metaworld_report(results, out_dir, plot=False)
    print(f"wrote {path}, {out_dir / 'live_demo.md'}")
    return 0


def add_arguments(p) -> None:
    from ..cli_types import positive, scratch, seed

    from ..sim.closed_loop import ENGINE_PROFILES

    p.add_argument("--robots", type=positive(int), nargs="+", default=[100, 10, 40], help="fleet sizes (regimes)")
    p.add_argument("--profiles", nargs="+", choices=ENGINE_PROFILES, default=["gpu_like", "cpu"],
                   help="engine profiles (regimes): gpu_like = 28 ms x (1 + 0.08 (b - 1)), cpu = the flow head's "
                        "profile of record (default: %(default)s)")
    p.add_argument("--episodes", type=positive(int), default=200,
                   help="scored episodes per row (per robot: ceil(episodes / robots)); paired seeds across a regime")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--out", default=scratch("closed-loop"), help="report folder: fleet.json + fleet.md (default: "
                   "%(default)s; the run of record: --out reports/closed_loop --force)")
    p.add_argument("--runs", default="data/closed_loop/runs.jsonl",
                   help="every finished configuration with its episodes (JSON lines); a re-run resumes from it")
    p.add_argument("--max-wall-s", type=positive(float), default=math.inf,
                   help="start no new configuration after this many seconds (re-run to resume)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from --runs, run nothing")
    p.add_argument("--rtc", action="store_true", help="also run each regime's RTC rows (" + rtc_rows_named()
                   + ") with every robot on real-time chunking "
                   "(docs/rtc_serving.md), each beside its plain twin")
    p.add_argument("--live-demo", metavar="DIR", help="instead: run a live demo record's rows (DIR/live_demo.json) in "
                   "the virtual fleet at its robots, seeds and the CPU profile, and add them to the record")
    p.add_argument("--no-primary-first", dest="primary_first", action="store_false",
                   help="run the regimes in the order given (default: the primary regime first)")
    p.set_defaults(func=cmd_fleet_closed)
