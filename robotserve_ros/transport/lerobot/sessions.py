"""The LeRobot endpoint's sessions: issued ids, the connection's own session (LeRobot's
unchanged RobotClient names none), caps with least-recently-used eviction, and the
re-establishment of an evicted connection session. A mixin of the servicer: a method
documented "under the lock" runs under the servicer's lock."""
from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict

import grpc

from ...core.observation import Observation
from ..tensors import shown
from .clients import Client
from .payloads import Refused

log = logging.getLogger("robotserve.lerobot")
SESSION_HEADER = "robotserve-session"  # a session id the server issued (Ready's initial metadata); "new" on Ready: another session


def _obs_bytes(obs: Observation) -> int:
    return sum(int(i.nbytes) for i in obs.images) + int(obs.joints.nbytes)


class Sessions:
    """Sessions by id, the connection sessions by peer, and what an evicted connection
    session had been told (its policy instructions), so that the unchanged client, which
    calls Ready and SendPolicyInstructions once, is served again on its next call: the
    server repeats those two calls for it (issue 37 item 5). At most max_sessions are
    remembered; one the client ends itself (a new Ready) or that went silent is forgotten."""

    def _init_sessions(self) -> None:
        self.clients: dict[str, Client] = {}  # by session id (issued here, unguessable)
        self.by_peer: dict[str, str] = {}  # connection -> its session (clients that name none: LeRobot's)
        self.evicted: OrderedDict = OrderedDict()  # connection -> (policy spec, rtc) its evicted session had
        self.evictions: dict[str, int] = {}
        self.sessions_resumed = 0

    @staticmethod
    def _session_header(context):
        for k, v in context.invocation_metadata() or ():
            if k == SESSION_HEADER and v:
                return v
        return None

    def _key(self, context):
        """The call's session: the id it names (one this server issued: never taken on the
        client's word), else its connection's session. None: no session."""
        sid = self._session_header(context)
        if sid is not None:
            return sid
        with self.lock:
            return self.by_peer.get(context.peer())

    def _client(self, key, context) -> Client:
        """Under the lock: the session, or no_session (an id never issued reads the same as
        one that ended: no oracle for live ids)."""
        c = self.clients.get(key) if key is not None else None
        if c is None:
            raise self._no_session()
        c.lru = time.monotonic()
        return c

    @staticmethod
    def _no_session() -> Refused:
        return Refused("no_session", grpc.StatusCode.FAILED_PRECONDITION,
                       "no session for this call (it names no session this server issued, or it was silent too long): "
                       "call Ready and SendPolicyInstructions first")

    def _start_client(self, key: str, peer: str) -> Client:
        """Under the lock: a new task for session `key`, ending the one it had; past
        max_sessions the least recently used other session is evicted (counted)."""
        old = self.clients.pop(key, None)
        if old is not None:
            self._end(old, unbind=False)  # the same session, a new task: still its connection's
        while len(self.clients) >= self.cfg.max_sessions:
            self._evict("sessions_evicted")
        self._n += 1
        c = self.clients[key] = Client(key, f"lerobot/{peer}#{self._n}", self.clock.now(), self.cfg.fps)
        c.peer, c.lru = peer, time.monotonic()
        self.changed.notify_all()
        return c

    def _connection_session(self, peer: str) -> Client:
        """Under the lock: a new session for the connection (a second Ready restarts it)."""
        self.evicted.pop(peer, None)  # the client starts afresh itself
        prev = self.by_peer.get(peer)
        if prev is not None and prev in self.clients:
            self._end(self.clients.pop(prev))
        c = self._start_client(secrets.token_urlsafe(18), peer)  # unguessable: 144 random bits
        self.by_peer[peer] = c.key
        return c

    def _evict(self, why: str, keep=None) -> None:
        """Under the lock: end the least recently used session other than `keep`."""
        lru = min((c for c in self.clients.values() if c is not keep), key=lambda c: c.lru)
        log.warning("session of %s evicted (%s): task %s dropped", shown(lru.peer, 80), why, shown(lru.task_id, 120))
        if self.by_peer.get(lru.peer) == lru.key and lru.spec is not None:  # its next call re-establishes it
            self.evicted[lru.peer] = (lru.spec, lru.rtc)
            while len(self.evicted) > self.cfg.max_sessions:
                self.evicted.popitem(last=False)
        self._end(self.clients.pop(lru.key))
        self.evictions[why] = self.evictions.get(why, 0) + 1
        self.changed.notify_all()

    def _bound_bytes(self, c: Client) -> None:
        """Under the lock: the observations sessions hold within max_session_bytes, the least
        recently used others evicted first; a session that alone passes it is refused."""
        c.held_bytes = sum(_obs_bytes(o[2]) for o in (c.newest, c.held) if o is not None)
        total = sum(x.held_bytes for x in self.clients.values())
        while total > self.cfg.max_session_bytes and len(self.clients) > 1:
            self._evict("session_bytes_evicted", keep=c)
            total = sum(x.held_bytes for x in self.clients.values())
        if total > self.cfg.max_session_bytes:
            c.newest = c.held = None
            c.held_bytes = 0
            raise Refused("session_bytes", grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this session's observations pass max_session_bytes ({self.cfg.max_session_bytes})")

    def _end(self, c: Client, unbind: bool = True) -> None:
        """Under the lock: drop the client's task, its queued round and its observation history."""
        if unbind and self.by_peer.get(c.peer) == c.key:
            del self.by_peer[c.peer]
        if c.session is not None:
            c.session.drop(c.task_id, "task_dropped", "the client's session ended")

    def _resumed_key(self, context):
        """The call's session after re-establishing an evicted one (None: still none)."""
        self._resume(context)
        return self._key(context)

    def _resume(self, context) -> None:
        """A call naming no session from a connection whose session was evicted: that session
        again, as Ready and SendPolicyInstructions would make it (a fresh task; the policy is
        resolved again, outside the lock, as it may load). Nothing when there is none to resume."""
        if self._session_header(context) is not None:
            return
        peer = context.peer()
        with self.lock:
            was = self.evicted.pop(peer, None) if peer not in self.by_peer else None
        if was is None:
            return
        spec, rtc = was
        try:
            resolved = self.policies.resolve(spec)
        except Refused:  # e.g. every policy slot in use: this call says so, the next one tries again
            with self.lock:
                self.evicted.setdefault(peer, was)
            raise
        with self.lock:
            if peer in self.by_peer:  # another call of this connection resumed it first
                return
            self._use_policy(self._connection_session(peer), spec, *resolved, rtc=rtc)
            self.sessions_resumed += 1
        log.info("session of %s re-established after its eviction", shown(peer, 80))

    def _use_policy(self, c: Client, spec, group, layout, apc: int, rtc: bool = False) -> None:
        """Under the lock: session `c` runs `spec` (its group, layout, chunk size) from now on,
        with real-time chunking or not (the robotserve-rtc header of its setup call)."""
        c.group, c.layout, c.actions_per_chunk, c.spec, c.rtc = group, layout, apc, spec, rtc
        c.session = group.fleet.session("lerobot", c.peer)
        c.last_seen = self.clock.now()
        group.last_used = time.monotonic()
