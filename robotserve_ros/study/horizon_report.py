"""Reports of the horizon study (study/horizon.py): the best static H and the matched
dynamic settings, the Markdown and Fig. 11 plots, the merged runs of record, and the fleet
workload written from a study.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np


def wilson_ci(successes: int, n: int, z: float = 1.96) -> list:
    """95 % Wilson score interval of a success rate."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    w = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [float(max(0.0, c - w)), float(min(1.0, c + w))]


def best_static(rows: list) -> dict:
    """Seed 000 §5.3: the largest static H that achieves the highest static success."""
    st = [r for r in rows if r["policy"] == "static"]
    top = max(r["success"] for r in st)
    return max((r for r in st if r["success"] >= top), key=lambda r: r["param"])


def matched(rows: list, policy: str, bs: dict) -> Optional[dict]:
    """The policy's setting with the longest mean horizon whose success reaches the best static
    success within its 95 % CI (success >= the static CI's lower bound)."""
    ok = [r for r in rows if r["policy"] == policy and r["success"] >= bs["success_ci95"][0]]
    return max(ok, key=lambda r: r["mean_horizon"]) if ok else None


DYNAMIC = ("confidence", "schedule", "self_consistency", "learned", "agreement")


def dynamic_policies(rows: list) -> list:
    """The dynamic policies present in rows: DYNAMIC's order, learned variants (learned-cos<c>,
    labels at another cosine threshold) after 'learned'."""
    have = {r["policy"] for r in rows if r["policy"] != "static"}
    out = []
    for p in DYNAMIC:
        out += [q for q in sorted(have) if _base(q) == p]
    return out + sorted(have - set(out))


def _base(policy: str) -> str:
    """The registry policy of a study row's name: learned-cos<c> and <policy>+<tag> variants."""
    p = policy.split("+")[0]
    return "learned" if p.startswith("learned") else p


# Policies whose extra batch rows the fleet simulator's workload format cannot charge (it
# records actions per round, one row each): kept out of measured workloads.
SAMPLING = ("self_consistency",)


def best_dynamic(rows: list, sampling: bool = True) -> dict:
    """The dynamic setting with the longest mean horizon at matched success (CI), else the most
    successful dynamic setting; sampling=False leaves out policies that add batch rows."""
    pols = [p for p in dynamic_policies(rows) if sampling or p not in SAMPLING]
    bs = best_static(rows)
    ms = [m for m in (matched(rows, p, bs) for p in pols) if m is not None]
    if ms:
        return max(ms, key=lambda r: r["mean_horizon"])
    return max((r for r in rows if r["policy"] in pols), key=lambda r: (r["success"], r["mean_horizon"]))


def to_workload(rows: list, meta: dict, static_row: dict, dyn_row: dict, name: str = "pushgust-diffusion"):
    """The simulator's workload: per evaluated episode one task; static = the rounds of the best
    static H, dynamic = the rounds of the chosen dynamic setting on the same arena (seed)."""
    from ..sim.workload import TaskSpec, Workload

    by_seed = dict(zip(dyn_row["episode_seeds"], dyn_row["rounds"]))
    tasks = []
    for s, r in zip(static_row["episode_seeds"], static_row["rounds"]):
        tasks.append(TaskSpec(f"pushgust-{s}", float(meta["control_hz"]),
                              {"static": tuple(int(x) for x in r), "dynamic": tuple(int(x) for x in by_seed[s])}))
    lat = {int(k): float(v) for k, v in meta["engine_profile_ms"].items()}
    return Workload(name, lat, tuple(tasks))


PARAM_NAME = {"static": "H", "confidence": "t", "schedule": "t", "self_consistency": "tau", "learned": "scale",
              "agreement": "tau"}
COLORS = {"static": "gray", "confidence": "tab:orange", "schedule": "tab:green", "self_consistency": "tab:purple",
          "learned": "tab:blue", "agreement": "tab:red"}
SCHEMA = ("task_family", "task", "policy", "param", "episodes", "seeds", "success", "success_ci95", "mean_horizon",
          "rounds_per_episode", "batch_rows_per_round")


TASK_TEXT = {
    "pushgust": ("PushGust", "push a puck through a gusty band into a goal (pymunk"),
    "metaworld": ("Meta-World", "a mixed set of Meta-World tasks, one task-conditioned policy (MuJoCo, state only"),
}


def markdown(rows: list, meta: dict) -> str:
    if not any(r["policy"] == "static" for r in rows):  # a partial run, for `study merge`
        return "# Partial horizon study run (no static rows): merge it into a run of record with `robotserve study merge`\n"
    bs = best_static(rows)
    fam = meta.get("family", "diffusion")
    what = TASK_TEXT.get(meta.get("task_family", "pushgust"), (meta.get("task", "?"), "?"))
    lines = [
        f"# Horizon study: {what[0]} with a trained {fam} policy (seed 000 §5.2, Figure 11)",
        "",
        f"Task: {what[1]}, {meta['control_hz']:g} Hz, chunk of "
        f"{meta['chunk']} actions, {meta['max_steps']} steps per episode). {len(meta['seeds'])} seeds x "
        f"{meta['episodes_per_seed']} episodes per configuration; each round executes H actions open-loop, then "
        f"observes again. H_min = {meta['confidence_h_min']} for every dynamic policy. Study wall time "
        f"{meta['wall_s']:.0f} s ({meta['torch_threads']} torch thread).",
        "",
        "| policy | param | episodes | success | 95 % CI | per seed | mean horizon | rounds/episode | batch rows/round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        seeds = " / ".join(f"{v:.2f}" for v in r["success_per_seed"].values())
        ci = r.get("success_ci95") or wilson_ci(int(round(r["success"] * r["episodes"])), r["episodes"])
        lines.append(f"| {r['policy']} | {r['param']:g} | {r['episodes']} | {r['success']:.3f} | {ci[0]:.2f}-{ci[1]:.2f} "
                     f"| {seeds} | {r['mean_horizon']:.2f} | {r['rounds_per_episode']:.1f} "
                     f"| {r.get('batch_rows_per_round', 1.0):.2f} |")
    lines += ["", "## What the curve shows", ""]
    ci = bs.get("success_ci95") or wilson_ci(int(round(bs["success"] * bs["episodes"])), bs["episodes"])
    bs = {**bs, "success_ci95": ci}
    lines.append(f"- Best static horizon (largest H at the highest static success, §5.3): H = {bs['param']}, "
                 f"success {bs['success']:.3f} (95 % CI {ci[0]:.2f}-{ci[1]:.2f}), mean horizon "
                 f"{bs['mean_horizon']:.2f}, {bs['rounds_per_episode']:.1f} rounds per episode.")
    for pol in dynamic_policies(rows):
        mine = [r for r in rows if r["policy"] == pol]
        if not mine:
            continue
        m = matched(rows, pol, bs)
        if m is None:
            top = max(mine, key=lambda r: r["success"])
            lines.append(f"- {pol}: no setting reaches the static CI's lower bound {ci[0]:.2f}; the best is "
                         f"{PARAM_NAME[_base(pol)]} = {top['param']:g} with {top['success']:.3f} at mean horizon "
                         f"{top['mean_horizon']:.2f}. Target (>= 1.5x at matched success): NOT met.")
        else:
            ratio = m["mean_horizon"] / bs["mean_horizon"]
            fewer = 1 - m["rounds_per_episode"] / bs["rounds_per_episode"]
            how = (f"{fewer:.0%} fewer rounds per episode" if fewer >= 0
                   else f"{-fewer:.0%} MORE rounds per episode: only at a shorter horizon than the static one")
            lines.append(f"- {pol}: {PARAM_NAME[_base(pol)]} = {m['param']:g} reaches it (success {m['success']:.3f}) at mean "
                         f"horizon {m['mean_horizon']:.2f}: {ratio:.2f}x the static horizon, {how}, "
                         f"{m.get('batch_rows_per_round', 1.0):.2f} batch rows per round. Target (>= 1.5x): "
                         f"{'met' if ratio >= 1.5 else 'NOT met'}.")
    ratios = [r.get("final_update_ratio_median") or {} for r in rows]
    phases = sorted({k for x in ratios for k, v in x.items() if v is not None})
    if phases:
        # Per task phase (PushGust: calm air / gusty band; Meta-World: free air / hand at the object).
        med = {k: float(np.median([x[k] for x in ratios if x.get(k) is not None])) for k in phases}
        lines.append("- The §3.1 ratio (final update over the earlier steps' mean), median over rounds, by phase: "
                     + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + ".")
    per_task = [r for r in rows if r.get("success_per_task")]
    if per_task:
        b = next((r for r in per_task if r["policy"] == "static" and r["param"] == bs["param"]), per_task[0])
        lines.append(f"- Success per task at {b['policy']} {b['param']:g}: "
                     + ", ".join(f"{t} {v:.2f}" for t, v in b["success_per_task"].items()) + ".")
    labs = [meta.get("learned_labels")] + [x.get("learned_labels") for x in meta.get("appended", [])]
    for lab in (x for x in labs if x):
        by = lab.get("by_cosine") or {"0.9": lab}
        lines.append(f"- Learned horizon: {lab['rounds']} labelled rounds (§2.2 procedure, start H = {lab['h_start']}, "
                     f"labelling cost {lab['engine_rows']} engine rows, {lab['wall_s']:.0f} s, offline). " + "; ".join(
                         f"cosine >= {c}: mean label {v['mean_label']:.2f}, histogram {v['histogram']}, fit MAE "
                         f"{v['fit_mae']:.2f}" for c, v in by.items()) + ".")
    sc = meta.get("self_consistency")
    if sc and any(r["policy"] == "self_consistency" for r in rows):
        lines.append(f"- Self-consistency: K = {sc['k']} extra samples per request, robots served "
                     f"{sc['robots_per_batch']} per batch, extras only below the saturation batch "
                     f"{sc['saturation_batch']} (measured profile); its batch rows per round count them.")
    return "\n".join(lines) + "\n"


def _curves(ax, rows: list, title: str) -> None:
    extra = iter(["tab:cyan", "tab:brown", "tab:olive", "tab:pink", "black"])
    for pol in ["static"] + dynamic_policies(rows):
        rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["mean_horizon"])
        if not rs:
            continue
        x, y = [r["mean_horizon"] for r in rs], [r["success"] for r in rs]
        ci = [r.get("success_ci95") or [r["success"], r["success"]] for r in rs]
        err = [[max(0.0, v - c[0]) for v, c in zip(y, ci)], [max(0.0, c[1] - v) for v, c in zip(y, ci)]]
        color = COLORS.get(pol) or next(extra)
        ax.errorbar(x, y, yerr=err, color=color, marker="o", capsize=3, label=f"{pol} ({PARAM_NAME[_base(pol)]})")
        for r in rs:
            ax.annotate(f"{r['param']:g}", (r["mean_horizon"], r["success"]), textcoords="offset points",
                        xytext=(3, 3), fontsize=6, color=color)
    ax.set_xlabel("mean execution horizon (actions per round)")
    ax.set_ylabel("success rate (95 % CI)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot(rows: list, path: Path, title: str = "PushGust: accuracy vs efficiency (seed 000 Fig. 11)") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    _curves(ax, rows, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_task(runs: list, path: Path, task: str) -> None:
    """Fig. 11 for one task: one panel per policy family, one curve per horizon policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2), squeeze=False)
    for ax, (rows, meta) in zip(axes[0], runs):
        _curves(ax, rows, f"{task} / {meta.get('family', '?')}: success vs mean horizon (Fig. 11)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge_study(folder: Path) -> list:
    """study.json (the issue's schema, one row per configuration) and fig11_<task>.png from every
    run of record in the folder (`<task>-<family>.json` with its `.meta.json`)."""
    folder = Path(folder)
    runs = []
    for f in sorted(folder.glob("*.meta.json")):
        data = folder / f.name.replace(".meta.json", ".json")
        if data.exists():
            runs.append((json.loads(data.read_text()), json.loads(f.read_text())))
    rows = [{k: r[k] for k in SCHEMA} for rs, _ in runs for r in rs if all(k in r for k in SCHEMA)]
    (folder / "study.json").write_text(json.dumps(rows, indent=1) + "\n")
    paths = [folder / "study.json"]
    for task in sorted({m.get("task_family", m["task"]) for _, m in runs}):
        p = folder / f"fig11_{task}.png"
        plot_task([(rs, m) for rs, m in runs if m.get("task_family", m["task"]) == task], p, task)
        paths.append(p)
    return paths


def profile_ms_of(path) -> dict:
    """Batch latencies (ms) of a `robotserve profile` JSON or a bare {"batch_latency_ms": ...}."""
    from ..profiles import load_profile_file

    prof = load_profile_file(path)
    return {str(int(b)): float(ms) for b, ms in zip(prof.batches, prof.latencies_ms)}


def write_reports(rows: list, meta: dict, out: Path, workload_out=None, profile=None, workload_name=None) -> list:
    """JSON (the list of rows), its meta (`.meta.json`: task, seeds, engine profile, training),
    Markdown table, PNG; the workload file if asked; study.json and Fig. 11 of the folder when
    the folder is reports/horizon (a `study.json` beside it)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if profile:
        meta = {**meta, "engine_profile_ms": profile_ms_of(profile)}
    out.write_text(json.dumps(rows, indent=1) + "\n")
    md, png, meta_path = out.with_suffix(".md"), out.with_suffix(".png"), out.with_suffix(".meta.json")
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    md.write_text(markdown(rows, meta))
    title = TASK_TEXT.get(meta.get("task_family", "pushgust"), (meta.get("task", "?"),))[0]
    plot(rows, png, f"{title} / {meta.get('family', '?')}: accuracy vs efficiency (seed 000 Fig. 11)")
    paths = [out, meta_path, md, png]
    if workload_out:
        bs = best_static(rows)
        dyn = best_dynamic(rows, sampling=False)
        name = workload_name or f"{meta.get('task_family', 'pushgust')}-{meta.get('family', 'diffusion')}".replace("_", "-")
        to_workload(rows, meta, bs, dyn, name).save(workload_out)
        paths.append(Path(workload_out))
    return paths
