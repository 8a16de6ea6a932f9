"""A robot's progress report applied to a fleet: the one rule for the inline server and the
engine core process (serve/core_process.py). A topic has no reply: what is refused is
returned as its reason, for the caller to count."""
from __future__ import annotations

from typing import Optional

from ..core.task_auth import NotTaskOwner


def apply_progress(fleet, task_id: str, robot: str, proof, done: Optional[object]):
    """Keep the task alive; `done` (an ExecInfo): the task ends. Returns 'unknown_task' or
    'not_task_owner' when refused, the ledger's record of a finished task, else None."""
    with fleet.lock:
        if not fleet.knows(task_id):
            return "unknown_task"
        try:  # another node ending or keeping alive a task not its own
            fleet.check_owner(task_id, robot, proof)
        except NotTaskOwner:
            return "not_task_owner"
        fleet.touch(task_id)
        if done is not None:
            return fleet.finish(task_id, done)
    return None
