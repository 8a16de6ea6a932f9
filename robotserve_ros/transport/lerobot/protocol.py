"""The gRPC servicer: LeRobot's four AsyncInference calls mapped onto policy groups (see
the package docstring for the mapping and the execution info it derives)."""
from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from typing import Any

import grpc
import numpy as np

from ...core.clock import WallClock
from ...core.observation import BadObservation, Observation
from ...core.rtc_rebuild import ServedChunk, rebuilt_guide
from ...core.types import ExecInfo, HorizonChoice, InferenceRequest
from .. import safe_pickle
from ..call_guard import CallGuard
from ..tensors import log_failure, shown
from .config import CompatConfig
from .groups import PolicyGroups
from .clients import Client, rtc_option
from .payloads import Payloads, Refused, lerobot_modules
from .sessions import SESSION_HEADER, Sessions  # noqa: F401  (SESSION_HEADER: importable from here)

log = logging.getLogger("robotserve.lerobot")


def _rpc(fn):
    """Every call ends in a clear status: a Refused with its own code, anything else
    INTERNAL naming only the exception's type (never the client's bytes; the log has it)."""

    @functools.wraps(fn)
    def call(self, request, context):
        try:
            return fn(self, request, context)
        except Refused as f:
            failure = f
        except Exception as e:  # noqa: BLE001 - the boundary: nothing escapes as UNKNOWN
            log_failure(log, f"{fn.__name__} failed")
            failure = Refused("internal", grpc.StatusCode.INTERNAL,
                              f"{fn.__name__}: internal error ({type(e).__name__}); the server logged it")
        self._abort(context, failure)

    return call


class LeRobotCompatServicer(Sessions):
    """transport.AsyncInference over the fleet scheduler.

    Each client is a session of its policy group's Fleet (serve/). One re-entrant lock, each fleet's,
    guards the clients and every group's fleet: a reply's callback, run under it, may submit the held observation."""

    def __init__(self, cfg: CompatConfig, clock=None, fleet=None) -> None:
        """fleet: serve every client on an existing Fleet (lerobot/fleet.py) instead of policy groups of its own."""
        self.cfg = cfg
        self.helpers, constants, self.pb, _ = lerobot_modules()
        self.clock = clock or WallClock()
        self.payloads = Payloads(self.pb, self.helpers, cfg, self.clock)
        self.lock = fleet.lock if fleet is not None else threading.RLock()
        self.changed = threading.Condition(self.lock)  # a chunk is ready, or a client went
        self._init_sessions()
        self.guard = CallGuard(cfg.guard_limits())
        groups = fleet.groups if fleet is not None else PolicyGroups
        self.policies = groups(cfg, self.clock, self.lock, tuple(constants.SUPPORTED_POLICIES), self._refresh)
        self.groups = self.policies.groups
        self.policies.sessions = lambda: list(self.clients.values())
        self.protocol_errors: dict[str, int] = {}  # calls refused before any core saw a request
        self.clients_reaped = 0
        self.uploads: dict = {}  # open SendObservations streams: token -> (deadline, context)
        self.uploads_cancelled = 0
        self.uploads_abandoned = 0  # streams the client itself cancelled (it stopped mid-upload)
        self._n = 0
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="lerobot-reaper", daemon=True)
        self._reaper.start()

    # --- the four RPCs ------------------------------------------------------------------
    @_rpc
    def Ready(self, request, context):  # noqa: N802 - the service's method names
        """A new task: for the session the call names (an id this server issued), for a new
        session (`robotserve-session: new`), or for the connection's own session (no header,
        as LeRobot's RobotClient calls it). The session id goes back in the initial metadata."""
        asked = self._session_header(context)
        peer = context.peer()
        with self.lock:
            if asked not in (None, "new"):
                old = self._client(asked, context)  # only an id this server issued
                c = self._start_client(old.key, old.peer)
            elif asked == "new":
                c = self._start_client(secrets.token_urlsafe(18), peer)
            else:
                c = self._connection_session(peer)
        context.send_initial_metadata([(SESSION_HEADER, c.key)])
        log.info("client %s ready: task %s", shown(peer, 80), shown(c.task_id, 120))
        return self.pb.Empty()

    @_rpc
    def SendPolicyInstructions(self, request, context):  # noqa: N802
        spec = self.payloads.loads(request.data, self.helpers.RemotePolicyConfig, "policy setup")
        with self.lock:
            key = self._key(context)
            if key is None:  # no Ready before: the connection's session starts here
                key = self._connection_session(context.peer()).key
            c = self._client(key, context)
        (group, layout, apc), rtc = self.policies.resolve(spec), rtc_option(context, self.cfg.rtc)
        with self.lock:
            if self.clients.get(c.key) is not c or c.group is not None or c.next_round:  # a new policy: a fresh task
                c = self._start_client(c.key, c.peer)
            self._use_policy(c, spec, group, layout, apc, rtc)
        log.info("client %s: task %s on %s %s, %d actions per chunk", shown(c.peer, 80), shown(c.task_id, 120),
                 shown(group.key[0]), shown(group.key[1], 200), apc)
        return self.pb.Empty()

    @_rpc
    def SendObservations(self, request_iterator, context):  # noqa: N802
        key = self._key(context)
        tobs = self.payloads.loads(self._upload(request_iterator, context), self.helpers.TimedObservation, "observation")
        key = key if key is not None else self._resumed_key(context)
        with self.lock:
            c = self._client(key, context)
            c.last_seen = self.clock.now()
            layout = c.layout
        if layout is None:
            raise Refused("no_policy", grpc.StatusCode.FAILED_PRECONDITION,
                          "send the policy instructions (SendPolicyInstructions) before observations")
        try:
            obs = self.payloads.observation(tobs, layout)  # outside the lock: images may be resized
        except BadObservation as e:  # a malformed request of the client's task: its fleet counts it
            c.session.refuse(e)
            raise Refused(e.code, grpc.StatusCode.INVALID_ARGUMENT, e.message, counted=True) from None
        with self.lock:
            if self.clients.get(c.key) is c:
                self._offer(c, tobs, obs)
                self._bound_bytes(c)
        return self.pb.Empty()

    def _upload(self, pieces, context) -> bytes:
        """The stream's payload, within the upload slots: each open stream holds a handler
        thread, so at most cfg.upload_slots at once, each cancelled by the reaper once
        upload_timeout_s has passed (a stream that stalls between pieces never ends itself)."""
        token, ended = object(), threading.Event()
        with self.lock:
            if len(self.uploads) >= self.cfg.upload_slots:
                raise Refused("too_many_uploads", grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{self.cfg.upload_slots} observation uploads already open (max_uploads); retry")
            self.uploads[token] = [time.monotonic() + self.cfg.upload_timeout_s, context, False]
        context.add_callback(ended.set)  # the call's end: a client's cancel ends it while we still read
        try:
            return self.payloads.join(pieces)
        except Exception as e:  # the stream broke or ended short: cancelled by the reaper, or by the client?
            with self.lock:
                late = self.uploads[token][2]
            if late:
                raise Refused("upload_limit", grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"observation stream open longer than upload_timeout_s ({self.cfg.upload_timeout_s} s)") from None
            if (not isinstance(e, Refused) or e.key == "bad_transfer") and self._cancelled(context, ended):
                # The client went away mid-upload (it stopped): its own doing, not a bad transfer. A
                # cancel can reach the read as the stream's end, before grpc marks the call cancelled.
                with self.lock:
                    self.uploads_abandoned += 1
                raise Refused("bad_transfer", grpc.StatusCode.CANCELLED, "observation stream cancelled by the client",
                              counted=True) from None
            if isinstance(e, Refused):
                raise
            raise Refused("bad_transfer", grpc.StatusCode.CANCELLED, "observation stream broken off") from None
        finally:
            with self.lock:
                self.uploads.pop(token, None)

    @staticmethod
    def _cancelled(context, ended: threading.Event) -> bool:
        """Whether the client cancelled the call: a stream that ended early while the call lives
        is the client's half-close (a real bad transfer); a cancel ends the call within moments."""
        return not context.is_active() or ended.wait(0.2)

    @_rpc
    def GetActions(self, request, context):  # noqa: N802
        end = time.monotonic() + self.cfg.get_actions_timeout_s
        key = self._key(context)
        key = key if key is not None else self._resumed_key(context)
        with self.lock:
            c = self._client(key, context)
        with self.changed:
            while c.ready is None:
                c.last_seen = self.clock.now()
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set() or self.clients.get(c.key) is not c or not context.is_active():
                    return self.pb.Actions()  # nothing yet: LeRobot's client simply asks again
                self.changed.wait(min(left, 0.25))
            reply, t0, stamp = c.ready
            c.ready = None
            h = len(reply.actions)
            c.delivered_until = max(c.delivered_until, t0 + h - 1)
            c.exec_start = self.clock.now()  # the client queues the chunk now: execution runs from here
            if c.rtc:  # the reply log the next round's leftover is rebuilt from
                c.served = ServedChunk(np.asarray(reply.actions, np.float32), t0, c.exec_start)
            c.counts["chunks"] += 1
            c.counts["actions"] += h
            if self.cfg.keep_trace:
                c.trace.extend(np.asarray(reply.actions, np.float32))
        return self.pb.Actions(data=safe_pickle.dumps(self.payloads.timed_actions(reply.actions, t0, stamp)))

    # --- rounds -----------------------------------------------------------------------------
    def _offer(self, c: Client, tobs, obs: Observation) -> None:
        """Under the lock: LeRobot's server filter, then submit, or hold while generating."""
        step, stamp = obs.timestep, float(tobs.timestamp)
        c.counts["observations"] += 1
        c.newest = (step, stamp, obs)
        left = max(0, c.delivered_until - step)
        c.measure_rate(step, stamp, left > 0)
        if not tobs.must_go and c.last_state is not None and (
            step in c.predicted or float(np.linalg.norm(obs.joints - c.last_state)) < self.cfg.similarity_atol
        ):
            c.counts["filtered"] += 1
            return
        if c.group.fleet.generating(c.task_id):
            c.held = (step, stamp, obs)  # its round is generating: this one goes next (newest wins)
            return
        self._submit(c, step, stamp, obs)

    def _submit(self, c: Client, step: int, stamp: float, obs: Observation) -> None:
        """Under the lock: the client's next round, through its session; the reply comes to _on_reply."""
        now = self.clock.now()
        rid = c.next_round
        info = None
        if rid > 0:  # last exec info (package docstring): actions still queued on the robot
            start = c.exec_start if c.exec_start is not None else now
            info = ExecInfo(start, max(0, c.delivered_until - step), c.hz)
        req = InferenceRequest(c.task_id, rid, info, HorizonChoice("static", float(c.actions_per_chunk)),
                               obs, obs_stamp=obs.stamp,
                               rtc=rebuilt_guide(c.served, now, c.hz, step) if info is not None else None)

        fut = c.session.submit(req)
        if fut.done() and fut.exception() is not None:  # refused (counted by the fleet)
            e = fut.exception()
            raise Refused(e.code, grpc.StatusCode.FAILED_PRECONDITION, e.message, counted=True) from None
        c.submitted(rid, step, stamp, obs)  # under the lock: before any reply can come
        fut.add_done_callback(lambda f: self._on_reply(c, rid, f))

    def _refresh(self, reqs) -> list:
        """The core's refresher (outside the lock, at dispatch), for a batch's stale requests."""
        return [self._refresh_one(r) for r in reqs]

    def _refresh_one(self, req: InferenceRequest):
        """A LeRobot client cannot be asked for an observation, but the newest it sent (one
        filtered as similar, or held) is fresher than the queued one; the chunk is then timed
        from it. None: none newer."""
        with self.lock:
            c = self._by_task(req.task_id)
            meta = c.rounds.get(req.round_id) if c is not None else None
            if meta is None or c.newest is None or c.newest[0] <= meta[0]:
                return None
            step, stamp, obs = c.newest
            c.rounds[req.round_id] = (step, stamp)
            c.predicted.add(step)
            c.last_state = obs.joints
            if c.held is not None and c.held[0] <= step:
                c.held = None
            c.counts["refreshed"] += 1
            return obs, obs.stamp

    def _on_reply(self, c: Client, rid: int, fut) -> None:
        """Under the lock (the fleet answers under it): a chunk is ready; the observation held
        while it generated is answered by it (replan_held: predicted next, as LeRobot's server does)."""
        if fut.exception() is not None or self.clients.get(c.key) is not c:  # dropped, failed or gone: it asks again
            return
        meta = c.rounds.get(rid)
        if meta is not None:
            c.ready = (fut.result(), *meta)  # a newer chunk replaces one never fetched
        if c.held is not None:
            step, stamp, obs = c.held
            c.held = None
            if not self.cfg.replan_held:
                # Sent before the robot had this chunk: the chunk answers it. The robot asks again
                # itself once its queue is back at its threshold (must_go when it ran dry).
                c.counts["answered"] += 1
            elif step not in c.predicted:
                try:
                    self._submit(c, step, stamp, obs)
                except Refused as f:
                    log.warning("held observation of %s refused: %s", shown(c.peer, 80), f.message)
        self.changed.notify_all()

    def _by_task(self, task_id: str):
        """Under the lock: the client whose task this is, if any."""
        return next((c for c in self.clients.values() if c.task_id == task_id), None)

    def _reap_loop(self) -> None:
        while not self._stop.wait(min(0.5, self.cfg.upload_timeout_s / 4)):
            now = time.monotonic()
            with self.lock:
                late = [u for u in self.uploads.values() if u[0] < now and not u[2]]
                for u in late:
                    u[2] = True
                    self.uploads_cancelled += 1
            for u in late:  # frees the handler thread: the stream's next read fails
                u[1].cancel()
            cutoff = self.clock.now() - self.cfg.client_timeout_s
            with self.changed:
                for key in [k for k, c in self.clients.items() if c.last_seen < cutoff]:
                    c = self.clients.pop(key)
                    log.info("client %s silent for %.0f s: its task is dropped", shown(c.peer, 80), self.cfg.client_timeout_s)
                    self._end(c)
                    self.clients_reaped += 1
                self.changed.notify_all()
                idle = self.policies.idle(time.monotonic(), {c.group for c in self.clients.values()})
            for g in idle:  # outside the lock: its runner's threads are joined
                self.policies.unload(g)

    # --- errors and stats -------------------------------------------------------------------
    def _abort(self, context, f: Refused):
        if not f.counted:
            with self.lock:
                self.protocol_errors[f.key] = self.protocol_errors.get(f.key, 0) + 1
        log.warning("refused %s: %s", shown(context.peer(), 80), f.message)
        context.abort(f.code, f.message)

    def stats(self) -> dict[str, Any]:
        """`protocol_errors`: calls this endpoint refused before a request reached a core
        (payloads, policy setup, unknown clients); each policy's `errors`: its core's count of
        refused requests and failed batches."""
        with self.lock:
            out = {"protocol_errors": dict(self.protocol_errors), "clients_reaped": self.clients_reaped,
                   "evictions": dict(self.evictions), "sessions_resumed": self.sessions_resumed,
                   "policies_unloaded": self.policies.unloaded,
                   "calls": {**dict(self.guard.counts), **self.guard.stats()},
                   "uploads_open": len(self.uploads), "uploads_cancelled": self.uploads_cancelled,
                   "uploads_abandoned": self.uploads_abandoned,
                   "clients": {}, "policies": {}}
            for c in self.clients.values():
                out["clients"][c.task_id] = {**c.counts, "peer": c.peer, "control_hz": c.hz, "policy": None, "wait_ratio": 0.0}
                if c.group is not None:
                    out["clients"][c.task_id].update(policy=list(c.group.key[:2]), wait_ratio=c.group.fleet.wait_ratio(c.task_id))
            for g in self.groups.values():
                out["policies"]["%s:%s" % g.key[:2]] = g.stats()
            return out

    def trace(self, task_id: str) -> list:
        with self.lock:
            c = self._by_task(task_id)
            return list(c.trace) if c is not None else []

    def close(self) -> None:
        self._stop.set()
        self.guard.close()
        with self.changed:
            self.changed.notify_all()
        self.policies.close()


class LeRobotCompatServer:
    """The gRPC server around the servicer; `port` is the bound port (useful with port 0)."""

    def __init__(self, cfg: CompatConfig, clock=None, fleet=None) -> None:
        from concurrent import futures

        self.servicer = LeRobotCompatServicer(cfg, clock, fleet)
        pb_grpc = lerobot_modules()[3]
        # A piece of an observation is at most 2 MiB (LeRobot's CHUNK_SIZE); the joined payload is capped separately.
        opts = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]
        # The call guard (transport/call_guard.py): per-connection and total caps, receive deadlines.
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.threads), options=opts,
                                  interceptors=[self.servicer.guard], maximum_concurrent_rpcs=cfg.guard_limits().max_calls)
        pb_grpc.add_AsyncInferenceServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if self.port == 0:
            raise OSError(f"cannot bind {cfg.host}:{cfg.port}")
        self.server.start()

    def stop(self, grace: float = 1.0) -> None:
        self.servicer.close()
        self.server.stop(grace).wait()
