"""Meta-World (seed 000 Table 1's manipulation benchmark) as the study's second task family.

A mixed set of five tasks of different lengths and contact phases, state only (no rendering):
Meta-World's 39-float observation (hand xyz, gripper opening, two objects' pose, the previous
frame of the same, the goal) with the task's one-hot appended, so ONE task-conditioned policy
serves the whole set, as one server serves a mixed fleet. Actions: 4 floats in [-1, 1] (hand
xyz delta, gripper effort). Each task has Meta-World's scripted expert (`metaworld.policies`).
Success is Meta-World's own `info["success"]`; an episode ends at its first success.

An episode seed picks the task (seed % number of tasks) and the object/goal placement: a fresh
draw from the task's own random-reset space with numpy's generator of that seed (MT1's fixed
50 placements and its wrapper's task sampler are bypassed, so one seed is one arena in every
process and evaluation arenas are never demonstration arenas).
"""
from __future__ import annotations

import numpy as np

from .pushgust import StepInfo

TASKS = ("reach-v3", "push-v3", "pick-place-v3", "drawer-open-v3", "door-open-v3")
OBS_DIM = 39
STATE_DIM, ACTION_DIM = OBS_DIM + len(TASKS), 4
CONTROL_HZ = 80.0  # Meta-World's env.dt = 0.0125 s (frame skip 5 of a 2.5 ms MuJoCo step)
MAX_STEPS = 200  # the experts finish in 40-100 steps; Meta-World's own limit (500) only costs failures
CONTACT_M = 0.05  # hand within 5 cm of the object: the manipulation phase


def metaworld_missing() -> str | None:
    """Why Meta-World cannot run here (None when it can): tests skip with this reason."""
    try:
        import metaworld  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure means: not usable here)
        return f"metaworld is not installed ({type(e).__name__}: {e}); `make test` installs metaworld==3.1.1"
    return None


def task_of(seed: int) -> int:
    return int(seed) % len(TASKS)


class MetaWorldEnv:
    """One Meta-World episode at a time, PushGustEnv's interface; `reset(seed)` is deterministic.

    MuJoCo models are loaded once per task name and kept (loading one takes ~1 s)."""

    def __init__(self, max_steps: int = MAX_STEPS, tasks: tuple = TASKS) -> None:
        self.max_steps = int(max_steps)
        self.tasks = tuple(tasks)
        self._envs: dict = {}
        self.steps, self._success = 0, False

    def _env(self, name: str):
        if name not in self._envs:
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS

            # The task's class directly (gym.make's MT1 wrapper builds 50 placements: seconds each).
            self._envs[name] = ALL_V3_ENVIRONMENTS[name]()
        return self._envs[name]

    def reset(self, seed: int) -> np.ndarray:
        import pickle

        from metaworld.types import Task

        self.task = task_of(seed) % len(self.tasks)
        self.name = self.tasks[self.task]
        u = self._env(self.name)
        space = u._random_reset_space
        rng = np.random.default_rng([int(seed), 11])
        vec = rng.uniform(space.low, space.high)
        # Object and goal (a 6-float draw) at least 15 cm apart in xy, as push/pick-place's own
        # reset insists: it redraws while they are closer, which loops forever on a fixed draw.
        while len(vec) == 6 and np.linalg.norm(vec[:2] - vec[3:5]) < 0.15:
            vec = rng.uniform(space.low, space.high)
        # A Task as Meta-World's benchmarks make them (goal observable, placement fixed).
        u.set_task(Task(env_name=self.name, data=pickle.dumps(
            {"env_cls": type(u), "rand_vec": vec, "partially_observable": False})))
        obs, _ = u.reset(seed=int(seed))
        self.u, self.steps, self._success = u, 0, False
        self._obs = np.asarray(obs, np.float32)
        return self.observe()

    def observe(self) -> np.ndarray:
        onehot = np.zeros(len(self.tasks), np.float32)
        onehot[self.task] = 1.0
        return np.concatenate([self._obs, onehot])

    def phase(self) -> str:
        """'contact' when the hand is within CONTACT_M of the object, else 'free' (the §3.1
        ratio statistics are split by it, as PushGust's are by the gusty band)."""
        return "contact" if np.linalg.norm(self._obs[0:3] - self._obs[4:7]) <= CONTACT_M else "free"

    def success(self) -> bool:
        return self._success

    def step(self, action) -> tuple[np.ndarray, StepInfo]:
        a = np.clip(np.asarray(action, np.float64).reshape(ACTION_DIM), -1.0, 1.0)
        obs, _, _, _, info = self.u.step(a)
        self._obs = np.asarray(obs, np.float32)
        self._success = self._success or bool(info["success"])
        self.steps += 1
        return self.observe(), StepInfo(self._success, False, self.steps)

    @property
    def done(self) -> bool:
        return self._success or self.steps >= self.max_steps

    def close(self) -> None:
        for u in self._envs.values():
            u.close()
        self._envs.clear()


_EXPERT_ENV: dict = {}


def expert(name: str):
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[name]()


def run_expert(seed: int, max_steps: int = MAX_STEPS, env: MetaWorldEnv | None = None):
    """One closed-loop expert episode: (states [T, STATE_DIM], actions [T, 4], success)."""
    env = env or _EXPERT_ENV.setdefault("env", MetaWorldEnv())
    env.max_steps = int(max_steps)
    obs = env.reset(seed)
    pol = expert(env.name)
    states, actions = [], []
    while not env.done:
        act = np.clip(pol.get_action(obs[:OBS_DIM].astype(np.float64)), -1.0, 1.0).astype(np.float32)
        states.append(obs)
        actions.append(act)
        obs, _ = env.step(act)
    return np.stack(states), np.stack(actions), env.success()
