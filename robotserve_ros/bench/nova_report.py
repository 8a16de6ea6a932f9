"""`robotserve bench nova`'s report (seed 003): Nova against each baseline per workload and
load, read off the rows, as DIR/nova.md + nova.png with its reading of the numbers."""
from __future__ import annotations

import json
from pathlib import Path


SCHEDULERS = ("nova", "fcfs", "prefill_first", "chunked_prefill", "static_partition")


BASELINES = ("fcfs", "prefill_first", "chunked_prefill", "static_partition")


def compare(rows: list) -> list:
    """Per (mode, workload, rate): Nova vs the baseline with the lowest max latency (all of
    them, whatever their throughput: the throughput ratio is stated beside it), the baseline
    with the lowest average, and the best baseline that does not partition the device.
    `target_met`: max >= 15 % lower at >= equal throughput (1 % tolerance) and average not worse."""
    out = []
    keys = sorted({(r["mode"], r["workload"], r["rate"]) for r in rows})
    for key in keys:
        group = {r["scheduler"]: r for r in rows if (r["mode"], r["workload"], r["rate"]) == key}
        nova = group.get("nova")
        if nova is None or "max_latency_s" not in nova:
            continue
        base = [group[b] for b in BASELINES if b in group and "max_latency_s" in group[b]]
        best = min(base, key=lambda b: b["max_latency_s"])
        best_avg = min(base, key=lambda b: b["avg_latency_s"])
        unpart = [b for b in base if b["scheduler"] != "static_partition"]
        best_u = min(unpart, key=lambda b: b["max_latency_s"])
        cut = 1 - nova["max_latency_s"] / best["max_latency_s"]
        thr = nova["throughput_rps"] / best["throughput_rps"]
        avg = nova["avg_latency_s"] / best_avg["avg_latency_s"] - 1
        out.append({"mode": key[0], "workload": key[1], "rate": key[2], "best_baseline": best["scheduler"],
                    "max_cut": cut, "avg_vs_best_avg": avg, "best_avg_baseline": best_avg["scheduler"],
                    "throughput_ratio": thr, "target_met": cut >= 0.15 and thr >= 0.99 and avg <= 0.0,
                    "best_unpartitioned": best_u["scheduler"],
                    "max_cut_vs_unpartitioned": 1 - nova["max_latency_s"] / best_u["max_latency_s"],
                    "avg_cut_vs_unpartitioned": 1 - nova["avg_latency_s"] / best_u["avg_latency_s"]})
    return out


def write_report(d: Path, data: dict, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d.mkdir(parents=True, exist_ok=True)
    (d / "nova.json").write_text(json.dumps(data, indent=1) + "\n")
    rows = meta["rows_full"]
    modes = [m for m in ("sim:measured", "sim:paper-shaped") if any(r["mode"] == m for r in rows)]
    wls = sorted({r["workload"] for r in rows if r["mode"].startswith("sim")})
    fig, axes = plt.subplots(len(modes), len(wls) * 2, figsize=(5 * len(wls) * 2, 3.6 * len(modes)), squeeze=False)
    for i, m in enumerate(modes):
        for j, w in enumerate(wls):
            for name in SCHEDULERS:
                rs = sorted((r for r in rows if r["mode"] == m and r["workload"] == w and r["scheduler"] == name),
                            key=lambda r: r["rate"])
                axes[i][2 * j].plot([r["rate"] for r in rs], [r["max_latency_s"] for r in rs], "o-", label=name)
                axes[i][2 * j + 1].plot([r["rate"] for r in rs], [r["avg_latency_s"] for r in rs], "o-", label=name)
            axes[i][2 * j].set_title(f"{m} / {w}: max latency")
            axes[i][2 * j + 1].set_title(f"{m} / {w}: avg latency")
            for ax in axes[i][2 * j:2 * j + 2]:
                ax.set_xlabel("rate (req/s)")
                ax.set_ylabel("s")
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d / "nova.png", dpi=90)
    plt.close(fig)

    def fmt(r):
        q = r.get("queue_s", {})
        return (f"| {r['mode']} | {r['workload']} | {r['rate']:.3f} | {r['scheduler']} | {r['avg_latency_s']:.2f} | "
                f"{r['p95_latency_s']:.2f} | {r['max_latency_s']:.2f} | {r['throughput_rps']:.3f} | "
                f"{q.get('vision', 0):.2f} / {q.get('prefill', 0):.2f} / {q.get('decode', 0):.2f} |")

    lines = [
        "# Nova (seed 003): stage-pipelined VLM serving, measured here", "",
        f"Device: {data['device']}. Load average before {meta['loadavg_before']}, after {meta['loadavg_after']}; "
        f"{meta['seconds']:.0f} s. Engine: StagedVLM `{meta['shape']}` (random weights, SmolVLM2-shaped).", "",
        "## Nova vs the best baseline (lowest max latency of the four)", "",
        "Target: max latency >= 15 % below the best baseline at equal or higher throughput, average not worse.", "",
        "Cuts are Nova's reductions (positive: Nova lower, negative: Nova higher).", "",
        "| mode | workload | rate | best baseline (max) | Nova's max cut | Nova's avg cut vs best avg | throughput "
        "Nova / best | met | best non-partitioned | max cut vs it | avg cut vs it |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in meta["compare"]:
        lines.append(f"| {c['mode']} | {c['workload']} | {c['rate']:.3f} | {c['best_baseline']} | "
                     f"{100 * c['max_cut']:+.1f} % | {-100 * c['avg_vs_best_avg']:+.1f} % ({c['best_avg_baseline']}) | "
                     f"{c['throughput_ratio']:.3f} | {'yes' if c['target_met'] else 'no'} | {c['best_unpartitioned']} | "
                     f"{100 * c['max_cut_vs_unpartitioned']:+.1f} % | {100 * c['avg_cut_vs_unpartitioned']:+.1f} % |")
    lines += [""] + reading(data, meta)
    lines += ["", "## Every row", "",
              "| mode | workload | rate | scheduler | avg s | P95 s | max s | req/s | queue vision / prefill / decode s |",
              "|---|---|---|---|---|---|---|---|---|"] + [fmt(r) for r in rows]
    lines += ["", "## Vision-encoder offload (§III-E)", "",
              "Layers fed from a memory-mapped safetensors file into K physical layers, one layer ahead, by a "
              "loader thread; `stall` is the time compute waited for a swap-in. Target: >= 50 % less resident "
              "vision-encoder memory with <= 10 % added vision latency. The record (nova.json) is the last row.", "",
              "| shape | layers | K | weights MB before -> after | cut | vision ms resident -> offloaded | ratio | "
              "stall ms/pass | outputs equal | process RSS of a model copy -> after offload MB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for off in meta.get("offloads", [meta["offload_full"]]):
        lines.append(f"| {off['shape']} | {off['layers']} | {off['physical_layers']} | {off['resident_mb_before']} -> "
                     f"{off['resident_mb_after']} | {100 * (1 - off['resident_mb_after'] / off['resident_mb_before']):.0f} % "
                     f"| {off['vision_ms_resident']} -> {off['vision_ms_offloaded']} | {off['vision_latency_ratio']} | "
                     f"{off.get('stall_ms_per_pass', '')} | {off['outputs_equal']} | {off['process_rss_mb_model_copy']} -> "
                     f"{off['process_rss_mb_after_offload']} |")
    lines += ["",
              "## Measured profile", "", "```", json.dumps(meta["profile"], indent=1), "```", "",
              "## Partition plans (measured profile)", "", "```",
              json.dumps({w: {k: v for k, v in p.items() if k != "frontier"} for w, p in meta["plans"].items()},
                         indent=1), "```", "", "![nova](nova.png)", ""]
    (d / "README.md").write_text("\n".join(lines))


def reading(data: dict, meta: dict) -> list:
    """What the run shows, in words, every number computed from this run."""
    out = ["## Reading", ""]
    prof, cmp, rows = meta["profile"], meta["compare"], meta["rows_full"]
    plans = meta["plans"]
    one = all(p["n0_vision"] == p["n_min"] == p["n0_prefill"] for p in plans.values())
    cr = prof.get("corun", {})
    out.append(f"- Measured profile: {prof['total']} {prof['unit']}; the partitions are decode shares 1..{prof['total'] - 1}"
               + (", so Nova's adaptive share (Eq. 5) has a single value and Nova equals static_partition here."
                  if one else "."))
    out.append(f"- Co-running the front and decode workers slowed vision x{cr.get('front', 1):.2f} and decode "
               f"x{cr.get('decode', 1):.2f} (load average {meta['loadavg_before'][0]:.1f} on {prof['total']} cores "
               "shared with other jobs): there is little idle compute for a second stage to use, so pipelining "
               "mostly time-shares, while the sequential baselines batch decode more.")
    for mode in ("sim:measured", "sim:paper-shaped", "live"):
        cs = [c for c in cmp if c["mode"] == mode]
        if not cs:
            continue
        met = sum(c["target_met"] for c in cs)
        mx = [100 * c["max_cut"] for c in cs]
        un = [100 * c["max_cut_vs_unpartitioned"] for c in cs]
        out.append(f"- {mode}: target met at {met} of {len(cs)} points; Nova's max-latency cut vs the best baseline "
                   f"{min(mx):+.1f} .. {max(mx):+.1f} %, vs the best non-partitioned baseline {min(un):+.1f} .. "
                   f"{max(un):+.1f} %.")
    live = {r["scheduler"]: r for r in rows if r["mode"] == "live"}
    if one and "nova" in live and "static_partition" in live:
        a, b = live["nova"]["max_latency_s"], live["static_partition"]["max_latency_s"]
        out.append(f"- Live, nova and static_partition are the same policy on this machine, yet their max latency "
                   f"differs by {100 * abs(a - b) / min(a, b):.0f} % ({a:.2f} vs {b:.2f} s): the live run's noise "
                   "here is larger than the 15 % target, so the live rows show the path works, not who wins.")
    out.append("- The paper-shaped profile is synthesized from the paper's numbers (not measured); there the best "
               "static partition is chosen per rate from a grid after the fact (an oracle), the hardest baseline.")
    offs = meta.get("offloads", [])
    for o in offs:
        cut = 100 * (1 - o["resident_mb_after"] / o["resident_mb_before"])
        ok = cut >= 50 and o["vision_latency_ratio"] <= 1.10
        out.append(f"- Offload `{o['shape']}`: {cut:.0f} % less vision-encoder weight memory, vision latency "
                   f"x{o['vision_latency_ratio']:.3f} (target >= 50 %, <= x1.10: {'met' if ok else 'missed'}); "
                   f"compute waited {o.get('stall_ms_per_pass', 0)} ms per pass for swap-ins, so any added time is "
                   "the copy competing for the same cores, not waiting.")
    return out
