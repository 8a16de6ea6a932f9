"""The openpi websocket endpoint on a Fleet (serve/): a msgpack codec plus one fleet session
per connection (see the package docstring)."""
from __future__ import annotations

import asyncio
import hmac
import http
import logging
import threading
import time
from collections import Counter
from typing import Optional

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from ...core.errors import RequestError
from ...core.observation import BadObservation
from ...core.rtc import RtcGuide
from ...core.rtc_rebuild import ServedChunk, rebuilt_guide
from ...core.types import ExecInfo, HorizonChoice, InferenceRequest
from ...serve import Fleet, Session
from ..tensors import shown
from .codec import Refusal, pack, unpack
from .config import EndpointConfig
from .features import EXEC_KEY, KeyMap, PolicyFeatures, exec_info

log = logging.getLogger("robotserve.openpi")


def rtc_said(reply) -> dict:
    """The reply says which RTC delay d its chunk was inpainted with, when it was."""
    d = reply.rtc_delay_steps
    return {} if d is None else {"rtc_delay_steps": int(d)}


def rtc_guide(c, own, now: float):
    """A round's RTC guide: the client's own leftover where it sent one, else (rtc on) the one
    rebuilt from the session's last chunk and the time since; None: unguided."""
    if own is not None:
        return RtcGuide(own)
    return rebuilt_guide(c.served, now, c.hz) if c.rtc else None


class _Conn:
    """One openpi client: one task of the fleet scheduler."""

    def __init__(self, task_id: str, peer: str, hz: float, burst: int, session: Session) -> None:
        self.task_id, self.peer, self.hz, self.session = task_id, peer, hz, session
        self.addr = peer.rsplit(":", 1)[0]  # its address: what the per-peer budgets count by
        self.next_round = 0
        self.delivered_at: Optional[float] = None  # when its last chunk was sent
        self.served: Optional[ServedChunk] = None  # that chunk (rtc on: the leftover is rebuilt from it)
        self.rtc = False  # this session's real-time chunking: the server's `rtc`, or what the client said
        self.tokens, self.refilled = float(burst), time.monotonic()


class _HandshakeFailures(logging.Filter):
    """websockets logs a failed opening handshake (a port scan, a bare TCP connect, a health
    check speaking plain TCP) as an error with its traceback chain: one counted info line
    instead, so a probe cannot flood the log."""

    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() == "opening handshake failed" and record.exc_info:
            exc = record.exc_info[1]
            self.counts["bad_handshake"] += 1
            record.msg, record.args = "openpi: opening handshake failed: %s", (shown(str(exc) or type(exc).__name__, 120),)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class OpenPiEndpoint:
    """openpi's protocol (a msgpack metadata frame, then one observation frame answered by one
    actions frame) served on `fleet`: each connection is a session and a task of its
    core, batched with every other robot of the same engine, whatever protocol it speaks.

    `policy` goes into the metadata (type, source, revision)."""

    def __init__(self, cfg: EndpointConfig, fleet: Fleet, policy: Optional[dict] = None) -> None:
        self.cfg, self.fleet, self.engine, self.clock = cfg, fleet, fleet.engine, fleet.clock
        engine = self.engine
        self.api_key = cfg.api_key()  # ValueError at start: unreadable or empty
        self.keys = KeyMap(cfg.key_map, PolicyFeatures.of(engine))
        self.metadata = {"server": "robotserve_ros", "protocol": "openpi", "policy": dict(policy or {}),
                         **self.keys.metadata(), "control_hz": cfg.control_hz,
                         "horizon": cfg.horizon or self.keys.feats.chunk_len}
        self.refused: Counter = Counter()  # refusals by limit/reason, before or after the core
        self._ws_log = logging.getLogger(f"robotserve.openpi.ws.{id(self):x}")
        self._ws_log.addFilter(_HandshakeFailures(self.refused))
        self.counts: Counter = Counter()  # connections, rounds, chunks
        self.active = 0
        self.per_peer: Counter = Counter()  # connections at once by remote address
        self.pending_bytes = 0  # frames received and not yet answered (the loop thread only)
        self.pending_by_peer: Counter = Counter()  # the same by remote address
        self._n = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self.port, self.bound = 0, []
        self._thread = threading.Thread(target=self._run, name="openpi-endpoint", daemon=True)

    # --- life -------------------------------------------------------------------------------
    def start(self) -> "OpenPiEndpoint":
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise OSError(f"cannot serve openpi on {self.cfg.host}:{self.cfg.port}: {self._error}")
        log.info("openpi endpoint on ws://%s:%d (%s)", self.cfg.host, self.port,
                 "API key required" if self.api_key else "no API key")
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            # max_size: websockets refuses a larger frame from its header, before reading it.
            server = await serve(self._handle, self.cfg.host, self.cfg.port, process_request=self._http,
                                 process_response=self._http_done,
                                 max_size=self.cfg.max_message_bytes, compression=None,
                                 max_queue=(self.cfg.max_queued_frames, 1),  # resume reading at 1 left
                                 logger=self._ws_log)
        except OSError as e:
            self._error = e
            self._ready.set()
            return
        self.bound = [sk.getsockname()[:2] for sk in server.sockets]  # what it listens on
        self.port = self.bound[0][1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()

    def close(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=5.0)

    # --- handshake: /healthz, the API key, connections at once ------------------------------
    def _http(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self.api_key is not None:
            values = request.headers.get_all("Authorization")  # two of them: refused, not a 500
            given = (values[0] if len(values) == 1 else "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, b"Api-Key " + self.api_key):  # constant time
                self.refused["bad_api_key"] += 1
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong API key (Authorization: Api-Key ...)\n")
        if self.active >= self.cfg.max_connections:
            self.refused["too_many_connections"] += 1
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"{self.cfg.max_connections} robots connected already (max_connections); retry later\n")
        addr = connection.remote_address[0] if connection.remote_address else "?"
        if self.per_peer[addr] >= self.cfg.max_connections_per_peer:
            self.refused["too_many_connections_per_peer"] += 1
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"{self.cfg.max_connections_per_peer} connections from this address already "
                                      "(max_connections_per_peer); retry later\n")
        self.active += 1  # counted from the handshake, so two at once cannot both pass the last slot
        self.per_peer[addr] += 1
        connection.robotserve_counted = addr
        return None

    def _http_done(self, connection, request, response):
        """A handshake admitted above that still failed (a bad upgrade) gives its slot back."""
        if getattr(connection, "robotserve_counted", None) and response.status_code != http.HTTPStatus.SWITCHING_PROTOCOLS:
            self._release(connection)
        return response

    def _release(self, connection) -> None:
        """A counted connection's slot, and its address's, are free again (once)."""
        addr, connection.robotserve_counted = getattr(connection, "robotserve_counted", None), None
        if addr:
            self.active -= 1
            self.per_peer[addr] -= 1
            if not self.per_peer[addr]:
                del self.per_peer[addr]

    # --- one connection ---------------------------------------------------------------------
    async def _handle(self, ws) -> None:
        self._n += 1
        peer = "%s:%s" % ws.remote_address[:2] if ws.remote_address else "?"
        c = _Conn(f"openpi/{peer}#{self._n}", peer, self.cfg.control_hz, self.cfg.rate_burst,
                  self.fleet.session("openpi", peer))
        c.rtc = self.cfg.rtc
        self.counts["connections"] += 1
        try:
            await ws.send(pack(self.metadata))
            while True:
                try:
                    msg = await asyncio.wait_for(ws.recv(), self.cfg.idle_timeout_s)
                except asyncio.TimeoutError:
                    raise Refusal("idle", f"no observation for idle_timeout_s ({self.cfg.idle_timeout_s} s)") from None
                await ws.send(await self._budgeted_round(c, msg))
        except Refusal as r:
            if r.key != "counted":
                self.refused[r.key] += 1
            log.warning("openpi client %s refused: %s", shown(c.peer, 64), r.message)
            try:
                await ws.send(r.message)  # one line: the client raises RuntimeError with it
                await ws.close(1008, r.key)
            except ConnectionClosed:
                pass
        except ConnectionClosed:  # openpi clients never close; a gone robot is this
            pass
        finally:
            self._release(ws)
            self._end(c)

    async def _budgeted_round(self, c: _Conn, msg) -> bytes:
        """A frame is held until answered within max_pending_bytes_per_peer of its address and
        max_pending_bytes of all together: past either, refused at once (and let go) rather than
        queued behind the others, so one address cannot take the whole budget."""
        n, addr, cfg = len(msg), c.addr, self.cfg
        for held, cap, name in ((self.pending_by_peer[addr], cfg.max_pending_bytes_per_peer, "max_pending_bytes_per_peer"),
                                (self.pending_bytes, cfg.max_pending_bytes, "max_pending_bytes")):
            if held + n > cap:
                raise Refusal("busy", f"the server holds {name} ({cap}) of frames not yet answered; retry later")
        self.pending_bytes += n
        self.pending_by_peer[addr] += n
        try:
            return await self._round(c, msg)
        finally:
            self.pending_bytes -= n
            self.pending_by_peer[addr] -= n
            if not self.pending_by_peer[addr]:
                del self.pending_by_peer[addr]

    async def _round(self, c: _Conn, msg) -> bytes:
        """One infer(): decode, map, submit, wait for the chunk; the reply frame."""
        received = time.monotonic()
        if isinstance(msg, str):
            raise Refusal("bad_message", "send observations as binary msgpack frames")
        self._rate(c, received)
        raw = unpack(msg, self.cfg.limits)
        try:
            left, c.hz, horizon, reset, want_rtc, own = exec_info(raw.get(EXEC_KEY), c.hz)
            obs = self.keys.observation(raw, self.clock.now())
        except BadObservation as e:  # a malformed request of this robot's task: the fleet counts it
            c.session.refuse(e)
            raise Refusal("counted", e.message) from None
        if reset and c.next_round:  # a new episode (RoboLab's env reset): a fresh task
            self._end(c)
            self._n += 1
            c.task_id, c.next_round, c.delivered_at, c.served = f"openpi/{c.peer}#{self._n}", 0, None, None
        now = self.clock.now()
        info = None
        if c.next_round:
            # openpi's client blocks in infer() until the chunk comes: a robot calling has run out of
            # actions (ActionChunkBroker asks when its chunk is spent), unless it says otherwise.
            info = ExecInfo(now, left or 0, c.hz)
        h = horizon or self.cfg.horizon or self.keys.feats.chunk_len
        c.rtc = c.rtc if want_rtc is None else want_rtc  # a per-session option: it holds until said again
        rtc = rtc_guide(c, own, now) if info is not None else None  # (round 0: nothing of ours is running)
        req = InferenceRequest(c.task_id, c.next_round, info, HorizonChoice("static", float(h)), obs, obs_stamp=obs.stamp,
                               rtc=rtc)
        key = (c.task_id, c.next_round)
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(c.session.submit(req)), self.cfg.reply_timeout_s)
        except RequestError as e:  # counted by the fleet
            raise Refusal("counted", e.message) from None
        except asyncio.TimeoutError:
            c.session.withdraw(*key)
            raise Refusal("reply_timeout", f"round {key[1]} not served within reply_timeout_s ({self.cfg.reply_timeout_s} s)") from None
        c.next_round += 1
        c.delivered_at = self.clock.now()
        if c.rtc:
            c.served = ServedChunk(reply.actions, None, c.delivered_at)
        self.counts["chunks"] += 1
        infer_ms = (time.monotonic() - received) * 1e3
        return pack({"actions": reply.actions.astype("float32", copy=False),
                     "server_timing": {"infer_ms": infer_ms}, "robotserve": {"round": key[1], "task": c.task_id,
                                                                            **rtc_said(reply)}})

    def _rate(self, c: _Conn, now: float) -> None:
        """Token bucket: max_rate_hz calls per second, rate_burst at once."""
        cfg = self.cfg
        c.tokens = min(cfg.rate_burst, c.tokens + (now - c.refilled) * cfg.max_rate_hz)
        c.refilled = now
        if c.tokens < 1.0:
            raise Refusal("rate_limited", f"more than max_rate_hz ({cfg.max_rate_hz}) infer calls per second")
        c.tokens -= 1.0

    def _end(self, c: _Conn) -> None:
        """The robot left (or reset): its queued round and observation history go."""
        c.session.drop(c.task_id, "task_dropped", "the robot left")

    def stats(self) -> dict:
        mix = {k: n for k, n in self.fleet.batches_by_protocols().items() if "openpi" in k.split("+")}
        return {"connected": self.active, "peers": len(self.per_peer), "pending_bytes": self.pending_bytes,
                "refused": dict(self.refused), **self.counts, "batches_by_protocols": mix}
