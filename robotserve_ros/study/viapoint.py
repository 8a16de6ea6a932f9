"""ViaPoint: a 2-D multimodal reaching task where chunk consistency matters (issue 39 item 1).

A point robot drives from the bottom of the arena to a goal at the top; a disc obstacle sits in
between. The scripted expert passes a via-point beside the obstacle on a side drawn at random per
episode and not observable, so at the start the demonstrations are bimodal for the same state:
the multimodality real-time chunking exists for (Black et al. 2025, §1 and Fig. 2: a new chunk
from another mode makes the robot switch mid-motion). The commanded motion is physical: the
action is a velocity command and the actuator follows it with a bounded acceleration, so a switch
between modes costs time (braking and re-accelerating sideways) or success (the obstacle is hit
while the robot turns). Touching the obstacle ends the episode as a failure.

Observation (6 floats): position xy (m), velocity xy (m/s), goal xy (m). Action (2 floats): the
commanded velocity (m/s, clipped to V_MAX). Control at CONTROL_HZ; success: within GOAL_R of the
goal at the end of a control step (latched, as Meta-World's). Every draw comes from the seed.

The geometry, control rate, chunk length H and the actuator limit are frozen here before any arm
of the study runs (issue 39: the report cites the commit); `ViaPointBatch` steps many episodes at
once (the study's arms run all episodes of one cell in lock step), `ViaPointEnv` is one episode
for the demonstration collector.
"""
from __future__ import annotations

import numpy as np

CONTROL_HZ = 20.0  # dt = 0.05 s
CHUNK = 16  # H: H x dt = 0.8 s >= 0.6 s (issue 39 item 1)
DELAYS = (2, 4, 6)  # d in control steps: d / H = 0.125, 0.25, 0.375
V_MAX = 1.0  # m/s, the command's norm clip
A_MAX = 3.0  # m/s^2, the actuator's acceleration limit (0.15 m/s per control step)
OBSTACLE = (0.0, 0.95)  # disc centre (m)
OBSTACLE_R = 0.30  # m
AGENT_R = 0.05  # m
VIA_X = 0.50  # the via-point is (side * VIA_X, OBSTACLE[1]), side = +-1 per episode
VIA_SWITCH = 0.08  # m before the via-point's height the expert turns to the goal
GOAL_R = 0.08  # m
START = ((-0.03, 0.03), (0.10, 0.20))  # x, y ranges of the start
GOAL = ((-0.10, 0.10), (1.70, 1.80))  # x, y ranges of the goal
ARENA = ((-1.0, 1.0), (0.0, 2.0))
MAX_STEPS = 120  # 6 s for the expert's demonstrations
TIME_CAP_S = 12.0  # the study's virtual-time cap per episode, pauses and holds included, every arm
EVAL_SEED_BASE = 1_000_000  # the study's episode seeds (demonstrations use 0.. : no evaluated start seen)
STATE_DIM, ACTION_DIM = 6, 2


def draw_episode(seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(start xy, goal xy, side) of an episode seed."""
    rng = np.random.default_rng([int(seed), 39])
    start = np.array([rng.uniform(*START[0]), rng.uniform(*START[1])])
    goal = np.array([rng.uniform(*GOAL[0]), rng.uniform(*GOAL[1])])
    side = 1 if rng.random() < 0.5 else -1
    return start, goal, side


def _clip_norm(v: np.ndarray, m: float) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v * np.minimum(1.0, m / np.maximum(n, 1e-12))


class ViaPointBatch:
    """n episodes stepped together; finished ones (success or collision) stay as they are."""

    def __init__(self, seeds) -> None:
        eps = [draw_episode(s) for s in seeds]
        self.n = len(eps)
        self.p = np.array([e[0] for e in eps])
        self.goal = np.array([e[1] for e in eps])
        self.side = np.array([e[2] for e in eps])
        self.v = np.zeros((self.n, 2))
        self.success = np.zeros(self.n, bool)
        self.collided = np.zeros(self.n, bool)
        self.steps = np.zeros(self.n, np.int64)

    @property
    def done(self) -> np.ndarray:
        return self.success | self.collided

    def observe(self) -> np.ndarray:
        return np.concatenate([self.p, self.v, self.goal], 1).astype(np.float32)

    def step(self, u: np.ndarray, moving: np.ndarray | None = None) -> None:
        """Apply velocity commands u [n, 2] to the episodes not done (and `moving`, if given)."""
        live = ~self.done if moving is None else (~self.done & moving)
        cmd = _clip_norm(np.asarray(u, np.float64), V_MAX)
        dv = _clip_norm(cmd - self.v, A_MAX / CONTROL_HZ)  # the acceleration limit
        v = self.v + dv
        p = self.p + v / CONTROL_HZ
        p[:, 0] = np.clip(p[:, 0], *ARENA[0])
        p[:, 1] = np.clip(p[:, 1], *ARENA[1])
        self.v[live], self.p[live] = v[live], p[live]
        self.steps[live] += 1
        hit = np.hypot(self.p[:, 0] - OBSTACLE[0], self.p[:, 1] - OBSTACLE[1]) < OBSTACLE_R + AGENT_R
        self.collided |= live & hit & ~self.success
        self.success |= live & ~self.collided & (np.linalg.norm(self.p - self.goal, axis=1) <= GOAL_R)


def expert_command(obs: np.ndarray, side: np.ndarray) -> np.ndarray:
    """The scripted expert, batched: to the via-point on its side, then to the goal, slowing
    down near the goal. It reads only the state and the episode's side."""
    p, goal = obs[:, 0:2].astype(np.float64), obs[:, 4:6].astype(np.float64)
    via = np.stack([side * VIA_X, np.full(len(p), OBSTACLE[1])], 1)
    target = np.where((p[:, 1] < OBSTACLE[1] - VIA_SWITCH)[:, None], via, goal)
    to = target - p
    dist = np.linalg.norm(to, axis=1, keepdims=True)
    speed = np.where((p[:, 1] < OBSTACLE[1] - VIA_SWITCH)[:, None], V_MAX, np.minimum(V_MAX, 2.5 * dist))
    return (to / np.maximum(dist, 1e-9) * speed).astype(np.float32)


class ViaPointEnv:
    """One episode (the TaskFamily interface: reset(seed) / step(action) / done / success())."""

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = int(max_steps)
        self.b = None

    def reset(self, seed: int) -> np.ndarray:
        self.b = ViaPointBatch([seed])
        return self.b.observe()[0]

    @property
    def steps(self) -> int:
        return int(self.b.steps[0])

    def step(self, action):
        self.b.step(np.asarray(action, np.float64).reshape(1, ACTION_DIM))
        return self.b.observe()[0], None

    def success(self) -> bool:
        return bool(self.b.success[0])

    def phase(self) -> str:
        return "approach" if self.b.p[0, 1] < OBSTACLE[1] else "exit"

    @property
    def done(self) -> bool:
        return bool(self.b.done[0]) or self.steps >= self.max_steps


def run_expert(seed: int, max_steps: int = MAX_STEPS):
    """One closed-loop expert episode: (observations [T, 6], actions [T, 2], success)."""
    env = ViaPointEnv(max_steps)
    obs = env.reset(seed)
    side = env.b.side
    observations, actions = [], []
    while not env.done:
        act = expert_command(obs[None], side)[0]
        observations.append(obs)
        actions.append(act)
        obs, _ = env.step(act)
    return np.stack(observations), np.stack(actions), env.success()
