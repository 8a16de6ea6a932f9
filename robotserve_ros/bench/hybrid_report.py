"""`robotserve bench hybrid`'s report: per rate, edge-only vs cloud-only vs hybrid placement
(seed 000 Figure 13 in small), the gRPC overhead and the cloud-server kill, as DIR/hybrid.md."""
from __future__ import annotations

from pathlib import Path

import numpy as np


WORKLOAD = "bimanual-diffusion"


MODES = ("edge_only", "cloud_only", "hybrid")


def summarize(res: dict) -> dict:
    by = {(r["mode"], r["rate"]): r for r in res["runs"]}
    rates = res["setting"]["rates"]
    out = {"avg_latency_s": {m: {str(rt): by[(m, rt)]["avg_latency_s"] for rt in rates} for m in MODES},
           "slowdown_vs_alone": {m: {str(rt): by[(m, rt)]["slowdown"] for rt in rates} for m in MODES},
           "hybrid_vs_edge_only_reduction": {}, "hybrid_vs_cloud_only_reduction": {}, "hybrid_offloaded": {}}
    for rt in rates:
        e, c, h = (by[(m, rt)]["avg_latency_s"] for m in MODES)
        out["hybrid_vs_edge_only_reduction"][str(rt)] = 1 - h / e
        out["hybrid_vs_cloud_only_reduction"][str(rt)] = 1 - h / c
        served = by[("hybrid", rt)]["served_by_tier"]
        out["hybrid_offloaded"][str(rt)] = served.get("cloud", 0) / max(1, sum(served.values()))
    top = str(max(rates))
    out["highest_rate"] = max(rates)
    out["targets"] = {"vs_edge_only_>=30%": out["hybrid_vs_edge_only_reduction"][top] >= 0.30,
                      "vs_cloud_only_>=45%": out["hybrid_vs_cloud_only_reduction"][top] >= 0.45}
    k = res["server_killed"]
    out["server_killed"] = {"requested": k["rounds_requested"], "answered": k["rounds_answered"],
                            "lost": k["rounds_lost"], "duplicated": k["rounds_duplicated"],
                            "finished": f"{k['finished']}/{k['tasks']}", "requeued": k["requeued"],
                            "late_replies_discarded": k["late_replies_discarded"], "at_kill": k["killed"]}
    return out


def write_markdown(res: dict, path: Path) -> None:
    s, st = res["summary"], res["setting"]
    g = res["grpc_overhead"]
    by = {(r["mode"], r["rate"]): r for r in res["runs"]}
    pings = [x for x in res["ping_rtt_s"] if x]
    lines = [
        "# Hybrid edge-cloud placement (seed 000 Figure 13 in small)", "",
        f"Edge: simulated `{WORKLOAD}` diffusion profile (CPU-measured, batch 1-16: "
        f"{st['edge_profile_ms'][1]:.0f}-{st['edge_profile_ms'][16]:.0f} ms), one instance. Cloud: ONE "
        f"`robotserve gpu-server` engine instance {st['cloud_speedup']}x faster (A100 vs RTX A6000, assumed), one batch "
        f"in flight, across network namespaces: veth + tbf {st['link_rate_mbit']:.0f} Mbit/s + a delaying relay "
        f"({st['wan_rtt_ms']:.0f} ms round trip; measured ping {1000 * float(np.median(pings)):.1f} ms). "
        f"Kairos scheduler; whole tasks (static horizons, {by[(MODES[0], st['rates'][0])]['rounds_total'] / by[(MODES[0], st['rates'][0])]['tasks']:.0f} "
        f"rounds per task on average); robots trigger at ceil(edge batch-1 latency x 30 Hz) actions left, wherever "
        f"they are served; {st['duration_s']:.0f} s of Poisson arrivals per run; the three modes of a rate run side by side.", "",
        "Average end-to-end task latency (slowdown over the contention-free latency of the same tasks):", "",
        "| rate (tasks/s) | tasks | " + " | ".join(MODES) + " | hybrid vs edge_only | hybrid vs cloud_only | hybrid offloaded |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rt in st["rates"]:
        k = str(rt)
        lines.append(f"| {rt:g} | {by[('hybrid', rt)]['tasks']} | " + " | ".join(
            f"{by[(m, rt)]['avg_latency_s']:.1f} s ({by[(m, rt)]['slowdown']:.2f}x)" for m in MODES)
            + f" | {100 * s['hybrid_vs_edge_only_reduction'][k]:.1f}% | {100 * s['hybrid_vs_cloud_only_reduction'][k]:.1f}%"
            f" | {100 * s['hybrid_offloaded'][k]:.0f}% |")
    top = str(s["highest_rate"])
    k = s["server_killed"]
    at = k["at_kill"] or {}
    lines += [
        "", f"At {s['highest_rate']:g} tasks/s hybrid lowers average end-to-end latency by "
        f"**{100 * s['hybrid_vs_edge_only_reduction'][top]:.1f}%** vs edge-only (target >= 30%: "
        f"{'met' if s['targets']['vs_edge_only_>=30%'] else 'MISSED'}; paper 36.9-47.7%) and by "
        f"**{100 * s['hybrid_vs_cloud_only_reduction'][top]:.1f}%** vs cloud-only (target >= 45%: "
        f"{'met' if s['targets']['vs_cloud_only_>=45%'] else 'MISSED'}; paper 51.9-67.9%).", "",
        f"Cloud server SIGKILLed mid-run (hybrid, {res['server_killed']['rate']:g} tasks/s) at {at.get('at_s', float('nan')):.1f} s, "
        f"with batches in flight {at.get('inflight_batches')} ({at.get('inflight_requests')} requests; both tiers busy: "
        f"{at.get('both_tiers_busy')}) and {at.get('pending')} pending: {k['requested']} rounds requested, {k['answered']} answered, "
        f"**{k['lost']} lost, {k['duplicated']} duplicated**, {k['finished']} tasks finished; {k['requeued']} requests requeued, "
        f"{k['late_replies_discarded']} late replies discarded.", "",
        f"gRPC overhead, loopback, batch of 8 x 224x224x3 ({g['payload_bytes']} bytes): median round trip "
        f"{1000 * g['grpc_round_trip_median_s']:.2f} ms beside {1000 * g['raw_copy_median_s']:.3f} ms to copy the raw payload "
        f"({g['ratio']:.0f}x).", "",
        f"Load average (1/5/15 min) at start {'/'.join(f'{x:.1f}' for x in res['loadavg_start'])}, at end "
        f"{'/'.join(f'{x:.1f}' for x in res['loadavg_end'])} (2 cores shared with other work); bench wall "
        f"{res.get('bench_wall_s', float('nan')):.0f} s.", "",
    ]
    path.write_text("\n".join(lines))
