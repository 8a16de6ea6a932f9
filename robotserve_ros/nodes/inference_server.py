"""The inference server node: srv/Infer in, trimmed action chunks out, the fleet in between.

srv/Infer is a codec (convert.py) plus sessions of the fleet (serve/): a call is decoded and
submitted, and answered (nodes/deferred.py: no executor thread held) when its round's future
is done: dispatch -> refresh stale observations from the robots (refresh.py) -> engine ->
complete (horizon policy, trim). Robots report progress on a topic: a finished task is
closed, a silent one reaped after task_timeout_s. Diagnostics go to /diagnostics. Services
beside srv/Infer (nodes/services) are built on this node and its fleet.

A lifecycle node (nodes/managed.py): configure builds the fleet from the parameters; activate
offers srv/Infer; deactivate withdraws it and drops every task (waiting calls answered
SHUTTING_DOWN); cleanup frees the engines. `autostart` (default true) walks configure + activate.
Parameters: InferenceServerConfig (server_config.py, docs/parameters.md; a bad one: one line, exit 2).
`engine_process: separate` puts the core, scheduler and engine in a process of their own (server_fleet.py).
"""
from __future__ import annotations

import json
import time
from collections import Counter, deque
from pathlib import Path

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.qos import QoSProfile, ReliabilityPolicy
from diagnostic_msgs.msg import DiagnosticArray

from ..core.errors import RequestError
from ..msg import ExecutionProgress
from ..serve import StageTrace
from ..srv import Infer
from .common import exit_process, NodeClock, ParamError, publish_queue_wait, run_nodes, service_qos
from .managed import ManagedNode
from .deferred import DeferredReplies, serve_queued, with_queued
from .convert import check_robot_id, check_service_name, fill_status
from .infer_call import InferCall, proof_of
from .refresh import ObservationRefresher
from .server_config import executor_kind, InferenceServerConfig
from .server_fleet import engine_side, node_fleet, on_progress
from .server_diagnostics import (MemoryTrace, RecentErrors, check_interfaces, diagnostic_array, server_stats,
                                 start_metrics, trim_heap)
from .services import SERVICES

__all__ = ["InferenceServerConfig", "InferenceServerNode", "check_robot_id", "check_service_name", "main"]


class InferenceServerNode(ManagedNode):
    config_class = InferenceServerConfig

    def __init__(self, name: str = "inference_server", **kw) -> None:
        super().__init__(name, **kw)
        self.infer = None
        self.autostart()

    def configure(self, c: InferenceServerConfig) -> None:
        """Build the fleet (engines, tiers, core, runner: serve/build.py) from the parameters."""
        c.check_executor(self.executor)  # a reconfigure adding services to a process that runs the single one
        self.clock = NodeClock(self)
        scheduler = c.scheduler.build()  # a wrong knob is its one line before anything is built
        built, self.engine = engine_side(self, c)  # this process's engines, or the engine core process's facts
        self.spec = c.observation_spec(self.engine.observation_spec)
        dim = self.engine.action_dim
        if c.joint_names and dim is not None and len(c.joint_names) != dim:
            built.close()
            raise ParamError("joint_names", f"{len(c.joint_names)} names for the engine's {dim} action columns")
        self._group = ReentrantCallbackGroup()
        self.refresher = ObservationRefresher(self, self.spec, c.refresh_timeout_s, self._group, topic=c.refresh_topic,
                                              verify=self._check_owner)
        self.trace = StageTrace(time.monotonic_ns) if c.stage_trace_file else None
        self.fleet = node_fleet(self, c, built, scheduler)
        if not c.task_auth.key_dir:
            self.get_logger().warning("task_auth.key_dir is not set: any node on this ROS domain can end or take "
                                      "another robot's task (docs/security.md)")
        self.lock, self.engines = self.fleet.lock, self.fleet.engines
        self.robots: dict = {}  # task id -> its robot's namespace ('' anonymous): /diagnostics keys robots by it
        self.progress_refused, self.finished = Counter(), Counter()  # progress not applied, by reason; tasks ended
        self.served_by_tier = Counter()  # replies per tier: how much the placement offloaded
        self.fleet.batch_listeners.append(lambda replies, _d, _r: self.served_by_tier.update(r.tier for r in replies))
        self.started_at = self.clock.now()  # engine time is measured on the core's clock too
        self.in_server_s: deque = deque(maxlen=1024)  # received -> answered, the last ok rounds
        self.language = None  # the service decoding language with the rounds (serve_language)
        self.joint_names = list(c.joint_names) or list(self.engine.action_names or [])
        self._wire(c)
        self.fleet.start()
        for n in self.fleet.pools:  # the tier's slots follow the replicas Ray runs
            self.fleet.attach_pool(self.engines[n], n)
        self.side_services: dict = {}  # other kinds of work (LLM plans, language, VLM questions) on the same server
        for name in c.services:
            try:
                self.side_services[name] = SERVICES.create(name, node=self, **c.service_params(name))
            except (TypeError, ValueError, OSError) as e:
                self.cleanup()
                raise ParamError(f"parameter '{name}': no {name} service with these: {e}") from e
        self.metrics = start_metrics(self, c)  # before activate: its histograms see every round
        self.get_logger().info(f"configured for {c.service}: scheduler {c.scheduler.name}, engine {c.engine.name}, "
                               f"engine profile saturation batch {self.engine.profile.saturation_batch}")

    def _wire(self, c: InferenceServerConfig) -> None:
        """Progress in (a burst of messages: one executor wake-up), diagnostics out, the reaper, memory tools."""
        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self._progress_sub = self.create_subscription(ExecutionProgress, c.progress_topic, with_queued(
            lambda: self._progress_sub, self._on_progress), reliable, callback_group=MutuallyExclusiveCallbackGroup())
        self.diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.recent_errors = RecentErrors(time.monotonic(), c.diagnostics_window_s)
        self.create_timer(1.0 / c.diagnostics_hz, self._publish_diagnostics)
        publish_queue_wait(self, c.queue_topic, c.queue_hz, self.fleet.expected_wait_s)
        self.create_timer(min(1.0, c.task_timeout_s / 4), self._reap)
        self.create_timer(30.0, trim_heap)
        self.memory = MemoryTrace(self, c.memory_trace_file, c.memory_trace_after_s) if c.memory_trace_file else None

    def activate(self) -> None:
        c = self.config
        self.infer = self.create_service(Infer, c.service, serve_queued(lambda: self.infer, self._on_infer),
                                         qos_profile=service_qos(c.infer_queue.depth), callback_group=self._group)
        self.replies = DeferredReplies(self.infer)
        self.get_logger().info(f"serving on {c.service}")

    def deactivate(self) -> None:
        """Stop serving: srv/Infer withdrawn, every task dropped (its waiting calls answered)."""
        if self.infer is not None:
            self.destroy_service(self.infer)
            self.infer = None
        with self.lock:
            for tid in self.fleet.tasks():
                self.fleet.drop(tid, "shutting_down", "the server was deactivated")
                self._forget(tid)
        if self.context.ok():  # not at process shutdown: /rosout is gone then
            self.get_logger().info(f"no longer serving {self.config.service} (deactivated)")

    def serve_language(self, handler) -> None:
        """The services' hook: `handler` (attach(req, prompt, max_tokens) -> language id,
        cancel(req, id)) decodes srv/Infer's language_prompt with the round; None: no longer."""
        self.language = handler

    # --- requests in (executor threads) --------------------------------------------
    def _on_infer(self, request, response):
        """Decode, submit to the fleet; the reply is sent when the round's future is done."""
        received = time.monotonic()
        if self.trace is not None:
            self.trace("received", [(request.task_id, request.round_id)])
        try:
            call = InferCall(request, response, received, self.spec, self.language)
        except RequestError as e:  # malformed or refused before it reaches the fleet: counted there
            self.fleet.count_error(e, "ros")
            fill_status(response.status, e.code, e.message)
            return response
        self.replies.defer(response)
        fut = self.fleet.session("ros", call.robot).submit(call.req, call.proof)
        if not fut.done() or fut.exception() is None:
            with self.lock:
                self.robots[call.req.task_id] = call.robot
                self.refresher.use(call.req.task_id, request.refresh_service)
        fut.add_done_callback(lambda f: self._complete(call, f))
        return response  # sent now if already answered, else by _complete (DeferredReplies)

    def _complete(self, call: InferCall, fut) -> None:
        """Once per call, when its future is done (any thread): fill its response and send it."""
        if call.answer(fut, self.clock.now(), self.joint_names, self.executor):
            self.in_server_s.append(time.monotonic() - call.received)
            if self.trace is not None:
                self.trace("answered", [(call.req.task_id, call.req.round_id)])
        self.replies.finish(call.response)

    def _check_owner(self, m) -> None:
        """A refresh-topic message (an srv/Infer request) is its task's robot's (task auth)."""
        self.fleet.check_owner(m.task_id, m.robot_id, proof_of(m, m.auth_stamp, "refresh"))

    def _on_progress(self, m) -> None:
        on_progress(self, m)

    def _reap(self) -> None:
        """A robot gone silent: its queued round and its task are dropped after task_timeout_s."""
        with self.lock:
            for tid in self.fleet.reap():
                self.get_logger().warning(f"task {tid!r} silent for {self.config.task_timeout_s} s: reaped")
                self.finished["reaped"] += 1
                self._forget(tid)

    def _forget(self, tid: str) -> None:
        """Under the lock: what this node keeps of a dropped task goes too."""
        self.refresher.forget(tid)
        self.robots.pop(tid, None)

    # --- diagnostics ------------------------------------------------------------------
    stats = server_stats  # what /diagnostics shows (server_diagnostics.py)

    def _publish_diagnostics(self) -> None:
        check_interfaces(self)  # a robot of another msg/srv build: named and counted, where the operator looks
        self.diag.publish(diagnostic_array(self.stats(), self.get_clock().now().to_msg(), self.get_name(),
                                           self.recent_errors, time.monotonic()))

    def cleanup(self) -> None:
        """Free the fleet, its engine(s) and the side services (lifecycle cleanup)."""
        for tool in filter(None, (self.memory, getattr(self, "metrics", None))):  # memory trace, metrics endpoint
            tool.close()
        for svc in getattr(self, "side_services", {}).values():
            svc.close()
        self.fleet.close()
        for eng in {id(e): e for e in self.engines.values()}.values():
            eng.close()
        if self.trace is not None:
            Path(self.config.stage_trace_file).write_text(json.dumps(self.trace.snapshot()))


def main(argv=None) -> int:
    return run_nodes(lambda: [InferenceServerNode()], argv, threads=lambda nodes: nodes[0].config.threads,
                     executor=lambda nodes: executor_kind(nodes[0].config.executor, nodes[0].config.services))


if __name__ == "__main__":
    exit_process(main())
