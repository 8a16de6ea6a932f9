"""`planner`: LLM plans for drones and arms, segment by segment (seed 002), on the inference
server (services: [planner]).

Action `plan_task` (action/PlanTask): a goal is one plan request; each generated segment (one
skill) goes back as feedback as soon as the schedule hands it out, the result once the plan
is complete. Robots publish PlanProgress when they start executing a segment: the next
segment's deadline runs from there (§4.3). The serving is core/timely/live.py: the segment
serving core on core/loop.py's LiveDriver with the LLM engine (engines/llm).

Bad input is answered to its sender only (the goal is aborted with a Status; nobody else is
affected): TUF beta <= 0 or cutoff <= ERT -> BAD_DEADLINE; an empty or over-long prompt ->
BAD_PROMPT; an agent kind without a skill set -> UNKNOWN_AGENT; a task id already being
planned -> DUPLICATE_REQUEST. Plans are generated freely by the model (greedy), one skill
per line, a segment bounded by `max_segment_tokens`, a plan by `max_segments`.

Parameters (the server's `planner` section): model ("" the converted SmolLM2 folder,
"tiny" a random-weight tiny Llama for tests, or a folder), scheduler (timely, fcfs,
fcfs_stream, seg_fcfs, seg_edf), max_batch, max_prompt_tokens, max_segment_tokens,
max_segments, profile (an LLM profile of record), action, progress_topic, threads,
queue_depth (DDS history depth of the action's goal, cancel and result services and its
feedback and status topics: the default 10 left 84 of 120 cancelled goals unanswered, issue
29) and max_goals (goals served at once, each holding a server thread; the next is aborted
with OVERLOADED at once);
engine ({name: vllm, vllm: {model, python, threads, ...}}: the plans run on a vLLM engine in
its own process, engines/llm/vllm_backend.py, docs/vllm.md; default: the own engine).
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter

from ...core.clock import WallClock
from ...core.errors import RequestError, UnknownAgent
from ...core.timely import NORMAL, SEGMENT_SCHEDULERS, TUF, URGENT, Plan, TimelyCore
from ...core.timely.serving import DuplicatePlan
from ...profiles import load_llm_profile as load_profile
from ...core.timely.live import BadPrompt, LiveTimely
from ...engines.llm.stop import StopChecker
from ...timely.skills import default_skill_time
from ...timely.trace import SYSTEM
from ..common import service_qos


class PlannerService:
    def __init__(self, node, *, model: str = "", scheduler: str = "timely", max_batch: int = 16,
                 max_prompt_tokens: int = 512, max_segment_tokens: int = 24, max_segments: int = 16,
                 profile: str = "smollm2_135m_llm", action: str = "/robotserve/plan_task",
                 progress_topic: str = "/robotserve/plan_progress",
                 threads: int = 1, queue_depth: int = 1000, max_goals: int = 32, engine: dict | str = "") -> None:
        from rclpy.action import ActionServer, CancelResponse, GoalResponse
        from rclpy.callback_groups import ReentrantCallbackGroup
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        from ...action import PlanTask
        from ...msg import PlanProgress

        for name, v in (("max_batch", max_batch), ("max_prompt_tokens", max_prompt_tokens),
                        ("max_segment_tokens", max_segment_tokens), ("max_segments", max_segments),
                        ("queue_depth", queue_depth), ("max_goals", max_goals)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"planner parameter '{name}': {v!r} is not a whole number >= 1")
        if scheduler not in SEGMENT_SCHEDULERS:
            raise ValueError(f"planner parameter 'scheduler': {scheduler!r} is not one of "
                             f"{', '.join(SEGMENT_SCHEDULERS.names())}")
        if max_goals >= getattr(getattr(node, "config", None), "threads", max_goals + 1):
            raise ValueError(f"planner parameter 'max_goals': {max_goals} is not < the server's threads")
        self.node, self.PlanTask = node, PlanTask
        self.max_goals = max_goals
        self._slots = threading.BoundedSemaphore(max_goals)
        self.max_segments = max_segments
        from ...engines.llm.vllm_backend import vllm_config

        vcfg = vllm_config(engine)
        self.engine = self._load_vllm(vcfg) if vcfg else self._load_engine(model, threads)
        self.skill_time = default_skill_time()
        self.kinds = self.skill_time.kinds()
        for kind in self.kinds:
            if kind in SYSTEM:
                self.engine.cache_prefix(self.engine.chat_prefix(SYSTEM[kind]))
        prof, _ = load_profile(profile)
        self.clock = WallClock()
        self.core = TimelyCore(SEGMENT_SCHEDULERS.create(scheduler), prof, self.skill_time, self.clock,
                               max_batch=max_batch, seg_tokens_max=max_segment_tokens, timer=time.perf_counter)
        live_cls = LiveTimely
        if vcfg:
            from ...engines.llm.vllm_backend import VLLMTimely as live_cls
        self.live = live_cls(self.engine, self.core, self._on_event, stop_checker=StopChecker,
                               max_segment_tokens=max_segment_tokens,
                               max_prompt_tokens=max_prompt_tokens).start()
        self._goals: dict = {}      # task id -> queue of core events
        self._lock = threading.Lock()
        self.counts: Counter = Counter()
        self.errors: Counter = Counter()
        group = ReentrantCallbackGroup()  # every goal waits in its own executor thread
        deep = service_qos(queue_depth)
        self.server = ActionServer(node, PlanTask, action, self._execute, callback_group=group,
                                   goal_callback=lambda g: GoalResponse.ACCEPT,
                                   cancel_callback=lambda g: CancelResponse.ACCEPT,
                                   goal_service_qos_profile=deep, result_service_qos_profile=deep,
                                   cancel_service_qos_profile=deep, feedback_pub_qos_profile=deep)
        node.create_subscription(PlanProgress, progress_topic, self._on_progress,
                                 QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE), callback_group=group)

    @staticmethod
    def _load_engine(model: str, threads: int):
        from ...engines import make_engine

        if model == "tiny":
            return make_engine("tiny_llm", None)
        try:
            return make_engine("llm", None, model=model, threads=threads)
        except FileNotFoundError as e:
            raise ValueError(f"planner parameter 'model': {e}") from None

    @staticmethod
    def _load_vllm(cfg):
        from ...engines.llm.vllm_backend import VLLMEngine

        return VLLMEngine(**cfg.host_params())  # VLLMUnavailable (a ConfigError) names what is missing

    # ---- goals ----
    def _execute(self, goal_handle):
        if not self._slots.acquire(blocking=False):
            result = self.PlanTask.Result()
            self.errors["overloaded"] += 1
            _status(result.status, "overloaded", f"{self.max_goals} plans are being served; send it again later")
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
            else:
                goal_handle.abort()
            return result
        try:
            return self._plan(goal_handle)
        finally:
            self._slots.release()

    def _plan(self, goal_handle):
        g = goal_handle.request
        result = self.PlanTask.Result()
        try:
            plan, q = self._admit(g)
        except RequestError as e:
            self.errors[e.code] += 1
            _status(result.status, e.code, e.message)
            goal_handle.abort()
            return result
        self.counts["accepted"] += 1
        skills = []
        try:
            while True:
                try:
                    ev = q.get(timeout=0.2)
                except queue.Empty:
                    if goal_handle.is_cancel_requested:
                        self.live.cancel(g.task_id)
                        goal_handle.canceled()
                        _status(result.status, "task_dropped", "cancelled by the robot")
                        self.counts["cancelled"] += 1
                        return result
                    if not self.live.driver.running:
                        _status(result.status, "shutting_down", "the server is shutting down")
                        goal_handle.abort()
                        return result
                    continue
                if ev.kind == "segment":
                    fb = self.PlanTask.Feedback()
                    fb.segment_index, fb.skill, fb.last, fb.expected_exec_s = ev.k, ev.text, ev.last, ev.expected_exec_s
                    goal_handle.publish_feedback(fb)
                    skills.append(ev.text)
                elif ev.kind == "done":
                    break
        finally:
            with self._lock:
                self._goals.pop(g.task_id, None)
        if ev.text:  # the plan ended on an engine failure
            self.errors[ev.text] += 1
            _status(result.status, ev.text, "the engine failed while generating this plan; send it again")
            goal_handle.abort()
            return result
        result.skills = skills
        result.response_time_s = float(plan.response_time or 0.0)
        result.utility = float(plan.tuf.utility(plan.response_time)) if plan.response_time is not None else 0.0
        result.generation_s = float(plan.generation_s)
        _status(result.status, "ok")
        self.counts["completed"] += 1
        goal_handle.succeed()
        return result

    def _admit(self, g):
        """Validate and submit a goal's plan; (plan, its event queue), or RequestError."""
        plan, ids = self._validate(g)
        q: queue.Queue = queue.Queue()
        with self._lock:
            if g.task_id in self._goals:
                raise DuplicatePlan(f"task '{g.task_id}' is already being planned")
            self._goals[g.task_id] = q
        try:
            self.live.submit(plan, ids)
        except RequestError:
            with self._lock:
                self._goals.pop(g.task_id, None)
            raise
        return plan, q

    def _validate(self, g):
        if not g.task_id:
            raise RequestError("empty task id")
        if g.agent_kind not in self.kinds:
            raise UnknownAgent(f"agent kind '{g.agent_kind}' is not served; known: {', '.join(self.kinds)}")
        tuf = TUF.from_list(g.tuf) if len(g.tuf) else TUF(*(URGENT if g.urgent else NORMAL))
        text = g.prompt.strip()
        if not text:
            raise BadPrompt("empty prompt")
        if len(text) > 16 * self.live.max_prompt_tokens:  # before tokenizing megabytes
            raise BadPrompt(f"prompt of {len(text)} characters is over the limit")
        ids = self.engine.chat_prompt(text, system=SYSTEM.get(g.agent_kind))
        n_seg = min(int(g.max_segments) or self.max_segments, self.max_segments)
        plan = Plan(g.task_id, g.agent_id, g.agent_kind, self.clock.now(), tuf, len(ids), urgent=bool(g.urgent),
                    max_segments=n_seg)
        return plan, ids

    def _on_event(self, ev) -> None:
        with self._lock:
            q = self._goals.get(ev.plan_id)
        if q is not None:
            q.put(ev)

    def _on_progress(self, m) -> None:
        """A robot started segment k: its stamp on the server's monotonic clock."""
        now_ros = self.node.get_clock().now().nanoseconds * 1e-9
        stamp = m.header.stamp.sec + m.header.stamp.nanosec * 1e-9
        t = self.clock.now() - max(now_ros - stamp, 0.0) if stamp > 0 else self.clock.now()
        self.live.progress(m.task_id, int(m.segment_index), t, float(m.expected_exec_s))

    # ---- service interface ----
    def stats(self) -> dict:
        snap = self.core.snapshot()  # the TimelyLLM core's counts, as plain data (core/contract.py)
        return {"plans_accepted": self.counts["accepted"], "plans_completed": self.counts["completed"],
                "plans_cancelled": self.counts["cancelled"], "errors": dict(self.errors),
                "segments": snap["segments"], "in_flight": snap["plans"],
                "decision_ms_median": snap["decision_ms_median"], "engine_failures": self.live.failures}

    def close(self) -> None:
        self.live.close()
        getattr(self.engine, "close", lambda: None)()  # the vLLM process
        # goals still waiting see the driver stopped and answer SHUTTING_DOWN
        self.server.destroy()


def _status(status, code: str, message: str = "") -> None:
    from ..convert import fill_status

    fill_status(status, code, message)
