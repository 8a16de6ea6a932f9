"""Learned execution horizon: a small numpy model predicts the round-optimal H.

Labels follow seed 000 §2.2 / Figure 4's offline procedure: from a recorded round, start
at the task-optimal (static) H, increase H in small steps, re-run the task with the first H
actions executed open loop, and keep the largest H whose trajectory stays within cosine
similarity 0.9 of the re-planned (recorded) one (`round_optimal_horizon`). The model reads
only what the server has when the chunk comes back (`horizon_features`): the observation's
joint state, the per-step update sizes and the chunk itself. At serve time
H = clip(floor(param x predicted H), h_min, chunk): param < 1 is the cautious side.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..types import ChunkResult, HorizonDecision
from .base import BadUpdates, HorizonPolicy, checked_updates


# --- labels (§2.2, Fig. 4) ------------------------------------------------------------------
def trajectory_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two trajectories (displacements from a common start), flattened."""
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"trajectories differ in shape: {np.shape(a)} vs {np.shape(b)}")
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx < 1e-12 and ny < 1e-12:
        return 1.0  # neither moved: the same trajectory
    if nx < 1e-12 or ny < 1e-12:
        return 0.0
    return float(x @ y / (nx * ny))


def round_optimal_horizon(reference: np.ndarray, candidates: dict, h_start: int, threshold: float = 0.9) -> int:
    """The largest H >= h_start whose trajectory stays within `threshold` cosine similarity of
    the re-planned reference, increasing H in the candidates' steps and stopping at the first
    that does not (seed 000 §2.2). candidates: {H: trajectory of the same shape as reference}."""
    label = int(h_start)
    for h in sorted(int(k) for k in candidates):
        if h <= h_start:
            continue
        if trajectory_cosine(candidates[h], reference) < threshold:
            break
        label = h
    return label


# --- features --------------------------------------------------------------------------------
def horizon_features(result: ChunkResult, steps: Optional[int] = None) -> np.ndarray:
    """What the server has for a chunk: joint state, log of each denoising step's mean update
    norm, the §3.1 final-update ratio (first actions and chunk mean), the chunk's path length."""
    if result.state is None:
        raise BadUpdates("the learned horizon needs the observation's joint state with the chunk (ChunkResult.state)")
    state = np.asarray(result.state, np.float64).ravel()
    if not np.all(np.isfinite(state)):
        raise BadUpdates("joint state has non-finite values")
    a = np.asarray(result.actions, np.float64)
    path = np.linalg.norm(np.diff(a, axis=0), axis=-1)
    u = checked_updates(result)
    if u is None:
        upd = np.zeros((steps or 0) + 3)
    else:
        if steps is not None and u.shape[0] != steps:
            raise BadUpdates(f"the model was trained on {steps} denoising steps, the chunk has {u.shape[0]}")
        norms = np.linalg.norm(u, axis=-1)  # [steps, chunk]
        ratio = norms[-1] / np.maximum(norms[:-1].mean(0), 1e-12)
        upd = np.concatenate([np.log(norms.mean(1) + 1e-9), [ratio[:4].mean(), ratio.mean(), ratio.max()]])
    return np.concatenate([state, upd, [np.log1p(path.sum()), np.log1p(path[:4].sum())]])


# --- the model: one hidden layer, numpy, full-batch Adam --------------------------------------
class HorizonModel:
    def __init__(self, mu, sd, w1, b1, w2, b2, steps: Optional[int] = None) -> None:
        self.mu, self.sd = np.asarray(mu, np.float64), np.asarray(sd, np.float64)
        self.w1, self.b1 = np.asarray(w1, np.float64), np.asarray(b1, np.float64)
        self.w2, self.b2 = np.asarray(w2, np.float64), np.asarray(b2, np.float64)
        self.steps = None if steps is None or int(steps) < 0 else int(steps)
        if self.w1.shape[0] != self.mu.shape[0]:
            raise ValueError("horizon model: feature statistics and first layer disagree")

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, hidden: int = 64, epochs: int = 3000, lr: float = 3e-3,
            l2: float = 1e-4, seed: int = 0, steps: Optional[int] = None) -> "HorizonModel":
        """Least squares on the labels (deterministic for a fixed seed)."""
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64).ravel()
        mu, sd = x.mean(0), x.std(0) + 1e-6
        z = (x - mu) / sd
        rng = np.random.default_rng(seed)
        p = [rng.normal(0, 1 / math.sqrt(z.shape[1]), (z.shape[1], hidden)), np.zeros(hidden),
             rng.normal(0, 1 / math.sqrt(hidden), hidden), np.array(y.mean())]
        m = [np.zeros_like(q) for q in p]
        v = [np.zeros_like(q) for q in p]
        for it in range(1, epochs + 1):
            h = np.tanh(z @ p[0] + p[1])
            err = h @ p[2] + p[3] - y
            g_out = 2 * err / len(y)
            gh = np.outer(g_out, p[2]) * (1 - h ** 2)
            grads = [z.T @ gh + l2 * p[0], gh.sum(0), h.T @ g_out + l2 * p[2], np.array(g_out.sum())]
            for i, g in enumerate(grads):
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                p[i] = p[i] - lr * (m[i] / (1 - 0.9 ** it)) / (np.sqrt(v[i] / (1 - 0.999 ** it)) + 1e-8)
        return cls(mu, sd, *p, steps=steps)

    def predict(self, x: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(np.asarray(x, np.float64)) - self.mu) / self.sd
        return np.tanh(z @ self.w1 + self.b1) @ self.w2 + self.b2

    def save(self, path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        np.savez(p, mu=self.mu, sd=self.sd, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2,
                 steps=np.int64(-1 if self.steps is None else self.steps))
        return p

    @classmethod
    def load(cls, path) -> "HorizonModel":
        try:
            with np.load(Path(path)) as z:
                return cls(z["mu"], z["sd"], z["w1"], z["b1"], z["w2"], z["b2"], steps=int(z["steps"]))
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"horizon model {str(path)!r} cannot be read: {e}") from None


class LearnedHorizon(HorizonPolicy):
    name = "learned"
    knob, knob_above = "learned-horizon scale", 0.0

    def __init__(self, model=None, scale: float = 1.0, h_min: int = 1) -> None:
        """model: a HorizonModel or the path of one saved with `HorizonModel.save`."""
        if model is None:
            raise ValueError("the learned horizon needs a model (path of a HorizonModel .npz)")
        self.model = model if isinstance(model, HorizonModel) else HorizonModel.load(model)
        self.scale = self._set_bounds(scale, h_min)

    def predict(self, results: Sequence[ChunkResult]) -> np.ndarray:
        """Predicted round-optimal H for several chunks at once (the study's batches)."""
        return self.model.predict(np.stack([horizon_features(r, self.model.steps) for r in results]))

    def choose(self, result, param=None, predicted: Optional[float] = None):
        n = len(result.actions)
        scale = self.scale if param is None else float(param)
        pred = float(self.predict([result])[0]) if predicted is None else float(predicted)
        h = self.clamp(math.floor(scale * pred), n)
        return HorizonDecision(h, f"predicted round-optimal H {pred:.1f} x {scale:g}: H={h}")
