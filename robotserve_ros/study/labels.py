"""Round-optimal horizon labels on PushGust (seed 000 §2.2, Figure 4's offline procedure).

Record rounds with the task-optimal static H (h_start). At a recorded round, fork the arena
(the fork keeps the same gust stream), and for H = h_start, h_start + step, ..., chunk run
the next `window` control steps: the round's first H actions open loop, then re-planning
every h_start actions as recorded. The reference is the h_start fork (the re-planned
trajectory). The label is core.horizon.learned.round_optimal_horizon: the largest H whose
trajectory (agent and puck displacement over the window) stays within cosine similarity 0.9
of the reference. Each fork draws its own diffusion/flow noise, as a re-run would.
"""
from __future__ import annotations

import copy
import time

import numpy as np

from ..core.horizon.learned import horizon_features, round_optimal_horizon
from ..core.observation import Observation
from ..core.types import InferenceRequest
from .pushgust import PushGustEnv

LABEL_SEED_BASE = 20_000_000  # label arenas: neither demo nor evaluation seeds


def _positions(env) -> np.ndarray:
    a, p = env.agent.position, env.puck.position
    return np.array([a.x, a.y, p.x, p.y])


class _Fork:
    def __init__(self, env, tid: str, h: int, first: np.ndarray, window: int) -> None:
        self.env, self.tid, self.h, self.window = env, tid, h, window
        self.start = _positions(env)
        self.pending = list(first[:h])
        self.traj: list = []

    @property
    def finished(self) -> bool:
        return len(self.traj) >= self.window or self.env.done

    def run_pending(self) -> None:
        while self.pending and not self.finished:
            self.env.step(self.pending.pop(0))
            self.traj.append(_positions(self.env) - self.start)

    def trajectory(self) -> np.ndarray:
        t = self.traj or [np.zeros(4)]
        return np.array(t + [t[-1]] * (self.window - len(t)))  # an ended episode stays put


def collect_labels(engine, h_start: int, episodes: int, max_steps: int, window: int = 16, step: int = 2,
                   every: int = 2, threshold: float = 0.9, log=print) -> dict:
    """Features and labels of every `every`-th round of `episodes` label episodes."""
    chunk = int(engine.chunk_len)
    hs = list(range(h_start, chunk + 1, step))
    envs = [PushGustEnv(max_steps) for _ in range(episodes)]
    obs = [env.reset(LABEL_SEED_BASE + e) for e, env in enumerate(envs)]
    nrounds = [0] * episodes
    feats, labels, trajs = [], [], []
    active = list(range(episodes))
    t0 = time.time()
    rows = 0
    while active:
        reqs = [InferenceRequest(f"label/{e}", nrounds[e], observation=Observation(joints=obs[e])) for e in active]
        results = engine.infer(reqs)
        rows += len(reqs)
        forks = []
        for e, res in zip(active, results):
            if nrounds[e] % every == 0:
                for h in hs:
                    forks.append((e, len(feats), _Fork(copy.deepcopy(envs[e]), f"label/{e}/{nrounds[e]}/H{h}", h,
                                                       res.actions, window)))
                feats.append(horizon_features(res))
        for _, _, f in forks:
            f.run_pending()
        k = 0
        while True:
            need = [f for _, _, f in forks if not f.finished]
            if not need:
                break
            out = engine.infer([InferenceRequest(f.tid, k + 1, observation=Observation(joints=f.env.observe()))
                                for f in need])
            rows += len(need)
            for f, r in zip(need, out):
                f.pending = list(r.actions[:h_start])
                f.run_pending()
            k += 1
        by_round: dict = {}
        for e, i, f in forks:
            by_round.setdefault(i, {})[f.h] = f.trajectory()
            engine.forget(f.tid)
        for i in sorted(by_round):
            c = by_round[i]
            labels.append(round_optimal_horizon(c[h_start], c, h_start, threshold))
            trajs.append(np.stack([c[h] for h in hs]))
        still = []
        for e, res in zip(active, results):
            for a in res.actions[:h_start]:
                obs[e], _ = envs[e].step(a)
                if envs[e].done:
                    break
            nrounds[e] += 1
            if envs[e].done:
                engine.forget(f"label/{e}")
            else:
                still.append(e)
        active = still
    y = np.array(labels, float)
    log(f"  labels: {len(y)} rounds of {episodes} episodes, H_start {h_start}, mean label {y.mean():.2f}, "
        f"{rows} engine rows, {time.time() - t0:.0f} s")
    # traj[i, j]: round i's trajectory with H = hs[j] (hs[0] = h_start: the re-planned reference),
    # so labels at any other cosine threshold come from the same collection.
    return {"x": np.stack(feats), "y": y, "rows": rows, "wall_s": round(time.time() - t0, 1),
            "hist": {int(h): int((y == h).sum()) for h in hs}, "hs": hs, "traj": np.stack(trajs)}
