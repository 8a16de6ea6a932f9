"""A drone or arm that plans with the LLM planner (seed 002): sends each task as a PlanTask
goal, executes every segment (skill) as its feedback arrives, one after another, for its
recorded duration, and reports each start on PlanProgress, so the server generates the next
segment while this one runs.

Tasks come from a TimelyLLM trace (`trace` + `jobs`: prompt, urgency, TUF, trigger times
relative to the first job, each skill's recorded `exe_time_detail`) or from `prompts` (each
skill then runs `skill_s` seconds, or the skill model's estimate). With `out`, the per-plan
record (response time, robot waiting time, time utility, status) is written as JSON when all
tasks are done; `exit_when_done` then stops the node.

    python -m robotserve_ros.nodes.planner_robot --ros-args -p agent_kind:=drone \
        -p trace:=data_sample_1.json -p "jobs:=[0,1,2]" -p out:=plans.json
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .common import (check, check_one_of, declare_config, exit_process, node_options, NodeConfig, param, ParamError,
                     run_nodes)


def _next_segment(arrived: threading.Condition, segments: list, k: int, res_fut):
    """Segment k's (received at, feedback), waiting for it; None when the plan has no more.
    Feedback and result travel apart: once the result is in, the segments it lists are still
    executed, each awaited a little if its feedback lags."""
    with arrived:
        deadline = None
        while len(segments) <= k:
            if res_fut is None:
                break
            if res_fut.done():
                expected = len(res_fut.result().result.skills)
                deadline = deadline or time.monotonic() + 2.0
                if k >= expected or time.monotonic() > deadline:
                    break
            arrived.wait(0.05)
        return segments[k] if len(segments) > k else None


@dataclass(frozen=True)
class PlannerRobotConfig(NodeConfig):
    action: str = param("/robotserve/plan_task", "the planner's PlanTask action")
    progress_topic: str = param("/robotserve/plan_progress", "where segment starts are published (PlanProgress)")
    agent_kind: str = param("drone", "drone or arm: the skill set the planner uses")
    agent_id: str = param("", "this robot's id (default: the node's name)")
    trace: str = param("", "a TimelyLLM trace file to take tasks from")
    jobs: tuple[int, ...] = param((), "job ids of the trace to run (in trigger order)")
    prompts: tuple[str, ...] = param((), "tasks to send when no trace is given, one after another")
    urgent: bool = param(False, "prompts are urgent (error handling): the urgent time-utility function")
    skill_s: float = param(-1.0, "seconds each skill of a prompt runs; <= 0: the skill model's estimate")
    max_segments: int = param(0, "segments per plan asked for; 0: the server's limit")
    out: str = param("", "write the per-plan record here (JSON) once every task is done")
    exit_when_done: bool = param(False, "stop the node once every task is done")
    server_wait_s: float = param(30.0, "how long to wait for the planner action server, > 0")

    def check(self) -> None:
        check_one_of("agent_kind", self.agent_kind, ("drone", "arm"))
        check(self.server_wait_s > 0, "server_wait_s", self.server_wait_s, "is not > 0")
        check(self.max_segments >= 0, "max_segments", self.max_segments, "is not >= 0")
        check(bool(self.trace) == bool(self.jobs), "jobs", list(self.jobs), "needs a trace (and a trace needs jobs)")
        check(bool(self.jobs) or bool(self.prompts), "prompts", list(self.prompts), "is empty and no trace jobs given")


def _node_base():
    from rclpy.node import Node

    return Node


class PlannerRobot(_node_base()):
    def __init__(self) -> None:
        from rclpy.action import ActionClient
        from rclpy.callback_groups import ReentrantCallbackGroup

        from ..action import PlanTask
        from ..msg import PlanProgress

        super().__init__("planner_robot", **node_options())
        c = self.config = declare_config(self, PlannerRobotConfig)
        self.PlanTask = PlanTask
        self.agent = c.agent_id or self.get_name()
        self.tasks = self._tasks(c)
        self.client = ActionClient(self, PlanTask, c.action, callback_group=ReentrantCallbackGroup())
        self.progress = self.create_publisher(PlanProgress, c.progress_topic, 100)
        self.PlanProgress = PlanProgress
        self.records: list = []
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="planner-robot").start()

    def _tasks(self, c) -> list:
        if c.trace:
            from ..timely.trace import load_trace, plan_specs

            try:
                records, _ = load_trace(c.trace)
            except ValueError as e:
                raise ParamError(f"parameter 'trace': {e}") from None
            specs = {s.job_id: s for s in plan_specs(records)}
            missing = [j for j in c.jobs if j not in specs]
            check(not missing, "jobs", missing, f"are not job ids of {c.trace}")
            chosen = sorted((specs[j] for j in c.jobs), key=lambda s: s.trigger)
            t0 = chosen[0].trigger
            return [{"id": f"{self.get_name()}-job{s.job_id}", "prompt": s.task_input, "urgent": s.urgent,
                     "tuf": [float(x) for x in s.tuf], "at": s.trigger - t0, "skill_s": [e for _, e in s.skills]}
                    for s in chosen]
        return [{"id": f"{self.get_name()}-{i}", "prompt": p, "urgent": c.urgent, "tuf": [], "at": 0.0, "skill_s": None}
                for i, p in enumerate(c.prompts)]

    def _run(self) -> None:
        c = self.config
        if not self.client.wait_for_server(timeout_sec=c.server_wait_s):
            self.get_logger().error(f"no planner action server at {c.action} after {c.server_wait_s} s")
            self._finish()
            return
        t0 = time.monotonic()
        threads = []
        for task in self.tasks:
            time.sleep(max(t0 + task["at"] - time.monotonic(), 0.0))
            th = threading.Thread(target=self._plan, args=(task,), daemon=True)
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        self._finish()

    def _plan(self, task: dict) -> None:
        """One task: send the goal, execute the segments as they come, in order."""
        from ..timely.skills import default_skill_time

        c = self.config
        goal = self.PlanTask.Goal()
        goal.task_id, goal.agent_id, goal.agent_kind = task["id"], self.agent, c.agent_kind
        goal.prompt, goal.urgent, goal.tuf, goal.max_segments = task["prompt"], task["urgent"], task["tuf"], c.max_segments
        segments: list = []
        arrived = threading.Condition()
        rec = {"task_id": task["id"], "sent": time.monotonic(), "segments": [], "status": "", "skills": []}

        def on_feedback(fb):
            with arrived:
                segments.append((time.monotonic(), fb.feedback))
                arrived.notify()

        fut = self.client.send_goal_async(goal, feedback_callback=on_feedback)
        while not fut.done():
            time.sleep(0.005)
        handle = fut.result()
        res_fut = handle.get_result_async() if handle.accepted else None
        skill_time = default_skill_time()
        k, robot_free, exec_total = 0, rec["sent"], 0.0
        while True:
            got = _next_segment(arrived, segments, k, res_fut)
            if got is None:
                break
            t_recv, fb = got
            if task["skill_s"] is not None and k < len(task["skill_s"]):
                dur = task["skill_s"][k]
            else:
                dur = c.skill_s if c.skill_s > 0 else skill_time.estimate(c.agent_kind, fb.skill)
            start = max(time.monotonic(), robot_free)
            time.sleep(max(start - time.monotonic(), 0.0))
            m = self.PlanProgress()
            m.header.stamp = self.get_clock().now().to_msg()
            m.task_id, m.segment_index, m.expected_exec_s = task["id"], int(fb.segment_index), float(dur)
            self.progress.publish(m)
            rec["segments"].append({"k": int(fb.segment_index), "skill": fb.skill, "received": t_recv - rec["sent"],
                                    "start": start - rec["sent"], "exec_s": dur})
            time.sleep(dur)  # executing the skill
            robot_free = start + dur
            exec_total += dur
            k += 1
        if res_fut is not None:
            while not res_fut.done():
                time.sleep(0.005)
            r = res_fut.result().result
            rec.update(status=r.status.reason, message=r.status.message, skills=list(r.skills),
                       response_time_s=r.response_time_s, utility=r.utility)
        else:
            rec.update(status="rejected")
        end = max(robot_free, rec["sent"])
        rec["waiting_time_s"] = (end - rec["sent"]) - exec_total if rec["segments"] else None
        self.records.append(rec)

    def _finish(self) -> None:
        if self.config.out:
            Path(self.config.out).write_text(json.dumps({"agent": self.agent, "plans": self.records}, indent=1))
        self._done.set()
        if self.config.exit_when_done:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGINT)


def main(argv=None) -> int:
    return run_nodes(lambda: [PlannerRobot()], argv, threads=8)


if __name__ == "__main__":
    exit_process(main())
