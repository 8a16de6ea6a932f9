"""Tasks as actions (action/RunTask, `~/run_task`, task_source `action`) for the robot client
(nodes/robot_client.py): a goal is checked, run as the robot's task with feedback, and ended by
a cancel, its time limit, its success condition (core/task_success.py) or its action budget."""
from __future__ import annotations

import math

from rclpy.action import GoalResponse
from rclpy.task import Future

from ..action import RunTask
from ..core.task_success import SUCCESS_CONDITIONS, TaskView


class RunTaskGoals:
    """Mixed into RobotClientNode: uses its clock, queue, acct, task state and _start_task,
    _hold, _publish_progress, _task_actions, _waiting_for, _log_once."""

    def _goal_feedback(self) -> None:
        self.goal.publish_feedback(RunTask.Feedback(
            task_id=self.task_id, round=self.chunks, actions_executed=self.queue.timestep, idle_s=self.idle,
            last_latency_s=self.last_latency_s, status=self._waiting_for() or "running"))

    async def _run_task(self, gh):
        """A goal: checked, run as the robot's task until it ends (_end_goal), answered."""
        started = self.clock.now()
        why = self._goal_error(gh.request)
        if why:
            self.acct.errors["goal_rejected"] += 1
            self._log_once("goal_rejected", f"RunTask goal refused: {why}")
            gh.abort()
            return RunTask.Result(outcome="rejected", message=why)
        self.goal, self.goal_end, self.goal_started = gh, Future(), started
        self.task_k += self.goals > 0  # a task id is never used twice, however the last one ended
        self.goals += 1
        self._start_task(goal=gh.request)
        self.get_logger().info(f"task {self.task_id}: {gh.request.instruction!r}")
        outcome, message = await self.goal_end
        self.goal = None
        res = RunTask.Result(outcome=outcome, message=message, task_id=self.task_id, rounds=self.chunks,
                             actions_executed=self.executed,
                             idle_s=self.idle, elapsed_s=self.clock.now() - started)
        {"succeeded": gh.succeed, "canceled": gh.canceled}.get(outcome, gh.abort)()
        self.get_logger().info(f"task {self.task_id} {outcome}: {message}")
        return res

    def _on_goal(self, g) -> "GoalResponse":
        """The goal response: a goal that is bad in itself (an unknown success condition, a
        negative time limit, a horizon without a name) is rejected here, counted and logged;
        one this robot cannot take now (inactive, busy) is accepted and answered `rejected`
        with why, in its result."""
        why = self._bad_goal(g)
        if why:
            self.acct.errors["goal_rejected"] += 1
            self.get_logger().warning(f"RunTask goal rejected: {why}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _bad_goal(self, g) -> str:
        if not math.isfinite(g.time_limit_s) or g.time_limit_s < 0:
            return f"time_limit_s {g.time_limit_s} is not >= 0"
        if g.success_condition and g.success_condition not in SUCCESS_CONDITIONS:
            return f"success_condition {g.success_condition!r} is not one of {', '.join(SUCCESS_CONDITIONS.names())}"
        if g.has_horizon and not g.horizon.name:
            return "horizon.name is empty"
        return ""

    def _goal_error(self, g) -> str:
        if self.state() != "active":
            return f"the robot client is {self.state()}, not active"
        if self.goal is not None:
            return f"task {self.task_id} is running: cancel it first"
        return self._bad_goal(g)

    def _check_goal(self) -> None:
        """Each tick of a goal's task: cancel, time limit, success condition."""
        g, now = self.goal.request, self.clock.now()
        elapsed = now - self.goal_started
        if self.goal.is_cancel_requested:
            self._end_goal("canceled", "canceled by the sender; the robot holds")
        elif g.time_limit_s > 0 and now - self.goal_started >= g.time_limit_s:
            self._end_goal("time_limit", f"{g.time_limit_s} s passed; the robot holds")
        elif g.success_condition and SUCCESS_CONDITIONS.create(g.success_condition)(TaskView(
                self.queue.timestep, self._task_actions(), elapsed, self.chunks,
                list(self.joints.position) if self.joints is not None else None)):
            self._end_goal("succeeded", f"{g.success_condition} held")
            self.finished_tasks += 1
            self._publish_progress(task_done=True)
        else:
            return
        self._hold()

    def _end_goal(self, outcome: str, message: str) -> None:
        if self.goal_end is not None and not self.goal_end.done():
            self.executed = self.queue.timestep  # before the hold resets the queue
            self.goal_end.set_result((outcome, message))
