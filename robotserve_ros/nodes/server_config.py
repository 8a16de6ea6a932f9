"""The inference server's parameter tree (nested ROS parameters, nav2-like), checked at start.

    inference_server:
      ros__parameters:
        scheduler: {name: kairos, kairos: {buckets: 10, aging: 4}}
        engine: {name: lerobot, profile: diffusion_arm, lerobot: {policy_dir: models/x, device: cpu}}
        horizon: {static: {h: 20}, confidence: {t: 0.4, h_min: 10}}
        remote_tiers: [cloud]             # each named one is a section beside the others
        cloud: {address: gpu1:50051, token_file: /run/token, slots: 2}
        placement: {name: shortest_delay}
        services: [planner]               # likewise, each with its section
        planner: {scheduler: timely, max_batch: 8}

No rclpy here: the tests and `docs/parameters.md` read it without ROS.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Optional

from ..config import (Config, ConfigError, EngineConfig, PluginConfig, SchedulerConfig, check, check_image_transport,
                      check_one_of, from_tree, param)
from ..core.observation import ObservationSpec
from ..core.placement import PLACEMENTS
from .services import SERVICES


@dataclass(frozen=True)
class RemoteTierConfig(Config):
    """A cloud tier: a `robotserve gpu-server` (seed 000 §3.2.3), its link's starting guesses."""

    address: str = param("", "host:port of a robotserve gpu-server (required)")
    token_file: str = param("", "file holding the server's token ('' = none)")
    root_cert: str = param("", "CA certificate (PEM) that turns TLS on ('' = plaintext)")
    server_name: str = param("", "TLS name to expect when it differs from the address")
    deadline_s: float = param(2.0, "one call's deadline, > 0")
    connect_timeout_s: float = param(5.0, "how long the server may take to answer at start, > 0")
    ping_interval_s: float = param(1.0, "how often the link's round trip is measured, > 0")
    slots: int = param(1, "batches in flight on it at once, >= 1")
    max_batch: int = param(0, "largest batch sent, >= 0 (0: its profile's saturation batch)")
    rtt_s: float = param(0.1, "starting guess of the round trip, s, >= 0")
    bandwidth_bps: float = param(125e6, "starting guess of the bandwidth, bytes/s, > 0")
    image_transport: str = param("raw", "cameras on the link: raw tensors, or jpeg / png files (docs/transport.md)")
    image_quality: int = param(90, "jpeg quality 1..100 (png: compression level 0..9)")

    def check(self) -> None:
        check_image_transport(self.image_transport, self.image_quality)
        host, sep, port = self.address.rpartition(":")
        check(bool(host) and bool(sep) and port.isdigit(), "address", self.address, "is not host:port")
        for name in ("deadline_s", "connect_timeout_s", "ping_interval_s", "bandwidth_bps"):
            check(getattr(self, name) > 0, name, getattr(self, name), "is not > 0")
        check(self.slots >= 1, "slots", self.slots, "is not >= 1")
        check(self.max_batch >= 0, "max_batch", self.max_batch, "is not >= 0")
        check(self.rtt_s >= 0, "rtt_s", self.rtt_s, "is not >= 0")

    def engine_params(self) -> dict:
        """The remote engine's keyword parameters (transport/remote_engine.py)."""
        kw = {"address": self.address, "deadline_s": self.deadline_s, "connect_timeout_s": self.connect_timeout_s,
              "ping_interval_s": self.ping_interval_s, "image_transport": self.image_transport,
              "image_quality": self.image_quality}
        kw.update({k: getattr(self, k) for k in ("token_file", "root_cert", "server_name") if getattr(self, k)})
        return kw


@dataclass(frozen=True)
class RayTierConfig(Config):
    """A Ray Serve pool of policy replicas (transport/ray_pool.py, issue 24): Ray places,
    restarts and scales the replicas; the server's scheduler orders and batches their work."""

    replicas: int = param(1, "replicas, >= 1 (a fixed pool; ignored when max_replicas > 0)")
    min_replicas: int = param(0, "autoscaling: fewest replicas, >= 0")
    max_replicas: int = param(0, "autoscaling: most replicas, >= min_replicas (0: a fixed pool of `replicas`)")
    num_cpus: float = param(0.0, "CPUs each replica reserves, >= 0")
    num_gpus: float = param(0.0, "GPUs each replica reserves, >= 0 (fractions share one)")
    resources: dict = param({}, "custom resources each replica needs, e.g. {arm_pool: 1}")
    accelerator_type: str = param("", "the accelerator a replica's node must have, e.g. A100 ('' = any)")
    max_replicas_per_node: int = param(0, "most replicas on one node, >= 0 (0: no limit)")
    address: str = param("", "host:port of a running Ray cluster ('' = start a local one on 127.0.0.1)")
    temp_dir: str = param("", "the local cluster's temp folder ('' = Ray's default)")
    local_cpus: float = param(2.0, "CPUs of a local cluster, > 0")
    engine: str = param("", "the replicas' engine ('' = the server's engine section, its profile and knobs)")
    engine_params: dict = param({}, "that engine's keyword parameters (when engine is set)")
    call_timeout_s: float = param(30.0, "a batch not answered within this is requeued, > 0")
    max_batch: int = param(0, "largest batch sent, >= 0 (0: the profile's saturation batch)")
    measure_repeats: int = param(0, "> 0: the tier's profile is measured through the pool at start (this many "
                                 "timed batches per size; Ray's cost included), >= 0 (0: the engine's profile)")
    app: str = param("", "the Serve application's name, unique in the cluster ('' = robotserve-<tier>-<pid>)")

    def check(self) -> None:
        check(self.replicas >= 1, "replicas", self.replicas, "is not >= 1")
        check(self.min_replicas >= 0, "min_replicas", self.min_replicas, "is not >= 0")
        check(self.max_replicas == 0 or self.max_replicas >= max(1, self.min_replicas), "max_replicas",
              self.max_replicas, "is not 0 or >= max(1, min_replicas)")
        for name in ("num_cpus", "num_gpus"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "is not >= 0")
        for k, v in self.resources.items():
            check(isinstance(v, (int, float)) and v > 0, f"resources.{k}", v, "is not a number > 0")
        check(self.max_replicas_per_node >= 0, "max_replicas_per_node", self.max_replicas_per_node, "is not >= 0")
        if self.address:
            host, sep, port = self.address.rpartition(":")
            check(bool(host) and bool(sep) and port.isdigit(), "address", self.address, "is not host:port")
        check(self.local_cpus > 0, "local_cpus", self.local_cpus, "is not > 0")
        check(self.call_timeout_s > 0, "call_timeout_s", self.call_timeout_s, "is not > 0")
        check(self.max_batch >= 0, "max_batch", self.max_batch, "is not >= 0")
        check(self.measure_repeats >= 0, "measure_repeats", self.measure_repeats, "is not >= 0")
        if self.engine:  # the replicas' engine and its knobs, as the `ray` engine checks them
            from ..engines import ENGINES

            ENGINES.check("ray", {"engine": self.engine, "engine_params": self.engine_params})

    def engine_params_for(self, engine: EngineConfig, tier: str, pid: int):
        """(profile, the `ray` engine's keyword parameters): the replicas run `engine` (the
        server's section) unless this section names its own."""
        kw = {"app": self.app or f"robotserve-{tier}-{pid}"}
        kw.update((k, getattr(self, k)) for k in ("replicas", "min_replicas", "max_replicas", "num_cpus", "num_gpus",
                                                  "accelerator_type", "max_replicas_per_node", "address", "temp_dir",
                                                  "local_cpus", "call_timeout_s", "measure_repeats"))
        kw["resources"] = dict(self.resources)
        if self.engine:
            return None, {**kw, "engine": self.engine, "engine_params": dict(self.engine_params)}
        return engine.engine_profile(), {**kw, "engine": engine.name, "engine_params": dict(engine.chosen)}


@dataclass(frozen=True)
class PlacementConfig(PluginConfig):
    name: str = param("fill_in_order", "which tier a batch goes to: fill_in_order, or shortest_delay "
                      "(seed 000 §3.2.3: offload when the cloud answers sooner)")
    params: dict = param({}, "each placement's keyword parameters under its name", beside=True)

    @classmethod
    def registry(cls):
        return PLACEMENTS


EXECUTORS = ("auto", "multithreaded", "single")  # rclpy's; its EventsExecutor cannot send a deferred reply (docs/scale.md)
ENGINE_PROCESSES = ("inline", "separate")  # where the core, scheduler and engine run (serve/core_process.py)


def executor_kind(executor: str, services) -> str:
    """The executor a server runs: 'auto' is single without side services (a third of the
    multithreaded one's CPU per round: its pool's wake-ups each rebuild the wait set,
    docs/scale.md), multithreaded with them (their calls wait in a thread)."""
    if executor != "auto":
        return executor
    return "multithreaded" if services else "single"


@dataclass(frozen=True)
class QueueConfig(Config):
    """srv/Infer's queues (issue 29): DDS keeps `depth` requests until a thread takes them
    (past it DDS drops the oldest, which nobody can answer); at most `max_waiting` calls wait
    for their round, the next is answered OVERLOADED at once. A waiting call holds no thread
    (its reply is deferred, nodes/deferred.py): max_waiting bounds the rounds held in memory."""

    # 10, rclpy's default: robots re-send an unanswered round themselves, so a deep queue only keeps
    # stale re-sends the server must answer one by one while it is behind (1000 lost 3-19 rounds in
    # 4 of 6 fleet-live x100 runs, replies 10-22 s late; 10: 0 lost; again with deferred replies,
    # issue 26: 35 lost at 1000, 0 at 10). A client that carries many robots' calls at once (a light
    # fleet host: 150) needs it deeper: at 10 its burst of round 0s is dropped (reports/live/depth).
    depth: int = param(10, "DDS history depth of srv/Infer's request and reply queues, >= 1 (deeper for "
                           "clients that carry many robots' calls at once)")
    max_waiting: int = param(4096, "Infer calls waiting for their round at once (they hold no thread), "
                                   "past it OVERLOADED, >= 1")

    def check(self) -> None:
        check(self.depth >= 1, "depth", self.depth, "is not >= 1")
        check(self.max_waiting >= 1, "max_waiting", self.max_waiting, "is not >= 1")


@dataclass(frozen=True)
class AdmissionConfig(Config):
    """Which robots the server takes (core/admission.py): past its capacity a new robot's first
    round is refused OVERLOADED with the reason, counted; admitted robots' rounds are never
    refused for it. Off by default (both 0/false)."""

    max_tasks: int = param(0, "most robots admitted at once, >= 0 (0: no fixed cap)")
    by_capacity: bool = param(False, "admit a new robot only while the admitted ones ask fewer rounds/s than the "
                                     "tiers serve at their batch limits (engine profiles) x headroom")
    headroom: float = param(1.0, "with by_capacity: the share of that capacity robots may ask for, > 0")

    def check(self) -> None:
        check(self.max_tasks >= 0, "max_tasks", self.max_tasks, "is not >= 0")
        check(self.headroom > 0, "headroom", self.headroom, "is not > 0")


@dataclass(frozen=True)
class TaskAuthConfig(Config):
    """Tasks bound to their first robot by a per-task MAC (core/task_auth.py)."""

    key_dir: str = param("", "folder of robot keys, <robot id>.key each (shared with that robot): every Infer request "
                             "and progress message must carry a valid HMAC; '' = off (a WARNING: any node can end "
                             "or take another robot's task)")
    max_skew_s: float = param(5.0, "an auth_stamp further than this from the server's clock is refused, > 0")

    def check(self) -> None:
        check(self.max_skew_s > 0, "max_skew_s", self.max_skew_s, "is not > 0")


@dataclass(frozen=True)
class MetricsConfig(Config):
    """Prometheus metrics (serve/metrics.py, docs/metrics.md) on http://address:port/metrics."""

    port: int = param(0, "-1: off; 0: a free port (shown in /diagnostics as metrics_port); else this port, 1..65535")
    address: str = param("127.0.0.1", "the address it listens on (loopback: scraped from this host, or through a proxy)")
    per_robot: bool = param(True, "per-robot series too (round latency histogram, rounds served; a series per robot)")

    def check(self) -> None:
        check(-1 <= self.port <= 65535, "port", self.port, "is not -1 (off), 0 (a free port) or 1..65535")
        check(bool(self.address), "address", self.address, "is empty")


_SIM_ENGINE = {"chunk_size": 50, "action_dim": 6, "steps": 10, "updates": True, "realtime": True}


@dataclass(frozen=True)
class InferenceServerConfig(Config):
    service: str = param("/robotserve/infer", "the srv/Infer service robots call")
    progress_topic: str = param("/robotserve/progress", "where robots report execution progress")
    queue_topic: str = param("/robotserve/queue_wait", "where the server publishes how long a round sent now is "
                                                    "expected to wait (std_msgs/Float64, s; robots re-send no sooner); '' = off")
    queue_hz: float = param(4.0, "queue_topic publication rate, > 0")
    scheduler: SchedulerConfig = param(SchedulerConfig(), "the scheduler: name, and each one's knobs under its name")
    engine: EngineConfig = param(EngineConfig(profile="smolvla_tiny", params={"simulated": _SIM_ENGINE}),
                                 "the engine: name, engine profile, and each one's knobs under its name")
    max_batch: int = param(0, "largest batch the edge tier runs, >= 0 (0: the profile's saturation batch)")
    horizon: dict = param({"static": {"h": 25}, "confidence": {"t": 0.4, "h_min": 10}},
                          "horizon policy name -> its keyword parameters (core/horizon)")
    stale_obs_s: float = param(0.25, "an observation older than this at dispatch is refreshed from the robot, > 0")
    max_obs_age_s: float = param(0.0, "a round whose observation is older than this when its batch begins (after "
                                      "the refresh) is not generated: its robot is answered STALE_OBSERVATION and "
                                      "sends it again; >= 0 (0: off)")
    refresh_timeout_s: float = param(0.05, "how long a refresh may take before the old observation is used, > 0")
    refresh_topic: str = param("", "robots' newest observations (srv/Infer requests) on this topic, sensor-data "
                               "QoS, the latest per task read at dispatch (nodes/refresh.py; empty: none)")
    task_timeout_s: float = param(10.0, "a task whose robot is silent this long is reaped, > 0")
    obs_cameras: int = param(-1, "images per observation (< 0: what the engine takes)")
    obs_width: int = param(-1, "image width (<= 0: what the engine takes)")
    obs_height: int = param(-1, "image height (<= 0: what the engine takes)")
    obs_encodings: tuple[str, ...] = param(("rgb8", "bgr8", "mono8"), "image encodings accepted (of those the engine takes)")
    obs_joints: int = param(-1, "joint positions per observation (< 0: what the engine takes)")
    joint_names: tuple[str, ...] = param((), "what the action columns command, sent as ActionChunk.joint_names "
                                         "(empty: the policy's action feature names, when it has them)")
    max_request_bytes: int = param(8 << 20, "largest observation payload accepted, > 0")
    max_task_id_bytes: int = param(256, "longest task id (and horizon name, refresh service) accepted, UTF-8 bytes, > 0")
    max_instruction_bytes: int = param(4096, "longest instruction accepted, UTF-8 bytes, > 0")
    max_images: int = param(16, "most images in one observation, > 0")
    diagnostics_hz: float = param(1.0, "/diagnostics publication rate, > 0")
    diagnostics_window_s: float = param(30.0, "/diagnostics' level follows the share of requests refused in this "
                                        "many recent seconds (OK: none, WARN: some, ERROR: half or more), > 0")
    threads: int = param(128, "executor threads, >= 4 (an Infer call holds one only while it is checked and queued; side services' calls hold one while they wait)")
    executor: str = param("auto", "rclpy's executor: multithreaded (`threads` of them), single (one thread, without "
                          "services: theirs wait in a thread) or auto (single unless `services`); bench fleet-live "
                          "--executors compares them")
    infer_queue: QueueConfig = param(QueueConfig(), "srv/Infer's queues: DDS depth, calls waiting at once (OVERLOADED past)")
    task_auth: TaskAuthConfig = param(TaskAuthConfig(), "tasks bound to their robot by HMAC: key_dir, max_skew_s")
    metrics: MetricsConfig = param(MetricsConfig(), "Prometheus metrics: port (-1 off, 0 a free one), address, per_robot")
    admission: AdmissionConfig = param(AdmissionConfig(), "robots admitted up to capacity: max_tasks, by_capacity, "
                                       "headroom (OVERLOADED past it)")
    remote_tiers: tuple[str, ...] = param((), "cloud tiers (GPU servers): names, each a section beside these "
                                          "(address, token_file, root_cert, slots, ...)")
    ray_tiers: tuple[str, ...] = param((), "Ray Serve pools of policy replicas: names, each a section beside "
                                       "these (replicas, num_gpus, resources, address, ...)")
    placement: PlacementConfig = param(PlacementConfig(), "the placement: name, and each one's knobs under its name")
    services: tuple[str, ...] = param((), "services beside srv/Infer (LLM plans, language, VLM): names from "
                                      "robotserve_ros/nodes/services, each with an optional section of its parameters")
    sections: dict = param({}, "the named remote tiers' and services' sections", beside=True)
    memory_trace_file: str = param("", "trace Python allocations (tracemalloc) and write the 30 sites that grew "
                                   "most from memory_trace_after_s to shutdown here as JSON; '' = off")
    memory_trace_after_s: float = param(120.0, "when the memory trace's baseline is taken, s after start, > 0")
    engine_process: str = param("inline", "inline: the core, scheduler and engine run in this process (the faster "
                                "one on a CPU-only machine: docs/nodes.md); separate: in an engine core process of "
                                "their own that this node starts and talks to over local ZMQ (serve/core_process.py)")
    stage_trace_file: str = param("", "write per-round stage times (CLOCK_MONOTONIC ns: received, submit, dispatch, "
                                  "engine_start, engine_end, reply, answered) here as JSON on shutdown; '' = off")

    @classmethod
    def extra_keys(cls, tree: Mapping, extra: dict) -> dict:
        """nav2's shape: a key beside the fields is the section of a named tier or service."""
        named = set(tree.get("remote_tiers") or ()) | set(tree.get("services") or ()) | set(tree.get("ray_tiers") or ())
        for k, v in extra.items():
            if k not in named:
                allowed = [f.name for f in fields(cls) if f.name != "sections"]
                raise ConfigError(k, f"is not a parameter here; allowed: {', '.join(allowed)}, or the section of "
                                  "a name in remote_tiers, ray_tiers or services")
            check(isinstance(v, Mapping), k, v, "is not a section")
        return {"sections": {**tree.get("sections", {}), **extra}}

    def check(self) -> None:
        from ..core.horizon import HORIZON_POLICIES

        for name in self.services:
            check_one_of("services", name, SERVICES.names())
            try:  # its section's knobs, as the service declares them, before anything starts
                SERVICES.check(name, self.service_params(name))
            except ConfigError as e:
                raise e.under(name) from None
        for name, kw in self.horizon.items():
            check_one_of("horizon", name, HORIZON_POLICIES.names())
            check(isinstance(kw, dict), f"horizon.{name}", kw, "is not a section of keyword parameters")
            try:  # its knobs, as the policy declares them (core/horizon), before anything starts
                HORIZON_POLICIES.check(name, kw)
            except ConfigError as e:
                raise e.under(f"horizon.{name}") from None
        fieldnames = {f.name for f in fields(self)}
        for name in self.remote_tiers:
            check(name not in fieldnames and name not in self.services, "remote_tiers", name,
                  "is taken: a tier's name may not be a parameter's or a service's")
            check(name in self.sections, "remote_tiers", name, f"has no section '{name}' (with its address)")
        for name in self.ray_tiers:
            check(name not in fieldnames and name not in self.services and name not in self.remote_tiers, "ray_tiers",
                  name, "is taken: a tier's name may not be a parameter's, a service's or a remote tier's")
            check(name in self.sections, "ray_tiers", name, f"has no section '{name}' (replicas: 1 at least)")
        self.tiers()  # each tier's section checked now
        self.ray_tier_configs()
        for name in ("stale_obs_s", "refresh_timeout_s", "task_timeout_s", "max_request_bytes", "diagnostics_hz", "queue_hz",
                     "diagnostics_window_s", "memory_trace_after_s", "max_task_id_bytes", "max_instruction_bytes", "max_images"):
            check(getattr(self, name) > 0, name, getattr(self, name), "is not > 0")
        check(self.max_batch >= 0, "max_batch", self.max_batch, "is not >= 0 (0: the saturation batch)")
        check(self.max_obs_age_s >= 0, "max_obs_age_s", self.max_obs_age_s, "is not >= 0 (0: off)")
        check(self.threads >= 4, "threads", self.threads, "is not >= 4")
        check_one_of("executor", self.executor, EXECUTORS)
        check_one_of("engine_process", self.engine_process, ENGINE_PROCESSES)
        check(self.engine_process == "inline" or not self.services, "engine_process", self.engine_process,
              "cannot serve `services` (they run on this process's engine): use inline")
        check(self.engine_process == "inline" or not self.stage_trace_file, "engine_process", self.engine_process,
              "cannot write a stage_trace_file (the rounds' stages are in the core process): use inline")
        check(self.executor != "single" or not self.services, "executor", self.executor,
              "cannot serve `services` (their calls wait in an executor thread): use multithreaded")

    def check_executor(self, running) -> None:
        """Side services need the multithreaded executor: a process whose `executor: auto`
        chose the single one at start (no services then) cannot take them on a reconfigure."""
        from rclpy.executors import SingleThreadedExecutor

        if self.services and isinstance(running, SingleThreadedExecutor):
            raise ConfigError("services", "need executor: multithreaded; this process runs the single one "
                              "(executor: auto without services at start): restart it")

    @property
    def max_waiting(self) -> int:
        return self.infer_queue.max_waiting

    def tiers(self) -> dict:
        """Cloud tier name -> its RemoteTierConfig, in remote_tiers order."""
        return {n: from_tree(RemoteTierConfig, self.sections.get(n), n) for n in self.remote_tiers}

    def ray_tier_configs(self) -> dict:
        """Ray tier name -> its RayTierConfig, in ray_tiers order."""
        return {n: from_tree(RayTierConfig, self.sections.get(n), n) for n in self.ray_tiers}

    def service_params(self, name: str) -> dict:
        return dict(self.sections.get(name, {}))

    def observation_spec(self, engine_spec: Optional[ObservationSpec]) -> ObservationSpec:
        """The checks a request passes before it is queued: the obs_* parameters where set,
        else what the engine's policy takes. A bad observation found only by the engine would
        fail its whole batch, and come back with every requeue."""
        e = engine_spec or ObservationSpec()
        spec = ObservationSpec(
            cameras=self.obs_cameras if self.obs_cameras >= 0 else e.cameras,
            width=self.obs_width if self.obs_width > 0 else e.width,
            height=self.obs_height if self.obs_height > 0 else e.height,
            encodings=tuple(x for x in self.obs_encodings if x in e.encodings),
            joints=self.obs_joints if self.obs_joints >= 0 else e.joints,
            max_bytes=self.max_request_bytes, max_task_id_bytes=self.max_task_id_bytes,
            max_instruction_bytes=self.max_instruction_bytes, max_images=self.max_images,
        )
        if not spec.encodings:
            raise ConfigError("obs_encodings", f"none of {list(self.obs_encodings)} is an image encoding the engine takes")
        return spec
