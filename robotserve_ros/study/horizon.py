"""The horizon study of seed 000 §5.2 / Figure 11 on a study task family (PushGust, Meta-World)
with a trained diffusion or flow-matching policy.

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

from .horizon_report import best_static, wilson_ci
from .labels import collect_labels
from .tasks import task_family

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
    tag: str = ""  # appended to this run's dynamic policy names ("<policy>+<tag>"), e.g. another H_min
    task: str = "pushgust"  # the task family (study/tasks.py)

    @property
    def steps_limit(self) -> int:
        return int(self.max_steps or task_family(self.task).max_steps)

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


def make_envs(cfg: StudyConfig) -> list:
    """One environment per evaluated (seed, episode), reusable by every configuration (reset(seed)
    starts afresh; a Meta-World env loads its MuJoCo model once)."""
    fam = task_family(cfg.task)
    return [fam.make_env(cfg.steps_limit) for _ in range(len(cfg.seeds) * cfg.episodes)]


def run_config(engine, policy: str, param: float, cfg: StudyConfig, learned_model=None, saturation: int = 32,
               envs: Optional[list] = None) -> dict:
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
    fam = task_family(cfg.task)
    envs = envs if envs is not None else make_envs(cfg)
    obs = [env.reset(episode_seed(s, e)) for env, (s, e) in zip(envs, eps)]
    # The study seed is part of the task id, so each seed draws its own diffusion noise.
    tids = [f"{policy}-{param:g}/seed{s}/ep{e}" for s, e in eps]
    rounds: list[list[int]] = [[] for _ in eps]
    batch_rows = 0
    # Final-step update norm over the mean of the earlier steps, per action (what the §3.1 rule
    # compares with 1 + t), split by the task's phase when observed (PushGust: in the gusty band
    # or calm; Meta-World: hand at the object or in free air).
    ratio: dict = {}
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
                ratio.setdefault(envs[i].phase(), []).append(nrm[-1] / np.maximum(nrm[:-1].mean(0), 1e-12))
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
    names = [getattr(env, "name", None) for env in envs]
    per_task = ({t: float(np.mean([ok for ok, nm in zip(success, names) if nm == t])) for t in sorted(set(names))}
                if names[0] is not None else None)
    flat = [n for r in rounds for n in r]
    n = len(eps)
    p = float(success.mean())
    nrounds = sum(len(r) for r in rounds)
    row = {
        "task": fam.task,
        "task_family": fam.name,
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
    if per_task is not None:
        row["success_per_task"] = per_task
    return row


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
    fam_t = task_family(cfg.task)
    if cfg.learned_scale and not fam_t.labels:
        raise ValueError(f"the learned horizon's §2.2 labels fork the arena, which study/labels.py does for "
                         f"PushGust only, not {cfg.task}")
    envs = make_envs(cfg)
    rows = []

    def run(pol, params, model=None):
        for param in params:
            r = run_config(engine, pol, param, cfg, learned_model=model, saturation=saturation, envs=envs)
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
    for env in envs:
        getattr(env, "close", lambda: None)()
    info_path = Path(policy_dir) / "train_info.json"
    meta = {
        "task": fam_t.task,
        "task_family": fam_t.name,
        "family": fam,
        "control_hz": fam_t.control_hz,
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
