"""Markdown + PNG of a timely bench run: per task type time utility, response time and robot
waiting time per scheduler (seed 002 Fig. 5 / 8 / 9), the summary table and the ratios."""
from __future__ import annotations

from pathlib import Path

FIELDS = ["utility_urgent_mean", "utility_normal_mean", "utility_mean", "response_time_mean_s",
          "waiting_time_total_s", "decision_ms_median", "utility_urgent_mean_clamped"]


def write_report(out: dict, report_dir: Path, stem: str) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in out if n not in ("ratios", "meta")]
    meta = out["meta"]
    png = report_dir / f"{stem}.png"
    _plot(out, names, png)
    lines = [f"# TimelyLLM bench: {Path(meta['trace']).name}, {meta['mode']}", "",
             f"`robotserve bench timely --trace {meta['trace']} --out DIR{' --sim' if meta['mode'] == 'sim' else ''}`",
             "", f"- plans: {meta.get('live_plans', meta['plans'])}"
             + (f" (the requests of the trace's first {meta['live_window_s']:.0f} s, live on this CPU)"
                if meta["mode"] == "live" else " (whole trace, virtual clock, engine times from the profile of record)"),
             f"- engine: SmolLM2-135M ({meta.get('profile_dtype')}), profile `{meta['profile']}`; max batch "
             f"{meta['max_batch']}; segment tokens mean {meta['segment_tokens_mean']}, max {meta['segment_tokens_max']};"
             f" prompt tokens mean {meta['prompt_tokens_mean']}, prefilled per request {meta['prefill_tokens_mean']}"
             f" ({'the system turn is a cached server-side prefix' if meta['prefix_cache'] else 'no prefix cache'})",
             f"- plans: {meta['plan_template']}", f"- utility: {meta['utility']}",
             *([f"- ASSUMPTION: engine {meta['engine_speedup']}x faster than this CPU's profile, so that a mean "
                f"segment takes {meta['segment_ms']:g} ms at batch 1 (the paper's engine, §7.1)"]
               if meta.get("segment_ms") else []),
             f"- load average before {tuple(round(x, 2) for x in meta['loadavg_before'])}, after "
             f"{tuple(round(x, 2) for x in meta['loadavg_after'])}; {meta['wall_s']} s", "",
             "| scheduler | " + " | ".join(FIELDS) + " | decision ms at 8 tasks (microbench) |",
             "|---" * (len(FIELDS) + 2) + "|"]
    for n in names:
        r = out[n]
        lines.append(f"| {n} | " + " | ".join(_fmt(r.get(f)) for f in FIELDS)
                     + f" | {_fmt(r.get('decision_ms_median_8_tasks_microbench'))} |")
    lines += ["", "Ratios (timely vs fcfs, the vLLM-like whole-plan baseline):", "",
              "```", *(f"{k}: {v}" for k, v in out["ratios"].items()), "```", ""]
    if any("segmentation_overhead" in out[n] for n in names):
        lines += ["Segmentation overhead (stop checks + KV moves between per-request and batch caches, "
                  "share of engine generation time):", ""]
        for n in names:
            so = out[n].get("segmentation_overhead")
            if so:
                lines.append(f"- {n}: {so['overhead_pct_of_generation']} % ({so['stop_check_s']} s stop checks, "
                             f"{so['kv_move_s']} s KV moves, {so['engine_s']} s engine, {so['segments']} segments)")
        lines.append("")
    lines += ["Per task type (utility mean / response time mean s / waiting time mean s):", "",
              "| task type | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    types = sorted({t for n in names for t in out[n]["per_task_type"]})
    for t in types:
        cells = []
        for n in names:
            v = out[n]["per_task_type"].get(t)
            cells.append(f"{_fmt(v['utility_mean'])} / {_fmt(v['response_time_mean_s'])} / "
                         f"{_fmt(v['waiting_time_mean_s'])}" if v else "-")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += ["", f"![per task type]({png.name})", ""]
    md = report_dir / f"{stem}.md"
    md.write_text("\n".join(lines))
    return md


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def _plot(out: dict, names: list, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    types = sorted({t for n in names for t in out[n]["per_task_type"]})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    x = np.arange(len(types))
    w = 0.8 / max(len(names), 1)
    for ax, key, title in zip(axes, ("utility_mean", "response_time_mean_s", "waiting_time_mean_s"),
                              ("time utility (Eq. 1)", "response time (s)", "robot waiting time (s)")):
        for i, n in enumerate(names):
            vals = [(out[n]["per_task_type"].get(t) or {}).get(key) for t in types]
            ax.bar(x + i * w, [v if v is not None else 0 for v in vals], w, label=n)
        ax.set_xticks(x + w * (len(names) - 1) / 2, [t.replace("-urgent", "\nurgent") for t in types], fontsize=7)
        ax.set_title(title)
        ax.axhline(0, color="k", lw=0.5)
    axes[0].legend(fontsize=7)
    meta = out["meta"]
    fig.suptitle(f"TimelyLLM bench, {Path(meta['trace']).name} ({meta['mode']})")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
