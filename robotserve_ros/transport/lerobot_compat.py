"""LeRobot's async-inference gRPC service, served by the fleet scheduler.

An unmodified LeRobot 0.4.x `robot_client` connects here as it would to LeRobot's own
`policy_server` (same service `transport.AsyncInference`, same compiled stubs, same
pickled payloads), but where LeRobot's server serves one robot at a time, each connected
client here is a task of a ServingCore with a scheduler from the registry (Kairos by
default), batched with every other client of the same policy.

Protocol mapping (one client = one gRPC peer, or the `robotserve-client` metadata value):
- Ready: starts the client's task (a new task id; a second Ready restarts it).
- SendPolicyInstructions: picks the engine for the RemotePolicyConfig it carries. Engines
  are cached per (policy type, resolved path) and shared by every client that names them,
  each with its own ServingCore and worker thread (different models never share a batch).
- SendObservations: the TRANSFER_BEGIN/MIDDLE/END pieces are joined per call, unpickled
  through safe_pickle's allow-list, mapped to a core Observation in the policy's feature
  order, filtered as LeRobot's server filters (a timestep already predicted, or a joint
  state within L2 `similarity_atol` of the last one, is skipped unless `must_go`), and
  submitted as the task's next round. While a round is generating the newest observation
  waits and is submitted when the chunk is ready (LeRobot's queue of one).
- GetActions: waits up to `get_actions_timeout_s` for the client's next chunk and returns
  it as LeRobot's list[TimedAction]: action i has timestep obs.timestep + i and timestamp
  obs.timestamp + i / fps, exactly as LeRobot's server times them, so the client's
  aggregation of overlapping timesteps works unchanged. An empty reply means "none yet".

Execution info for Kairos (seed 000 §3.2.1, "last exec info"), derived from what the
client already sends: its observation timestep is the last action it executed, so with
`delivered_until` the last timestep of the chunks handed to it, the actions it still has
queued are `delivered_until - timestep`; the running execution started when the newest
chunk was handed over (the client merges it into its queue at once); the control rate is
measured from consecutive observations taken while the robot was busy throughout
(timestep delta over client timestamp delta), starting from the server's `fps`.
"""
from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import grpc
import numpy as np

from ..core.clock import WallClock
from ..core.errors import RequestError
from ..core.observation import BadObservation, Observation, PayloadTooLarge
from ..core.schedulers import make_scheduler
from ..core.serving import ServingCore, Tier
from ..core.types import ExecInfo, HorizonChoice, InferenceRequest
from . import safe_pickle

log = logging.getLogger("robotserve.lerobot_compat")
STATE_KEY = "observation.state"
IMAGE_PREFIX = "observation.images."
CLIENT_ID_HEADER = "robotserve-client"


@dataclass
class CompatConfig:
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (tests)
    fps: float = 30.0  # the clients' control rate: action timestamps, first rate estimate
    scheduler: str = "kairos"
    scheduler_params: dict = field(default_factory=dict)
    engine: str = "lerobot"  # or "simulated": a profile-driven stand-in, no model
    engine_params: dict = field(default_factory=dict)  # e.g. device, seed, profile_file
    profile_ms: Optional[dict] = None  # batch -> ms; None: the engine's own (or 30 ms flat for simulated)
    max_batch: Optional[int] = None  # None: the profile's saturation batch
    policy_dirs: tuple = ()  # policies may only be loaded from under these; empty: any local dir
    get_actions_timeout_s: float = 2.0  # LeRobot's obs_queue_timeout
    client_timeout_s: float = 10.0  # a client silent this long is gone: its task is dropped
    similarity_atol: float = 1.0  # LeRobot's observations_similar tolerance
    max_payload_bytes: int = 32 << 20  # one observation or policy setup, after joining pieces
    threads: int = 32  # gRPC handler threads; each client holds about two
    keep_trace: bool = False  # remember every delivered action per task (tests)


class _Fail(Exception):
    """A call refused: counted under `key`, answered with `code` and `message`."""

    def __init__(self, key: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.key, self.code, self.message = key, code, message


@dataclass
class _Layout:
    """Where the policy's inputs sit in one client's raw observation dict."""

    state_names: list  # joint keys, in the policy's state order
    cameras: list  # (raw camera key, (h, w) the policy takes or None to pass as is)


class _Group:
    """One loaded policy: its engine, a ServingCore over it and the worker that runs batches."""

    def __init__(self, key: tuple, engine, core: ServingCore) -> None:
        self.key, self.engine, self.core = key, engine, core
        self.work = threading.Event()
        self.busy_s = 0.0
        self.thread: Optional[threading.Thread] = None


class _Client:
    def __init__(self, key: str, task_id: str, now: float, fps: float) -> None:
        self.key, self.task_id = key, task_id
        self.group: Optional[_Group] = None
        self.layout: Optional[_Layout] = None
        self.actions_per_chunk = 1
        self.next_round = 0
        self.rounds: dict = {}  # round_id -> (timestep, timestamp) of its observation
        self.predicted: set = set()  # timesteps already submitted (LeRobot's _predicted_timesteps)
        self.last_state: Optional[np.ndarray] = None
        self.held = None  # (timestep, timestamp, Observation) waiting for the round in flight
        self.ready = None  # (ChunkReply, timestep, timestamp) not yet fetched
        self.delivered_until = -1
        self.exec_start: Optional[float] = None
        self.hz = float(fps)
        self.rate_anchor = None  # (timestep, client timestamp) where the current busy stretch began
        self.last_seen = now
        self.counts = {"observations": 0, "filtered": 0, "rounds": 0, "chunks": 0, "actions": 0}
        self.trace: list = []  # delivered action rows (keep_trace)


def _lerobot():
    """LeRobot's helpers (TimedAction & co.) and stubs, imported behind the torchvision shim."""
    from ..engines.torch_env import import_lerobot_policies

    import_lerobot_policies()
    from lerobot.async_inference import constants, helpers
    from lerobot.transport import services_pb2, services_pb2_grpc

    return helpers, constants, services_pb2, services_pb2_grpc


class LeRobotCompatServicer:
    """transport.AsyncInference over the fleet scheduler (see the module docstring)."""

    def __init__(self, cfg: CompatConfig, clock=None) -> None:
        from ..engines import ENGINES

        if cfg.engine not in ENGINES:
            raise ValueError(f"unknown engine '{cfg.engine}'; known: {', '.join(ENGINES.names())}")
        make_scheduler(cfg.scheduler, **cfg.scheduler_params)  # a bad name or knob fails here, not per client
        if not cfg.fps > 0:
            raise ValueError(f"fps must be > 0, got {cfg.fps}")
        self.cfg = cfg
        self.helpers, constants, self.pb, _ = _lerobot()
        self.torch = __import__("torch")
        self.supported = tuple(constants.SUPPORTED_POLICIES)
        self.clock = clock or WallClock()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # a chunk is ready, or a client went
        self.clients: dict[str, _Client] = {}
        self.by_task: dict[str, _Client] = {}
        self.groups: dict[tuple, _Group] = {}
        self._load_lock = threading.Lock()  # one policy load at a time; each loads once
        self.errors: dict[str, int] = {}
        self._n = 0
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="lerobot-reaper", daemon=True)
        self._reaper.start()

    # --- the four RPCs ------------------------------------------------------------------
    def Ready(self, request, context):  # noqa: N802 - the service's method names
        key = self._key(context)
        with self.lock:
            self._start_client(key)
        log.info("client %s ready", key)
        return self.pb.Empty()

    def SendPolicyInstructions(self, request, context):  # noqa: N802
        key = self._key(context)
        try:
            spec = self._loads(request.data, self.helpers.RemotePolicyConfig, "policy setup")
            group, layout, apc = self._policy(spec)
        except _Fail as f:
            self._abort(context, f)
        with self.lock:
            c = self.clients.get(key)
            if c is None or c.group is not None or c.next_round:  # no Ready, or a new policy: a fresh task
                c = self._start_client(key)
            c.group, c.layout, c.actions_per_chunk = group, layout, apc
            c.last_seen = self.clock.now()
        log.info("client %s: task %s on %s %s, %d actions per chunk", key, c.task_id, *group.key[:2], apc)
        return self.pb.Empty()

    def SendObservations(self, request_iterator, context):  # noqa: N802
        key = self._key(context)
        try:
            data = self._join(request_iterator)
            tobs = self._loads(data, self.helpers.TimedObservation, "observation")
            with self.lock:
                c = self._client(key)
                c.last_seen = self.clock.now()
                layout = c.layout
            obs = self._observation(tobs, layout)  # outside the lock: images may be resized
            with self.lock:
                if self.clients.get(key) is c:
                    self._offer(c, tobs, obs)
        except _Fail as f:
            self._abort(context, f)
        return self.pb.Empty()

    def GetActions(self, request, context):  # noqa: N802
        key = self._key(context)
        end = time.monotonic() + self.cfg.get_actions_timeout_s
        with self.lock:
            c = self.clients.get(key)
        if c is None:
            self._abort(context, self._no_session(key))
        with self.changed:
            while c.ready is None:
                c.last_seen = self.clock.now()
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set() or self.clients.get(key) is not c or not context.is_active():
                    return self.pb.Actions()  # nothing yet: LeRobot's client simply asks again
                self.changed.wait(min(left, 0.25))
            reply, t0, stamp = c.ready
            c.ready = None
            h = len(reply.actions)
            c.delivered_until = max(c.delivered_until, t0 + h - 1)
            c.exec_start = self.clock.now()  # the client queues the chunk now: execution runs from here
            c.counts["chunks"] += 1
            c.counts["actions"] += h
            if self.cfg.keep_trace:
                c.trace.extend(np.asarray(reply.actions, np.float32))
        return self.pb.Actions(data=safe_pickle.dumps(self._timed_actions(reply.actions, t0, stamp)))

    # --- policies and engines --------------------------------------------------------------
    def _policy(self, spec) -> tuple:
        """Check a RemotePolicyConfig; its engine group (loaded once), layout and chunk length."""
        ptype, path, apc = spec.policy_type, spec.pretrained_name_or_path, spec.actions_per_chunk
        feats, rename = spec.lerobot_features, spec.rename_map
        if not isinstance(ptype, str) or ptype not in self.supported:
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                        f"policy type {ptype!r} is not one LeRobot's async inference serves ({', '.join(self.supported)})")
        if isinstance(apc, bool) or not isinstance(apc, int) or apc < 1:
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT, f"actions_per_chunk must be an integer >= 1, got {apc!r}")
        if not isinstance(path, str) or not path:
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT, "pretrained_name_or_path must be a non-empty string")
        if not isinstance(feats, dict) or not isinstance(rename, dict):
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT, "lerobot_features and rename_map must be dicts")
        state = feats.get(STATE_KEY)
        names = state.get("names") if isinstance(state, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                        f"lerobot_features needs '{STATE_KEY}' with its joint 'names' (as hw_to_dataset_features writes it)")
        cams = [k for k, v in feats.items() if isinstance(k, str) and k.startswith(IMAGE_PREFIX)]
        group = self._group(ptype, path, len(names))
        return group, self._layout(group, names, cams, rename), apc

    def _group(self, ptype: str, path: str, n_joints: int) -> _Group:
        cfg = self.cfg
        try:
            local = Path(path).expanduser()
            resolved = local.resolve() if local.exists() else local
        except (OSError, RuntimeError) as e:  # an unknown ~user, a symlink loop
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT, f"policy path {path!r}: {e}") from None
        if cfg.policy_dirs and not any(resolved.is_relative_to(Path(d).expanduser().resolve()) for d in cfg.policy_dirs):
            raise _Fail("policy_not_allowed", grpc.StatusCode.PERMISSION_DENIED,
                        f"policy path {path!r} is outside the directories this server loads policies from")
        if cfg.engine == "lerobot":
            from ..engines.lerobot_engine import PolicyDirError, check_policy_dir

            try:
                found = check_policy_dir(resolved)["type"]
            except PolicyDirError as e:
                raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                            f"{e} (this server loads local checkpoints only, never from the hub)") from None
            if found != ptype:
                raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                            f"policy type {ptype!r} asked for, but {path!r} holds a {found!r} policy")
            key = (ptype, str(resolved))
        else:  # a stand-in engine: one per policy name and action size
            key = (ptype, str(resolved), n_joints)
        with self._load_lock:
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = self._load(key, str(resolved), n_joints)
        return g

    def _load(self, key: tuple, path: str, n_joints: int) -> _Group:
        from ..core.profile import EngineProfile
        from ..engines import make_engine

        cfg = self.cfg
        params = dict(cfg.engine_params)
        profile = EngineProfile(cfg.profile_ms) if cfg.profile_ms else None
        if cfg.engine == "lerobot":
            params["policy_dir"] = path
        else:
            params.setdefault("action_dim", n_joints)
            params.setdefault("realtime", True)
            profile = profile or EngineProfile({1: 30.0})
        t = time.monotonic()
        try:
            engine = make_engine(cfg.engine, profile, **params)
            scheduler = make_scheduler(cfg.scheduler, **cfg.scheduler_params)
        except (OSError, TypeError, ValueError, KeyError) as e:
            raise _Fail("policy_load_failed", grpc.StatusCode.FAILED_PRECONDITION,
                        f"cannot load {key[0]} policy from {path!r}: {e}") from None
        log.info("loaded %s policy from %s in %.1f s", key[0], path, time.monotonic() - t)
        tier = Tier("edge", engine.profile, max_batch=cfg.max_batch)
        g = _Group(key, engine, ServingCore(scheduler, [tier], self.clock))
        g.thread = threading.Thread(target=self._serve_loop, args=(g,), name=f"lerobot-{key[0]}", daemon=True)
        g.thread.start()
        return g

    def _layout(self, g: _Group, names: list, cams: list, rename: dict) -> _Layout:
        eng = g.engine
        image_keys = getattr(eng, "image_keys", None)
        if image_keys is None:  # a stand-in engine takes whatever the robot has
            return _Layout(list(names), [(k[len(IMAGE_PREFIX):], None) for k in cams])
        if len(names) != eng.state_dim:
            raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                        f"the robot has {len(names)} joints, the {g.key[0]} policy takes a state of {eng.state_dim}")
        by_policy_key = {rename.get(k, k): k for k in cams}  # LeRobot's rename_map: robot key -> policy key
        cameras = []
        for k, (_, h, w) in zip(image_keys, eng.image_shapes):
            if k not in by_policy_key:
                raise _Fail("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                            f"the policy takes camera '{k}' but the robot sends {sorted(cams) or 'none'} "
                            f"(map one with rename_map)")
            cameras.append((by_policy_key[k][len(IMAGE_PREFIX):], (h, w)))
        return _Layout(list(names), cameras)

    # --- observations in -------------------------------------------------------------------
    def _join(self, pieces) -> bytes:
        """LeRobot's chunked transfer (transport.utils.receive_bytes_in_chunks), size-capped."""
        pb, cap = self.pb, self.cfg.max_payload_bytes
        buf, n = [], 0
        for item in pieces:
            st = item.transfer_state
            if st == pb.TRANSFER_BEGIN:
                buf, n = [], 0
            elif st not in (pb.TRANSFER_MIDDLE, pb.TRANSFER_END):
                raise _Fail("bad_transfer", grpc.StatusCode.INVALID_ARGUMENT, f"unknown transfer state {st}")
            n += len(item.data)
            if n > cap:
                raise _Fail(PayloadTooLarge.code, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"observation larger than the {cap} bytes this server accepts")
            buf.append(item.data)
            if st == pb.TRANSFER_END:
                return b"".join(buf)
        raise _Fail("bad_transfer", grpc.StatusCode.INVALID_ARGUMENT, "observation stream ended before TRANSFER_END")

    def _loads(self, data: bytes, kind: type, what: str):
        try:
            obj = safe_pickle.loads(data, self.cfg.max_payload_bytes)
        except PayloadTooLarge as e:
            raise _Fail(e.code, grpc.StatusCode.RESOURCE_EXHAUSTED, f"{what}: {e.message}") from None
        except safe_pickle.UnsafePickle as e:
            raise _Fail(e.code, grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {e.message}") from None
        if not isinstance(obj, kind):
            raise _Fail("bad_payload", grpc.StatusCode.INVALID_ARGUMENT,
                        f"{what}: expected a pickled {kind.__name__}, got {type(obj).__name__}")
        return obj

    def _observation(self, tobs, layout: Optional[_Layout]) -> Observation:
        """LeRobot's raw observation dict -> core Observation in the policy's input order."""
        if layout is None:
            raise _Fail("no_policy", grpc.StatusCode.FAILED_PRECONDITION,
                        "send the policy instructions (SendPolicyInstructions) before observations")
        raw, step, stamp = tobs.observation, tobs.timestep, tobs.timestamp
        if not isinstance(raw, dict):
            raise self._bad(f"observation must be a dict, got {type(raw).__name__}")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise self._bad(f"timestep must be an integer >= 0, got {step!r}")
        if not isinstance(stamp, (float, int, np.floating)) or not math.isfinite(stamp):
            raise self._bad(f"timestamp must be a finite number, got {stamp!r}")
        try:
            q = np.array([raw[n] for n in layout.state_names], dtype=np.float32)
        except KeyError as e:
            raise self._bad(f"joint {e.args[0]!r} missing from the observation") from None
        except (TypeError, ValueError):
            raise self._bad("joint values must be numbers") from None
        if q.ndim != 1 or not np.all(np.isfinite(q)):
            raise self._bad("joint values must be finite numbers")
        images = []
        for cam, hw in layout.cameras:
            img = raw.get(cam)
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or 0 in img.shape:
                raise self._bad(f"camera {cam!r} must be an HxWx3 uint8 array, got "
                                f"{getattr(img, 'dtype', type(img).__name__)} {getattr(img, 'shape', '')}")
            if hw is not None and img.shape[:2] != hw:
                import cv2  # LeRobot's server resizes to the policy's image size too (bilinear)

                img = cv2.resize(img, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
            images.append(np.ascontiguousarray(img))
        task = raw.get("task", "")
        if not isinstance(task, str):
            raise self._bad("'task' must be a string")
        # The capture time on the server's clock: client wall time, assumed synced (LeRobot does too).
        age = min(max(time.time() - float(stamp), 0.0), 5.0)
        return Observation(images=images, joints=q, instruction=task, timestep=int(step), stamp=self.clock.now() - age)

    @staticmethod
    def _bad(msg: str) -> _Fail:
        return _Fail(BadObservation.code, grpc.StatusCode.INVALID_ARGUMENT, msg)

    def _offer(self, c: _Client, tobs, obs: Observation) -> None:
        """Under the lock: LeRobot's server filter, then submit, or hold while generating."""
        step, stamp = obs.timestep, float(tobs.timestamp)
        c.counts["observations"] += 1
        left = max(0, c.delivered_until - step)
        self._measure_rate(c, step, stamp, left > 0)
        if not tobs.must_go and c.last_state is not None and (
            step in c.predicted or float(np.linalg.norm(obs.joints - c.last_state)) < self.cfg.similarity_atol
        ):
            c.counts["filtered"] += 1
            return
        if c.group.core.generating(c.task_id):
            c.held = (step, stamp, obs)  # its round is generating: this one goes next (newest wins)
            return
        self._submit(c, step, stamp, obs)

    def _measure_rate(self, c: _Client, step: int, stamp: float, busy: bool) -> None:
        """Control rate from a stretch of observations the robot had actions queued for
        throughout: an idle robot's timestep stands still and would read as a slow one."""
        if not busy:
            c.rate_anchor = None
            return
        if c.rate_anchor is None:
            c.rate_anchor = (step, stamp)
            return
        ds, dt = step - c.rate_anchor[0], stamp - c.rate_anchor[1]
        if dt >= 0.25 and ds > 0:  # long enough that one action more or less is a small error
            c.hz = min(1000.0, max(1.0, 0.7 * c.hz + 0.3 * ds / dt))
            c.rate_anchor = (step, stamp)

    def _submit(self, c: _Client, step: int, stamp: float, obs: Observation) -> None:
        now = self.clock.now()
        rid = c.next_round
        info = None
        if rid > 0:  # last exec info (module docstring): actions still queued on the robot
            start = c.exec_start if c.exec_start is not None else now
            info = ExecInfo(start, max(0, c.delivered_until - step), c.hz)
        req = InferenceRequest(c.task_id, rid, info, HorizonChoice("static", float(c.actions_per_chunk)),
                               obs, obs_stamp=obs.stamp)
        try:
            c.group.core.submit(req)  # counts its own errors
        except RequestError as e:
            raise _Fail(e.code, grpc.StatusCode.FAILED_PRECONDITION, e.message) from None
        c.next_round += 1
        c.counts["rounds"] += 1
        c.rounds[rid] = (step, stamp)
        c.rounds.pop(rid - 64, None)
        c.predicted.add(step)
        if len(c.predicted) > 4096:
            c.predicted = {s for s in c.predicted if s >= step}
        c.last_state = obs.joints
        c.group.work.set()

    # --- the engine workers ----------------------------------------------------------------
    def _serve_loop(self, g: _Group) -> None:
        while not self._stop.is_set():
            g.work.wait(0.05)
            g.work.clear()
            while not self._stop.is_set():
                with self.lock:
                    ds = g.core.dispatch()
                if not ds:
                    break
                for d in ds:
                    self._run(g, d)

    def _run(self, g: _Group, d) -> None:
        t = time.monotonic()
        try:
            results = g.engine.infer([p.request for p in d.requests])
        except Exception as e:  # an engine fault costs no robot its round: requeue, count, go on
            log.error("engine failed on a batch of %d: %r; requeued", len(d.requests), e)
            with self.lock:
                self._count("engine_failure")
                g.core.requeue(d.id)
            time.sleep(0.1)
            return
        g.busy_s += time.monotonic() - t
        with self.changed:
            try:
                replies = g.core.complete(d.id, results)
            except ValueError as e:
                log.error("%s", e)
                self._count("engine_failure")
                return
            for r in replies:
                c = self.by_task.get(r.task_id)
                meta = c.rounds.get(r.round_id) if c is not None else None
                if meta is not None:
                    c.ready = (r, *meta)  # a newer chunk replaces one never fetched
            for p in d.requests:
                c = self.by_task.get(p.task_id)
                if c is not None and c.held is not None:
                    step, stamp, obs = c.held
                    c.held = None
                    if step not in c.predicted:
                        try:
                            self._submit(c, step, stamp, obs)
                        except _Fail as f:
                            self._count(f.key)
            self.changed.notify_all()

    def _timed_actions(self, actions: np.ndarray, t0: int, stamp: float) -> list:
        """LeRobot's PolicyServer._time_action_chunk: action i at timestep t0 + i, stamp + i/fps."""
        dt, torch, TA = 1.0 / self.cfg.fps, self.torch, self.helpers.TimedAction
        rows = np.asarray(actions, np.float32)
        return [TA(timestamp=stamp + i * dt, timestep=t0 + i, action=torch.from_numpy(rows[i].copy()))
                for i in range(len(rows))]

    # --- clients --------------------------------------------------------------------------
    def _key(self, context) -> str:
        for k, v in context.invocation_metadata() or ():
            if k == CLIENT_ID_HEADER and v:
                return f"id:{v}"
        return context.peer()

    def _client(self, key: str) -> _Client:
        c = self.clients.get(key)
        if c is None:
            raise self._no_session(key)
        return c

    @staticmethod
    def _no_session(key: str) -> _Fail:
        return _Fail("no_session", grpc.StatusCode.FAILED_PRECONDITION,
                     f"client {key} is not connected (or was silent too long): call Ready and SendPolicyInstructions first")

    def _start_client(self, key: str) -> _Client:
        """Under the lock: a new task for `key`, ending the one it had."""
        old = self.clients.pop(key, None)
        if old is not None:
            self._end(old)
        self._n += 1
        c = self.clients[key] = _Client(key, f"lerobot/{key}#{self._n}", self.clock.now(), self.cfg.fps)
        self.by_task[c.task_id] = c
        self.changed.notify_all()
        return c

    def _end(self, c: _Client) -> None:
        """Under the lock: drop the client's task, its queued round and its observation history."""
        self.by_task.pop(c.task_id, None)
        if c.group is not None:
            c.group.core.drop_task(c.task_id)
            forget = getattr(c.group.engine, "forget", None)
            if forget is not None:
                forget(c.task_id)

    def _reap_loop(self) -> None:
        while not self._stop.wait(0.5):
            cutoff = self.clock.now() - self.cfg.client_timeout_s
            with self.changed:
                for key in [k for k, c in self.clients.items() if c.last_seen < cutoff]:
                    log.info("client %s silent for %.0f s: its task is dropped", key, self.cfg.client_timeout_s)
                    self._end(self.clients.pop(key))
                    self._count("client_gone")
                self.changed.notify_all()

    # --- errors and stats -------------------------------------------------------------------
    def _count(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1

    def _abort(self, context, f: _Fail):
        with self.lock:
            self._count(f.key)
        log.warning("refused: %s", f.message)
        context.abort(f.code, f.message)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            now = self.clock.now()
            out = {"errors": dict(self.errors), "clients": {}, "policies": {}}
            for c in self.clients.values():
                ledger = c.group.core.ledger if c.group is not None else None
                wr = ledger.wait_ratio(c.task_id, now) if ledger and c.task_id in ledger.tasks else 0.0
                out["clients"][c.task_id] = {**c.counts, "peer": c.key, "control_hz": c.hz, "wait_ratio": wr,
                                             "policy": list(c.group.key[:2]) if c.group else None}
            for g in self.groups.values():
                s = g.core.stats
                out["policies"]["%s:%s" % g.key[:2]] = {
                    "tasks": len(g.core.ledger.tasks), "batches": s.batches, "served": s.completed,
                    "mean_batch": s.dispatched / s.batches if s.batches else 0.0,
                    "errors": dict(s.errors), "busy_s": g.busy_s}
            return out

    def trace(self, task_id: str) -> list:
        with self.lock:
            c = self.by_task.get(task_id)
            return list(c.trace) if c is not None else []

    def close(self) -> None:
        self._stop.set()
        with self.changed:
            self.changed.notify_all()
        for g in list(self.groups.values()):
            if g.thread is not None:
                g.thread.join(timeout=2.0)
            g.engine.close()


class LeRobotCompatServer:
    """The gRPC server around the servicer; `port` is the bound port (useful with port 0)."""

    def __init__(self, cfg: CompatConfig) -> None:
        from concurrent import futures

        self.servicer = LeRobotCompatServicer(cfg)  # checks the config before the slow LeRobot import
        pb_grpc = _lerobot()[3]
        # A piece of an observation is at most 2 MiB (LeRobot's CHUNK_SIZE); the joined payload is capped separately.
        opts = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.threads), options=opts)
        pb_grpc.add_AsyncInferenceServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if self.port == 0:
            raise OSError(f"cannot bind {cfg.host}:{cfg.port}")
        self.server.start()

    def stop(self, grace: float = 1.0) -> None:
        self.servicer.close()
        self.server.stop(grace).wait()


def add_arguments(p) -> None:
    d = CompatConfig()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--fps", type=float, default=d.fps, help="the clients' control rate (LeRobot's server --fps)")
    p.add_argument("--scheduler", default=d.scheduler)
    p.add_argument("--scheduler-param", action="append", metavar="KEY=VALUE")
    p.add_argument("--engine", default=d.engine, help="lerobot (the checkpoint each client names) or simulated")
    p.add_argument("--engine-param", action="append", metavar="KEY=VALUE", help="e.g. device=cuda, profile_file=F")
    p.add_argument("--latency-ms", help="engine profile as BATCH:MS,...; default: the engine's own")
    p.add_argument("--max-batch", type=int)
    p.add_argument("--policy-dir", action="append", help="load policies only from under this directory (repeatable)")
    p.add_argument("--client-timeout", type=float, default=d.client_timeout_s, help="seconds of silence before a client's task is dropped")
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--stats-every", type=float, default=0.0, help="print the server's stats as JSON every N seconds")


def cli(a) -> int:
    """`robotserve lerobot-server`: serve LeRobot robot_clients until Ctrl-C or SIGTERM."""
    import json

    from ..cli import _params
    from ..core.profile import EngineProfile

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        profile = None
        if a.latency_ms:
            profile = {int(b): float(ms) for b, _, ms in (x.partition(":") for x in a.latency_ms.split(","))}
            EngineProfile(profile)
        cfg = CompatConfig(
            host=a.host, port=a.port, fps=a.fps, scheduler=a.scheduler, scheduler_params=_params(a.scheduler_param),
            engine=a.engine, engine_params=_params(a.engine_param), profile_ms=profile, max_batch=a.max_batch,
            policy_dirs=tuple(a.policy_dir or ()), client_timeout_s=a.client_timeout, threads=a.threads,
        )
        srv = LeRobotCompatServer(cfg)
    except (KeyError, TypeError, ValueError, OSError, RuntimeError) as e:  # RuntimeError: grpc cannot bind
        print(f"robotserve lerobot-server: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    print(f"serving LeRobot async inference on {a.host}:{srv.port} (scheduler {a.scheduler}, engine {a.engine}); "
          f"Ctrl-C stops", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(a.stats_every or 3600)
            if a.stats_every:
                print(json.dumps(srv.servicer.stats()), flush=True)
    except KeyboardInterrupt:
        pass
    srv.stop()
    return 0
