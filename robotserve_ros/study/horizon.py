"""The horizon study of seed 000 §5.2 / Figure 11 on PushGust with a trained DiffusionPolicy.

For each static H and each confidence threshold t, run episodes (several seeds x episodes)
and record success and the actions executed per round. All episodes of one configuration
are tasks of ONE LeRobotEngine, served as one batch per round (its multi-robot batching).
Execution is synchronous: the simulator waits for the chunk, executes the H actions the
horizon policy picked open-loop, then observes again. The horizon policies come from the
core registry; their `choose(result, param)` decides H.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from .labels import collect_labels
from .pushgust import CONTROL_HZ, MAX_STEPS, PushGustEnv

# Evaluation arenas: far from the demo seeds (collect.DEMO_SEED_BASE + seed * 100000 + i).
EVAL_SEED_BASE = 10_000_000
BATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass
class StudyConfig:
    static_h: tuple = (1, 2, 4, 6, 8, 12, 16)
    thresholds: tuple = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)  # confidence t (§3.1, unchanged)
    seeds: tuple = (0, 1, 2)
    episodes: int = 20
    max_steps: Optional[int] = None
    threads: int = 1
    h_min: Optional[int] = None  # confidence H_min (§3.1); default the smallest static H
    profile_batches: tuple = BATCH_SIZES  # batch sizes timed for the workload's engine block
    # Issue 11's policies (empty: not run).
    schedule_t: tuple = ()  # schedule-normalised confidence thresholds
    sc_tau: tuple = ()  # self-consistency spread thresholds (action units: pixels)
    sc_k: int = 3  # extra samples per request, while spare slots exist
    robots_per_batch: int = 4  # the server batch the study's robots are served in (self-consistency)
    learned_scale: tuple = ()  # learned-horizon scales
    learned_cos: tuple = (0.9,)  # cosine thresholds of the §2.2 labels, one model each (0.9: the paper's)
    agree_tau: tuple = ()  # plan-agreement thresholds (action units: pixels)
    label_episodes: int = 30  # episodes whose rounds label the learned horizon (§2.2)
    labels_cache: Optional[str] = None  # npz of a label collection to reuse / write
    label_h_start: Optional[int] = None
    tag: str = ""  # appended to this run's dynamic policy names ("<policy>+<tag>"), e.g. another H_min  # the labels' starting H (default: the best static H of this run)

    @property
    def steps_limit(self) -> int:
        return int(self.max_steps or MAX_STEPS)

    @property
    def confidence_h_min(self) -> int:
        return int(self.h_min or min(self.static_h or (1,)))


def episode_seed(seed: int, episode: int) -> int:
    return EVAL_SEED_BASE + seed * 10_000 + episode


def load_engine(policy_dir, seed: int = 0, threads: int = 1):
    """The engine of a checkpoint directory: 'flow' for a flow-matching head, else 'lerobot'."""
    from ..engines import make_engine
    from ..engines.torch_env import import_torch

    import_torch().set_num_threads(threads)
    if json.loads((Path(policy_dir) / "config.json").read_text()).get("type") == "flow_matching":
        return make_engine("flow", None, policy_dir=str(policy_dir), device="cpu", seed=seed)
    from .train import allow_state_only_diffusion

    allow_state_only_diffusion()
    return make_engine("lerobot", None, policy_dir=str(policy_dir), device="cpu", seed=seed)


def family(engine) -> str:
    """The policy family of the study's rows (what the README's advice is keyed by)."""
    return "flow_matching" if engine.policy_type == "flow_matching" else str(engine.policy_type)


def wilson_ci(successes: int, n: int, z: float = 1.96) -> list:
    """95 % Wilson score interval of a success rate."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    w = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [float(max(0.0, c - w)), float(min(1.0, c + w))]


class _Sampler:
    """The server's batch self-consistency for the study: robots served `robots_per_batch` at a
    time, each batch topped up with replicas only into slots below the saturation batch
    (core.horizon.self_consistency.extra_sample_plan), all rows run in one engine call."""

    def __init__(self, engine, k: int, robots_per_batch: int, saturation: int) -> None:
        self.engine, self.k, self.per, self.sat = engine, k, robots_per_batch, saturation

    def infer(self, reqs):
        import dataclasses

        from ..core.horizon.self_consistency import extra_sample_plan

        rows, owner = list(reqs), []
        for b in range(0, len(reqs), self.per):
            part = reqs[b: b + self.per]
            for i, (r, m) in enumerate(zip(part, extra_sample_plan(len(part), self.k, self.sat))):
                rows += [dataclasses.replace(r, sample=j) for j in range(1, m + 1)]
                owner += [b + i] * m
        res = self.engine.infer(rows)
        out, extra = list(res[: len(reqs)]), [[] for _ in reqs]
        for i, r in zip(owner, res[len(reqs):]):
            extra[i].append(r.actions)
        for i, e in enumerate(extra):
            if e:
                out[i] = dataclasses.replace(out[i], samples=np.stack(e))
        return out, [1 + len(e) for e in extra]


def make_policy(policy: str, cfg: StudyConfig, learned_model=None):
    """The registry's horizon policy for a study configuration (one instance, the knob per round,
    as the server does)."""
    from ..core.horizon import make_horizon_policy

    h_min = cfg.confidence_h_min
    if policy == "confidence":
        return make_horizon_policy("confidence", h_min=h_min)
    if policy == "schedule":
        return make_horizon_policy("schedule", h_min=h_min)
    if policy == "self_consistency":
        return make_horizon_policy("self_consistency", h_min=h_min)
    if policy.startswith("learned"):
        return make_horizon_policy("learned", model=learned_model, h_min=h_min)
    if policy == "agreement":
        return make_horizon_policy("agreement", h_min=h_min)
    raise ValueError(f"unknown study policy {policy!r}")


def run_config(engine, policy: str, param: float, cfg: StudyConfig, learned_model=None, saturation: int = 32) -> dict:
    """Every (seed, episode) of one horizon configuration, batched round by round."""
    from ..core.horizon import make_horizon_policy
    from ..core.observation import Observation
    from ..core.types import InferenceRequest

    if policy == "static":
        hp = make_horizon_policy("static", h=int(param))
    else:
        # choose() takes any t; t < 0 (outside what check_param lets a client ask for) is reported so.
        hp = make_policy(policy, cfg, learned_model)
    sampler = _Sampler(engine, cfg.sc_k, cfg.robots_per_batch, saturation) if policy == "self_consistency" else None
    eps = [(s, e) for s in cfg.seeds for e in range(cfg.episodes)]
    envs = [PushGustEnv(cfg.steps_limit) for _ in eps]
    obs = [env.reset(episode_seed(s, e)) for env, (s, e) in zip(envs, eps)]
    # The study seed is part of the task id, so each seed draws its own diffusion noise.
    tids = [f"{policy}-{param:g}/seed{s}/ep{e}" for s, e in eps]
    rounds: list[list[int]] = [[] for _ in eps]
    batch_rows = 0
    # Final-step update norm over the mean of the earlier steps, per action (what the §3.1 rule
    # compares with 1 + t), split by whether the puck was in the gusty band when observed.
    ratio = {"band": [], "calm": []}
    active = list(range(len(eps)))
    t0 = time.time()
    while active:
        reqs = [InferenceRequest(task_id=tids[i], round_id=len(rounds[i]), observation=Observation(joints=obs[i]))
                for i in active]
        if sampler is None:
            results, nrows = engine.infer(reqs), [1] * len(reqs)
        else:
            results, nrows = sampler.infer(reqs)
        batch_rows += sum(nrows)
        learned = policy.startswith("learned")
        pred = hp.predict(results) if learned else [None] * len(results)
        still = []
        for i, res, pr in zip(active, results, pred):
            h = hp.choose(res, param, predicted=pr).horizon if learned else hp.choose(res, param).horizon
            if res.updates is not None:
                nrm = np.linalg.norm(res.updates, axis=-1)
                ratio["band" if envs[i].puck_in_band() else "calm"].append(nrm[-1] / np.maximum(nrm[:-1].mean(0), 1e-12))
            done = 0
            for a in res.actions[:h]:
                obs[i], _ = envs[i].step(a)
                done += 1
                if envs[i].done:
                    break
            rounds[i].append(done)
            if envs[i].done:
                engine.forget(tids[i])
            else:
                still.append(i)
        active = still
    success = np.array([env.success() for env in envs], bool)
    per_seed = {str(s): float(np.mean([ok for ok, (ss, _) in zip(success, eps) if ss == s])) for s in cfg.seeds}
    flat = [n for r in rounds for n in r]
    n = len(eps)
    p = float(success.mean())
    nrounds = sum(len(r) for r in rounds)
    return {
        "task": "pushgust",
        "policy": policy,
        "param": int(param) if policy == "static" else float(param),
        "episodes": n,
        "seeds": len(cfg.seeds),
        "success": p,
        "success_ci95": wilson_ci(int(success.sum()), n),
        "mean_horizon": float(np.mean(flat)),
        "rounds_per_episode": float(np.mean([len(r) for r in rounds])),
        "batch_rows_per_round": float(batch_rows / max(nrounds, 1)),
        "param_accepted_by_server": hp.check_param(param) is None,
        "success_stderr": float(np.sqrt(p * (1 - p) / n)),
        "final_update_ratio_median": {k: float(np.median(v)) if v else None for k, v in ratio.items()},
        "final_update_ratio_p90": {k: float(np.percentile(v, 90)) if v else None for k, v in ratio.items()},
        "success_per_seed": per_seed,
        "steps_per_episode": float(np.mean([env.steps for env in envs])),
        "episode_seeds": [episode_seed(s, e) for s, e in eps],
        "episode_success": [bool(x) for x in success],
        "rounds": rounds,
        "wall_s": round(time.time() - t0, 1),
    }


def measure_profile(engine, batch_sizes=BATCH_SIZES, repeats: int = 5) -> dict:
    """The engine block of the workload: `robotserve profile`'s measurement of this engine."""
    from ..engines.profiling import build_report, measure

    samples = measure(engine, batch_sizes, warmup=2, repeats=repeats)
    rep = build_report(samples, engine_name="lerobot", engine_params={}, warmup=2)
    return {int(k): v for k, v in rep["engine"]["batch_latency_ms"].items()}


def run_study(policy_dir, cfg: StudyConfig, log=print, learned_out=None) -> tuple[list, dict]:
    """Static H first (the best one starts the §2.2 labels), then every dynamic policy's sweep."""
    from ..core.horizon.learned import HorizonModel

    engine = load_engine(policy_dir, seed=0, threads=cfg.threads)
    fam = family(engine)
    t0 = time.time()
    profile_ms = measure_profile(engine, cfg.profile_batches)
    from ..core.profile import EngineProfile

    saturation = EngineProfile(profile_ms).saturation_batch
    rows = []

    def run(pol, params, model=None):
        for param in params:
            r = run_config(engine, pol, param, cfg, learned_model=model, saturation=saturation)
            r["family"], r["policy_dir"], r["h_min"] = fam, str(policy_dir), cfg.confidence_h_min
            if cfg.tag and pol != "static":
                r["policy"] = f"{pol}+{cfg.tag}"
            rows.append(r)
            log(f"  {fam} {r['policy']} {param:g}: success {r['success']:.3f} {r['success_ci95']}, mean H "
                f"{r['mean_horizon']:.2f}, {r['rounds_per_episode']:.1f} rounds/episode, "
                f"{r['batch_rows_per_round']:.2f} rows/round ({r['wall_s']:.0f} s)")

    run("static", cfg.static_h)
    run("confidence", cfg.thresholds)
    run("schedule", cfg.schedule_t)
    run("self_consistency", cfg.sc_tau)
    run("agreement", cfg.agree_tau)
    labels = None
    if cfg.learned_scale:
        from ..core.horizon.learned import round_optimal_horizon

        # §2.2 starts from the task-optimal static H (an appended run without static rows: H_min).
        h_start = cfg.label_h_start or (int(best_static(rows)["param"]) if any(r["policy"] == "static" for r in rows)
                                        else cfg.confidence_h_min)
        lab = _labels(engine, h_start, cfg, log)
        labels = {"h_start": h_start, "rounds": int(len(lab["x"])), "engine_rows": lab["rows"], "wall_s": lab["wall_s"],
                  "by_cosine": {}}
        for cos in cfg.learned_cos:
            # One collection, labels at each threshold (§2.2: the threshold is tuned to keep accuracy).
            y = np.array([round_optimal_horizon(tr[0], dict(zip(lab["hs"], tr)), h_start, cos) for tr in lab["traj"]],
                         float)
            model = HorizonModel.fit(lab["x"], y, hidden=32, epochs=2000, seed=0, steps=_steps(engine))
            name = "learned" if cos == 0.9 else f"learned-cos{cos:g}"
            path = None
            if learned_out:
                path = Path(learned_out)
                path = path if cos == 0.9 else path.with_name(f"{path.stem}-cos{cos:g}{path.suffix}")
                model.save(path)
            labels["by_cosine"][f"{cos:g}"] = {
                "policy": name, "mean_label": float(y.mean()),
                "histogram": {int(h): int((y == h).sum()) for h in lab["hs"]},
                "fit_mae": float(np.abs(model.predict(lab["x"]) - y).mean()), "model": str(path) if path else None}
            log(f"  labels at cosine {cos:g}: mean {y.mean():.2f}, histogram {labels['by_cosine'][f'{cos:g}']['histogram']}")
            run(name, cfg.learned_scale, model)
    engine.close()
    info_path = Path(policy_dir) / "train_info.json"
    meta = {
        "task": "pushgust",
        "family": fam,
        "control_hz": CONTROL_HZ,
        "policy_dir": str(policy_dir),
        "chunk": int(engine.chunk_len),
        "max_steps": cfg.steps_limit,
        "seeds": list(cfg.seeds),
        "episodes_per_seed": cfg.episodes,
        "confidence_h_min": cfg.confidence_h_min,
        "self_consistency": {"k": cfg.sc_k, "robots_per_batch": cfg.robots_per_batch, "saturation_batch": saturation},
        "learned_labels": labels,
        "torch_threads": cfg.threads,
        "wall_s": round(time.time() - t0, 1),
        "engine_profile_ms": {str(k): v for k, v in profile_ms.items()},
        "train_info": json.loads(info_path.read_text()) if info_path.exists() else None,
    }
    return rows, meta


def _labels(engine, h_start: int, cfg: StudyConfig, log) -> dict:
    """collect_labels, or the same collection from cfg.labels_cache when it was made with this
    start H and episode count (labelling is the study's costliest part)."""
    cache = Path(cfg.labels_cache) if cfg.labels_cache else None
    if cache is not None and cache.is_file():
        with np.load(cache) as z:
            if int(z["h_start"]) == h_start and int(z["episodes"]) == cfg.label_episodes:
                log(f"  labels: from {cache}")
                return {"x": z["x"], "traj": z["traj"], "hs": [int(h) for h in z["hs"]], "rows": int(z["rows"]),
                        "wall_s": float(z["wall_s"])}
    lab = collect_labels(engine, h_start, cfg.label_episodes, cfg.steps_limit, log=log)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(cache, x=lab["x"], traj=lab["traj"], hs=np.array(lab["hs"]), rows=lab["rows"],
                            wall_s=lab["wall_s"], h_start=h_start, episodes=cfg.label_episodes)
    return lab


def _steps(engine) -> Optional[int]:
    """Denoising steps per chunk (the learned model's features depend on it)."""
    cfg = getattr(engine, "cfg", {})
    if isinstance(cfg, dict):
        return int(cfg.get("num_steps")) if cfg.get("num_steps") else None
    return int(getattr(cfg, "num_inference_steps", None) or getattr(cfg, "num_steps", 0) or 0) or None


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
SCHEMA = ("task", "policy", "param", "episodes", "seeds", "success", "success_ci95", "mean_horizon",
          "rounds_per_episode", "batch_rows_per_round")


def markdown(rows: list, meta: dict) -> str:
    if not any(r["policy"] == "static" for r in rows):  # a partial run, for `study merge`
        return "# Partial horizon study run (no static rows): merge it into a run of record with `robotserve study merge`\n"
    bs = best_static(rows)
    fam = meta.get("family", "diffusion")
    lines = [
        f"# Horizon study: PushGust with a trained {fam} policy (seed 000 §5.2, Figure 11)",
        "",
        f"Task: push a puck through a gusty band into a goal (pymunk, {meta['control_hz']:g} Hz, chunk of "
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
    ratios = [r["final_update_ratio_median"] for r in rows if r.get("final_update_ratio_median", {}).get("calm")]
    if ratios:
        bands = [x["band"] for x in ratios if x["band"] is not None]
        band = float(np.median(bands)) if bands else float("nan")
        calm = np.median([x["calm"] for x in ratios])
        lines.append(f"- The §3.1 ratio (final update over the earlier steps' mean), median over rounds: {calm:.2f} with "
                     f"the puck in calm air, {band:.2f} in the gusty band.")
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
    for task in sorted({m["task"] for _, m in runs}):
        p = folder / f"fig11_{task}.png"
        plot_task([(rs, m) for rs, m in runs if m["task"] == task], p, task)
        paths.append(p)
    return paths


def profile_ms_of(path) -> dict:
    """Batch latencies (ms) of a `robotserve profile` JSON or a bare {"batch_latency_ms": ...}."""
    from ..engines.profiling import load_profile_file

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
    plot(rows, png, f"PushGust / {meta.get('family', '?')}: accuracy vs efficiency (seed 000 Fig. 11)")
    paths = [out, meta_path, md, png]
    if workload_out:
        bs = best_static(rows)
        dyn = best_dynamic(rows, sampling=False)
        name = workload_name or f"pushgust-{meta.get('family', 'diffusion')}".replace("_", "-")
        to_workload(rows, meta, bs, dyn, name).save(workload_out)
        paths.append(Path(workload_out))
    return paths
