"""The inference server node: srv/Infer in, trimmed action chunks out, the core in between.

Each Infer call validates and submits its request and returns; its reply is sent (from the
thread that finishes the round, nodes/deferred.py), so a waiting call holds no executor
thread, once the core's runner has served its round: dispatch
(scheduler + batching) -> refresh stale observations from the robots (refresh.py) ->
engine -> complete (horizon policy, trim) -> wake the waiting calls. Robots report progress
on a topic; a finished task is closed in the ledger, a silent one is reaped after
task_timeout_s with its queued round dropped. Diagnostics (server_diagnostics.py) go to
/diagnostics. Services beside srv/Infer (nodes/services) are built on this node; one that
decodes language with the action rounds registers itself through serve_language().

A lifecycle node (rclpy.lifecycle.LifecycleNode, through nodes/managed.py): configure builds
the engine, scheduler and core from the parameters; activate offers srv/Infer; deactivate
withdraws it and drops every task (their waiting calls answered SHUTTING_DOWN; robots go on
under new task ids once it is back); cleanup frees the engine. `autostart` (default true) walks configure + activate at start.

Parameters: the tree of InferenceServerConfig (server_config.py, docs/parameters.md), nested
ROS parameters; a wrong key or value prints the one line naming it and exits 2.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Optional

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.qos import QoSProfile, ReliabilityPolicy
from diagnostic_msgs.msg import DiagnosticArray

from ..config import ConfigError
from ..core.errors import Overloaded, RequestError
from ..core.liveness import LastHeard
from ..core.placement import hybrid_tiers
from ..core.runner import Runner, StageTrace
from ..core.serving import ServingCore, Tier
from ..core.task_auth import NotTaskOwner, TaskBinder
from ..core.types import ExecInfo
from ..engines import make_engine
from ..msg import ExecutionProgress
from ..srv import Infer
from .common import exit_process, NodeClock, ParamError, run_nodes, service_qos, to_ns, to_sec
from .managed import ManagedNode
from .deferred import DeferredReplies
from .convert import fill_chunk, fill_status, request_from_msg
from .refresh import ObservationRefresher
from .server_config import InferenceServerConfig
from .server_diagnostics import MemoryTrace, RecentErrors, diagnostic_array, server_stats, trim_heap
from .services import SERVICES

__all__ = ["InferenceServerConfig", "InferenceServerNode", "main"]


class _Waiter:
    """One Infer call waiting for its round: its response is sent when the round is answered
    (nodes/deferred.py), so the call holds no executor thread meanwhile."""
    __slots__ = ("response", "reply", "error", "first_timestep", "req", "received", "language_id", "lang")

    def __init__(self, response, first_timestep: int, received: float) -> None:
        self.response = response
        self.reply = None
        self.error: Optional[tuple] = None
        self.first_timestep = first_timestep
        self.received = received
        self.req = self.lang = None
        self.language_id = ""


class InferenceServerNode(ManagedNode):
    config_class = InferenceServerConfig

    def __init__(self, name: str = "inference_server", **kw) -> None:
        super().__init__(name, **kw)
        self.infer = None
        self.autostart()

    def configure(self, c: InferenceServerConfig) -> None:
        """Build scheduler, engine(s), core and runner from the parameters (lifecycle configure)."""
        self.clock = NodeClock(self)
        try:
            scheduler = c.scheduler.build()
            self.engine = c.engine.build()
            self.spec = c.observation_spec(getattr(self.engine, "observation_spec", None))
            # Cloud tiers: GPU servers, profiles fetched from them; the links' down-until
            # times are on the core's clock, which the placement reads.
            edge = Tier("edge", self.engine.profile, max_batch=c.max_batch or None)
            clouds = {n: {"slots": t.slots, "max_batch": t.max_batch, "rtt_s": t.rtt_s,
                          "bandwidth_bps": t.bandwidth_bps, **t.engine_params()} for n, t in c.tiers().items()}
            tiers, self.engines, placement = hybrid_tiers(
                edge, self.engine, clouds, lambda link, **kw: make_engine("remote", None, link=link,
                                                                          clock=self.clock.now, **kw),
                c.placement.name, c.placement.chosen)
            for n, t in c.ray_tier_configs().items():  # Ray Serve pools: a slot per replica (transport/ray_pool.py)
                try:
                    profile, kw = t.engine_params_for(c.engine, n, os.getpid())
                    self.engines[n] = make_engine("ray", profile, **kw)
                except Exception as e:  # ray missing, a cluster not reachable, a replica that cannot start
                    raise ValueError(n, f"{type(e).__name__}: {e}") from e
                tiers.append(Tier(n, self.engines[n].profile, slots=self.engines[n].slots, max_batch=t.max_batch or None))
        except ConfigError:
            raise
        except ValueError as e:  # a bad tier, an unreachable server or a bad placement knob
            for eng in {id(x): x for x in [self.engine, *getattr(self, "engines", {}).values()]}.values():
                eng.close()
            where, what = e.args if len(e.args) == 2 else ("remote_tiers", str(e))
            raise ParamError(where, f"cannot build it: {what}") from e
        dim = getattr(self.engine, "action_dim", None)
        if c.joint_names and dim is not None and len(c.joint_names) != dim:
            for eng in self.engines.values():
                eng.close()
            raise ParamError("joint_names", f"{len(c.joint_names)} names for the engine's {dim} action columns")
        self._group = ReentrantCallbackGroup()
        self.refresher = ObservationRefresher(self, self.spec, c.refresh_timeout_s, self._group, topic=c.refresh_topic,
                                              verify=self._check_owner)
        try:
            self.core = ServingCore(scheduler, tiers, self.clock, horizon_params=c.horizon, placement=placement,
                                    refresher=self.refresher, stale_obs_s=c.stale_obs_s,
                                    rtc_shape=(dim, getattr(self.engine, "chunk_len", None)))
        except (TypeError, ValueError) as e:  # a horizon knob the policy does not take: say which
            raise ParamError("horizon", str(e)) from e
        # guards core (through the runner), waiters, heard; re-entrant: the LeRobot service submits under it
        self.lock = threading.RLock()
        # Calls waiting for their round: past max_waiting, OVERLOADED at once (issue 29); they
        # hold no threads (deferred replies), this bounds the rounds queued in memory.
        self.waiting = threading.BoundedSemaphore(c.max_waiting)
        try:
            self.binder = TaskBinder(c.task_auth.key_dir, c.task_auth.max_skew_s) if c.task_auth.key_dir else None
        except ValueError as e:
            raise ParamError("task_auth.key_dir", str(e)) from None
        if self.binder is None:
            self.get_logger().warning("task_auth.key_dir is not set: any node on this ROS domain can end or take "
                                      "another robot's task (docs/security.md)")
        self.robots: dict = {}  # task id -> its robot's namespace ('' anonymous): /diagnostics keys robots by it
        self.progress_refused = Counter()  # progress messages not applied, by reason
        self.waiters: dict = {}
        self.heard = LastHeard(c.task_timeout_s, time.monotonic)
        self.finished = Counter()
        self.served_by_tier = Counter()  # replies per tier: how much the placement offloaded
        self.started_at = self.clock.now()  # engine time is measured on the core's clock too
        self.in_server_s: deque = deque(maxlen=1024)  # received -> answered, the last ok rounds
        self.language = None  # the service decoding language with the rounds (serve_language)
        # What the action columns command: configured, else the policy's action features.
        self.joint_names = list(c.joint_names) or list(getattr(self.engine, "action_names", None) or [])
        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(ExecutionProgress, c.progress_topic, self._on_progress, reliable,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self.diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.recent_errors = RecentErrors(time.monotonic(), c.diagnostics_window_s)
        self.create_timer(1.0 / c.diagnostics_hz, self._publish_diagnostics)
        self.create_timer(min(1.0, c.task_timeout_s / 4), self._reap)
        self.create_timer(30.0, trim_heap)
        self.memory = MemoryTrace(self, c.memory_trace_file, c.memory_trace_after_s) if c.memory_trace_file else None
        # The core's one serving loop (core/runner.py): a thread per tier slot, edge and cloud at once.
        self.trace = StageTrace(time.monotonic_ns) if c.stage_trace_file else None
        # Refresh ahead: the next batch's stale observations are fetched while the current one
        # generates (within 2 refresh timeouts of its end), not while the engine waits.
        self.runner = Runner(self.core, self.engines, self._deliver, lock=self.lock, observer=self.trace,
                             on_given_up=self._given_up,
                             prefresh_lead_s=min(0.5 * c.stale_obs_s, 2 * c.refresh_timeout_s),
                             on_error=lambda d, e: self.get_logger().error(
                                 f"tier {d.tier} failed a batch of {len(d.requests)}: {e!r}; requeued")).start()
        for n in c.ray_tiers:  # the tier's slots follow the replicas Ray runs
            self.engines[n].attach(self.runner, n)
        # Other kinds of work (LLM plans, language, VLM questions) on the same server.
        self.side_services: dict = {}
        for name in c.services:
            try:
                self.side_services[name] = SERVICES.create(name, node=self, **c.service_params(name))
            except (TypeError, ValueError, OSError) as e:
                self.cleanup()
                raise ParamError(f"parameter '{name}': no {name} service with these: {e}") from e
        p = self.engine.profile
        self.get_logger().info(f"configured for {c.service}: scheduler {c.scheduler.name}, engine {c.engine.name}, "
                               f"engine profile saturation batch {p.saturation_batch}")

    def activate(self) -> None:
        c = self.config
        self.infer = self.create_service(Infer, c.service, self._on_infer, qos_profile=service_qos(c.infer_queue.depth),
                                         callback_group=self._group)
        self.replies = DeferredReplies(self.infer)
        self.get_logger().info(f"serving on {c.service}")

    def deactivate(self) -> None:
        """Stop serving: srv/Infer withdrawn, every task dropped (its waiting calls answered)."""
        if self.infer is not None:
            self.destroy_service(self.infer)
            self.infer = None
        with self.lock:
            for tid in list(self.core.ledger.tasks):
                self._forget(tid, ("shutting_down", "the server was deactivated"))
        if self.context.ok():  # not at process shutdown: /rosout is gone then
            self.get_logger().info(f"no longer serving {self.config.service} (deactivated)")

    def serve_language(self, handler) -> None:
        """The services' hook: `handler` (attach(req, prompt, max_tokens) -> language id,
        cancel(req, id)) decodes srv/Infer's language_prompt with the round; None: no longer."""
        self.language = handler

    # --- requests in (executor threads) --------------------------------------------
    def _on_infer(self, request, response):
        """Validate and submit; the reply is sent when the round is served (_complete), so
        a waiting call holds no executor thread (nodes/deferred.py)."""
        received = time.monotonic()
        if self.trace is not None:
            self.trace("received", [(request.task_id, request.round_id)])
        w = _Waiter(response, int(request.observation.timestep), received)
        try:
            w.req = req = request_from_msg(request, self.spec)
            robot = check_robot_id(request.robot_id, self.spec.max_task_id_bytes)
            check_service_name(request.refresh_service)
            if self.binder is not None:
                with self.lock:
                    self.binder.check(req.task_id, req.round_id, robot, to_ns(request.auth_stamp),
                                      bytes(request.auth_mac), self.clock.now(), bind=req.round_id == 0)
            if not self.waiting.acquire(blocking=False):
                raise Overloaded(f"{self.config.max_waiting} calls are waiting for their rounds; send it again later")
        except RequestError as e:  # malformed or refused before it reaches the core: count it there
            self.runner.count_error(e)
            fill_status(response.status, e.code, e.message)
            return response
        try:
            self._serve(request, req, robot, w)
        except BaseException:
            self.waiting.release()
            raise
        return response  # sent now if already answered, else by _complete (DeferredReplies)

    def _serve(self, request, req, robot: str, w: _Waiter) -> None:
        w.lang = self.language
        try:
            if request.language_prompt:  # language from this round's prefill (seed 001): the vla_language service
                if w.lang is None:
                    raise RequestError("this server decodes no language: start it with the vla_language service")
                w.language_id = w.lang.attach(req, request.language_prompt, int(request.language_max_tokens))
        except RequestError as e:  # malformed before it reaches the core: count it there
            self.runner.count_error(e)
            fill_status(w.response.status, e.code, e.message)
            self.waiting.release()
            return

        def register(pending) -> None:  # under the runner's lock, before any batch can take it
            if pending.replay is not None:  # a re-sent round already answered: the cached reply
                w.reply = pending.replay
                self._complete(w)
            else:  # a re-sent round still queued or generating: the newest call gets the reply
                self._answer((req.task_id, req.round_id), error=(
                    "duplicate_request", "this round was sent again: its reply goes to the newer call"))
                self.waiters[(req.task_id, req.round_id)] = w
            self.heard.heard(req.task_id)
            self.robots[req.task_id] = robot
            self.refresher.use(req.task_id, request.refresh_service)

        self.replies.defer(w.response)
        try:
            self.runner.submit(req, then=register)  # the core counts the errors it raises
        except RequestError as e:
            with self.lock:
                if self.binder is not None and req.task_id not in self.core.ledger.tasks:
                    self.binder.forget(req.task_id)  # a refused round 0 binds nothing
                w.error = (e.code, e.message)
                self._complete(w)

    def _complete(self, w: _Waiter) -> None:
        """Under the lock, once per call: fill its response and send it (any thread)."""
        response, req = w.response, w.req
        if w.error is not None:
            if w.language_id:  # off this lock: the language service takes its own (executor thread)
                ex = self.executor
                if ex is not None:
                    ex.create_task(w.lang.cancel, req, w.language_id)
                else:
                    w.lang.cancel(req, w.language_id)
            fill_status(response.status, *w.error)
        else:
            response.language_id = w.language_id
            fill_status(response.status, "ok")
            fill_chunk(response.chunk, w.reply, w.first_timestep, self.clock.now(), self.joint_names)
            self.in_server_s.append(time.monotonic() - w.received)
            if self.trace is not None:
                self.trace("answered", [(req.task_id, req.round_id)])
        self.waiting.release()
        self.replies.finish(response)

    def _check_owner(self, m) -> None:
        """A refresh-topic message (an srv/Infer request) is its task's robot's (task auth)."""
        if self.binder is not None:
            with self.lock:
                self.binder.check(m.task_id, int(m.round_id), m.robot_id, to_ns(m.auth_stamp), bytes(m.auth_mac),
                                  self.clock.now(), bind=False)

    def _on_progress(self, m) -> None:
        with self.lock:
            if m.task_id not in self.core.ledger.tasks:
                self.progress_refused["unknown_task"] += 1
                return
            if self.binder is not None:  # another node ending or keeping alive a task not its own
                try:
                    self.binder.check(m.task_id, int(m.round_id), m.robot_id, to_ns(m.header.stamp),
                                      bytes(m.auth_mac), self.clock.now(), bind=False)
                except NotTaskOwner:
                    self.progress_refused["not_task_owner"] += 1
                    return
            self.heard.heard(m.task_id)
            if m.task_done:
                info = ExecInfo(to_sec(m.exec_start), 0, float(m.control_hz) or 1.0)
                rec = self.core.finish_task(m.task_id, info)
                self.finished["tasks"] += 1
                self.finished["wait_sum"] += rec.closed_wait
                self._forget(m.task_id, ("task_dropped", "task finished"))

    def _reap(self) -> None:
        """A robot gone silent: drop its queued round and its task after task_timeout_s."""
        t = self.config.task_timeout_s
        with self.lock:
            for tid in self.heard.silent():
                self.get_logger().warning(f"task {tid!r} silent for {t} s: reaped")
                self.finished["reaped"] += 1
                self._forget(tid, ("task_dropped", f"task '{tid}' was reaped after {t} s of silence"))

    def _forget(self, tid: str, error: tuple) -> None:
        """Under the lock: drop the task; answer its waiting calls with `error`."""
        self.core.cancel(tid)
        for eng in self.engines.values():
            eng.forget(tid)  # per-task observation history (n_obs_steps) goes with the task
        self.heard.forget(tid)
        self.refresher.forget(tid)
        self.robots.pop(tid, None)
        if self.binder is not None:
            self.binder.forget(tid)
        for key in [k for k in self.waiters if k[0] == tid]:
            self._answer(key, error=error)

    def _answer(self, key: tuple, reply=None, error: Optional[tuple] = None) -> None:
        """Under the lock: wake the call waiting for round `key`, if any."""
        w = self.waiters.pop(key, None)
        if w is not None:
            w.reply, w.error = reply, error
            self._complete(w)

    # --- replies (engine threads) ----------------------------------------------------------
    def _deliver(self, replies, _dispatch, _results) -> None:
        """Under the lock (Runner.finish): hand each reply to its waiting call."""
        for r in replies:
            self.served_by_tier[r.tier] += 1
            self._answer((r.task_id, r.round_id), reply=r)

    def _given_up(self, pendings, exc) -> None:
        """Under the lock (Runner): rounds in max_attempts failed batches get an error."""
        for p in pendings:
            if isinstance(exc, RequestError):  # the engine refused this request alone: its own code
                error = (exc.code, f"round {p.request.round_id}: {exc.message}")
            else:
                error = ("engine_failure", f"round {p.request.round_id} failed {p.failures} batches "
                                           f"({type(exc).__name__}); send it again")
            self._answer((p.task_id, p.request.round_id), error=error)

    # --- diagnostics ------------------------------------------------------------------
    def stats(self) -> dict:
        return server_stats(self)

    def _publish_diagnostics(self) -> None:
        self.diag.publish(diagnostic_array(self.stats(), self.get_clock().now().to_msg(), self.get_name(),
                                           self.recent_errors, time.monotonic()))

    def cleanup(self) -> None:
        """Free the engine(s), the runner and the side services (lifecycle cleanup)."""
        if self.memory is not None:
            self.memory.close()
        for svc in getattr(self, "side_services", {}).values():
            svc.close()
        with self.lock:
            for key in list(self.waiters):
                self._answer(key, error=("shutting_down", "the server is shutting down"))
        self.runner.close()
        for eng in self.engines.values():
            eng.close()
        if self.trace is not None:
            Path(self.config.stage_trace_file).write_text(json.dumps(self.trace.snapshot()))


def check_robot_id(robot_id: str, max_bytes: int) -> str:
    """A robot's namespace as sent: '' or a ROS namespace (it becomes a /diagnostics key)."""
    if not robot_id:
        return ""
    from rclpy.validate_namespace import validate_namespace

    if len(robot_id.encode()) > max_bytes:
        raise RequestError(f"robot_id: {len(robot_id.encode())} bytes, at most {max_bytes}")
    try:
        validate_namespace(robot_id)
    except Exception:  # rclpy's InvalidNamespaceException, with the name in it: not echoed
        raise RequestError("robot_id is not a ROS namespace") from None
    return robot_id


def check_service_name(name: str) -> None:
    """refresh_service: '' or a name the refresher can make a client for."""
    if name:
        from rclpy.validate_full_topic_name import validate_full_topic_name

        try:
            validate_full_topic_name(name if name.startswith("/") else "/" + name, is_service=True)
        except Exception:
            raise RequestError("refresh_service is not a ROS service name") from None


def main(argv=None) -> int:
    return run_nodes(lambda: [InferenceServerNode()], argv, threads=lambda nodes: nodes[0].config.threads,
                     executor=lambda nodes: nodes[0].config.executor)


if __name__ == "__main__":
    exit_process(main())
