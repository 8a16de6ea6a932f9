"""`robotserve study rtc`: real-time chunking under inference delay, closed loop (issue 28 item 3;
Black, Galliker & Levine, arXiv 2506.07339).

Each robot runs its episode in simulated time at the task's control rate. A round: the robot
observes and sends a request carrying the leftover of its current chunk; the chunk takes d
control steps to come back (d = ceil(delay_s x control_hz)), during which the robot executes
its leftover; when the leftover runs out first it HOLDS (robot_client: sends nothing, the
timestep does not advance) for the rest of d. The new chunk starts at index m = min(d, k)
(the actions for timesteps already executed are dropped, core/action_queue.py), the robot
executes up to index s (the executed horizon the horizon policy picks), then sends the next
request with B[s:] as its leftover.
- Without RTC the chunk is generated freely and s ranges d <= s <= H (s > H - d holds).
- With RTC (`+rtc`) the chunk is generated as an inpainting of the leftover with the first d
  actions frozen (FlowEngine, paper §4), so execution continues from action d of it; s keeps
  d <= s <= H - d (§4) so the leftover always covers the delay and the robot never holds.
  When d > H / 2 no s exists: the `+rtc` configuration cannot run at that delay (no row; the
  meta says so).
`mean_horizon` counts the actions executed from each chunk, those executed while the next
chunk was generated included. `boundary_jerk`: docs/rtc.md.

All episodes of one configuration are tasks of one FlowEngine, served as one batch per
round (each robot's simulated time is its own, so its request sequence does not depend on
the others'; the engine's rows are batch-independent).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .horizon import episode_seed
from .horizon_report import wilson_ci
from .tasks import task_family

ROW_KEYS = ("task", "policy", "delay_s", "config", "episodes", "success", "success_ci95", "mean_horizon",
            "rounds_per_episode", "boundary_jerk")
# The dynamic horizon per family: the best non-sampling flow-policy setting of the horizon study
# (reports/horizon/README.md: Meta-World schedule t = 0, 0.990 at 1.79x; PushGust schedule
# t = -0.2, 0.892 at 1.02x; PushGust's learned horizon needs its label model, left out here).
DYNAMIC = {"metaworld": ("schedule", 0.0), "pushgust": ("schedule", -0.2)}
POLICY_DIR = {"metaworld": "models/metaworld_flow", "pushgust": "models/pushgust_flow"}
STATIC_S = 1  # both flow policies' best zero-delay static H (reports/horizon): re-plan as often as d lets


@dataclass
class RtcStudyConfig:
    tasks: tuple = ("metaworld", "pushgust")
    seeds: tuple = (0, 1, 2)
    episodes: int = 34
    delays: tuple = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6)
    rtc_form: str = "paper"
    rtc_mask: str = "soft"
    threads: int = 1
    max_steps: Optional[int] = None
    policy_dirs: dict = field(default_factory=dict)


def delay_steps(delay_s: float, control_hz: float) -> int:
    return int(math.ceil(round(delay_s * control_hz, 9)))


def hold_action(task: str, obs: np.ndarray, last: Optional[np.ndarray], action_dim: int) -> np.ndarray:
    """What a holding robot does for one control step: PushGust's PD target on the agent itself
    (it stops where it is); Meta-World's hand delta zero with the gripper effort kept."""
    if task == "pushgust":
        return np.asarray(obs[:2], np.float32).copy()
    a = np.zeros(action_dim, np.float32)
    if last is not None:
        a[-1] = last[-1]
    return a


class _Robot:
    """One episode's state: the env, the leftover, the executed commands and per-chunk counts."""

    def __init__(self, env, obs) -> None:
        self.env, self.obs = env, obs
        self.leftover: Optional[np.ndarray] = None  # action space, [k, dim]
        self.executed: list = []  # every command sent, holds included (the jerk reads them)
        self.boundaries: list = []  # indices in executed of each chunk's first action
        self.per_chunk: list = []  # actions executed from each chunk
        self.held = 0
        self.last_chunk: Optional[int] = None

    def act(self, a, chunk: Optional[int]) -> bool:
        """One control step; False once the episode is over."""
        if self.env.done:
            return False
        if chunk is not None and chunk != self.last_chunk:
            self.boundaries.append(len(self.executed))
            self.last_chunk = chunk
        self.obs, _ = self.env.step(a)
        self.executed.append(np.asarray(a, np.float32))
        if chunk is not None:
            self.per_chunk[chunk] += 1
        return not self.env.done


def boundary_jerk(executed: list, boundaries: list, an) -> list:
    """||a_t - 3 a_{t-1} + 3 a_{t-2} - a_{t-3}|| at each chunk's first executed action t, in the
    policy's normalised action units per control step cubed (docs/rtc.md)."""
    if not executed:
        return []
    a = an.norm(np.stack(executed))
    return [float(np.linalg.norm(a[t] - 3 * a[t - 1] + 3 * a[t - 2] - a[t - 3])) for t in boundaries if t >= 3]


def run_rtc_config(engine, fam, config: str, delay_s: float, cfg: RtcStudyConfig, envs: list, hp=None,
                   param: Optional[float] = None) -> Optional[dict]:
    from ..core.observation import Observation
    from ..core.rtc import RtcGuide
    from ..core.types import InferenceRequest

    rtc = config.endswith("+rtc")
    H = int(engine.chunk_len)
    d = delay_steps(delay_s, fam.control_hz)
    hi = H - d if rtc else H
    # s >= d: the next request cannot leave before this chunk started, at index min(d, k); without
    # RTC a d past the chunk means s = H, the robot holds the rest of the delay.
    lo = max(d, 1) if rtc else max(min(d, H), 1)
    if lo > hi:
        return None  # §4's d <= s <= H - d has no s at this delay
    eps = [(s, e) for s in cfg.seeds for e in range(cfg.episodes)]
    robots = [_Robot(env, env.reset(episode_seed(s, e))) for env, (s, e) in zip(envs, eps)]
    # One task id per arena across configurations: every configuration draws the same noise.
    tids = [f"rtc/seed{s}/ep{e}" for s, e in eps]
    active = list(range(len(eps)))
    t0 = time.time()
    rnd = 0
    while active:
        reqs = []
        for i in active:
            r = robots[i]
            left = r.leftover if r.leftover is not None else np.zeros((0, fam.action_dim), np.float32)
            guide = RtcGuide(left, min(d, len(left))) if rtc else None  # the engine freezes min(d, k) anyway
            reqs.append(InferenceRequest(task_id=tids[i], round_id=rnd, observation=Observation(joints=r.obs), rtc=guide))
        results = engine.infer(reqs)
        still = []
        for i, res in zip(active, results):
            r = robots[i]
            left = r.leftover if r.leftover is not None else np.zeros((0, fam.action_dim), np.float32)
            k = len(left)
            prev = len(r.per_chunk) - 1
            r.per_chunk.append(0)
            cur = len(r.per_chunk) - 1
            alive = True
            # While the chunk is generated: the leftover, then hold.
            for j in range(min(d, k)):
                alive = alive and r.act(left[j], prev)
            for _ in range(d - min(d, k)):
                if not alive:
                    break
                alive = r.act(hold_action(fam.name, r.obs, r.executed[-1] if r.executed else None, fam.action_dim),
                              None)
                r.held += 1
            m = min(d, k)
            if hp is None:
                s = STATIC_S
            else:
                s = hp.choose(res, param).horizon
            s = min(max(int(s), lo), hi)
            for a in res.actions[m:s]:
                if not alive:
                    break
                alive = r.act(a, cur)
            r.leftover = np.ascontiguousarray(res.actions[s:])
            if alive:
                still.append(i)
            else:
                engine.forget(tids[i])
        active = still
        rnd += 1
    success = np.array([r.env.success() for r in robots], bool)
    per_chunk = [n for r in robots for n in r.per_chunk if n > 0]
    jerks = [j for r in robots for j in boundary_jerk(r.executed, r.boundaries, engine.an)]
    n = len(eps)
    return {
        "task": fam.task,
        "policy": str(cfg.policy_dirs.get(fam.name) or POLICY_DIR[fam.name]),
        "delay_s": float(delay_s),
        "config": config,
        "episodes": n,
        "success": float(success.mean()),
        "success_ci95": wilson_ci(int(success.sum()), n),
        "mean_horizon": float(np.mean(per_chunk)) if per_chunk else 0.0,
        "rounds_per_episode": float(np.mean([len(r.per_chunk) for r in robots])),
        "boundary_jerk": float(np.mean(jerks)) if jerks else 0.0,
        # extras (not in ROW_KEYS; the report's JSON keeps them in rtc_study.meta.json)
        "_extra": {"delay_steps": d, "s_range": [lo, hi], "held_steps_per_episode": float(np.mean([r.held for r in robots])),
                   "steps_per_episode": float(np.mean([r.env.steps for r in robots])),
                   "rounds": [[int(x) for x in r.per_chunk if x > 0] for r in robots],
                   "episode_seeds": [episode_seed(s, e) for s, e in eps], "wall_s": round(time.time() - t0, 1)},
    }


def run_family(task: str, cfg: RtcStudyConfig, log=print) -> tuple[list, dict]:
    """Every (delay, configuration) of one task family."""
    from ..core.horizon import make_horizon_policy

    fam = task_family(task)
    pdir = cfg.policy_dirs.get(task) or POLICY_DIR[task]
    engine = _engine(pdir, cfg)
    steps = int(cfg.max_steps or fam.max_steps)
    envs = [fam.make_env(steps) for _ in range(len(cfg.seeds) * cfg.episodes)]
    dyn, t = DYNAMIC[task]
    rows, skipped = [], []
    t0 = time.time()
    done: dict = {}  # (d, config) -> row: delays that round to the same d run once
    for delay in cfg.delays:
        for config in ("static", "static+rtc", f"dynamic:{dyn}", f"dynamic:{dyn}+rtc"):
            hp = make_horizon_policy(dyn, h_min=1) if config.startswith("dynamic") else None
            key = (delay_steps(delay, fam.control_hz), config)
            if key in done:
                row = None if done[key] is None else {**done[key], "delay_s": float(delay)}
            else:
                row = done[key] = run_rtc_config(engine, fam, config, delay, cfg, envs, hp, t)
            if row is None:
                skipped.append({"delay_s": delay, "config": config, "delay_steps": delay_steps(delay, fam.control_hz),
                                "chunk": int(engine.chunk_len)})
                log(f"  {task} {delay:g} s {config}: no s with d <= s <= H - d (d = "
                    f"{delay_steps(delay, fam.control_hz)}, H = {engine.chunk_len}): skipped")
                continue
            rows.append(row)
            x = row["_extra"]
            log(f"  {task} {delay:g} s (d={x['delay_steps']}) {config}: success {row['success']:.3f} "
                f"{[round(v, 3) for v in row['success_ci95']]}, mean H {row['mean_horizon']:.2f}, "
                f"{row['rounds_per_episode']:.1f} rounds, jerk {row['boundary_jerk']:.3f}, held "
                f"{x['held_steps_per_episode']:.1f} steps/ep ({x['wall_s']:.0f} s)")
    profile = _engine_profile_ms(engine)
    engine.close()
    for env in envs:
        getattr(env, "close", lambda: None)()
    meta = {"task": fam.task, "task_family": task, "policy_dir": str(pdir), "control_hz": fam.control_hz,
            "chunk": int(engine.chunk_len), "max_steps": steps, "dynamic": {"policy": dyn, "t": t},
            "static_s": STATIC_S, "rtc_form": cfg.rtc_form, "rtc_mask": cfg.rtc_mask, "skipped": skipped,
            "wall_s": round(time.time() - t0, 1),
            "engine_profile_ms": profile}
    return rows, meta


def _engine(pdir, cfg: RtcStudyConfig):
    from ..engines import make_engine
    from ..engines.torch_env import import_torch

    import_torch().set_num_threads(cfg.threads)
    return make_engine("flow", None, policy_dir=str(pdir), device="cpu", seed=0, rtc_form=cfg.rtc_form,
                       rtc_mask=cfg.rtc_mask)


def _engine_profile_ms(engine) -> dict:
    from .horizon import measure_profile

    return {str(k): v for k, v in measure_profile(engine, (1, 2, 4, 8, 16, 32), repeats=3).items()}


def _family_job(args):
    task, cfg = args
    return run_family(task, cfg)


def run_study(cfg: RtcStudyConfig, workers: int = 1, log=print) -> tuple[list, dict]:
    """All families, `workers` processes (one family each)."""
    jobs = [(t, cfg) for t in cfg.tasks]
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(jobs))) as ex:
            outs = list(ex.map(_family_job, jobs))
    else:
        outs = [run_family(t, cfg, log) for t in cfg.tasks]
    rows = [r for rs, _ in outs for r in rs]
    meta = {m["task_family"]: m for _, m in outs}
    return rows, meta


def target_check(rows: list, task: str, min_delay: float = 0.2, ratio: float = 1.5) -> dict:
    """Issue 28's target: at a delay >= 0.2 s some `+rtc` configuration reaches success >= the
    lower CI bound of the best zero-delay static configuration at >= 1.5x its mean horizon."""
    st = [r for r in rows if r["task"] == task and r["delay_s"] == 0 and r["config"] == "static"]
    if not st:
        return {"met": False, "why": "no zero-delay static row"}
    base = max(st, key=lambda r: r["success"])
    lo, h = base["success_ci95"][0], base["mean_horizon"]
    cand = [r for r in rows if r["task"] == task and r["config"].endswith("+rtc") and r["delay_s"] >= min_delay]
    ok = [r for r in cand if r["success"] >= lo and r["mean_horizon"] >= ratio * h]
    best = max(cand, key=lambda r: (r["success"], r["mean_horizon"]), default=None)
    return {"met": bool(ok), "baseline": {"success": base["success"], "ci_low": lo, "mean_horizon": h},
            "meeting": [(r["config"], r["delay_s"]) for r in ok],
            "closest": None if best is None else {k: best[k] for k in ("config", "delay_s", "success", "mean_horizon")},
            "rtc_rows_at_delay": len(cand)}


def markdown(rows: list, meta: dict) -> str:
    lines = ["# RTC study: success, horizon and boundary jerk under inference delay", "",
             f"`{meta.get('command', 'robotserve study rtc')}`: {len(meta.get('seeds', []))} seeds x "
             f"{meta.get('episodes_per_seed')} episodes per configuration, RTC form {meta.get('rtc_form')}, mask "
             f"{meta.get('rtc_mask', 'soft')}; load average {meta.get('loadavg_before', [0])[0]:.1f} before / "
             f"{meta.get('loadavg_after', [0])[0]:.1f} after.", ""]
    for fam, m in meta.get("families", {}).items():
        chk = target_check(rows, m["task"])
        lines += [f"## {m['task']} ({m['control_hz']:g} Hz, chunk {m['chunk']}, {m['policy_dir']})", "",
                  "| delay s | d | config | success | 95 % CI | mean horizon | rounds/episode | boundary jerk |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["task"] != m["task"]:
                continue
            lo, hi = r["success_ci95"]
            lines.append(f"| {r['delay_s']:g} | {delay_steps(r['delay_s'], m['control_hz'])} | {r['config']} "
                         f"| {r['success']:.3f} | {lo:.2f}-{hi:.2f} | {r['mean_horizon']:.2f} "
                         f"| {r['rounds_per_episode']:.1f} | {r['boundary_jerk']:.3f} |")
        if m.get("skipped"):
            ds = sorted({s["delay_s"] for s in m["skipped"]})
            lines += ["", f"No `+rtc` rows at {', '.join(f'{x:g}' for x in ds)} s: d > H / 2 = {m['chunk'] // 2}, so "
                          f"RTC's d <= s <= H - d has no s."]
        b = chk.get("baseline")
        verdict = "MET" if chk["met"] else "MISSED"
        lines += ["", f"Target (delay >= 0.2 s, a `+rtc` config with success >= {b['ci_low']:.3f} at mean horizon >= "
                      f"{1.5 * b['mean_horizon']:.2f}): **{verdict}**" + (f" by {chk['meeting']}" if chk["met"] else
                      f"; closest: {chk['closest']}") if b else f"Target: MISSED ({chk.get('why')})", ""]
    return "\n".join(lines) + "\n"


def read_study(out: Path) -> tuple[list, dict]:
    """A run written by write_study, rows with their extras again (for --append)."""
    import json

    rows = json.loads((out / "rtc_study.json").read_text())
    meta = json.loads((out / "rtc_study.meta.json").read_text())
    extra = {(x["task"], x["delay_s"], x["config"]): x for x in meta.pop("rows")}
    for r in rows:
        x = dict(extra[r["task"], r["delay_s"], r["config"]])
        r["_extra"] = {k: v for k, v in x.items() if k not in ("task", "delay_s", "config")}
    return rows, meta


def merge_runs(rows: list, meta: dict, new_rows: list, new_meta: dict) -> tuple[list, dict]:
    """A run's rows added to a run of record (same (task, delay, config): the new one replaces it);
    a family's skipped list and delays are the union; the command of each run is kept."""
    key = lambda r: (r["task"], r["delay_s"], r["config"])  # noqa: E731
    new = {key(r) for r in new_rows}
    merged = [r for r in rows if key(r) not in new] + list(new_rows)
    merged.sort(key=lambda r: (r["task"], r["delay_s"]))
    fams = dict(meta.get("families", {}))
    for f, m in new_meta.get("families", {}).items():
        old = fams.get(f)
        if old is not None:
            done = {(x["delay_s"], x["config"]) for x in m["skipped"]} | {(r["delay_s"], r["config"]) for r in new_rows
                                                                        if r["task"] == m["task"]}
            m = {**m, "skipped": [x for x in old["skipped"] if (x["delay_s"], x["config"]) not in done] + m["skipped"]}
        fams[f] = m
    delays = sorted(set(meta.get("delays_s", [])) | set(new_meta.get("delays_s", [])))
    appended = meta.get("appended", []) + [new_meta.get("command")]
    return merged, {**meta, "families": fams, "delays_s": delays, "appended": appended}


def write_study(rows: list, meta: dict, out: Path) -> list:
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "rtc_study.json").write_text(json.dumps([{k: r[k] for k in ROW_KEYS} for r in rows], indent=1) + "\n")
    extra = [{"task": r["task"], "delay_s": r["delay_s"], "config": r["config"], **r["_extra"]} for r in rows]
    # One line per row: the per-episode rounds would take a line per number with indent.
    head = json.dumps({**meta, "rows": []}, indent=1)
    body = ",\n".join("  " + json.dumps(x) for x in extra)
    (out / "rtc_study.meta.json").write_text(head.replace('"rows": []', '"rows": [\n' + body + "\n ]") + "\n")
    (out / "rtc_study.md").write_text(markdown(rows, meta))
    return [out / "rtc_study.json", out / "rtc_study.meta.json", out / "rtc_study.md"]
