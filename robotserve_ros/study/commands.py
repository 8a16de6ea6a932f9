"""`robotserve study collect | train | horizon | rtc`: the study's task families (PushGust,
Meta-World), the horizon study and the real-time chunking study."""
from __future__ import annotations

import sys
from pathlib import Path

from ..cli_types import scratch


def cmd_collect(a) -> int:
    from .collect import collect, save_demos

    data = collect(a.episodes, seed=a.seed, task=a.task)
    save_demos(a.out, data)
    print(f"wrote {a.out}: {len(data['episode_len'])} demos, {len(data['state'])} frames "
          f"(expert success {data['expert_success']:.1%} over {int(data['attempts'])} attempts)")
    return 0


DEMO_KEYS = ("state", "action", "episode_index", "episode_len")  # what training reads of a demos file


def _check_demos(path: str) -> None:
    """A missing or unreadable --demos is refused before torch is imported to train on it."""
    from ..cli_types import UsageError
    from .collect import load_demos

    what = "demos that `robotserve study collect` wrote"
    if not Path(path).is_file():
        raise UsageError(f"--demos {path!r}: no such file ({what})")
    try:
        keys = set(load_demos(path))
    except Exception:  # numpy's refusal of a non-npz (pickle, zip, junk): its kinds and words vary
        raise UsageError(f"--demos {path!r}: not a demos file ({what}): numpy cannot read it as an .npz") from None
    missing = [k for k in DEMO_KEYS if k not in keys]
    if missing:
        raise UsageError(f"--demos {path!r}: not a demos file ({what}): no {missing[0]!r} array")


def _check_profile(flag: str, path) -> None:
    """An engine profile JSON named on the command line is read before a long run, not after it."""
    if path is None:
        return
    from ..cli_types import UsageError
    from .horizon_report import profile_ms_of

    try:
        profile_ms_of(path)
    except Exception as e:  # missing, not JSON, not a profile
        raise UsageError(f"{flag} {str(path)!r}: not an engine profile JSON (`robotserve profile --out`): "
                         f"{str(e).splitlines()[0][:120] if str(e) else type(e).__name__}") from None


def cmd_train(a) -> int:
    _check_demos(a.demos)
    from .train import TrainConfig, train

    cfg = TrainConfig(steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads)
    info = train(a.demos, a.out, cfg)
    print(f"wrote {a.out}: {info['params'] / 1e6:.2f}M params, trained in {info['train_wall_s']:.0f} s, "
          f"final loss {info['final_loss']:.4f}")
    return 0


def cmd_train_flow(a) -> int:
    _check_demos(a.demos)
    from .train_flow import FlowTrainConfig, train_flow

    if not 0 <= a.prefix_max_delay < FlowTrainConfig.chunk:
        from ..core.errors import ConfigError

        raise ConfigError(f"--prefix-max-delay {a.prefix_max_delay}: must be 0..{FlowTrainConfig.chunk - 1}")
    cfg = FlowTrainConfig(steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads,
                          hidden=a.hidden, blocks=a.blocks, prefix_max_delay=a.prefix_max_delay)
    info = train_flow(a.demos, a.out, cfg)
    print(f"wrote {a.out}: {info['params'] / 1e6:.2f}M params, trained in {info['train_wall_s']:.0f} s, "
          f"final loss {info['final_loss']:.4f}")
    return 0


def merge_runs(rows: list, meta: dict, new_rows: list, new_meta: dict) -> tuple:
    """Add a run's configurations to a run of record of the same task and policy (reruns replace)."""
    new = {(r["policy"], r["param"]) for r in new_rows}
    rows = [r for r in rows if (r["policy"], r["param"]) not in new] + list(new_rows)
    extra = {"policies": sorted({p for p, _ in new}), "wall_s": new_meta["wall_s"], "h_min": new_meta["confidence_h_min"]}
    if new_meta.get("learned_labels"):
        extra["learned_labels"] = new_meta["learned_labels"]
    return rows, {**meta, "appended": meta.get("appended", []) + [extra]}


def cmd_merge(a) -> int:
    import json

    from .horizon_report import merge_study, write_reports

    into = Path(a.into)
    files = [into] + [Path(f) for f in a.add]
    for f in files:
        if not f.is_file() or not f.with_suffix(".meta.json").is_file():
            print(f"robotserve study merge: {str(f)!r} needs the run's JSON and its .meta.json beside it", file=sys.stderr)
            return 2
    rows, meta = json.loads(into.read_text()), json.loads(into.with_suffix(".meta.json").read_text())
    for f in files[1:]:
        rows, meta = merge_runs(rows, meta, json.loads(f.read_text()), json.loads(f.with_suffix(".meta.json").read_text()))
    paths = write_reports(rows, meta, into) + merge_study(into.parent)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


# Per task family, the sweeps a flag left out runs (thresholds in the family's action units:
# PushGust pixels, Meta-World normalised [-1, 1] actions). Meta-World has no §2.2 labels.
SWEEP_DEFAULTS = {
    "pushgust": {"sc_tau": [2.0, 5.0, 10.0, 20.0], "agree_tau": [5.0, 10.0, 20.0], "learned_scale": [0.5, 0.75, 1.0, 1.25]},
    "metaworld": {"sc_tau": [0.1, 0.3], "agree_tau": [0.1, 0.2, 0.4], "learned_scale": []},
}


def policy_task(policy_dir) -> str:
    """The task family a checkpoint was trained on (its config or train_info; older: pushgust)."""
    import json

    for name in ("config.json", "train_info.json"):
        f = Path(policy_dir) / name
        if f.is_file():
            task = json.loads(f.read_text()).get("task")
            if task:
                return str(task)
    return "pushgust"


def cmd_horizon(a) -> int:
    import json

    from .horizon import StudyConfig, run_study
    from .horizon_report import merge_study, write_reports
    from .tasks import task_family

    from ..cli_types import UsageError

    cfg_file = Path(a.policy) / "config.json"
    if not cfg_file.is_file():
        raise UsageError(f"--policy {a.policy!r} is not a checkpoint directory (no config.json)")
    task = policy_task(a.policy)
    if task not in SWEEP_DEFAULTS:
        raise UsageError(f"--policy {a.policy!r}: a {task} policy; the horizon study runs {', '.join(SWEEP_DEFAULTS)}")
    for k, v in SWEEP_DEFAULTS[task].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.learned_scale and not task_family(task).labels:
        raise UsageError(f"--learned-scale needs the §2.2 labels, collected for pushgust only "
                         f"(this policy is {task}): give --learned-scale with no values")
    if not a.static and a.h_min is None:
        raise UsageError("--h-min is needed when no --static horizons are given")
    _check_profile("--profile", a.profile)
    cfg = StudyConfig(
        static_h=tuple(a.static), thresholds=tuple(a.thresholds), seeds=tuple(a.seeds), episodes=a.episodes,
        max_steps=a.max_steps, threads=a.threads, h_min=a.h_min, schedule_t=tuple(a.schedule_t),
        sc_tau=tuple(a.sc_tau), sc_k=a.sc_k, robots_per_batch=a.robots_per_batch,
        learned_scale=tuple(a.learned_scale), label_episodes=a.label_episodes, agree_tau=tuple(a.agree_tau),
        learned_cos=tuple(a.learned_cos), label_h_start=a.label_h_start,
        labels_cache=a.labels_cache, tag=a.tag, task=task,
    )
    fam = "flow-matching" if json.loads(cfg_file.read_text()).get("type") == "flow_matching" else "diffusion"
    out = Path(a.out or Path(scratch("horizon")) / f"{task}-{fam}.json")
    learned_out = a.learned_out or (str(Path(a.policy) / "horizon_model.npz") if cfg.learned_scale else None)
    rows, meta = run_study(a.policy, cfg, learned_out=learned_out)
    if a.append and out.is_file() and out.with_suffix(".meta.json").is_file():
        rows, meta = merge_runs(json.loads(out.read_text()), json.loads(out.with_suffix(".meta.json").read_text()),
                                rows, meta)
    paths = write_reports(rows, meta, out, workload_out=a.workload_out, profile=a.profile)
    paths += merge_study(out.parent)
    for r in rows:
        print(f"  {r['policy']:16s} {r['param']:>6g}  success {r['success']:.3f}  mean H {r['mean_horizon']:5.2f}  "
              f"rounds/episode {r['rounds_per_episode']:6.1f}  rows/round {r['batch_rows_per_round']:.2f}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_workload(a) -> int:
    import json

    from .horizon_report import best_dynamic, best_static, profile_ms_of, to_workload

    run = Path(a.run)
    meta_path = run.with_suffix(".meta.json")
    if not run.is_file() or not meta_path.is_file():
        print(f"robotserve study workload: --run {a.run!r} needs the run's JSON and its .meta.json beside it", file=sys.stderr)
        return 2
    _check_profile("--profile", a.profile)
    rows, meta = json.loads(run.read_text()), json.loads(meta_path.read_text())
    if a.profile:
        meta["engine_profile_ms"] = profile_ms_of(a.profile)
    bs, dyn = best_static(rows), best_dynamic(rows, sampling=False)
    name = a.name or f"{meta.get('task_family', 'pushgust')}-{meta.get('family', 'diffusion')}".replace("_", "-")
    to_workload(rows, meta, bs, dyn, name).save(a.out)
    print(f"wrote {a.out}: {name}, static H={bs['param']} (success {bs['success']:.3f}) vs {dyn['policy']} "
          f"{dyn['param']:g} (success {dyn['success']:.3f}, mean H {dyn['mean_horizon']:.2f}), "
          f"{len(bs['rounds'])} tasks, engine profile from {a.profile or 'the study run'}")
    return 0


def cmd_rtc(a) -> int:
    import json
    import os

    from ..cli_types import UsageError
    from .rtc import POLICY_DIR, RtcStudyConfig, merge_runs, read_study, run_study, write_study
    from .rtc_fleet import fleet_on_rounds, write_fleet

    dirs = {}
    for spec in a.policy or []:
        task, _, d = spec.partition("=")
        if task not in POLICY_DIR or not d:
            raise UsageError(f"--policy {spec!r}: give TASK=DIR with TASK one of {', '.join(POLICY_DIR)}")
        dirs[task] = d
    for t in a.tasks:
        d = Path(dirs.get(t, POLICY_DIR[t]))
        if not (d / "config.json").is_file() or json.loads((d / "config.json").read_text()).get("type") != "flow_matching":
            raise UsageError(f"--policy: {str(d)!r} is not a flow-matching checkpoint (the {t} policy; give {t}=DIR)")
    cfg = RtcStudyConfig(tasks=tuple(dict.fromkeys(a.tasks)), seeds=tuple(a.seeds), episodes=a.episodes,
                         delays=tuple(sorted(set(a.delays))), rtc_form=a.rtc_form, rtc_mask=a.rtc_mask,
                         max_steps=a.max_steps, policy_dirs=dirs)
    load0 = os.getloadavg()
    rows, meta = run_study(cfg, workers=a.workers)
    meta = {"command": "robotserve " + " ".join(sys.argv[1:]), "loadavg_before": list(load0),
            "loadavg_after": list(os.getloadavg()), "seeds": list(cfg.seeds), "episodes_per_seed": cfg.episodes,
            "delays_s": list(cfg.delays), "rtc_form": cfg.rtc_form, "rtc_mask": cfg.rtc_mask,
            "families": meta}
    out = Path(a.out)
    if a.append and (out / "rtc_study.json").is_file():
        rows, meta = merge_runs(*read_study(out), rows, meta)
    paths = write_study(rows, meta, out)
    if not a.no_fleet:
        paths += write_fleet(fleet_on_rounds(rows, meta), out)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_rtc_arms(a) -> int:
    import subprocess

    from ..cli_types import UsageError
    from ..engines.torch_env import import_torch
    from .rtc_arms import ARMS, FAMILY, run_study, write_markdown

    tasks = {}
    for spec in a.tasks:
        name, _, n = spec.partition("=")
        if name not in FAMILY or not n.isdigit() or int(n) < 1:
            raise UsageError(f"--tasks {spec!r}: give TASK=EPISODES with TASK one of {', '.join(FAMILY)}")
        tasks[name] = int(n)
    bad = [x for x in a.arms if x not in ARMS]
    if bad:
        raise UsageError(f"--arms {bad[0]!r}: known {', '.join(ARMS)}")
    if any(d < 0 or d > 8 for d in a.delays):
        raise UsageError(f"--delays {a.delays}: each d must be 0..8 control steps (H = 16)")
    try:
        subprocess.run(["git", "cat-file", "-e", a.frozen_commit + "^{commit}"], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError):
        raise UsageError(f"--frozen-commit {a.frozen_commit!r}: not a commit of this repository") from None
    import_torch().set_num_threads(1)
    study = run_study(tasks, sorted(set(a.delays)), tuple(a.arms), a.frozen_commit, partial_out=Path(a.out),
                      command="robotserve " + " ".join(sys.argv[1:]))
    md = write_markdown(study, Path(a.out))
    print(f"wrote {Path(a.out) / 'rtc_study.json'}, {md}; target {'MET' if study['target']['met'] else 'MISSED'}")
    return 0


def cmd_rtc_profile(a) -> int:
    import json

    from ..cli_types import UsageError
    from .rtc_profile import measure_rtc, write_rtc_block

    for flag, pdir in (("--policy", a.policy), ("--trained-policy", a.trained_policy)):
        cfg = Path(pdir or a.policy) / "config.json"
        if not cfg.is_file() or json.loads(cfg.read_text()).get("type") != "flow_matching":
            raise UsageError(f"{flag} {pdir!r}: not a flow-matching checkpoint directory")
    if a.forms_out:
        from .rtc_profile import measure_forms

        prof = measure_forms(a.policy, a.trained_policy, delay=a.delay, repeats=a.repeats)
        Path(a.forms_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.forms_out).write_text(json.dumps(prof, indent=1) + "\n")
        print(f"wrote {a.forms_out}: ms p50 at batch 8 " + ", ".join(
            f"{f} {v['engine_ms_p50']:.1f}" for f, v in prof["forms"].items()) + f"; ratios {prof['ratio_vs_unguided']}")
        return 0
    block = {"policy_dir": a.policy, **measure_rtc(a.policy, tuple(sorted(set(a.batch_sizes))), delay=a.delay,
                                                   repeats=a.repeats)}
    for form in ("paper", "lerobot"):
        print(f"  {form} / unguided per batch size: {block['ratio_vs_unguided'][form]}")
    paths = []
    if a.profile_file:
        paths.append(write_rtc_block(a.profile_file, block))
    if a.out:
        out = Path(a.out)
        rows = json.loads(out.read_text()) if out.is_file() else {}
        rows[a.policy] = block
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=1) + "\n")
        paths.append(out)
    print("wrote " + (", ".join(str(p) for p in paths) or "nothing (no --profile-file, no --out)"))
    return 0


def add_parser(sub):
    """The `study` command group, added to the `robotserve` parser; returns its subcommands."""
    from ..cli_types import between, positive, seed
    from .tasks import FAMILIES
    st = sub.add_parser("study", help="PushGust / Meta-World tasks: demos, policy training, horizon study")
    g = st.add_subparsers(dest="study", required=True)
    c = g.add_parser("collect", help="scripted-expert demonstrations into an npz")
    c.add_argument("--episodes", type=positive(int), default=500, help="successful demos to keep")
    c.add_argument("--seed", type=seed, default=0)
    c.add_argument("--task", choices=FAMILIES, default="pushgust",
                   help="task family: pushgust (pymunk) or metaworld (the mixed Meta-World set, docs/horizon.md)")
    c.add_argument("--out", required=True, help="npz path (keep it out of git)")
    c.set_defaults(func=cmd_collect)
    t = g.add_parser("train", help="train a small state-only DiffusionPolicy on the CPU; save_pretrained into --out")
    t.add_argument("--demos", required=True, help="demonstrations file (study collect --out)")
    t.add_argument("--out", required=True, help="checkpoint directory (policy + pre/post-processors)")
    t.add_argument("--steps", type=positive(int), default=7000, help="training steps")
    t.add_argument("--batch-size", type=positive(int), default=128, help="training batch size")
    t.add_argument("--lr", type=positive(float), default=1e-3, help="learning rate")
    t.add_argument("--seed", type=seed, default=0)
    t.add_argument("--threads", type=positive(int), default=1, help="torch threads (1 is kind to a shared CPU)")
    t.set_defaults(func=cmd_train)
    f = g.add_parser("train-flow", help="train a small flow-matching action head (Euler sampling) on the CPU")
    f.add_argument("--demos", required=True, help="demonstrations file (study collect --out)")
    f.add_argument("--out", required=True, help="checkpoint directory (config.json + model.safetensors)")
    f.add_argument("--steps", type=positive(int), default=8000, help="training steps")
    f.add_argument("--hidden", type=positive(int), default=256, help="width of the velocity MLP")
    f.add_argument("--blocks", type=positive(int), default=3, help="residual blocks of the velocity MLP")
    f.add_argument("--batch-size", type=positive(int), default=256, help="training batch size")
    f.add_argument("--lr", type=positive(float), default=1e-3, help="learning rate")
    f.add_argument("--seed", type=seed, default=0)
    f.add_argument("--threads", type=positive(int), default=1, help="torch threads (1 is kind to a shared CPU)")
    f.add_argument("--prefix-max-delay", type=positive(int, zero_ok=True), default=0,
                   help="training-time RTC: condition on a clean executed prefix of d ~ U{0..N} actions (0: off)")
    f.set_defaults(func=cmd_train_flow)
    h = g.add_parser("horizon", help="success vs mean execution horizon: static H and confidence t (seed 000 Fig. 11)")
    h.add_argument("--policy", required=True, help="checkpoint directory")
    h.add_argument("--out", default=None, help="JSON of this run (default $TMPDIR/robotserve-horizon/<task>-<family>.json; the record: reports/horizon/); "
                   ".md/.png/.meta.json beside it; study.json and fig11_<task>.png merge every run in its folder")
    h.add_argument("--static", type=positive(int), nargs="*", default=[1, 2, 3, 4, 6, 8, 12, 16],
                   help="static horizons to compare")
    h.add_argument("--thresholds", type=positive(float, zero_ok=True), nargs="*", default=[0.0, 0.5],
                   help="confidence t (§3.1)")
    h.add_argument("--schedule-t", type=positive(float, zero_ok=True), nargs="*", default=[0.0, 0.5, 1.0, 2.0],
                   help="schedule-normalised confidence t")
    h.add_argument("--sc-tau", type=positive(float), nargs="*", default=None,
                   help="self-consistency spread thresholds (action units; default per task family)")
    h.add_argument("--sc-k", type=positive(int), default=3, help="extra samples per request while spare slots exist")
    h.add_argument("--robots-per-batch", type=positive(int), default=4,
                   help="robots per server batch in the study (self-consistency fills the rest up to saturation)")
    h.add_argument("--learned-scale", type=positive(float), nargs="*", default=None,
                   help="learned-horizon scales (empty: skip the learned horizon; PushGust only)")
    h.add_argument("--agree-tau", type=positive(float), nargs="*", default=None,
                   help="plan-agreement thresholds (action units; empty: skip; default per task family)")
    h.add_argument("--learned-cos", type=between(-1.0, 1.0), nargs="+", default=[0.9],
                   help="cosine thresholds of the §2.2 labels, one learned model each (0.9: the paper's)")
    h.add_argument("--label-h-start", type=positive(int), default=None,
                   help="the labels' starting H (default: this run's best static H)")
    h.add_argument("--labels-cache", default=None,
                   help="npz of the §2.2 label collection: reused when it exists (same start H, episodes), else written")
    h.add_argument("--label-episodes", type=positive(int), default=30, help="episodes labelled by the §2.2 procedure")
    h.add_argument("--learned-out", default=None, help="where the learned model goes (default <policy>/horizon_model.npz)")
    h.add_argument("--h-min", type=positive(int), default=None, help="H_min of the dynamic policies (default: the smallest static H)")
    h.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2])
    h.add_argument("--episodes", type=positive(int), default=34, help="episodes per seed and configuration")
    h.add_argument("--max-steps", type=positive(int), default=None, help="episode step limit (default: the task's)")
    h.add_argument("--threads", type=positive(int), default=1)
    h.add_argument("--tag", default="", help="suffix for this run's dynamic policy names (<policy>+<tag>), e.g. hmin2")
    h.add_argument("--append", action="store_true",
                   help="add these configurations to the run already in --out (same policy), replacing reruns")
    h.add_argument("--workload-out", help="also write the simulator workload file here (best static vs best dynamic)")
    h.add_argument("--profile", help="engine profile JSON (`robotserve profile`) for the workload's engine block")
    h.set_defaults(func=cmd_horizon)
    w = g.add_parser("workload", help="a measured fleet workload from a study run: best static H vs the best "
                                      "non-sampling dynamic policy, per evaluated episode")
    w.add_argument("--run", required=True, help="a study run of record, e.g. reports/horizon/pushgust-diffusion.json")
    w.add_argument("--out", required=True, help="workload JSON, e.g. robotserve_ros/sim/measured/<name>.json")
    w.add_argument("--profile", help="engine profile JSON (`robotserve profile`) for the engine block")
    w.add_argument("--name", help="workload name (default pushgust-<family>)")
    w.set_defaults(func=cmd_workload)
    mg = g.add_parser("merge", help="add study runs' configurations (same task and policy) to a run of record")
    mg.add_argument("--into", required=True, help="the run of record, e.g. reports/horizon/pushgust-diffusion.json")
    mg.add_argument("--add", nargs="+", required=True, help="runs written elsewhere with --out (their .meta.json beside)")
    mg.set_defaults(func=cmd_merge)
    r = g.add_parser("rtc", help="real-time chunking under inference delay, closed loop: static / dynamic horizon, "
                                 "with and without RTC, Meta-World and PushGust flow policies (docs/rtc.md)")
    r.add_argument("--out", required=True, help="report folder: rtc_study.json (+ .meta.json, fleet.json)")
    r.add_argument("--tasks", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    r.add_argument("--policy", nargs="*", metavar="TASK=DIR",
                   help="flow checkpoint per task (default models/<task>_flow)")
    r.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2])
    r.add_argument("--episodes", type=positive(int), default=34, help="episodes per seed and configuration")
    r.add_argument("--delays", type=positive(float, zero_ok=True), nargs="+",
                   default=[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6], help="inference delays in seconds")
    r.add_argument("--rtc-form", choices=("paper", "lerobot"), default="paper",
                   help="the guidance: the paper's (VJP through the denoiser) or LeRobot's cheaper form")
    r.add_argument("--rtc-mask", choices=("soft", "hard"), default="soft",
                   help="RTC's prefix weights: the paper's soft mask over the leftover, or 1 on the first d only (§4.2)")
    r.add_argument("--max-steps", type=positive(int), default=None, help="episode step limit (default: the task's)")
    r.add_argument("--workers", type=positive(int), default=1, help="processes, one task family each")
    r.add_argument("--no-fleet", action="store_true", help="skip the fleet simulator on the measured rounds")
    r.add_argument("--append", action="store_true",
                   help="add this run's rows to the run already in --out (same task, delay, config: replaced)")
    r.set_defaults(func=cmd_rtc)
    rp = g.add_parser("rtc-profile", help="engine time of RTC guided denoising (paper and LeRobot forms) vs unguided, "
                                          "per batch size, into the engine profile file's rtc block")
    rp.add_argument("--policy", required=True, help="flow checkpoint directory")
    rp.add_argument("--profile-file", help="engine profile JSON to add the rtc block to, e.g. "
                                           "robotserve_ros/profiles/pushgust_flow.json")
    rp.add_argument("--out", help="also merge the block into this JSON, keyed by policy (e.g. reports/rtc/issue28/rtc_profile.json)")
    rp.add_argument("--batch-sizes", type=positive(int), nargs="+", default=[1, 2, 4, 8, 16, 32])
    rp.add_argument("--delay", type=positive(int), default=4, help="d of every guided row (the leftover is H - d)")
    rp.add_argument("--repeats", type=positive(int), default=15)
    rp.add_argument("--trained-policy", help="a training-time RTC checkpoint (train-flow --prefix-max-delay): with "
                                             "--forms-out, its engine time is the rtc_trained form")
    rp.add_argument("--forms-out", help="write the forms profile of record here (issue 39 schema, batch 8, one "
                                        "thread), e.g. reports/rtc/rtc_profile.json")
    rp.set_defaults(func=cmd_rtc_profile)
    ra = g.add_parser("rtc-arms", help="issue 39's RTC arms (sync, naive, ensemble, RTC hard/soft/LeRobot/trained) "
                                       "on paired episodes under one virtual-time cap (docs/rtc.md)")
    ra.add_argument("--out", required=True, help="report folder: rtc_study.json, rtc_study.md")
    ra.add_argument("--tasks", nargs="+", default=["viapoint=500", "pushgust=100", "metaworld=100"],
                    metavar="TASK=EPISODES", help="task families and paired episodes per cell")
    ra.add_argument("--delays", type=positive(int, zero_ok=True), nargs="+", default=[0, 2, 4, 6],
                    help="d in control steps, 0..8")
    ra.add_argument("--arms", nargs="+", default=["sync", "naive", "ensemble", "rtc_hard", "rtc_soft",
                                                  "rtc_lerobot", "rtc_trained"],
                    help="the arms to run, paired on the same episodes (default: all seven)")
    ra.add_argument("--frozen-commit", required=True, help="the commit that froze the multimodal task")
    ra.set_defaults(func=cmd_rtc_arms)
    return g  # the CLI adds `study fleet` (a benchmark: bench/study_fleet.py)


__all__ = ["add_parser"]
