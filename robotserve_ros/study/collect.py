"""Scripted-expert demonstrations of a study task family (PushGust, Meta-World), saved as one npz
(frames of all episodes, and the family's name under "task")."""
from __future__ import annotations

from pathlib import Path
from typing import Union

import numpy as np

from .tasks import task_family

# Episode seeds of demonstrations start here; the study's evaluation seeds lie elsewhere
# (horizon.EVAL_SEED_BASE), so no evaluated arena was seen in training.
DEMO_SEED_BASE = 0


def collect(n: int, seed: int = 0, max_steps=None, keep_failures: bool = False, task: str = "pushgust") -> dict:
    """Run the family's expert on episode seeds seed*100000 + i until `n` (successful) demos are kept.

    Returns arrays: state [T, state_dim] float32, action [T, action_dim] float32, episode_index [T]
    int64, episode_seed [E] int64, episode_len [E] int64, plus attempts, expert_success and task."""
    fam = task_family(task)
    max_steps = int(max_steps or fam.max_steps)
    states, actions, index, seeds, lens = [], [], [], [], []
    attempts = successes = 0
    i = 0
    while len(seeds) < n:
        ep_seed = DEMO_SEED_BASE + seed * 100000 + i
        i += 1
        obs, act, ok = fam.run_expert(ep_seed, max_steps)
        attempts += 1
        successes += ok
        if not ok and not keep_failures:
            continue
        index.append(np.full(len(obs), len(seeds), np.int64))
        states.append(obs)
        actions.append(act)
        seeds.append(ep_seed)
        lens.append(len(obs))
    return {
        "state": np.concatenate(states).astype(np.float32),
        "action": np.concatenate(actions).astype(np.float32),
        "episode_index": np.concatenate(index),
        "episode_seed": np.array(seeds, np.int64),
        "episode_len": np.array(lens, np.int64),
        "attempts": np.int64(attempts),
        "expert_success": np.float64(successes / max(attempts, 1)),
        "task": np.str_(fam.name),
    }


def save_demos(path: Union[str, Path], data: dict) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(p, **data)
    return p


def load_demos(path: Union[str, Path]) -> dict:
    """The arrays of a demo npz; "task" is the family name (demos written before it: pushgust)."""
    with np.load(Path(path)) as z:
        d = {k: z[k] for k in z.files}
    d["task"] = str(d.get("task", "pushgust"))
    return d
