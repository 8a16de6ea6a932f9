"""`robotserve bench slo`'s report (seed 004 §4): the issue's targets read off the rows (at the
highest rate where fcfs_cb still attains 50 % end to end) and DIR/slo.md + slo.png."""
from __future__ import annotations

import json
from pathlib import Path


SCHEDULERS = ("fcfs_cb", "urgency_only", "slack_only", "urgency_slack")


# --------------------------------------------------------------------------------------------
# Targets and report
# --------------------------------------------------------------------------------------------
def evaluate(rows: list[dict]) -> dict:
    """Issue 13's targets on one mode's rows: at the highest rate where fcfs_cb attains >= 50 %
    end to end, urgency_slack >= 25 % higher with decode tokens/s not lower; each ablation's
    share of the gain."""
    by = {(r["scheduler"], r["rate"]): r for r in rows}
    rates = sorted({r["rate"] for r in rows})
    ok = [x for x in rates if by[("fcfs_cb", x)]["e2e_attainment"] >= 0.5]
    if not ok:
        return {"rate": None, "note": "fcfs_cb never attains 50 % end to end"}
    x = max(ok)
    f, k = by[("fcfs_cb", x)], by[("urgency_slack", x)]
    gain = k["e2e_attainment"] - f["e2e_attainment"]
    out = {"rate": x, "fcfs_cb_e2e": f["e2e_attainment"], "urgency_slack_e2e": k["e2e_attainment"],
           "e2e_gain_points": 100 * gain, "e2e_gain_relative_pct": 100 * gain / f["e2e_attainment"],
           "decode_tps_ratio": k["decode_tokens_per_s"] / f["decode_tokens_per_s"] if f["decode_tokens_per_s"] else None}
    out["met_e2e_relative_25pct"] = out["e2e_gain_relative_pct"] >= 25.0
    out["met_e2e_points_25"] = out["e2e_gain_points"] >= 25.0
    out["met_decode_not_lower"] = out["decode_tps_ratio"] is not None and out["decode_tps_ratio"] >= 1.0
    for ab in ("urgency_only", "slack_only"):
        g = by[(ab, x)]["e2e_attainment"] - f["e2e_attainment"]
        out[f"{ab}_gain_points"] = 100 * g
        out[f"{ab}_share_of_gain"] = g / gain if abs(gain) > 1e-9 else None
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("sim", "live", "sim_decode_bound") if res.get(m)]
    metrics_ = (("e2e_attainment", "end-to-end SLO attainment"), ("ttft_attainment", "TTFT SLO attainment"),
                ("tpot_attainment", "TPOT SLO attainment"), ("decode_tokens_per_s", "decode tokens/s per request (median)"))
    fig, axes = plt.subplots(len(modes), 4, figsize=(18, 4.2 * len(modes)), squeeze=False)
    for i, mode in enumerate(modes):
        rows = [d for d in res[mode]["details"] if d["mode"] == mode]
        for j, (key, title) in enumerate(metrics_):
            ax = axes[i][j]
            for s in dict.fromkeys(d["scheduler"] for d in rows):
                pts = sorted((r["rate"], r[key]) for r in rows if r["scheduler"] == s)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s,
                        linestyle=":" if s not in SCHEDULERS else "-")
            ax.set_title(f"{mode}: {title}", fontsize=10)
            ax.set_xlabel("requests/s")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(res: dict, path: Path) -> None:
    L = ["# SLO-aware disaggregated LLM serving (seed 004): `robotserve bench slo`", "",
         f"Machine: {res['machine']['cpu']} ({res['machine']['cores']} cores), load average "
         f"{res['loadavg_start']} at start, {res['loadavg_end']} at end; {res['bench_wall_s']:.0f} s in all.",
         f"Profile: `{res['profile_file']}` ({res['profile_meta'].get('model', '?')}, measured "
         f"{res['profile_meta'].get('measured_at', '?')}).", ""]
    if res.get("notes"):
        L += ["Notes:", ""] + [f"- {n}" for n in res["notes"]] + [""]
    for mode in ("sim", "live", "sim_decode_bound"):
        m = res.get(mode)
        if not m:
            continue
        L += [f"## {mode}", "",
              f"TTFT SLO {m['ttft_slo_s']:.3f} s, TPOT SLO {1000 * m['tpot_slo_s']:.1f} ms (from the profile, see "
              f"bench/slo.py); rates are multiples of {m['capacity']['fcfs_cb_knee_req_s']:.4f} req/s, where the "
              f"simulator has fcfs_cb attain 50 % e2e (analytic capacity: prefill {m['capacity']['prefill_req_s']:.3f}, "
              f"decode at the TPOT SLO {m['capacity']['decode_req_s']:.3f} req/s); "
              f"{m['requests']} requests per run; mix: {json.dumps(m['mix_summary'])}.", ""]
        if mode == "live":
            sp = m["split"]
            L += [f"Disaggregation: the prefill worker ({sp['prompt_tokens']}-token prompt, {sp['prefill_alone_s']:.2f} s alone) "
                  f"and the decode worker ({sp['decode_steps']} steps at batch {sp['decode_batch']}, "
                  f"{sp['decode_alone_s']:.2f} s alone) took {sp['together_s']:.2f} s side by side: overlap "
                  f"x{sp['overlap']:.2f} (2 = a core each, 1 = serialised; load {sp['loadavg_1m']}).", ""]
            L += [f"KV handover (prefill engine export + decode engine import, in-process tensors): "
                  f"{m['kv_handover']['ms_mean']:.2f} ms mean for {m['kv_handover']['bytes_mean'] / 1e6:.2f} MB mean "
                  f"over {m['kv_handover']['handovers']} handovers.", ""]
        live = mode == "live"
        L += ["| rate (req/s) | scheduler | TTFT att. | TPOT att. | e2e att. | decode tok/s (median per request) | "
              "system decode tok/s |" + (" load avg (1 min) before |" if live else ""),
              "|---|---|---|---|---|---|---|" + ("---|" if live else "")]
        for d in m["details"]:
            if d["mode"] != mode:
                continue
            L.append(f"| {d['rate']:.3f} | {d['scheduler']} | {d['ttft_attainment']:.3f} | {d['tpot_attainment']:.3f} | "
                     f"{d['e2e_attainment']:.3f} | {d['decode_tokens_per_s']:.2f} | "
                     f"{d.get('decode_tokens_per_s_system', float('nan')):.2f} |"
                     + (f" {d.get('loadavg_1m_before', float('nan')):.1f} |" if live else ""))
        ev = m["targets"]
        L += ["", "**Targets** (issue 13):", ""]
        if ev.get("rate") is None:
            L.append(f"- {ev['note']}")
        else:
            L += [f"- highest rate where fcfs_cb attains >= 50 % e2e: {ev['rate']:.3f} req/s "
                  f"(fcfs_cb {ev['fcfs_cb_e2e']:.3f}, urgency_slack {ev['urgency_slack_e2e']:.3f})",
                  f"- e2e gain: {ev['e2e_gain_points']:+.1f} points, {ev['e2e_gain_relative_pct']:+.1f} % relative "
                  f"(target >= 25 %: {'met' if ev['met_e2e_relative_25pct'] else 'MISSED'} relative, "
                  f"{'met' if ev['met_e2e_points_25'] else 'missed'} in points)",
                  f"- decode tok/s urgency_slack / fcfs_cb: {ev['decode_tps_ratio']:.3f} "
                  f"({'met' if ev['met_decode_not_lower'] else 'MISSED'}: not lower)",
                  f"- ablation: urgency_only {ev['urgency_only_gain_points']:+.1f} points, slack_only "
                  f"{ev['slack_only_gain_points']:+.1f} points of urgency_slack's {ev['e2e_gain_points']:+.1f}"]
        L.append("")
    L += ["![SLO attainment and decode speed vs rate](slo.png)", ""]
    path.write_text("\n".join(L) + "\n")
