"""`robotserve study rtc-arms`: the arms of issue 39 on the same episodes and the same virtual-time cap.

Every episode of a cell (task, d, s, arm) runs in virtual time at the task's control rate; all
episodes of a cell step together, one engine call per round (they request at the same steps).
Arms (docs/rtc.md):
- `sync`: the robot pauses while the next chunk is generated: the world waits d steps (the
  pause counts in time, nothing moves: the most favourable synchronous robot), then s actions.
- the asynchronous arms request every s control steps; a chunk requested at step T arrives at
  T + d and its action i is for step T + i (actions of passed steps are dropped, as
  core/action_queue.py does); before the first chunk arrives the robot holds.
  - `naive`: the newest arrived chunk is executed (the leftover runs until the switch).
  - `ensemble`: every arrived chunk covering the step votes, weights exp(-0.01 i), i = 0 the
    oldest (ACT's temporal ensembling, LeRobot's `temporal_ensemble_coeff` = 0.01).
  - `rtc_hard`, `rtc_soft` (the paper: VJP, soft mask, beta 5), `rtc_lerobot` (LeRobot 0.4.4's
    defaults: identity Jacobian, linear schedule, beta 10, execution_horizon 10): `naive`, each
    chunk generated as the guided inpainting of the leftover with the true d (Black et al. §4).
  - `rtc_trained`: `naive` on a head trained with training-time RTC (arXiv 2512.05964), the
    leftover's first d actions given as its clean prefix, no guidance.
The pairing: episode seeds and each round's noise (task id = episode, round id = request
index) are the same in every arm. Success is latched; time to success counts pauses and holds;
an episode still running at the virtual-time cap has failed.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

ARMS = ("sync", "naive", "ensemble", "rtc_hard", "rtc_soft", "rtc_lerobot", "rtc_trained")
ENSEMBLE_COEFF = 0.01  # ACT / LeRobot temporal_ensemble_coeff
BASELINES = ("naive", "ensemble")
TARGET_ARMS = ("rtc_soft", "rtc_trained")


class ListBatch:
    """A batch view over one-episode envs (PushGust, Meta-World) for the lock-step runner."""

    def __init__(self, fam, seeds, max_steps: int) -> None:
        self.envs = [fam.make_env(max_steps) for _ in seeds]
        self.obs = np.stack([e.reset(int(s)) for e, s in zip(self.envs, seeds)])
        self.n = len(seeds)
        self.success = np.zeros(self.n, bool)
        self.failed = np.zeros(self.n, bool)

    @property
    def done(self) -> np.ndarray:
        return self.success | self.failed

    def observe(self) -> np.ndarray:
        return self.obs.astype(np.float32)

    def step(self, u, moving=None) -> None:
        live = ~self.done if moving is None else (~self.done & moving)
        for i in np.flatnonzero(live):
            self.obs[i], _ = self.envs[i].step(u[i])
            self.success[i] |= bool(self.envs[i].success())


def make_batch(task: str, seeds):
    if task == "viapoint":
        from .viapoint import ViaPointBatch

        return ViaPointBatch(seeds)
    from .tasks import task_family

    return ListBatch(task_family(task), seeds, 10 ** 6)  # the runner's virtual-time cap ends episodes


@dataclass(frozen=True)
class Cell:
    task: str
    arm: str
    d: int
    s: int


def run_cell(engine, cell: Cell, seeds, cap_steps: int, hz: float) -> list:
    """Per-episode outcomes of one cell: success, time to success (s), boundary jerks."""
    from ..core.observation import Observation
    from ..core.rtc import RtcGuide
    from ..core.types import InferenceRequest
    from .rtc import hold_action  # ViaPoint holds with a zero velocity command, as Meta-World's hand

    H, A, d, s = int(engine.chunk_len), int(engine.action_dim), cell.d, cell.s
    if not 1 <= s <= H or (cell.arm.startswith("rtc") and s > H - d) or (cell.arm != "sync" and s < d):
        raise ValueError(f"{cell}: s must satisfy d <= s <= H - d (RTC) or d <= s <= H")
    b = make_batch(cell.task, seeds)
    n = b.n
    clock = np.zeros(n, np.int64)  # virtual control steps, pauses included
    t_succ = np.full(n, np.nan)
    cmds: list = [[] for _ in range(n)]  # commanded actions (holds included, pauses not)
    bounds: list = [[] for _ in range(n)]
    chunks: list = [[] for _ in range(n)]  # (requested at, actions) per episode, async arms
    guided = cell.arm.startswith("rtc")  # rtc_trained: the engine's head takes the prefix itself
    tids = [f"rtc-arms/{cell.task}/{int(x)}" for x in seeds]

    def infer(rows, rnd, obs, leftovers):
        reqs = [InferenceRequest(tids[i], rnd, observation=Observation(joints=obs[i]),
                                 rtc=RtcGuide(leftovers[i], min(d, len(leftovers[i]))) if leftovers is not None and guided else None)
                for i in rows]
        return [r.actions for r in engine.infer(reqs)]

    def act(u, moving):
        before = b.done.copy()
        b.step(u, moving)
        live = moving & ~before
        clock[live] += 1
        for i in np.flatnonzero(live):
            cmds[i].append(u[i].copy())
        newly = b.success & ~before
        t_succ[newly] = clock[newly] / hz

    rnd = 0
    if cell.arm == "sync":
        while True:
            rows = np.flatnonzero(~b.done & (clock < cap_steps))
            if not len(rows):
                break
            obs = b.observe()
            got = infer(rows, rnd, obs, None)
            clock[rows] += d  # the world waits while the chunk is generated
            for j in range(s):
                u = np.zeros((n, A), np.float32)
                moving = np.zeros(n, bool)
                for r, i in enumerate(rows):
                    if clock[i] < cap_steps:
                        u[i], moving[i] = got[r][j], True
                        if j == 0:
                            bounds[i].append(len(cmds[i]))
                act(u, moving)
            rnd += 1
    else:
        step, pending = 0, {}

        def arrive():  # the chunk requested at T is there at T + d
            nonlocal pending
            if pending and step == next(iter(pending.values()))[0] + d:
                for i, ch in pending.items():
                    chunks[i] = chunks[i][-(H // s + 1):] + [ch]
                    bounds[i].append(len(cmds[i]))
                pending = {}

        while True:
            live = ~b.done & (clock < cap_steps)
            if not live.any():
                break
            arrive()
            if step % s == 0:  # a request leaves: the leftover is what the newest chunk has left
                rows = np.flatnonzero(live)
                obs = b.observe()
                left = {}
                for i in rows:
                    t0, c = chunks[i][-1] if chunks[i] else (step - H, None)
                    left[i] = np.ascontiguousarray(c[step - t0:]) if step - t0 < H else np.zeros((0, A), np.float32)
                got = infer(rows, rnd, obs, left)
                pending = {int(i): (step, g) for i, g in zip(rows, got)}
                rnd += 1
                arrive()  # d = 0: at once
            obs_now = b.observe()
            u = np.stack([hold_action(cell.task, obs_now[i], cmds[i][-1] if cmds[i] else None, A) for i in range(n)])
            for i in np.flatnonzero(live):
                cover = [(t0, c) for t0, c in chunks[i] if 0 <= step - t0 < H]
                if not cover:
                    continue
                if cell.arm == "ensemble":
                    w = np.exp(-ENSEMBLE_COEFF * np.arange(len(cover)))
                    u[i] = np.tensordot(w / w.sum(), np.stack([c[step - t0] for t0, c in cover]), 1)
                else:
                    t0, c = cover[-1]
                    u[i] = c[step - t0]
            act(u, live)
            step += 1
    an = engine.an
    out = []
    for i in range(n):
        a = an.norm(np.stack(cmds[i])) if cmds[i] else np.zeros((0, A))
        jerk = [float(np.linalg.norm(a[t] - 3 * a[t - 1] + 3 * a[t - 2] - a[t - 3])) for t in bounds[i]
                if 3 <= t < len(a)]
        ok = bool(b.success[i] and clock[i] <= cap_steps)
        out.append({"seed": int(seeds[i]), "success": ok,
                    "time_to_success_s": round(float(t_succ[i]), 4) if ok else None, "jerks": jerk})
    return out


# ---- the study: cells, statistics, the report of record ------------------------------------------

FAMILY = {"viapoint": "multimodal", "pushgust": "unimodal", "metaworld": "unimodal"}
POLICIES = {"viapoint": "models/viapoint_flow", "pushgust": "models/pushgust_flow",
            "metaworld": "models/metaworld_flow"}
TRAINED = {"viapoint": "models/viapoint_flow_trained_rtc"}  # training-time RTC heads (none for the controls)


def time_cap_steps(task: str) -> int:
    """The virtual-time cap of every arm: ViaPoint's frozen one; 2x the expert's step cap on the
    controls (a synchronous robot at s = d spends half its time paused)."""
    from .tasks import task_family

    if task == "viapoint":
        from .viapoint import CONTROL_HZ, TIME_CAP_S

        return int(round(TIME_CAP_S * CONTROL_HZ))
    return 2 * int(task_family(task).max_steps)


def engine_for(task: str, arm: str, policy_dirs: dict):
    from ..engines import make_engine

    if arm == "rtc_trained":
        return make_engine("flow", None, policy_dir=policy_dirs.get(task + ":trained", TRAINED.get(task)), seed=0)
    kw = {"rtc_hard": {"rtc_form": "paper", "rtc_mask": "hard"}, "rtc_soft": {"rtc_form": "paper"},
          "rtc_lerobot": {"rtc_form": "lerobot"}}.get(arm, {})
    return make_engine("flow", None, policy_dir=policy_dirs.get(task, POLICIES[task]), seed=0, **kw)


def cells_of(H: int, delays, arms) -> list:
    """(d, s) pairs: s in {d, H/2, H - d} (d = 0: s = H/2 only), RTC's d <= s <= H - d kept."""
    out = []
    for d in delays:
        ss = [H // 2] if d == 0 else sorted({d, H // 2, H - d})
        out += [(d, s) for s in ss if d <= s <= H - d]
    return [(d, s, a) for d, s in out for a in arms]


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """McNemar's exact test on paired successes: the discordant pairs under Binomial(n, 1/2)."""
    from scipy.stats import binomtest

    n01, n10 = int(np.sum(a & ~b)), int(np.sum(~a & b))
    return 1.0 if n01 + n10 == 0 else float(binomtest(n01, n01 + n10, 0.5).pvalue)


def holm(ps: list) -> list:
    """Holm's step-down adjustment (family-wise error over the tests given)."""
    m = len(ps)
    order = np.argsort(ps)
    adj, run = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        run = max(run, (m - rank) * ps[i])
        adj[i] = min(1.0, run)
    return adj


def time_ratio(ta: np.ndarray, tb: np.ndarray, seed: int = 0) -> tuple:
    """mean(a) / mean(b) over co-solved episodes and its paired bootstrap 95 % CI (percentile)."""
    from scipy.stats import bootstrap

    if len(ta) < 2:
        return None, None
    r = float(ta.mean() / tb.mean())
    if np.allclose(ta, tb):
        return r, [r, r]
    ci = bootstrap((ta, tb), lambda x, y, axis=-1: x.mean(axis) / y.mean(axis), paired=True, vectorized=True,
                   n_resamples=2000, method="percentile", random_state=np.random.default_rng(seed)).confidence_interval
    return r, [float(ci.low), float(ci.high)]


def compare(task: str, H: int, d: int, s: int, a: str, b: str, ea: list, eb: list) -> dict:
    sa, sb = np.array([e["success"] for e in ea]), np.array([e["success"] for e in eb])
    both = sa & sb
    ta = np.array([e["time_to_success_s"] for e, k in zip(ea, both) if k], float)
    tb = np.array([e["time_to_success_s"] for e, k in zip(eb, both) if k], float)
    r, ci = time_ratio(ta, tb)
    return {"task": task, "H": H, "d": d, "s": s, "a": a, "b": b, "success_diff": float(sa.mean() - sb.mean()),
            "mcnemar_p": mcnemar_exact(sa, sb), "mcnemar_p_holm": None, "time_ratio": r, "time_ratio_ci95": ci,
            "co_solved": int(both.sum())}


def is_target(t: dict) -> bool:
    """Issue 39's target cells: the multimodal family, d / H in 0.25..0.375, RTC soft or trained."""
    return FAMILY[t["task"]] == "multimodal" and 0.25 <= t["d"] / t["H"] <= 0.375 and t["a"] in TARGET_ARMS


def tests_of(task: str, H: int, by: dict) -> list:
    """Every RTC arm against the better of naive / ensemble and against sync, in each cell."""
    out = []
    for (d, s) in sorted({(d, s) for d, s, _ in by}):
        cell = {a: by[d, s, a] for a in ARMS if (d, s, a) in by}
        if not all(x in cell for x in ("sync", *BASELINES)):
            continue
        rate = {x: np.mean([e["success"] for e in cell[x]]) for x in BASELINES}
        best = max(BASELINES, key=lambda x: (rate[x], x == "naive"))
        for a in ARMS[3:]:
            if a in cell:
                out += [compare(task, H, d, s, a, b, cell[a], cell[b]) for b in (best, "sync")]
    return out


def adjust(tests: list) -> None:
    """Holm over the target cells' tests together; over each task's other tests otherwise."""
    groups: dict = {}
    for i, t in enumerate(tests):
        t["target"] = is_target(t)
        groups.setdefault("target" if t["target"] else t["task"], []).append(i)
    for idx in groups.values():
        for i, p in zip(idx, holm([tests[i]["mcnemar_p"] for i in idx])):
            tests[i]["mcnemar_p_holm"] = p


def target_check(tests: list) -> dict:
    """Issue 39's first target, per target cell: RTC >= best baseline + 0.10 (Holm p < 0.05), not
    below sync (p >= 0.05 or not lower), time <= 0.85x sync with the CI's upper bound < 1."""
    cells = {}
    for t in tests:
        if t["target"]:
            cells.setdefault((t["d"], t["s"], t["a"]), {})["sync" if t["b"] == "sync" else "baseline"] = t
    out = []
    for (d, s, a), c in sorted(cells.items()):
        bl, sy = c.get("baseline"), c.get("sync")
        if not bl or not sy:
            continue
        ok_bl = bl["success_diff"] >= 0.10 and bl["mcnemar_p_holm"] < 0.05
        ok_sy = sy["success_diff"] >= 0 or sy["mcnemar_p_holm"] >= 0.05
        ok_t = sy["time_ratio"] is not None and sy["time_ratio"] <= 0.85 and sy["time_ratio_ci95"][1] < 1
        out.append({"d": d, "s": s, "arm": a, "baseline": bl["b"], "vs_baseline": ok_bl, "vs_sync_success": ok_sy,
                    "vs_sync_time": ok_t, "met": ok_bl and ok_sy and ok_t})
    return {"met": any(c["met"] for c in out), "cells": out}


def run_task(task: str, episodes: int, delays, arms, policy_dirs: dict, log=print) -> tuple:
    """(rows, tests, episodes) of one task family."""
    from .horizon import EVAL_SEED_BASE
    from .horizon_report import wilson_ci
    from .tasks import task_family

    fam = task_family(task)
    base = EVAL_SEED_BASE
    if task == "viapoint":
        from .viapoint import EVAL_SEED_BASE as base
    seeds = list(range(base, base + episodes))
    cap = time_cap_steps(task)
    engines: dict = {}
    rows, eps, by = [], [], {}
    for d, s, arm in cells_of(16, delays, arms):
        if arm == "rtc_trained" and not (policy_dirs.get(task + ":trained") or TRAINED.get(task)):
            continue
        eng = engines.get(arm) or engines.setdefault(arm, engine_for(task, arm, policy_dirs))
        H = int(eng.chunk_len)
        t0 = time.time()
        out = run_cell(eng, Cell(task, arm, d, s), seeds, cap, fam.control_hz)
        by[d, s, arm] = out
        k = sum(e["success"] for e in out)
        times = [e["time_to_success_s"] for e in out if e["success"]]
        jerks = [j for e in out for j in e["jerks"]]
        rows.append({"task": task, "family": FAMILY[task], "policy": eng.policy_dir, "arm": arm, "d": d, "H": H,
                     "s": s, "episodes": len(out), "success": k / len(out), "success_ci95": wilson_ci(k, len(out)),
                     "time_to_success_mean_s": float(np.mean(times)) if times else None,
                     "boundary_jerk": float(np.mean(jerks)) if jerks else None})
        eps += [{"task": task, "arm": arm, "d": d, "s": s, "seed": e["seed"], "success": e["success"],
                 "time_to_success_s": e["time_to_success_s"]} for e in out]
        log(f"  {task} d={d} s={s} {arm}: success {k / len(out):.3f}, time "
            f"{rows[-1]['time_to_success_mean_s'] or float('nan'):.2f} s, jerk "
            f"{rows[-1]['boundary_jerk'] or float('nan'):.3f} ({time.time() - t0:.0f} s)")
    for e in engines.values():
        e.close()
    return rows, tests_of(task, 16, by), eps


def run_study(tasks: dict, delays, arms, frozen_commit: str, policy_dirs: Optional[dict] = None, log=print,
              partial_out: Optional[Path] = None, command: str = "") -> dict:
    """tasks: {name: episodes}. Each task's results are written to partial_out as they finish, so
    a stopped run keeps what completed."""
    rows, tests, eps = [], [], []
    meta = {"command": command, "delays": list(delays), "arms": list(arms), "tasks": {},
            "loadavg_before": list(os.getloadavg()), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    study: dict = {}
    for task, n in tasks.items():
        t0 = time.time()
        r, t, e = run_task(task, n, delays, arms, policy_dirs or {}, log)
        rows, tests, eps = rows + r, tests + t, eps + e
        meta["tasks"][task] = {"episodes": n, "time_cap_steps": time_cap_steps(task), "wall_s": round(time.time() - t0, 1)}
        adjust(tests)
        meta["loadavg_after"] = list(os.getloadavg())
        study = {"frozen_commit": frozen_commit, "rows": rows, "tests": tests, "episodes": eps,
                 "target": target_check(tests), "meta": meta}
        if partial_out is not None:
            write_report(study, partial_out)
    return study


def write_report(study: dict, out_dir) -> Path:
    """rtc_study.json, one row / test / episode per line (diffable, and small enough for git)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for k, v in study.items():
        if isinstance(v, list):
            body = ",\n".join("  " + json.dumps(x, separators=(",", ":")) for x in v)
            parts.append(f"{json.dumps(k)}: [\n{body}\n ]")
        else:
            parts.append(f"{json.dumps(k)}: {json.dumps(v)}")
    p = out / "rtc_study.json"
    p.write_text("{\n " + ",\n ".join(parts) + "\n}\n")
    return p


def _f(x, fmt="{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def write_markdown(study: dict, out_dir) -> Path:
    """rtc_study.md: per task the rows (success and CI, time, jerk) and the tests, target checked."""
    lines = [f"# RTC arms (issue 39), frozen task commit {study['frozen_commit']}", "",
             f"Command: `{study['meta'].get('command', '')}`", ""]
    tc = study["target"]
    lines.append(f"**Target (multimodal, d/H 0.25-0.375, RTC soft or trained): {'MET' if tc['met'] else 'MISSED'}**"
                 f" in {sum(c['met'] for c in tc['cells'])} of {len(tc['cells'])} target cells.")
    lines += ["", "| d | s | arm | vs best baseline | success vs sync | time vs sync | met |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['d']} | {c['s']} | {c['arm']} | {c['vs_baseline']} ({c['baseline']}) | {c['vs_sync_success']} | "
              f"{c['vs_sync_time']} | {c['met']} |" for c in tc["cells"]]
    for task in study["meta"]["tasks"]:
        rows = [r for r in study["rows"] if r["task"] == task]
        lines += ["", f"## {task} ({rows[0]['family'] if rows else ''}; {study['meta']['tasks'][task]['episodes']} "
                      f"paired episodes per cell, cap {study['meta']['tasks'][task]['time_cap_steps']} steps)", "",
                  "| d | s | arm | success (95 % CI) | time to success s | boundary jerk |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['d']} | {r['s']} | {r['arm']} | {r['success']:.3f} ({r['success_ci95'][0]:.2f}-"
                  f"{r['success_ci95'][1]:.2f}) | {_f(r['time_to_success_mean_s'], '{:.2f}')} | "
                  f"{_f(r['boundary_jerk'])} |" for r in rows]
        lines += ["", "| d | s | a | b | success a - b | McNemar p | Holm p | time a / b (95 % CI) | target |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for t in (t for t in study["tests"] if t["task"] == task):
            ci = t["time_ratio_ci95"]
            lines.append(f"| {t['d']} | {t['s']} | {t['a']} | {t['b']} | {t['success_diff']:+.3f} | {t['mcnemar_p']:.2g} | "
                         f"{t['mcnemar_p_holm']:.2g} | {_f(t['time_ratio'])} "
                         f"({_f(ci[0] if ci else None)}-{_f(ci[1] if ci else None)}) | {t['target']} |")
    p = Path(out_dir) / "rtc_study.md"
    p.write_text("\n".join(lines) + "\n")
    return p
