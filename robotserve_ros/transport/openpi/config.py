"""The openpi endpoint's configuration: frozen, checked once when made.

`EndpointConfig` is the websocket endpoint alone (what the inference server node's `openpi`
service section takes); `OpenPiConfig` adds what `robotserve openpi-server` builds around it
(the policy, its scheduler and engine), as the LeRobot endpoint's CompatConfig does."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Optional

from ...config import ConfigError, EngineConfig, SchedulerConfig, engine_config, relabel
from .codec import Limits


def _positive(name: str, v, kind=(int, float), zero_ok: bool = False) -> None:
    ok = not isinstance(v, bool) and isinstance(v, kind) and math.isfinite(v) and (v >= 0 if zero_ok else v > 0)
    if not ok:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what} {'>= 0' if zero_ok else '> 0'}, got {v!r}")


@dataclass(frozen=True)
class EndpointConfig:
    host: str = "127.0.0.1"  # loopback unless asked: a robot fleet's server is not for the internet
    port: int = 8000  # openpi's default; 0: any free port (tests)
    # '' = no key; else clients send `Authorization: Api-Key <key>`, one key per line, one line per
    # holder: a key's connections are budgeted per key, not per address (docs/security.md)
    api_key_file: str = ""
    control_hz: float = 50.0  # the robots' control rate, until a client's robotserve/exec says otherwise
    horizon: int = 0  # actions per reply; 0: the whole chunk (openpi's ActionChunkBroker slices it)
    # openpi observation key -> policy feature ('observation.images.<cam>', 'observation.state', 'task');
    # empty: openpi's conventions (observation/image, observation/wrist_image, observation/state, prompt).
    key_map: dict = field(default_factory=dict)
    max_message_bytes: int = 16 << 20  # one frame; larger ones are refused before they are read
    max_array_elements: int = 16 << 20  # all arrays of one frame together
    max_nesting_depth: int = 16
    max_items: int = 100_000  # msgpack objects in one frame
    max_string_bytes: int = 64 << 10
    # Budgets (transport/openpi/budget.py): a peer is an API key holder where keys are checked,
    # else an IP address (unauthenticated); every peer within the totals. Sized for a real fleet:
    # 100 robots of 3 cameras at 224x224 hold 45 MB of frames at once (test_openpi_fleet_budget.py).
    max_connections: int = 512  # robots connected at once, all peers together
    # One unauthenticated address cannot take every slot (a robot is one connection): many robots
    # behind one NAT, or on loopback, present a key instead of raising this.
    max_connections_per_peer: int = 16
    max_connections_per_key: int = 256  # ... of one API key holder
    # openpi sends one frame and waits for its reply: a second frame queued behind it is already one too many.
    max_queued_frames: int = 1  # frames websockets buffers per connection before it stops reading the socket
    # Bytes of frames held (being read, queued, being answered), reserved from each frame's header
    # before its body is read: past a budget the connection waits (TCP back-pressure), not refused.
    max_pending_bytes: int = 256 << 20  # all connections together
    max_pending_bytes_per_peer: int = 64 << 20  # ... of one unauthenticated address
    max_pending_bytes_per_key: int = 128 << 20  # ... of one API key holder: one holder cannot take the total
    max_rate_hz: float = 100.0  # infer calls per second per connection (token bucket)
    rate_burst: int = 10
    idle_timeout_s: float = 300.0  # a connection silent this long is closed
    reply_timeout_s: float = 30.0  # a round not answered by then gets an error frame
    # Real-time chunking: each round's leftover rebuilt from the connection's last chunk and the
    # time since, at control_hz (core/rtc_rebuild.py; docs/rtc_serving.md).
    rtc: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in 0..65535, got {self.port!r}")
        if not isinstance(self.api_key_file, str):
            raise ValueError(f"api_key_file must be a file name, got {self.api_key_file!r}")
        for name in ("control_hz", "max_rate_hz", "idle_timeout_s", "reply_timeout_s"):
            _positive(name, getattr(self, name))
        _positive("horizon", self.horizon, kind=int, zero_ok=True)
        if not isinstance(self.rtc, bool):
            raise ValueError(f"rtc must be true or false, got {self.rtc!r}")
        for name in ("max_message_bytes", "max_array_elements", "max_nesting_depth", "max_items", "max_string_bytes",
                     "max_connections", "max_connections_per_peer", "max_connections_per_key", "max_queued_frames",
                     "max_pending_bytes", "max_pending_bytes_per_peer", "max_pending_bytes_per_key", "rate_burst"):
            _positive(name, getattr(self, name), kind=int)
        if not isinstance(self.key_map, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                         for k, v in self.key_map.items()):
            raise ValueError(f"key_map must map openpi keys to policy feature names (strings), got {self.key_map!r}")

    @property
    def limits(self) -> Limits:
        return Limits(max_message_bytes=self.max_message_bytes, max_array_elements=self.max_array_elements,
                      max_nesting_depth=self.max_nesting_depth, max_items=self.max_items,
                      max_string_bytes=self.max_string_bytes)

    def api_keys(self) -> tuple:
        """The keys of api_key_file, one per line (surrounding whitespace dropped), each a
        holder; () without a file. ValueError if the file cannot be read or holds none: a
        server meant to check keys must not start open."""
        if not self.api_key_file:
            return ()
        try:
            with open(self.api_key_file, "rb") as f:
                text = f.read(1 << 20)
        except OSError as e:
            raise ValueError(f"api_key_file {self.api_key_file!r} cannot be read ({e.strerror or type(e).__name__})") from None
        keys = tuple(k.strip() for k in text.splitlines() if k.strip())
        if not keys:
            raise ValueError(f"api_key_file {self.api_key_file!r} is empty")
        return keys

    def budgets(self):
        from .budget import Budgets, Caps

        return Budgets(Caps(self.max_connections, self.max_pending_bytes),
                       Caps(self.max_connections_per_key, self.max_pending_bytes_per_key),
                       Caps(self.max_connections_per_peer, self.max_pending_bytes_per_peer))


ENDPOINT_FIELDS = tuple(f.name for f in fields(EndpointConfig))


@dataclass(frozen=True)
class OpenPiConfig:
    """`robotserve openpi-server`: one policy, served to openpi clients by the fleet scheduler."""

    policy: str = ""  # a local directory under policy_dirs, or a hub id matching allow_hub
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    policy_dirs: tuple = ()  # local policies only from under these; empty: the policy's own folder
    allow_hub: tuple = ()  # hub id patterns (fnmatch), e.g. ("lerobot/*",); empty: no hub ids
    revision: Optional[str] = None  # hub revision (branch, tag or commit); None: main, pinned at start
    scheduler: str = "remaining"  # docs/defaults.md; "kairos": seed 000 §3.2.2
    scheduler_params: dict = field(default_factory=dict)
    engine: str = "lerobot"  # or "simulated": a profile-driven stand-in (tests)
    engine_params: dict = field(default_factory=dict)
    profile_ms: Optional[dict] = None  # batch -> ms; None: the engine's own
    max_batch: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or (self.engine == "lerobot" and not self.policy):
            raise ValueError("policy must name a local policy directory or a hub id")
        for name in ("policy_dirs", "allow_hub"):
            v = getattr(self, name)
            if isinstance(v, str) or not all(isinstance(x, str) and x for x in v):
                raise ValueError(f"{name} must be a list of non-empty strings, got {v!r}")
            object.__setattr__(self, name, tuple(v))
        if self.max_batch is not None:
            _positive("max_batch", self.max_batch, kind=int)
        try:  # a bad knob fails here, not when the first robot connects
            self.scheduler_config.build()
            self.engine_config  # noqa: B018
        except (TypeError, ValueError) as e:
            flat = {"name": "scheduler", "scheduler": "scheduler_params", "batch_sizes": "profile_ms", "latency_ms": "profile_ms",
                    self.scheduler: "scheduler_params"}  # a knob of the scheduler: scheduler_params.<knob>
            raise relabel(e, flat) if isinstance(e, ConfigError) else ValueError(f"profile_ms: {e}") from None

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(name=self.scheduler, params={self.scheduler: dict(self.scheduler_params)})

    @property
    def engine_config(self) -> EngineConfig:
        try:
            return engine_config(self.engine, self.engine_params, self.profile_ms)
        except ConfigError as e:
            raise relabel(e, {"name": "engine", "batch_sizes": "profile_ms", "latency_ms": "profile_ms"}) from None
