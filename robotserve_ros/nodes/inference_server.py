"""The inference server node: srv/Infer in, trimmed action chunks out, the core in between.

Each Infer call validates and submits its request, then waits (in its own executor thread,
so no robot blocks another) until the engine worker thread has run its batch. The worker
loops: dispatch (scheduler + batching) -> refresh stale observations from the robots ->
engine -> complete (horizon policy, trim) -> wake the waiting calls. Robots report progress
on a topic; a finished task is closed in the ledger, a silent one is reaped after
task_timeout_s with its queued round dropped. Diagnostics go to /diagnostics.

Parameters: the fields of InferenceServerConfig, each a ROS parameter with its help as
description; a bad value prints the one line naming it and exits 2.
"""
from __future__ import annotations

import json
import threading
import time
import tracemalloc
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from ..core.errors import RequestError
from ..core.observation import ObservationSpec
from ..core.placement import PLACEMENTS, LinkEstimate, make_placement
from ..core.profile import EngineProfile
from ..core.schedulers import SCHEDULERS, make_scheduler
from ..core.runner import Runner, StageTrace
from ..core.serving import ServingCore, Tier
from ..core.types import ExecInfo
from ..engines import ENGINES, make_engine
from ..msg import ExecutionProgress
from ..profiles import names as profile_names, profile_of_record
from ..srv import FetchObservation, Infer
from .common import (NodeClock, NodeConfig, ParamError, bad_param, check, check_one_of, declare_config, param, run_nodes,
                     service_qos, to_sec)
from .services import SERVICES
from .convert import fill_chunk, fill_status, observation_from_msg, request_from_msg


def _json(name: str, value: str, kind: type):
    """A JSON parameter's value, checked to be a `kind` (dict or list)."""
    try:
        v = json.loads(value)
    except ValueError:
        v = None
    check(isinstance(v, kind), name, value, f"is not a JSON {'object' if kind is dict else 'list'}")
    return v


@dataclass(frozen=True)
class InferenceServerConfig(NodeConfig):
    service: str = param("/robotserve/infer", "the srv/Infer service robots call")
    progress_topic: str = param("/robotserve/progress", "where robots report execution progress")
    scheduler: str = param("remaining", f"one of {', '.join(SCHEDULERS.names())}")
    scheduler_params: str = param("{}", 'a JSON object of the scheduler\'s keyword parameters, e.g. {"buckets": 10, "aging": 4}')
    engine: str = param("simulated", f"one of {', '.join(ENGINES.names())}")
    engine_params: str = param('{"chunk_size": 50, "action_dim": 6, "steps": 10, "updates": true, "realtime": true}',
                               "a JSON object of the engine's keyword parameters")
    engine_profile: str = param("smolvla_tiny", "the engine profile of record (robotserve_ros/profiles/NAME.json): "
                                "latency vs batch, read by the scheduler and the simulated engine")
    engine_batch_sizes: tuple[int, ...] = param((), "an explicit engine profile instead of engine_profile: "
                                                "batch sizes, 1 first, increasing (empty: use engine_profile)")
    engine_latency_ms: tuple[float, ...] = param((), "the explicit profile's latency (ms) at each of engine_batch_sizes")
    max_batch: int = param(0, "largest batch the edge tier runs, >= 0 (0: the profile's saturation batch)")
    horizon_params: str = param('{"static": {"h": 25}, "confidence": {"t": 0.4, "h_min": 10}}',
                                "a JSON object: horizon policy name -> its keyword parameters")
    stale_obs_s: float = param(0.25, "an observation older than this at dispatch is refreshed from the robot, > 0")
    refresh_timeout_s: float = param(0.05, "how long a refresh may take before the old observation is used, > 0")
    task_timeout_s: float = param(10.0, "a task whose robot is silent this long is reaped, > 0")
    obs_cameras: int = param(-1, "images per observation (< 0: what the engine takes)")
    obs_width: int = param(-1, "image width (<= 0: what the engine takes)")
    obs_height: int = param(-1, "image height (<= 0: what the engine takes)")
    obs_encodings: tuple[str, ...] = param(("rgb8", "bgr8", "mono8"), "image encodings accepted (of those the engine takes)")
    obs_joints: int = param(-1, "joint positions per observation (< 0: what the engine takes)")
    max_request_bytes: int = param(8 << 20, "largest observation payload accepted, > 0")
    max_task_id_bytes: int = param(256, "longest task id (and horizon name, refresh service) accepted, UTF-8 bytes, > 0")
    max_instruction_bytes: int = param(4096, "longest instruction accepted, UTF-8 bytes, > 0")
    max_images: int = param(16, "most images in one observation, > 0")
    diagnostics_hz: float = param(1.0, "/diagnostics publication rate, > 0")
    threads: int = param(128, "Infer calls served at once, >= 4")
    # Cloud tiers: GPU servers (robotserve gpu-server), each an object with "address" and
    # optionally "name", "token_file", "root_cert", "server_name", "deadline_s", "slots",
    # "max_batch", "rtt_s", "bandwidth_bps" (starting guesses).
    remote_tiers: str = param("[]", "a JSON list of objects, each with an 'address' (host:port of a robotserve gpu-server)")
    placement: str = param("fill_in_order", f"one of {', '.join(PLACEMENTS.names())}")  # shortest_delay: seed 000 §3.2.3
    placement_params: str = param("{}", "a JSON object of the placement's keyword parameters")
    services: tuple[str, ...] = param((), "services beside srv/Infer on this server (LLM plans, language, VLM): "
                                      "names from robotserve_ros/nodes/services")
    services_params: str = param("{}", "a JSON object: service name -> its keyword parameters")
    memory_trace_file: str = param("", "trace Python allocations (tracemalloc) and write the 30 sites that grew "
                                   "most from memory_trace_after_s to shutdown here as JSON; '' = off")
    memory_trace_after_s: float = param(120.0, "when the memory trace's baseline is taken, s after start, > 0")
    stage_trace_file: str = param("", "write per-round stage times (CLOCK_MONOTONIC ns: received, submit, dispatch, "
                                  "engine_start, engine_end, reply, answered) here as JSON on shutdown; '' = off")

    def check(self) -> None:
        check_one_of("scheduler", self.scheduler, SCHEDULERS.names())
        check_one_of("engine", self.engine, ENGINES.names())
        check_one_of("placement", self.placement, PLACEMENTS.names())
        check_one_of("engine_profile", self.engine_profile, profile_names())
        for name in self.services:
            check_one_of("services", name, SERVICES.names())
        for name in ("scheduler_params", "engine_params", "horizon_params", "placement_params", "services_params"):
            _json(name, getattr(self, name), dict)
        tiers = _json("remote_tiers", self.remote_tiers, list)
        check(all(isinstance(t, dict) and isinstance(t.get("address"), str) for t in tiers), "remote_tiers",
              self.remote_tiers, "is not a list of objects each with an 'address' (host:port)")
        b, ms = self.engine_batch_sizes, self.engine_latency_ms
        check(len(b) == len(ms), "engine_latency_ms", ms,
              f"does not give one latency for each of the {len(b)} engine_batch_sizes")
        if b:
            check(b[0] == 1 and all(x < y for x, y in zip(b, b[1:])), "engine_batch_sizes", b,
                  "is not a list of increasing batch sizes starting at 1")
            try:
                EngineProfile(dict(zip(b, ms)))
            except ValueError as e:
                raise bad_param("engine_latency_ms", ms, f"is not a profile: {e}") from None
        for name in ("stale_obs_s", "refresh_timeout_s", "task_timeout_s", "max_request_bytes", "diagnostics_hz",
                     "memory_trace_after_s",
                     "max_task_id_bytes", "max_instruction_bytes", "max_images"):
            check(getattr(self, name) > 0, name, getattr(self, name), "is not > 0")
        check(self.max_batch >= 0, "max_batch", self.max_batch, "is not >= 0 (0: the saturation batch)")
        check(self.threads >= 4, "threads", self.threads, "is not >= 4")

    def profile(self) -> EngineProfile:
        """The explicit engine_batch_sizes/engine_latency_ms, else the profile of record."""
        if self.engine_batch_sizes:
            return EngineProfile(dict(zip(self.engine_batch_sizes, self.engine_latency_ms)))
        return profile_of_record(self.engine_profile)

    def parsed(self, name: str):
        """A JSON parameter's value (checked at construction)."""
        return json.loads(getattr(self, name))


def _trim_heap() -> None:
    """Give the heap pages freed since the last call back to the OS (glibc malloc_trim). A
    long-running server sees peaks of queued observations on ~150 threads' malloc arenas;
    without this its resident set keeps the highest peak's fragments (a 10-minute soak grew
    7 % after its first 2 minutes, with nothing leaking in the server's own structures)."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc: nothing to do
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc = None


def _ms_pct(samples, q: float):
    """The q-th percentile of recent durations (s) in ms; None for none."""
    xs = list(samples)
    return round(1000 * float(np.percentile(xs, q)), 3) if xs else None


class _Waiter:
    __slots__ = ("event", "reply", "error", "first_timestep")

    def __init__(self, first_timestep: int) -> None:
        self.event = threading.Event()
        self.reply = None
        self.error: Optional[tuple] = None
        self.first_timestep = first_timestep


class InferenceServerNode(Node):
    def __init__(self, **kw) -> None:
        super().__init__("inference_server", **kw)
        c = self.config = declare_config(self, InferenceServerConfig)
        try:
            scheduler = make_scheduler(c.scheduler, **c.parsed("scheduler_params"))
        except (TypeError, ValueError) as e:  # a bad knob: say which
            raise ParamError(f"parameter 'scheduler_params': no {c.scheduler} scheduler with these: {e}") from e
        try:
            self.engine = make_engine(c.engine, c.profile(), **c.parsed("engine_params"))
        except (TypeError, ValueError, OSError) as e:  # a bad knob or a missing model: say which
            raise ParamError(f"parameter 'engine_params': no {c.engine} engine with these: {e}") from e
        profile = self.engine.profile  # the given one, or one the engine measured (profile_file)
        self.spec = self._observation_spec(c, getattr(self.engine, "observation_spec", None))
        if not self.spec.encodings:
            raise ParamError(f"parameter 'obs_encodings': none of {list(c.obs_encodings)} is an image encoding the engine takes")
        self.clock = NodeClock(self)
        tier = Tier("edge", profile, max_batch=c.max_batch or None)
        tiers, self.engines = [tier], {"edge": self.engine}
        failing = "remote_tiers"
        try:  # cloud tiers: remote GPU servers, profiles fetched from them
            links = {}
            for i, rt in enumerate(c.parsed("remote_tiers")):
                rt = dict(rt)
                name, slots, mb = rt.pop("name", f"cloud{i}"), int(rt.pop("slots", 1)), rt.pop("max_batch", None)
                link = LinkEstimate(**{k: float(rt.pop(k)) for k in ("rtt_s", "bandwidth_bps") if k in rt})
                # The link's down-until times must be on the core's clock: the placement reads them.
                eng = self.engines[name] = make_engine("remote", None, link=link, clock=self.clock.now, **rt)
                tiers.append(Tier(name, eng.profile, slots=slots, max_batch=mb))
                links[name] = link
            failing = "placement_params"
            pp = c.parsed("placement_params")
            if c.placement == "shortest_delay":
                pp = {"links": links, "edge_tiers": [tier], **pp}
            placement = make_placement(c.placement, **pp)
        except (TypeError, ValueError, KeyError, RuntimeError) as e:  # a bad tier or an unreachable server
            for eng in self.engines.values():
                eng.close()
            raise ParamError(f"parameter '{failing}': cannot build it: {e}") from e
        try:
            self.core = ServingCore(
                scheduler, tiers, self.clock, horizon_params=c.parsed("horizon_params"),
                placement=placement, refresher=self._refresh, stale_obs_s=c.stale_obs_s,
            )
        except (TypeError, ValueError) as e:  # a horizon knob the policy does not take: say which
            raise ParamError(f"parameter 'horizon_params': {e}") from e
        self.lock = threading.Lock()  # guards core (through the runner), waiters, last_seen
        self.waiters: dict = {}
        self.last_seen: dict = {}
        self.refresh_service: dict = {}
        self.finished = Counter()
        self.served_by_tier = Counter()  # replies per tier: how much the placement offloaded
        self._t0 = self.clock.now()  # engine time is measured on the core's clock too
        self.in_server_s: deque = deque(maxlen=1024)  # received -> answered, the last ok rounds
        self.refresh_s: deque = deque(maxlen=1024)  # one batch's refresh, call to return
        self._fetch_clients: dict = {}  # (rclpy's Node keeps its own _clients)
        self._fetch_lock = threading.Lock()  # refreshes run from two threads (refresh ahead)
        # Rounds whose robot did not answer a refresh in time (oldest first, bounded): asked
        # ahead and failed, it is not asked again at dispatch, where the engine would wait.
        self._no_refresh: dict = {}
        self._group = ReentrantCallbackGroup()
        self.create_service(Infer, c.service, self._on_infer, qos_profile=service_qos(), callback_group=self._group)
        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(ExecutionProgress, c.progress_topic, self._on_progress, reliable,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self.diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(1.0 / c.diagnostics_hz, self._publish_diagnostics)
        self.create_timer(min(1.0, c.task_timeout_s / 4), self._reap)
        self.create_timer(30.0, _trim_heap)
        self._mem_base = None  # tracemalloc snapshot after memory_trace_after_s (memory_trace_file)
        if c.memory_trace_file:
            tracemalloc.start(1)
            self._mem_timer = self.create_timer(c.memory_trace_after_s, self._memory_baseline)
        # The core's one serving loop (core/runner.py): a thread per tier slot, edge and cloud at once.
        self.trace = StageTrace(time.monotonic_ns) if c.stage_trace_file else None
        # Refresh ahead: the next batch's stale observations are fetched while the current one
        # generates (within 2 refresh timeouts of its end), not while the engine waits.
        self.runner = Runner(self.core, self.engines, self._deliver, lock=self.lock, observer=self.trace,
                             on_given_up=self._given_up,
                             prefresh_lead_s=min(0.5 * c.stale_obs_s, 2 * c.refresh_timeout_s),
                             on_error=lambda d, e: self.get_logger().error(
                                 f"tier {d.tier} failed a batch of {len(d.requests)}: {e!r}; requeued")).start()
        # Other kinds of work (LLM plans, language, VLM questions) on the same server.
        self.side_services: dict = {}
        sp = c.parsed("services_params")
        for name in c.services:
            try:
                self.side_services[name] = SERVICES.create(name, node=self, **dict(sp.get(name, {})))
            except (TypeError, ValueError, OSError) as e:
                self.close()
                raise ParamError(f"parameter 'services_params': no {name} service with these: {e}") from e
        self.get_logger().info(
            f"serving on {c.service}: scheduler {c.scheduler}, engine {c.engine}, engine profile "
            f"{'given' if c.engine_batch_sizes else c.engine_profile} (saturation batch {profile.saturation_batch})"
        )

    # --- requests in (executor threads) --------------------------------------------
    def _on_infer(self, request, response):
        received = time.monotonic()
        if self.trace is not None:
            self.trace("received", [(request.task_id, request.round_id)])
        try:
            req = request_from_msg(request, self.spec)
        except RequestError as e:  # malformed before it reaches the core: count it there
            self.runner.count_error(e)
            fill_status(response.status, e.code, e.message)
            return response
        w = _Waiter(int(request.observation.timestep))
        language_id = ""
        if request.language_prompt:  # language from this round's prefill (seed 001): the vla_language service
            lang = getattr(self, "language_requests", None)
            try:
                if lang is None:
                    raise RequestError("this server decodes no language: start it with the vla_language service")
                language_id = lang.attach(req, request.language_prompt, int(request.language_max_tokens))
            except RequestError as e:
                self.runner.count_error(e)
                fill_status(response.status, e.code, e.message)
                return response

        def register(pending) -> None:  # under the runner's lock, before any batch can take it
            if pending.replay is not None:  # a re-sent round already answered: the cached reply
                w.reply = pending.replay
                w.event.set()
            else:  # a re-sent round still queued or generating: the newest call gets the reply
                self._answer((req.task_id, req.round_id), error=(
                    "duplicate_request", "this round was sent again: its reply goes to the newer call"))
                self.waiters[(req.task_id, req.round_id)] = w  # (one executor thread per round)
            self.last_seen[req.task_id] = time.monotonic()
            self.refresh_service[req.task_id] = request.refresh_service

        try:
            self.runner.submit(req, then=register)  # the core counts the errors it raises
        except RequestError as e:
            if language_id:
                self.language_requests.cancel(req, language_id)
            fill_status(response.status, e.code, e.message)
            return response
        w.event.wait()  # this executor thread only; other robots' calls run on others
        if w.error is not None:
            if language_id and getattr(self, "language_requests", None) is not None:
                self.language_requests.cancel(req, language_id)
            fill_status(response.status, *w.error)
            return response
        response.language_id = language_id
        fill_status(response.status, "ok")
        fill_chunk(response.chunk, w.reply, w.first_timestep, self.clock.now())
        self.in_server_s.append(time.monotonic() - received)
        if self.trace is not None:
            self.trace("answered", [(req.task_id, req.round_id)])
        return response

    def _on_progress(self, m) -> None:
        with self.lock:
            if m.task_id not in self.core.ledger.tasks:
                return
            self.last_seen[m.task_id] = time.monotonic()
            if m.task_done:
                info = ExecInfo(to_sec(m.exec_start), 0, float(m.control_hz) or 1.0)
                rec = self.core.finish_task(m.task_id, info)
                self.finished["tasks"] += 1
                self.finished["wait_sum"] += rec.closed_wait
                self._forget(m.task_id, ("task_dropped", "task finished"))

    def _reap(self) -> None:
        """A robot gone silent: drop its queued round and its task after task_timeout_s."""
        cutoff = time.monotonic() - self.config.task_timeout_s
        with self.lock:
            for tid in [t for t, seen in self.last_seen.items() if seen < cutoff]:
                self.get_logger().warning(f"task '{tid}' silent for {self.config.task_timeout_s} s: reaped")
                self.finished["reaped"] += 1
                self._forget(tid, ("task_dropped", f"task '{tid}' was reaped after {self.config.task_timeout_s} s of silence"))

    @staticmethod
    def _observation_spec(c: InferenceServerConfig, engine_spec: Optional[ObservationSpec]) -> ObservationSpec:
        """The checks a request passes before it is queued: the obs_* parameters where set,
        else what the engine's policy takes. A bad observation found only by the engine would
        fail its whole batch, and come back with every requeue."""
        e = engine_spec or ObservationSpec()
        return ObservationSpec(
            cameras=c.obs_cameras if c.obs_cameras >= 0 else e.cameras,
            width=c.obs_width if c.obs_width > 0 else e.width,
            height=c.obs_height if c.obs_height > 0 else e.height,
            encodings=tuple(x for x in c.obs_encodings if x in e.encodings),
            joints=c.obs_joints if c.obs_joints >= 0 else e.joints,
            max_bytes=c.max_request_bytes,
            max_task_id_bytes=c.max_task_id_bytes,
            max_instruction_bytes=c.max_instruction_bytes,
            max_images=c.max_images,
        )

    def _forget(self, tid: str, error: tuple) -> None:
        """Under the lock: drop the task; answer its waiting calls with `error`."""
        self.core.drop_task(tid)
        for eng in self.engines.values():
            eng.forget(tid)  # per-task observation history (n_obs_steps) goes with the task
        self.last_seen.pop(tid, None)
        self.refresh_service.pop(tid, None)
        for key in [k for k in self.waiters if k[0] == tid]:
            self._answer(key, error=error)

    def _answer(self, key: tuple, reply=None, error: Optional[tuple] = None) -> None:
        """Under the lock: wake the call waiting for round `key`, if any."""
        w = self.waiters.pop(key, None)
        if w is not None:
            w.reply, w.error = reply, error
            w.event.set()

    # --- replies (engine threads) ----------------------------------------------------------
    def _deliver(self, replies, _dispatch, _results) -> None:
        """Under the lock (Runner.finish): hand each reply to its waiting call."""
        for r in replies:
            self.served_by_tier[r.tier] += 1
            self._answer((r.task_id, r.round_id), reply=r)

    def _given_up(self, pendings, exc) -> None:
        """Under the lock (Runner): rounds in max_attempts failed batches get an error."""
        for p in pendings:
            self._answer((p.task_id, p.request.round_id), error=(
                "engine_failure", f"round {p.request.round_id} failed {p.failures} batches ({type(exc).__name__}); send it again"))

    def _refresh(self, reqs) -> list:
        """Algorithm 1 lines 20-21 over srv/FetchObservation, for a batch's stale requests: all
        asked at once, all waited for within one refresh_timeout_s, so a slow or silent robot
        costs the batch at most that, never the engine one timeout per robot. None for a robot
        that cannot answer in time: its round goes with the observation it has."""
        t0 = time.monotonic()
        try:
            return self._refresh_batch(reqs)
        finally:
            self.refresh_s.append(time.monotonic() - t0)

    def _refresh_batch(self, reqs) -> list:
        calls = []
        end = time.monotonic() + self.config.refresh_timeout_s  # one deadline for the whole batch
        for req in reqs:
            name = self.refresh_service.get(req.task_id)
            if (req.task_id, req.round_id) in self._no_refresh:  # it just failed to answer for this round
                calls.append(None)
                continue
            with self._fetch_lock:
                cli = self._fetch_clients.get(name) if name else None
                if name and cli is None:
                    cli = self._fetch_clients[name] = self.create_client(FetchObservation, name, callback_group=self._group)
            if cli is None or not cli.service_is_ready():
                calls.append(None)
                continue
            done = threading.Event()
            fut = cli.call_async(FetchObservation.Request(task_id=req.task_id, round_id=req.round_id))
            fut.add_done_callback(lambda _, done=done: done.set())
            calls.append((cli, fut, done))
        out = []
        for req, call in zip(reqs, calls):
            if call is None:
                out.append(None)
                continue
            cli, fut, done = call
            res = fut.result() if done.wait(max(0.0, end - time.monotonic())) else None
            if res is None or not res.ok:
                cli.remove_pending_request(fut)
                with self._fetch_lock:
                    self._no_refresh[(req.task_id, req.round_id)] = True
                    while len(self._no_refresh) > 1024:
                        self._no_refresh.pop(next(iter(self._no_refresh)))
                out.append(None)
                continue
            try:
                obs = observation_from_msg(res.observation, self.spec)
            except RequestError:
                out.append(None)
                continue
            out.append((obs, obs.stamp))
        return out

    # --- diagnostics ------------------------------------------------------------------
    def stats(self) -> dict:
        with self.lock:
            s = self.core.stats
            now = self.clock.now()
            wr = {t: self.core.ledger.wait_ratio(t, now) for t in self.core.ledger.tasks}
            r = self.runner
            r.account()  # the backlog integrals up to now
            load = {
                "engine_busy_s": r.busy_s["edge"],
                "backlog_threshold": r.backlog_threshold,
                "backlogged_s": r.backlogged_s,
                "busy_while_backlogged_s": r.busy_backlogged_s["edge"],
                "engine_utilization_when_backlogged": (r.busy_backlogged_s["edge"] / r.backlogged_s
                                                       if r.backlogged_s > 0 else None),
                "dispatch_ms_p50": _ms_pct(r.dispatch_s, 50), "dispatch_ms_p99": _ms_pct(r.dispatch_s, 99),
                "gap_to_dispatch_ms_p50": _ms_pct(r.gap_dispatch_s, 50), "gap_to_dispatch_ms_p99": _ms_pct(r.gap_dispatch_s, 99),
                "gap_handoff_ms_p50": _ms_pct(r.gap_handoff_s, 50), "gap_handoff_ms_p99": _ms_pct(r.gap_handoff_s, 99),
                "refresh_ms_p50": _ms_pct(self.refresh_s, 50), "refresh_ms_p99": _ms_pct(self.refresh_s, 99),
                "gap_refresh_ms_p50": _ms_pct(r.gap_refresh_s, 50), "gap_refresh_ms_p99": _ms_pct(r.gap_refresh_s, 99),
                "in_server_ms_p50": _ms_pct(self.in_server_s, 50), "in_server_ms_p99": _ms_pct(self.in_server_s, 99),
                "waiters": len(self.waiters), "reply_cache": len(self.core.last_reply),
                "refresh_clients": len(self._fetch_clients),
                "refreshed_ahead": r.prefreshes["ok"], "refresh_ahead_failures": r.prefreshes["failed"],
            }
            return {
                "queue_length": len(self.core.pending),
                "in_flight": len(self.core.inflight),
                "tasks": len(self.core.ledger.tasks),
                "served": s.completed,
                "served_by_tier": dict(self.served_by_tier),
                "batches": s.batches,
                "engine_utilization": self.runner.busy_s["edge"] / max(1e-9, self.clock.now() - self._t0),
                "tier_failures": dict(self.runner.failures),
                "late_replies_discarded": self.runner.late_replies,
                "resent_requests": s.resent_requests,
                "replies_replayed": s.replies_replayed,
                "given_up": s.given_up,
                "errors": dict(s.errors),
                "refreshes": s.refreshes,
                "refresh_failures": s.refresh_failures,
                "refresh_skipped": s.refresh_skipped,
                "refresh_success_recent": round(self.core.refresh_gate.success, 3),
                "mean_obs_age_s": s.obs_age_sum / s.obs_age_n if s.obs_age_n else 0.0,
                "finished_tasks": self.finished["tasks"],
                "reaped_tasks": self.finished["reaped"],
                **load,
                "wait_ratio": wr,
                "services": {n: svc.stats() for n, svc in self.side_services.items()},
            }

    def _publish_diagnostics(self) -> None:
        st = self.stats()
        kv = [KeyValue(key=k, value=str(v)) for k, v in st.items()
              if k not in ("errors", "wait_ratio", "served_by_tier", "services")]
        kv += [KeyValue(key=f"services/{n}/{k}", value=str(v)) for n, ss in sorted(st["services"].items())
               for k, v in sorted(ss.items())]
        kv += [KeyValue(key=f"served_by_tier/{k}", value=str(v)) for k, v in sorted(st["served_by_tier"].items())]
        kv += [KeyValue(key=f"errors/{k}", value=str(v)) for k, v in sorted(st["errors"].items())]
        kv += [KeyValue(key=f"wait_ratio/{t}", value=f"{w:.4f}") for t, w in sorted(st["wait_ratio"].items())]
        level = DiagnosticStatus.WARN if st["errors"] else DiagnosticStatus.OK
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [DiagnosticStatus(level=level, name="robotserve: inference_server", hardware_id=self.get_name(),
                                       message=f"{st['queue_length']} queued, {st['tasks']} tasks", values=kv)]
        self.diag.publish(msg)

    def _memory_baseline(self) -> None:
        self._mem_timer.cancel()
        self._mem_base = tracemalloc.take_snapshot()

    def _write_memory_trace(self) -> None:
        """The allocation sites that grew most since the baseline: where a slow leak lives."""
        if self._mem_base is None:
            return
        diff = tracemalloc.take_snapshot().compare_to(self._mem_base, "lineno")
        top = [{"site": str(d.traceback), "size_diff_kb": round(d.size_diff / 1024, 1), "count_diff": d.count_diff,
                "size_kb": round(d.size / 1024, 1)} for d in diff[:30]]
        total = sum(d.size_diff for d in diff) / 1024
        Path(self.config.memory_trace_file).write_text(json.dumps({"python_growth_kb": round(total, 1), "top": top}))

    def close(self) -> None:
        if self.config.memory_trace_file:
            self._write_memory_trace()
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


def main(argv=None) -> int:
    return run_nodes(lambda: [InferenceServerNode()], argv, threads=lambda nodes: nodes[0].config.threads)


if __name__ == "__main__":
    raise SystemExit(main())
