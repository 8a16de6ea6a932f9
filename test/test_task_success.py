"""RunTask success conditions (core/task_success.py): the built-in hooks, and a user's own
registered by name, judged on a task's progress. Pure core: no ROS."""
from __future__ import annotations

import pytest

from robotserve_ros.core.errors import UnknownName
from robotserve_ros.core.task_success import SUCCESS_CONDITIONS, TaskView


def view(executed, budget=100, rounds=1, joints=None):
    return TaskView(actions_executed=executed, action_budget=budget, elapsed_s=1.0, rounds=rounds, joint_positions=joints)


def gripper_closed():
    return lambda v: v.joint_positions is not None and v.joint_positions[-1] > 0.5


def test_built_in_conditions():
    budget = SUCCESS_CONDITIONS.create("action_budget")
    assert not budget(view(99)) and budget(view(100))
    first = SUCCESS_CONDITIONS.create("first_chunk_executed")
    assert not first(view(0, rounds=1)) and not first(view(5, rounds=0)) and first(view(1, rounds=1))


def test_a_users_condition_by_name_and_an_unknown_one_refused():
    SUCCESS_CONDITIONS.register("gripper_closed", gripper_closed)  # the same factory again: no error
    closed = SUCCESS_CONDITIONS.create("gripper_closed")
    assert closed(view(3, joints=[0.0, 0.9])) and not closed(view(3, joints=[0.0, 0.1])) and not closed(view(3))
    assert "gripper_closed" in SUCCESS_CONDITIONS.names()
    with pytest.raises(UnknownName):
        SUCCESS_CONDITIONS.create("no_such_hook")
