"""The study's task families by config name: PushGust (pymunk), Meta-World (MuJoCo) and ViaPoint
(numpy, multimodal; issue 39).

Each gives its environment (reset(seed) / step(action) / done / success() / phase()), its
scripted expert and the shapes a policy trained on it has. Everything else in study/
(collect, train, train-flow, horizon) takes a family name and reads these."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FAMILIES = ("pushgust", "metaworld", "viapoint")


@dataclass(frozen=True)
class TaskFamily:
    name: str
    task: str  # the study rows' "task": what was evaluated (one task, or the mixed set)
    state_dim: int
    action_dim: int
    control_hz: float
    max_steps: int
    make_env: Callable  # make_env(max_steps) -> env
    run_expert: Callable  # run_expert(seed, max_steps) -> (states, actions, success)
    action_unit: str  # what the agreement / self-consistency thresholds are measured in
    labels: bool  # the §2.2 label collection (arena forking) exists for it


def task_family(name: str) -> TaskFamily:
    if name == "pushgust":
        from . import pushgust as p

        return TaskFamily("pushgust", "pushgust", p.STATE_DIM, p.ACTION_DIM, p.CONTROL_HZ, p.MAX_STEPS,
                          p.PushGustEnv, p.run_expert, "px", True)
    if name == "metaworld":
        from . import metaworld_task as m

        return TaskFamily("metaworld", "metaworld-" + "+".join(t.removesuffix("-v3") for t in m.TASKS),
                          m.STATE_DIM, m.ACTION_DIM, m.CONTROL_HZ, m.MAX_STEPS, m.MetaWorldEnv, m.run_expert,
                          "normalised action", False)
    if name == "viapoint":
        from . import viapoint as v

        return TaskFamily("viapoint", "viapoint", v.STATE_DIM, v.ACTION_DIM, v.CONTROL_HZ, v.MAX_STEPS,
                          v.ViaPointEnv, v.run_expert, "m/s", False)
    raise ValueError(f"unknown task family {name!r} (known: {', '.join(FAMILIES)})")
