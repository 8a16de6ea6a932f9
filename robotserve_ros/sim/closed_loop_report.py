"""The Markdown of `robotserve study fleet-closed`'s report of record (bench/fleet_closed.py builds
the data; this renders reports/closed_loop/fleet.md from it)."""
from __future__ import annotations


def _updown(red) -> str:
    """A reduction as words: '12.3 % lower' / '4.5 % higher' (never a signed 'lower')."""
    return "-" if red is None else f"{abs(100 * red):.1f} % {'lower' if red >= 0 else 'higher'}"


def _f(x, fmt=".2f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(rep: dict, meta: dict) -> str:
    lines = ["# Closed-loop fleet: what execution-aware serving pays where a fleet has a queue", "",
             f"`robotserve study fleet-closed` (bench/fleet_closed.py; docs/closed_loop.md): N Meta-World robots (MuJoCo, "
             f"Meta-World's own success) on the production ServingCore + Runner on the virtual clock; every batch computed "
             f"by the trained flow policy (models/metaworld_flow), charged its engine profile's time. "
             f"{meta.get('episodes_per_row')} scored episodes per row, paired seeds; wall time {meta.get('wall_s', 0):.0f} s "
             f"on {meta.get('machine', 'this machine')}.", "",
             "## Primary test (fixed in code before the run)", ""] + primary_lines(rep)
    for g in rep["regimes"]:
        lines += ["", f"## {g['robots']} robots, {g['profile']} profile", ""] + regime_lines(rep, g)
    lines += ["", "Time to success: mean over the episodes the row and the regime's baseline both solved (the baseline "
              "row: over its own solved episodes); 'time saved' is 1 - mean(row) / mean(baseline) on those (positive: "
              "the row is faster; negative: slower), with its paired bootstrap 95 % CI. Restricted mean: failures counted at the cap (the regime's "
              "longest episode). Engine utilisation: busy share of the virtual time until the last scored episode ended."]
    lines += rtc_lines(rep["rows"])
    if rep["not_run"]:
        lines += ["", "## Not run", ""]
        for n in rep["not_run"]:
            rows = n["rows"] if n["rows"] == "all" else ", ".join(n["rows"])
            lines.append(f"- {n['robots']} robots, {n['profile']}: {rows}")
    return "\n".join(lines) + "\n"


def primary_lines(rep: dict) -> list:
    """The primary test and the ordering share, as Markdown lines (the report; the demo prints them)."""
    p = rep["primary"]
    lines = [f"{p['robots']} robots, {p['profile']}: {p['scheduler']} + {p['horizon']} vs {p.get('baseline')}; "
             f"ordering share: {p['ordering_share']}.", ""]
    r = p.get("result")
    if isinstance(r, dict):
        ci = r["ci95"]
        lines += [f"- Time to success (co-solved, n={r['co_solved']}): {_f(r['time_to_success_mean_s']['row'])} s vs "
                  f"{_f(r['time_to_success_mean_s']['baseline'])} s: {_updown(r['time_reduction'])}, time saved 95 % CI "
                  f"[{_f(ci and 100 * ci[0], '.1f')}, {_f(ci and 100 * ci[1], '.1f')}] % "
                  f"(target >= 30 %, CI excluding 0).",
                  f"- Success {r['success']['row']:.3f} vs {r['success']['baseline']:.3f} (McNemar p = {r['mcnemar_p']:.3g}); "
                  f"baseline engine utilisation {r['baseline_engine_utilization']:.3f} (target >= 0.9).",
                  f"- Why, from the run: {p['scheduler']} + {p['horizon']} needed "
                  f"{r['evidence']['rounds_per_episode']['row']:.1f} rounds per episode vs "
                  f"{r['evidence']['rounds_per_episode']['baseline']:.1f} ({r['evidence']['actions_per_round']['row']:.2f} vs "
                  f"{r['evidence']['actions_per_round']['baseline']:.2f} actions per round) on an engine busy "
                  f"{r['evidence']['engine_utilization']['baseline']:.0%} of the time with batches of "
                  f"{r['evidence']['mean_batch']['baseline']:.1f}: at saturation every round waits for its share of the "
                  f"engine, so time follows rounds.",
                  f"- Checks: {', '.join(k + (' met' if v else ' MISSED') for k, v in r['checks'].items())}. "
                  f"**Primary target {'met' if r['met'] else 'missed'}.**"]
    else:
        lines.append(f"- Primary: {r}")
    o = p.get("ordering_result")
    if isinstance(o, dict):
        ci = o["ci95"]
        ev = o["evidence"]
        lines.append(f"- Ordering share: {_f(o['time_reduction'] and 100 * o['time_reduction'], '.1f')} % "
                     f"(95 % CI [{_f(ci and 100 * ci[0], '.1f')}, {_f(ci and 100 * ci[1], '.1f')}] %), target >= 10 % with "
                     f"the CI excluding 0: **{'met' if o['met'] else 'missed'}**. From the run: the baseline's mean batch "
                     f"{_f(ev['mean_batch'], '.1f')} of at most {ev['saturation_batch']}, more requests waiting than one full "
                     f"batch {_f(ev['backlogged_share_baseline'] and 100 * ev['backlogged_share_baseline'], '.0f')} % of the time, "
                     f"{_f(ev['rounds_per_episode_baseline'], '.1f')} rounds per episode. Little's law for a fleet closed "
                     f"at N on a saturated engine (N x rounds per episode / chunks per s): "
                     f"{ev['little_law_episode_s']['row']:.2f} s vs {ev['little_law_episode_s']['baseline']:.2f} s, "
                     f"measured mean episode {ev['episode_mean_s']['row']:.2f} s vs {ev['episode_mean_s']['baseline']:.2f} s: "
                     f"the order cannot change the mean, only which episodes wait (P95 time to success "
                     f"{_f(ev['time_to_success_p95_s']['row'])} s vs {_f(ev['time_to_success_p95_s']['baseline'])} s).")
    else:
        lines.append(f"- Ordering share: {o}")
    return lines


def regime_lines(rep: dict, g: dict) -> list:
    """One regime's baseline and table of rows, as Markdown lines (the report; the demo prints the 100-robot one)."""
    lines = [f"Baseline: {g.get('baseline') or 'not determined (static rows missing)'}"
             + (f" (best static: {g['best_static']}; not below it: {', '.join(g['eligible'])})" if g.get("baseline") else "")
             + f"; trigger point {g.get('trigger_actions')} actions; restricted mean capped at {g['restricted_cap_s']:.1f} s.", "",
             "| row | episodes | success (95 % CI) | time to success s | time saved vs baseline | McNemar p | restricted mean s "
             "| P95 s | idle/episode s | rounds/episode | actions/round | engine util | mean batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rep["rows"]:
        if (x["robots"], x["profile"]) != (g["robots"], g["profile"]):
            continue
        red, ci = x.get("time_reduction_vs_baseline"), x.get("time_reduction_ci95")
        vs = "baseline" if x["baseline"] else (
            f"{100 * red:+.1f} % [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if red is not None and ci else "-")
        lines.append(f"| {x['scheduler']} + {x['horizon']} | {x['episodes']} | {x['success']:.3f} "
                     f"({x['success_ci95'][0]:.2f}-{x['success_ci95'][1]:.2f}) | {_f(x['time_to_success_mean_s'])} "
                     f"| {vs} | {_f(x.get('mcnemar_p_vs_baseline'), '.3g')} | {_f(x['restricted_mean_s'])} "
                     f"| {_f(x['time_to_success_p95_s'])} | {_f(x['idle_per_episode_s'])} | {_f(x['rounds_per_episode'], '.1f')} "
                     f"| {_f(x['actions_per_round'])} | {_f(x['engine_utilization'], '.3f')} | {_f(x['mean_batch'], '.1f')} |")
    return lines


def rtc_lines(rows: list) -> list:
    """The RTC rows (--rtc): the delays the loaded fleet's dispatcher set, and each row against its plain twin."""
    rtc = [x for x in rows if "rtc" in x]
    if not rtc:
        return []
    out = ["", "## Real-time chunking rows", "",
           "Every robot sends its leftover with each round; the server sets d at dispatch (queueing + the batch's "
           "profile latency, docs/rtc_serving.md), the flow head inpaints with the paper's soft guidance, the robot "
           "splices the chunk at d. Against the same row without RTC (paired episodes).", "",
           "| row | guided chunks | d p50 | d mean | came after the leftover ran out | success vs plain (McNemar p) "
           "| time saved vs plain (95 % CI) |", "|---|---|---|---|---|---|---|"]
    for x in rtc:
        r = x["rtc"]
        red, ci = r.get("time_reduction_vs_plain"), r.get("ci95")
        vs = f"{100 * red:+.1f} % [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if red is not None and ci else "-"
        plain = (f"{x['success']:.3f} vs {r['success_plain']:.3f} (p = {r['mcnemar_p_vs_plain']:.3g})"
                 if "success_plain" in r else "- (no plain twin: its row above is against the baseline)")
        out.append(f"| {x['robots']} robots {x['profile']}: {x['scheduler']} + {x['horizon']} | {r['guided']} "
                   f"| {_f(r['d_p50'], '.0f')} | {_f(r['d_mean'], '.1f')} | {_f(r['held_share'] and 100 * r['held_share'], '.0f')} % "
                   f"| {plain} | {vs} |")
    return out
