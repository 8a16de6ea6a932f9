"""The LeRobot endpoint's configuration: frozen, checked once when made. Its scheduler and
engine are the same SchedulerConfig/EngineConfig (robotserve_ros/config.py) the inference
server node's `scheduler` and `engine` sections build, here from flat fields."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...config import ConfigError, EngineConfig, SchedulerConfig, engine_config, relabel


@dataclass(frozen=True)
class CompatConfig:
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (tests)
    fps: float = 30.0  # the clients' control rate: action timestamps, first rate estimate
    scheduler: str = "remaining"  # docs/defaults.md; "kairos": seed 000 §3.2.2
    scheduler_params: dict = field(default_factory=dict)
    engine: str = "lerobot"  # or "simulated": a profile-driven stand-in, no model
    engine_params: dict = field(default_factory=dict)  # e.g. device, seed, profile_file
    profile_ms: Optional[dict] = None  # batch -> ms; None: the engine's own (or 30 ms flat for simulated)
    max_batch: Optional[int] = None  # None: the profile's saturation batch
    policy_dirs: tuple = ()  # policies may only be loaded from under these; empty: any local dir
    allow_hub: tuple = ()  # hub id patterns clients may name (transport/policy_source.py); empty: none
    get_actions_timeout_s: float = 2.0  # LeRobot's obs_queue_timeout
    client_timeout_s: float = 10.0  # a client silent this long is gone: its task is dropped
    similarity_atol: float = 1.0  # LeRobot's observations_similar tolerance
    # A queued observation older than this is swapped for the client's newest one at dispatch
    # (seed 000 Algorithm 1 lines 20-21); None: never (observation age is recorded either way).
    stale_obs_s: Optional[float] = None
    # An observation that arrived while its client's chunk was generating: False, the chunk
    # answers it (dropped, counted `answered`); True, predicted as soon as the chunk is out, as
    # LeRobot's own server does (docs/lerobot.md, "Held observations").
    replan_held: bool = False
    max_payload_bytes: int = 32 << 20  # one observation or policy setup, after joining pieces
    # What one payload may expand into (safe_pickle.Limits; docs/security.md): the data it
    # builds is bounded by max_payload_bytes too, checked before anything is allocated.
    max_array_elements: int = 32 << 20  # elements of all its arrays together
    max_nesting_depth: int = 32  # containers within containers
    max_string_bytes: int = 64 << 10  # one string (task, key, path)
    max_pickle_ops: int = 200_000  # pickle opcodes: bounds the time one payload takes
    max_expanded_items: int = 1 << 20  # container items the payload expands into, shared references counted each use
    max_container_items: int = 4096  # one dict or set (keys str/bytes only: no hash flooding)
    # Uploads (SendObservations streams): each holds a handler thread until it ends.
    upload_timeout_s: float = 10.0  # a stream still open after this is cancelled
    max_upload_pieces: int = 1024  # transfer pieces in one stream (LeRobot sends 2 MiB pieces)
    max_uploads: Optional[int] = None  # streams open at once; None: half the threads
    # gRPC handler threads: each robot holds about two (GetActions waiting up to get_actions_timeout_s,
    # an observation stream), so 100 robots hold 200 (test_fleet_budget.py); idle ones cost no CPU
    threads: int = 256
    # Calls (transport/call_guard.py): no client can hold the handler threads.
    receive_timeout_s: float = 5.0  # a unary call's request must arrive by then (LeRobot sends it at once)
    max_calls_per_peer: int = 8  # calls in flight from one connection (LeRobot's client has at most three)
    max_calls: Optional[int] = None  # calls in flight in total; None: 2 x threads
    # Bounded state: sessions and policy groups, each refused or evicted past its cap, counted.
    max_sessions: int = 256  # sessions at once; a new one evicts the least recently seen
    max_session_bytes: int = 512 << 20  # observations sessions hold (newest + held), all together: LRU eviction past it
    max_policy_groups: int = 8  # policies loaded at once (each an engine and its runner's threads)
    policy_idle_s: float = 300.0  # a policy no session has used this long is unloaded
    keep_trace: bool = False  # remember every delivered action per task (tests)
    # Real-time chunking: each round's leftover rebuilt from the session's last chunk and its
    # timestep (core/rtc_rebuild.py), for an engine that inpaints (docs/rtc_serving.md).
    rtc: bool = False

    def __post_init__(self) -> None:
        def positive(name: str, v, kind=(int, float), zero_ok=False) -> None:
            if isinstance(v, bool) or not isinstance(v, kind) or not (v >= 0 if zero_ok else v > 0):
                what = "an integer" if kind is int else "a number"
                raise ValueError(f"{name} must be {what} {'>= 0' if zero_ok else '> 0'}, got {v!r}")

        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in 0..65535, got {self.port!r}")
        for name in ("fps", "get_actions_timeout_s", "client_timeout_s"):
            positive(name, getattr(self, name))
        positive("similarity_atol", self.similarity_atol, zero_ok=True)
        if not isinstance(self.replan_held, bool):
            raise ValueError(f"replan_held must be true or false, got {self.replan_held!r}")
        if self.stale_obs_s is not None:
            positive("stale_obs_s", self.stale_obs_s, zero_ok=True)
        for name in ("upload_timeout_s", "receive_timeout_s", "policy_idle_s"):
            positive(name, getattr(self, name))
        for name in ("max_payload_bytes", "threads", "max_array_elements", "max_nesting_depth", "max_string_bytes",
                     "max_pickle_ops", "max_upload_pieces", "max_expanded_items", "max_container_items",
                     "max_calls_per_peer", "max_sessions", "max_session_bytes", "max_policy_groups"):
            positive(name, getattr(self, name), kind=int)
        if self.max_uploads is not None:
            positive("max_uploads", self.max_uploads, kind=int)
            if self.max_uploads >= self.threads:
                raise ValueError(f"max_uploads must be < threads ({self.threads}), so stalled uploads cannot take "
                                 f"every handler thread; got {self.max_uploads}")
        if self.max_batch is not None:
            positive("max_batch", self.max_batch, kind=int)
        if self.max_calls is not None:
            positive("max_calls", self.max_calls, kind=int)
        for name in ("scheduler_params", "engine_params"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a dict, got {type(getattr(self, name)).__name__}")
        flat = {"name": "scheduler", "scheduler": "scheduler_params", "batch_sizes": "profile_ms",
                "latency_ms": "profile_ms", self.scheduler: "scheduler_params"}  # a knob: scheduler_params.<knob>
        try:  # a bad knob fails here, not when the first client connects
            self.scheduler_config.build()
            self.engine_config  # noqa: B018 (checked when made)
        except (TypeError, ValueError) as e:  # a profile_ms of non-numbers; a ConfigError
            raise relabel(e, flat) if isinstance(e, ConfigError) else ValueError(f"profile_ms: {e}") from None
        if isinstance(self.policy_dirs, str) or not all(isinstance(d, str) and d for d in self.policy_dirs):
            raise ValueError(f"policy_dirs must be a sequence of directory names, got {self.policy_dirs!r}")
        object.__setattr__(self, "policy_dirs", tuple(self.policy_dirs))
        if isinstance(self.allow_hub, str) or not all(isinstance(p, str) and p for p in self.allow_hub):
            raise ValueError(f"allow_hub must be a sequence of hub id patterns, got {self.allow_hub!r}")
        object.__setattr__(self, "allow_hub", tuple(self.allow_hub))

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(name=self.scheduler, params={self.scheduler: dict(self.scheduler_params)})

    @property
    def engine_config(self) -> EngineConfig:
        """The engine as the node's `engine` section would give it (profile_ms: an explicit
        profile; None: the engine's own)."""
        try:
            return engine_config(self.engine, self.engine_params, self.profile_ms)
        except ConfigError as e:
            raise relabel(e, {"name": "engine", "batch_sizes": "profile_ms", "latency_ms": "profile_ms"}) from None

    @property
    def upload_slots(self) -> int:
        """Upload streams served at once: the other threads stay free for the other calls."""
        return self.max_uploads if self.max_uploads is not None else max(1, self.threads // 2)

    def guard_limits(self):
        """The call guard's limits: calls still waiting for their request after its grace
        (a stalled stream or unary call) get the upload slots, never every thread."""
        from ..call_guard import GuardLimits

        # streams: the servicer's own upload reaper cancels them at upload_timeout_s (naming
        # it); the guard's deadline is the backstop a second later
        return GuardLimits(receive_timeout_s=self.receive_timeout_s, stream_timeout_s=self.upload_timeout_s + 1.0,
                           max_calls_per_peer=self.max_calls_per_peer, max_calls=self.max_calls or 2 * self.threads,
                           receive_slots=self.upload_slots)

    def pickle_limits(self):
        from ..safe_pickle import Limits

        return Limits(max_bytes=self.max_payload_bytes, max_array_elements=self.max_array_elements,
                      max_depth=self.max_nesting_depth, max_string_bytes=self.max_string_bytes,
                      max_ops=self.max_pickle_ops, max_expanded_items=self.max_expanded_items,
                      max_container_items=self.max_container_items)
