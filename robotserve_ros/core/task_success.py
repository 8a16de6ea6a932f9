"""Success conditions of a RunTask goal (action/RunTask.action): name -> a factory of a
predicate on the task's progress. The robot client asks it every control tick; a user adds
one with SUCCESS_CONDITIONS.register("name", factory). Pure Python: no ROS here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .registry import Registry


@dataclass(frozen=True)
class TaskView:
    """What a success condition sees of a running task."""
    actions_executed: int
    action_budget: int
    elapsed_s: float
    rounds: int
    joint_positions: Optional[Sequence[float]]  # the last /joint_states, when there is one


Condition = Callable[[TaskView], bool]


def action_budget() -> Condition:
    """Done once the task's action budget is executed (what a task without a hook does)."""
    return lambda v: v.actions_executed >= v.action_budget


def first_chunk_executed() -> Condition:
    """Done once the first chunk's actions are executed: a smoke check of the whole loop."""
    return lambda v: v.rounds >= 1 and v.actions_executed >= 1


SUCCESS_CONDITIONS: Registry[Condition] = Registry("success condition", {
    "action_budget": action_budget,
    "first_chunk_executed": first_chunk_executed,
})
