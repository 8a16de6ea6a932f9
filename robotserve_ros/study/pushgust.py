"""PushGust: push a puck into a goal through a gusty band, on Chipmunk2D (pymunk). Headless.

A disc agent follows a PD position controller towards the commanded target (the action);
it pushes a free puck across a 512 x 512 walled arena to a goal disc. A band across the
middle of the arena is windy: while the puck is in it, random gusts kick it sideways. So
predictability varies within an episode, which is what a dynamic execution horizon
exploits (seed 000 §2.2, §3.1): approach and the calm final push tolerate long open-loop
chunks; in the band a chunk goes stale as soon as a gust lands and needs a fresh observation.

Observation (state, 8 floats): agent xy, puck xy, puck velocity xy, goal xy (pixels, px/s).
Action (2 floats): the agent's target xy. Control at 10 Hz, 10 physics substeps per action.
Success: the puck's centre within GOAL_R of the goal at the end of a control step.
Every random draw comes from the episode's seed, and gust draws are made at every step
whatever the puck does, so one seed gives one arena and one gust stream for every policy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pymunk

SIZE = 512.0
CONTROL_HZ = 10.0
SUBSTEPS = 10
AGENT_R, PUCK_R, GOAL_R = 15.0, 20.0, 22.0
WIND_BAND = (190.0, 330.0)  # y range where gusts blow
GUST_P = 0.15  # chance per control step of a gust while the puck is in the band
GUST_SPEED = (150.0, 250.0)  # px/s added to the puck's velocity
MAX_STEPS = 220
KP, KD, V_MAX = 120.0, 22.0, 220.0  # agent PD gains and speed cap
STATE_DIM, ACTION_DIM = 8, 2


@dataclass
class StepInfo:
    success: bool
    gust: bool
    steps: int


class PushGustEnv:
    """One episode at a time; `reset(seed)` makes it deterministic."""

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = int(max_steps)
        self.space = None

    def reset(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng([int(seed), 7])
        self.rng = rng
        s = pymunk.Space()
        s.gravity = (0.0, 0.0)
        s.damping = 0.15  # the puck slides on a surface: keeps 15% of its speed per second
        for a, b in (((0, 0), (SIZE, 0)), ((SIZE, 0), (SIZE, SIZE)), ((SIZE, SIZE), (0, SIZE)), ((0, SIZE), (0, 0))):
            w = pymunk.Segment(s.static_body, a, b, 2.0)
            w.elasticity, w.friction = 0.5, 0.5
            s.add(w)
        self.agent = pymunk.Body(body_type=pymunk.Body.KINEMATIC)
        self.agent.position = (float(rng.uniform(60, SIZE - 60)), float(rng.uniform(360, SIZE - 40)))
        ac = pymunk.Circle(self.agent, AGENT_R)
        ac.friction, ac.elasticity = 0.3, 0.0
        self.puck = pymunk.Body(1.0, pymunk.moment_for_circle(1.0, 0, PUCK_R))
        while True:  # puck below the band, clear of the agent
            p = (float(rng.uniform(100, SIZE - 100)), float(rng.uniform(370, SIZE - 60)))
            if np.hypot(p[0] - self.agent.position.x, p[1] - self.agent.position.y) > AGENT_R + PUCK_R + 30:
                break
        self.puck.position = p
        pc = pymunk.Circle(self.puck, PUCK_R)
        pc.friction, pc.elasticity = 0.3, 0.0
        s.add(self.agent, ac, self.puck, pc)
        self.goal = np.array([rng.uniform(100, SIZE - 100), rng.uniform(70, 140)])
        self.space = s
        self.steps = 0
        self.gusts = 0
        return self.observe()

    def observe(self) -> np.ndarray:
        a, p, v = self.agent.position, self.puck.position, self.puck.velocity
        return np.array([a.x, a.y, p.x, p.y, v.x, v.y, self.goal[0], self.goal[1]], dtype=np.float32)

    def puck_in_band(self) -> bool:
        return WIND_BAND[0] <= self.puck.position.y <= WIND_BAND[1]

    def phase(self) -> str:
        """Where the §3.1 ratio statistics are split: 'band' (gusts blow) or 'calm'."""
        return "band" if self.puck_in_band() else "calm"

    def success(self) -> bool:
        p = self.puck.position
        return bool(np.hypot(p.x - self.goal[0], p.y - self.goal[1]) <= GOAL_R)

    def step(self, action) -> tuple[np.ndarray, StepInfo]:
        target = np.clip(np.asarray(action, dtype=np.float64).reshape(ACTION_DIM), 0.0, SIZE)
        # Draw the gust every step so the random stream does not depend on the policy.
        blow, ang, speed = self.rng.random() < GUST_P, self.rng.uniform(0, 2 * np.pi), self.rng.uniform(*GUST_SPEED)
        gust = bool(blow and self.puck_in_band())
        if gust:
            # Mostly sideways: squash the y component so gusts rarely help or undo progress.
            self.puck.velocity += (float(speed * np.cos(ang)), float(0.4 * speed * np.sin(ang)))
            self.gusts += 1
        dt = 1.0 / (CONTROL_HZ * SUBSTEPS)
        for _ in range(SUBSTEPS):
            pos = np.array(self.agent.position)
            vel = np.array(self.agent.velocity)
            vel = vel + (KP * (target - pos) - KD * vel) * dt
            n = np.linalg.norm(vel)
            if n > V_MAX:
                vel *= V_MAX / n
            self.agent.velocity = (float(vel[0]), float(vel[1]))
            self.space.step(dt)
        self.steps += 1
        return self.observe(), StepInfo(self.success(), gust, self.steps)

    @property
    def done(self) -> bool:
        return self.success() or self.steps >= self.max_steps


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v)
    return v / n if n > 1e-9 else np.array([0.0, -1.0])


def expert_action(obs: np.ndarray) -> np.ndarray:
    """Closed-loop pushing: stand behind the puck on the goal line, then push through it.

    The puck moves along the line from the agent's centre through its own, so the agent
    restages whenever that line drifts more than ~20 degrees off the goal direction."""
    agent, puck, vel, goal = obs[0:2].astype(np.float64), obs[2:4].astype(np.float64), obs[4:6], obs[6:8]
    # Aim where the puck will be in a moment, so a drifting puck is chased, not trailed.
    lead = puck + 0.25 * vel
    u = _unit(goal - lead)
    contact = AGENT_R + PUCK_R
    rel = agent - lead
    along = float(rel @ u)  # < 0: behind the puck
    perp = np.array([-u[1], u[0]])
    side = float(rel @ perp)
    aligned = float(_unit(lead - agent) @ u)
    dist = float(np.linalg.norm(rel))
    if aligned > np.cos(np.radians(20)) and dist < contact + 12:
        # Push: aim a little beyond the puck along the goal line; slow down near the goal.
        d_goal = float(np.linalg.norm(goal - lead))
        return (agent + u * min(20.0, 4.0 + 0.25 * d_goal) + perp * (-0.3 * side)).astype(np.float32)
    stage = lead - u * (contact + 8)
    if along > -(contact * 0.6):
        # In front of or beside the puck: go round it on the agent's side first.
        s = 1.0 if side >= 0 else -1.0
        way = lead + perp * s * (contact + 22) - u * contact
        return np.clip(way, AGENT_R, SIZE - AGENT_R).astype(np.float32)
    return np.clip(stage, AGENT_R, SIZE - AGENT_R).astype(np.float32)


def run_expert(seed: int, max_steps: int = MAX_STEPS):
    """One closed-loop expert episode: (observations [T, 8], actions [T, 2], success)."""
    env = PushGustEnv(max_steps)
    obs = env.reset(seed)
    observations, actions = [], []
    while not env.done:
        act = expert_action(obs)
        observations.append(obs)
        actions.append(act)
        obs, _ = env.step(act)
    return np.stack(observations), np.stack(actions), env.success()
