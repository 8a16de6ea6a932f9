"""Simulated robots that act: Meta-World episodes with real MuJoCo physics, served over srv/Infer.

One process hosts several robots (`--robots N`), as the light fleet does, and follows the same
rules: it is live/light_fleet.py's LightFleetNode with four hooks changed (robot_client's
trigger point, re-send and give-up rule, progress and account all come from there). Each robot:
- runs Meta-World episodes of the study's mixed task set (study/metaworld_task.py: reach, push,
  pick-place, drawer-open, door-open); episode k of robot i has seed
  episode_seed + 101 * (mix_seed * 1000 + i) + k, so the task (seed mod 5) differs between
  robots at one time, and the same robot meets the same arenas in every configuration;
- sends its state observation (Meta-World's 39 floats + the task's one-hot: the joint state
  the flow engine reads) with its execution info to the inference server;
- executes the returned chunk at its control rate in the env (core/action_queue.py: the chunk
  placed at its observation's timestep, actions already past dropped, the overlap blended);
  with nothing queued it holds (no env step) and the tick counts as idle;
- ends an episode at Meta-World's first `info["success"]` or after max_steps executed actions,
  publishes progress with task_done (as robot_client does, so the server frees the task), and
  appends one JSON line per episode to `episodes_file` (success, steps, episode time, idle, rounds).

Run: python -m robotserve_ros.nodes.metaworld_robot --robots N --first-index I --params FILE
(its `/**/metaworld_robot` section: MetaWorldRobotConfig).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from .common import check, param
from ..live.light_fleet import LightFleetNode, LightRobot, main as fleet_main
from .robot_client import RobotClientConfig


@dataclass(frozen=True)
class MetaWorldRobotConfig(RobotClientConfig):
    # Meta-World's env.dt is 0.0125 s: 80 Hz executes the episode in real time.
    control_hz: float = param(80.0, "control rate: env steps (actions) per second, > 0")
    max_steps: int = param(200, "an episode ends after this many executed actions without success, > 0")
    episode_seed: int = param(100_000, "first episode seed (study/metaworld_task.py: the seed picks task and arena), "
                                       ">= 0; the study's demonstrations used 0..249")
    episodes_file: str = param("", "append one JSON line per finished episode here ('{robot}' -> the first "
                                   "robot's name); '' = off")

    def check(self) -> None:
        super().check()
        check(self.max_steps > 0, "max_steps", self.max_steps, "is not > 0")
        check(self.episode_seed >= 0, "episode_seed", self.episode_seed, "is not >= 0")


class MetaWorldRobot(LightRobot):
    """One robot: its Meta-World env, its action queue, the episode it runs."""

    __slots__ = ("index", "env", "queue", "seed", "fleet")

    def __init__(self, fleet: "MetaWorldFleetNode", index: int, name: str) -> None:
        from ..core.action_queue import ActionQueue
        from ..study.metaworld_task import MetaWorldEnv

        self.fleet, self.index = fleet, index
        self.env = MetaWorldEnv(max_steps=fleet.c.max_steps)
        for seed in range(len(self.env.tasks)):  # every task's MuJoCo model loaded now (~0.25 s each), not in
            self.env.reset(seed)                 # a control tick mid-run, where it would stall the process's robots
        self.queue = ActionQueue(fleet.c.aggregate)
        super().__init__(name, fleet.hz, **fleet.loop_kw)

    def start_task(self, now: float, keep_motion: bool = False) -> None:
        super().start_task(now, keep_motion)
        if keep_motion:
            return  # the server forgot the task: the same episode goes on under a new id
        c = self.fleet.c
        self.seed = c.episode_seed + 101 * (c.mix_seed * 1000 + self.index) + self.task_k
        self.queue.reset()
        self.env.reset(self.seed)

    def left(self) -> int:
        return len(self.queue)


class MetaWorldFleetNode(LightFleetNode):
    robot_class = MetaWorldRobot
    config_class = MetaWorldRobotConfig
    config_section = "/**/metaworld_robot"
    node_prefix = "metaworld_robots"

    def __init__(self, names: list, params, stats_dir, context=None, **fleet_kw) -> None:
        super().__init__(names, params, stats_dir, context, **fleet_kw)
        path = self.c.episodes_file.replace("{robot}", names[0] if names else "robot")
        self.episodes_out = open(path, "a") if path else None
        self.bad_chunk_logged = False

    def make_robot(self, index: int, name: str) -> MetaWorldRobot:
        return MetaWorldRobot(self, int(name.rsplit("_", 1)[1]) if name.rsplit("_", 1)[-1].isdigit() else index, name)

    def execute(self, r: MetaWorldRobot) -> bool:
        a = r.queue.pop()
        if a is None:
            return False  # holding: nothing to execute
        r.env.step(a)
        r.timestep = r.queue.timestep
        return True

    def task_over(self, r: MetaWorldRobot) -> bool:
        return r.env.done

    def needs_more(self, r: MetaWorldRobot) -> bool:
        return not r.env.done

    def use_chunk(self, r: MetaWorldRobot, chunk) -> bool:
        """A chunk that is not [H, 4] finite actions is never executed: counted (bad_chunk),
        logged once, and the round is asked again."""
        import numpy as np

        from ..study.metaworld_task import ACTION_DIM
        from .convert import chunk_to_array

        try:
            a = chunk_to_array(chunk)
            why = "" if a.shape[1] == ACTION_DIM and np.all(np.isfinite(a)) else \
                f"{a.shape[1]} values per action (Meta-World takes {ACTION_DIM}), or a value that is not finite"
        except ValueError as e:
            why = str(e)
        if why:
            r.acct.errors["bad_chunk"] += 1
            if not self.bad_chunk_logged:
                self.bad_chunk_logged = True
                self.node.get_logger().error(f"{r.task_id}: chunk refused: {why} (logged once; counted)")
            return False
        r.queue.merge(int(chunk.first_timestep), a)
        return True

    def fill_observation(self, r: MetaWorldRobot, o) -> None:
        from sensor_msgs.msg import JointState

        from .common import to_time

        o.header.stamp = to_time(self.clock.now())
        o.timestep = r.queue.timestep
        o.images = []
        o.joint_state = JointState(position=[float(x) for x in r.env.observe()])
        o.instruction = r.env.name  # the task; the policy reads it from the state's one-hot

    def _finish(self, r: MetaWorldRobot, now: float) -> None:
        if self.episodes_out is not None:
            self.episodes_out.write(json.dumps({
                "robot": r.name, "task_id": r.task_id, "seed": int(r.seed), "task": r.env.name,
                "success": bool(r.env.success()), "steps": int(r.env.steps),
                "latency_s": float(now - r.task_start) if r.task_start is not None else 0.0,
                "idle_s": float(r.idle), "chunks": int(r.chunks), "wall": time.time()}) + "\n")
            self.episodes_out.flush()
        super()._finish(r, now)

    def close(self) -> None:
        super().close()
        if self.episodes_out is not None:
            self.episodes_out.close()
        for r in self.robots:
            r.env.close()


def main(argv=None) -> int:
    return fleet_main(argv, MetaWorldFleetNode, prog="metaworld_robot", doc=__doc__)


if __name__ == "__main__":
    from .common import exit_process

    exit_process(main())
