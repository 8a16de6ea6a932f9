"""The inference server node: srv/Infer in, trimmed action chunks out, the core in between.

Each Infer call validates and submits its request, then waits (in its own executor thread,
so no robot blocks another) until the engine worker thread has run its batch. The worker
loops: dispatch (scheduler + batching) -> refresh stale observations from the robots ->
engine -> complete (horizon policy, trim) -> wake the waiting calls. Robots report progress
on a topic; a finished task is closed in the ledger, a silent one is reaped after
task_timeout_s with its queued round dropped. Diagnostics go to /diagnostics.
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional

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
from ..srv import FetchObservation, Infer
from .common import NodeClock, ParamError, declare, run_nodes, service_qos, to_sec
from .convert import fill_chunk, fill_status, observation_from_msg, request_from_msg

DEFAULTS = {
    "service": "/robotserve/infer",
    "progress_topic": "/robotserve/progress",
    "scheduler": "kairos",
    "scheduler_params": "{}",  # JSON object, e.g. {"buckets": 10, "aging": 4}
    "engine": "simulated",
    "engine_params": '{"chunk_size": 50, "action_dim": 6, "steps": 10, "updates": true, "realtime": true}',
    "engine_batch_sizes": [1, 2, 4, 8, 16],
    "engine_latency_ms": [24.0, 28.5, 34.5, 46.6, 69.4],  # smolvla_tiny, measured on this CPU
    "max_batch": 0,  # 0: the profile's saturation batch
    "horizon_params": '{"static": {"h": 25}, "confidence": {"t": 0.4, "h_min": 10}}',
    "stale_obs_s": 0.25,
    "refresh_timeout_s": 0.05,
    "task_timeout_s": 10.0,
    "obs_cameras": -1,
    "obs_width": -1,
    "obs_height": -1,
    "obs_encodings": ["rgb8", "bgr8", "mono8"],
    "obs_joints": -1,
    "max_request_bytes": 8 << 20,
    "diagnostics_hz": 1.0,
    "threads": 128,
    # Cloud tiers: a JSON list of GPU servers (robotserve gpu-server), each an object with
    # "address" and optionally "name", "token_file", "root_cert", "server_name",
    # "deadline_s", "slots", "max_batch", "rtt_s", "bandwidth_bps" (starting guesses).
    "remote_tiers": "[]",
    "placement": "fill_in_order",  # shortest_delay: Algorithm 1 phase 3 (seed 000 §3.2.3)
    "placement_params": "{}",
    # Per-round stage times (CLOCK_MONOTONIC ns: received, submit, dispatch, engine_start,
    # engine_end, reply, answered) written here as JSON when the server stops; "" = off.
    "stage_trace_file": "",
}
WHY = {
    "scheduler": f"one of {', '.join(SCHEDULERS.names())}",
    "engine": f"one of {', '.join(ENGINES.names())}",
    "scheduler_params": "a JSON object of the scheduler's keyword parameters",
    "engine_params": "a JSON object of the engine's keyword parameters",
    "horizon_params": "a JSON object: policy name -> its keyword parameters",
    "engine_latency_ms": "as many positive latencies as engine_batch_sizes, batch 1 first",
    "threads": "Infer calls served at once (>= 4)",
    "remote_tiers": "a JSON list of objects, each with an 'address' (host:port of a robotserve gpu-server)",
    "placement": f"one of {', '.join(PLACEMENTS.names())}",
    "placement_params": "a JSON object of the placement's keyword parameters",
}


def _json_obj(s) -> bool:
    try:
        return isinstance(json.loads(s), dict)
    except (TypeError, ValueError):
        return False


def _json_remote_tiers(s) -> bool:
    try:
        v = json.loads(s)
    except (TypeError, ValueError):
        return False
    return isinstance(v, list) and all(isinstance(t, dict) and isinstance(t.get("address"), str) for t in v)


CHECKS = {
    "scheduler": lambda v: v in SCHEDULERS,
    "engine": lambda v: v in ENGINES,
    "scheduler_params": _json_obj,
    "engine_params": _json_obj,
    "horizon_params": _json_obj,
    "engine_latency_ms": lambda v: len(v) > 0 and all(x > 0 for x in v),
    "max_batch": lambda v: v >= 0,
    "stale_obs_s": lambda v: v > 0,
    "refresh_timeout_s": lambda v: v > 0,
    "task_timeout_s": lambda v: v > 0,
    "max_request_bytes": lambda v: v > 0,
    "diagnostics_hz": lambda v: v > 0,
    "threads": lambda v: v >= 4,
    "remote_tiers": lambda v: _json_remote_tiers(v),
    "placement": lambda v: v in PLACEMENTS,
    "placement_params": _json_obj,
}


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
        p = self.p = declare(self, DEFAULTS, CHECKS, WHY)
        if len(p["engine_batch_sizes"]) != len(p["engine_latency_ms"]):
            raise ParamError("parameters 'engine_batch_sizes' and 'engine_latency_ms' must have the same length")
        try:
            profile = EngineProfile(dict(zip(p["engine_batch_sizes"], p["engine_latency_ms"])))
            scheduler = make_scheduler(p["scheduler"], **json.loads(p["scheduler_params"]))
            self.engine = make_engine(p["engine"], profile, **json.loads(p["engine_params"]))
        except (TypeError, ValueError, OSError) as e:  # a bad knob or a missing model: say which
            raise ParamError(f"cannot build scheduler/engine from parameters: {e}") from e
        profile = self.engine.profile  # the given one, or one the engine measured (profile_file)
        self.spec = self._observation_spec(p, getattr(self.engine, "observation_spec", None))
        if not self.spec.encodings:
            raise ParamError(f"parameter 'obs_encodings': none of {p['obs_encodings']} is an image encoding the engine takes")
        self.clock = NodeClock(self)
        tier = Tier("edge", profile, max_batch=p["max_batch"] or None)
        tiers, self.engines = [tier], {"edge": self.engine}
        try:  # cloud tiers: remote GPU servers, profiles fetched from them
            links = {}
            for i, rt in enumerate(json.loads(p["remote_tiers"])):
                rt = dict(rt)
                name, slots, mb = rt.pop("name", f"cloud{i}"), int(rt.pop("slots", 1)), rt.pop("max_batch", None)
                link = LinkEstimate(**{k: float(rt.pop(k)) for k in ("rtt_s", "bandwidth_bps") if k in rt})
                # The link's down-until times must be on the core's clock: the placement reads them.
                eng = self.engines[name] = make_engine("remote", None, link=link, clock=self.clock.now, **rt)
                tiers.append(Tier(name, eng.profile, slots=slots, max_batch=mb))
                links[name] = link
            pp = json.loads(p["placement_params"])
            if p["placement"] == "shortest_delay":
                pp = {"links": links, "edge_tiers": [tier], **pp}
            placement = make_placement(p["placement"], **pp)
        except (TypeError, ValueError, KeyError, RuntimeError) as e:  # a bad tier or an unreachable server
            for eng in self.engines.values():
                eng.close()
            raise ParamError(f"cannot build the cloud tiers/placement from parameters: {e}") from e
        self.core = ServingCore(
            scheduler, tiers, self.clock, horizon_params=json.loads(p["horizon_params"]),
            placement=placement, refresher=self._refresh, stale_obs_s=p["stale_obs_s"],
        )
        self.lock = threading.Lock()  # guards core (through the runner), waiters, last_seen
        self.waiters: dict = {}
        self.last_seen: dict = {}
        self.refresh_service: dict = {}
        self.finished = Counter()
        self.served_by_tier = Counter()  # replies per tier: how much the placement offloaded
        self._t0 = self.clock.now()  # engine time is measured on the core's clock too
        self._fetch_clients: dict = {}  # (rclpy's Node keeps its own _clients)
        self._group = ReentrantCallbackGroup()
        self.create_service(Infer, p["service"], self._on_infer, qos_profile=service_qos(), callback_group=self._group)
        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(ExecutionProgress, p["progress_topic"], self._on_progress, reliable,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self.diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(1.0 / p["diagnostics_hz"], self._publish_diagnostics)
        self.create_timer(min(1.0, p["task_timeout_s"] / 4), self._reap)
        # The core's one serving loop (core/runner.py): a thread per tier slot, edge and cloud at once.
        self.trace = StageTrace(time.monotonic_ns) if p["stage_trace_file"] else None
        self.runner = Runner(self.core, self.engines, self._deliver, lock=self.lock, observer=self.trace,
                             on_error=lambda d, e: self.get_logger().error(
                                 f"tier {d.tier} failed a batch of {len(d.requests)}: {e!r}; requeued")).start()
        self.get_logger().info(
            f"serving on {p['service']}: scheduler {p['scheduler']}, engine {p['engine']} "
            f"(saturation batch {profile.saturation_batch})"
        )

    # --- requests in (executor threads) --------------------------------------------
    def _on_infer(self, request, response):
        if self.trace is not None:
            self.trace("received", [(request.task_id, request.round_id)])
        try:
            req = request_from_msg(request, self.spec)
        except RequestError as e:  # malformed before it reaches the core: count it there
            self.runner.count_error(e)
            fill_status(response.status, e.code, e.message)
            return response
        w = _Waiter(int(request.observation.timestep))

        def register(_pending) -> None:  # under the runner's lock, before any batch can take it
            self.waiters[(req.task_id, req.round_id)] = w
            self.last_seen[req.task_id] = time.monotonic()
            self.refresh_service[req.task_id] = request.refresh_service

        try:
            self.runner.submit(req, then=register)  # the core counts the errors it raises
        except RequestError as e:
            fill_status(response.status, e.code, e.message)
            return response
        w.event.wait()  # this executor thread only; other robots' calls run on others
        if w.error is not None:
            fill_status(response.status, *w.error)
            return response
        fill_status(response.status, "ok")
        fill_chunk(response.chunk, w.reply, w.first_timestep, self.clock.now())
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
        cutoff = time.monotonic() - self.p["task_timeout_s"]
        with self.lock:
            for tid in [t for t, seen in self.last_seen.items() if seen < cutoff]:
                self.get_logger().warning(f"task '{tid}' silent for {self.p['task_timeout_s']} s: reaped")
                self.finished["reaped"] += 1
                self._forget(tid, ("task_dropped", f"task '{tid}' was reaped after {self.p['task_timeout_s']} s of silence"))

    @staticmethod
    def _observation_spec(p, engine_spec: Optional[ObservationSpec]) -> ObservationSpec:
        """The checks a request passes before it is queued: the obs_* parameters where set,
        else what the engine's policy takes. A bad observation found only by the engine would
        fail its whole batch, and come back with every requeue."""
        e = engine_spec or ObservationSpec()
        return ObservationSpec(
            cameras=p["obs_cameras"] if p["obs_cameras"] >= 0 else e.cameras,
            width=p["obs_width"] if p["obs_width"] > 0 else e.width,
            height=p["obs_height"] if p["obs_height"] > 0 else e.height,
            encodings=tuple(x for x in p["obs_encodings"] if x in e.encodings),
            joints=p["obs_joints"] if p["obs_joints"] >= 0 else e.joints,
            max_bytes=p["max_request_bytes"],
        )

    def _forget(self, tid: str, error: tuple) -> None:
        """Under the lock: drop the task; answer its waiting calls with `error`."""
        self.core.drop_task(tid)
        for eng in self.engines.values():
            eng.forget(tid)  # per-task observation history (n_obs_steps) goes with the task
        self.last_seen.pop(tid, None)
        self.refresh_service.pop(tid, None)
        for key in [k for k in self.waiters if k[0] == tid]:
            w = self.waiters.pop(key)
            w.error = error
            w.event.set()

    # --- replies (engine threads) ----------------------------------------------------------
    def _deliver(self, replies, _dispatch, _results) -> None:
        """Under the lock (Runner.finish): hand each reply to its waiting call."""
        for r in replies:
            self.served_by_tier[r.tier] += 1
            w = self.waiters.pop((r.task_id, r.round_id), None)
            if w is not None:
                w.reply = r
                w.event.set()

    def _refresh(self, req):
        """Algorithm 1 lines 20-21 over srv/FetchObservation; None if the robot cannot answer."""
        name = self.refresh_service.get(req.task_id)
        if not name:
            return None
        cli = self._fetch_clients.get(name)
        if cli is None:
            cli = self._fetch_clients[name] = self.create_client(FetchObservation, name, callback_group=self._group)
        if not cli.service_is_ready():
            return None
        done = threading.Event()
        fut = cli.call_async(FetchObservation.Request(task_id=req.task_id, round_id=req.round_id))
        fut.add_done_callback(lambda _: done.set())
        if not done.wait(self.p["refresh_timeout_s"]) or fut.result() is None or not fut.result().ok:
            fut.cancel()
            return None
        try:
            obs = observation_from_msg(fut.result().observation, self.spec)
        except RequestError:
            return None
        return obs, obs.stamp

    # --- diagnostics ------------------------------------------------------------------
    def stats(self) -> dict:
        with self.lock:
            s = self.core.stats
            now = self.clock.now()
            wr = {t: self.core.ledger.wait_ratio(t, now) for t in self.core.ledger.tasks}
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
                "errors": dict(s.errors),
                "refreshes": s.refreshes,
                "refresh_failures": s.refresh_failures,
                "mean_obs_age_s": s.obs_age_sum / s.obs_age_n if s.obs_age_n else 0.0,
                "finished_tasks": self.finished["tasks"],
                "reaped_tasks": self.finished["reaped"],
                "wait_ratio": wr,
            }

    def _publish_diagnostics(self) -> None:
        st = self.stats()
        kv = [KeyValue(key=k, value=str(v)) for k, v in st.items() if k not in ("errors", "wait_ratio", "served_by_tier")]
        kv += [KeyValue(key=f"served_by_tier/{k}", value=str(v)) for k, v in sorted(st["served_by_tier"].items())]
        kv += [KeyValue(key=f"errors/{k}", value=str(v)) for k, v in sorted(st["errors"].items())]
        kv += [KeyValue(key=f"wait_ratio/{t}", value=f"{w:.4f}") for t, w in sorted(st["wait_ratio"].items())]
        level = DiagnosticStatus.WARN if st["errors"] else DiagnosticStatus.OK
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [DiagnosticStatus(level=level, name="robotserve: inference_server", hardware_id=self.get_name(),
                                       message=f"{st['queue_length']} queued, {st['tasks']} tasks", values=kv)]
        self.diag.publish(msg)

    def close(self) -> None:
        with self.lock:
            for w in self.waiters.values():
                w.error = ("shutting_down", "the server is shutting down")
                w.event.set()
            self.waiters.clear()
        self.runner.close()
        for eng in self.engines.values():
            eng.close()
        if self.trace is not None:
            Path(self.p["stage_trace_file"]).write_text(json.dumps(self.trace.snapshot()))


def main(argv=None) -> int:
    return run_nodes(lambda: [InferenceServerNode()], argv, threads=lambda nodes: nodes[0].p["threads"])


if __name__ == "__main__":
    raise SystemExit(main())
