"""The openpi websocket endpoint on a Fleet (serve/): a msgpack codec plus one fleet session
per connection (see the package docstring)."""
from __future__ import annotations

import asyncio
import hmac
import http
import logging
import threading
import time
import traceback
from collections import Counter
from typing import Optional

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, PayloadTooBig
from websockets.frames import OP_CONT, OP_BINARY, OP_TEXT

from ...core.errors import RequestError
from ...core.observation import BadObservation
from ...core.rtc import RtcGuide
from ...core.rtc_rebuild import ServedChunk, rebuilt_guide
from ...core.types import ExecInfo, HorizonChoice, InferenceRequest
from ...serve import Fleet, Session
from .. import heap
from ..tensors import shown
from .budget import TooLarge
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
        self.next_round = 0
        self.delivered_at: Optional[float] = None  # when its last chunk was sent
        self.served: Optional[ServedChunk] = None  # that chunk (rtc on: the leftover is rebuilt from it)
        self.rtc = False  # this session's real-time chunking: the server's `rtc`, or what the client said
        self.tokens, self.refilled = float(burst), time.monotonic()


class _Gated(ServerConnection):
    """A websocket connection that reads a frame's body only once the budgets (budget.py) hold
    its bytes: reserved from the frame's header (websockets' parser reads header then body with
    reader.read_exact), released when its round ends (`release`) or the connection is lost. A
    frame waiting for budget pauses this socket's reading; its client's bytes stay in TCP.
    Written against websockets 15's sans-I/O reader (setup.py pins 15.x)."""

    peer: Optional[tuple] = None  # set once the handshake is admitted: only frames after it are budgeted
    done = False  # its handler has ended
    endpoint: "OpenPiEndpoint"

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.reserved, self.ticket = 0, None
        read_exact, handle_frame = self.protocol.reader.read_exact, self.protocol.recv_frame

        def budgeted_read_exact(n: int):
            if n > 125 and self.peer is not None:  # a body (a control frame's is <= 125 bytes)
                if self.done:  # nobody will answer it: not read (the parser fails, drops the rest)
                    raise EOFError("the connection's handler has ended")
                yield from self._reserve(n)
            return (yield from read_exact(n))

        def recv_frame(frame) -> None:
            if frame.opcode not in (OP_CONT, OP_BINARY, OP_TEXT):  # ping/pong/close: not held
                self.release(len(frame.data))
            handle_frame(frame)

        self.protocol.reader.read_exact, self.protocol.recv_frame = budgeted_read_exact, recv_frame

    def _reserve(self, n: int):
        try:
            t = self.endpoint.budgets.reserve(self.peer, n, lambda: self._granted(t))
        except TooLarge as e:
            self.endpoint.refused["frame_over_budget"] += 1
            msg = (f"a frame of {n} bytes can never fit {e.name} ({e.cap}): send smaller observations")
            self.protocol.send_text(msg.encode())
            raise PayloadTooBig(n, e.cap) from None  # the parser closes with 1009
        while not t.granted:
            if self.done:
                raise EOFError("the connection's handler has ended")
            self.ticket = t
            self.transport.pause_reading()  # again after every resume by websockets' own flow control
            yield
        self.ticket = None
        self.reserved += n

    def _granted(self, t) -> None:
        if self.ticket is t:
            self.transport.resume_reading()
            self.endpoint._loop.call_soon(self._redrive)

    def _redrive(self) -> None:
        """The parser waits in _reserve until data comes: bring it on with what is buffered."""
        if not self.protocol.reader.eof:
            self.data_received(b"")

    def stop_reading(self) -> None:
        """Its handler has ended: no frame of it is read any more (a waiting one gives its
        turn up, and the parser fails and drops the rest unread), and the bytes reserved for
        frames it queued are freed."""
        self.done = True
        if self.ticket is not None:
            self.endpoint.budgets.cancel(self.ticket)
            self.ticket = None
            self.transport.resume_reading()
            self.endpoint._loop.call_soon(self._redrive)
        self.release(self.reserved)

    def release(self, n: int) -> None:
        n = min(n, self.reserved)
        if n > 0 and self.peer is not None:
            self.reserved -= n
            self.endpoint.budgets.release(self.peer, n)

    def connection_lost(self, exc) -> None:
        if self.ticket is not None:
            self.endpoint.budgets.cancel(self.ticket)
        self.release(self.reserved)
        super().connection_lost(exc)
        # The connection lives on in reference cycles until a garbage collection, and with it
        # the frames it still holds: the parser's last one (a local of the frame its error's
        # traceback keeps), those queued for a handler that will not read them (the peer is
        # gone, no answer could reach it). Let them go now.
        self.protocol.parser.close()  # receive_eof() has run: it is never stepped again
        if self.protocol.parser_exc is not None:
            traceback.clear_frames(self.protocol.parser_exc.__traceback__)
        self.recv_messages.frames.queue.clear()
        del self.protocol.reader.read_exact, self.protocol.recv_frame
        self.endpoint.heap_after_close()


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
        self.api_keys = cfg.api_keys()  # ValueError at start: unreadable or empty
        self.keys = KeyMap(cfg.key_map, PolicyFeatures.of(engine))
        self.metadata = {"server": "robotserve_ros", "protocol": "openpi", "policy": dict(policy or {}),
                         **self.keys.metadata(), "control_hz": cfg.control_hz,
                         "horizon": cfg.horizon or self.keys.feats.chunk_len}
        self.refused: Counter = Counter()  # refusals by limit/reason, before or after the core
        self._ws_log = logging.getLogger(f"robotserve.openpi.ws.{id(self):x}")
        self._ws_log.addFilter(_HandshakeFailures(self.refused))
        self.counts: Counter = Counter()  # connections, rounds, chunks
        self.budgets = cfg.budgets()  # connections and frame bytes per peer and in total (the loop thread only)
        self._trim_at, self._trim_due = 0.0, False
        self._connection = type("GatedConnection", (_Gated,), {"endpoint": self})
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
                 f"{len(self.api_keys)} API key(s) required" if self.api_keys else "no API key")
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        heap.return_large_frees()  # a freed frame buffer goes back to the OS (glibc; heap.py)
        try:
            # max_size: websockets refuses a larger frame from its header, before reading it.
            server = await serve(self._handle, self.cfg.host, self.cfg.port, process_request=self._http,
                                 process_response=self._http_done,
                                 max_size=self.cfg.max_message_bytes, compression=None,
                                 max_queue=(self.cfg.max_queued_frames, 1),  # resume reading at 1 left
                                 logger=self._ws_log, create_connection=self._connection)
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
        if self.api_keys:
            values = request.headers.get_all("Authorization")  # two of them: refused, not a 500
            given = (values[0] if len(values) == 1 else "").encode("utf-8", "replace")
            holder = None
            for i, key in enumerate(self.api_keys):  # constant time each, every key compared
                if hmac.compare_digest(given, b"Api-Key " + key):
                    holder = i
            if holder is None:
                self.refused["bad_api_key"] += 1
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong API key (Authorization: Api-Key ...)\n")
            peer = ("key", holder)  # budgeted per key holder, wherever its robots connect from
        else:
            peer = ("addr", connection.remote_address[0] if connection.remote_address else "?")
        full = self.budgets.admit(peer)  # counted from the handshake, so two at once cannot both pass the last slot
        if full is not None:
            self.refused["too_many_connections" + full[len("max_connections"):]] += 1
            cap = getattr(self.cfg, full)
            whose = {"max_connections": "robots are", "max_connections_per_peer": "from this address (no API key) are",
                     "max_connections_per_key": "with this API key are"}[full]
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"{cap} connections {whose} open already ({full}); retry later\n")
        connection.peer = peer
        return None

    def _http_done(self, connection, request, response):
        """A handshake admitted above that still failed (a bad upgrade) gives its slot back."""
        if connection.peer is not None and response.status_code != http.HTTPStatus.SWITCHING_PROTOCOLS:
            self._release(connection)
        return response

    def _release(self, connection) -> None:
        """A counted connection's slot, and its peer's, are free again (once)."""
        if getattr(connection, "counted", True) and connection.peer is not None:
            connection.counted = False
            self.budgets.leave(connection.peer)

    def _let_go(self, ws) -> None:
        """Its handler is done: its slot and frame bytes go back (_Gated.stop_reading)."""
        ws.stop_reading()
        self._release(ws)

    def heap_after_close(self) -> None:
        """A connection closed: once no frame is held, the arenas' free pages go back to the OS
        (malloc_trim: the 256 KiB socket reads of a burst fragment them), at most once a second,
        the last close of a burst included."""
        if self.budgets.held_total or self._trim_due:
            return
        self._trim_due = True
        self._loop.call_at(max(self._loop.time(), self._trim_at), self._trim)

    def _trim(self) -> None:
        self._trim_due = False
        if not self.budgets.held_total:
            self._trim_at = self._loop.time() + 1.0
            heap.trim()

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
                await ws.send(await self._budgeted_round(ws, c, msg))
        except Refusal as r:
            if r.key != "counted":
                self.refused[r.key] += 1
            log.warning("openpi client %s refused: %s", shown(c.peer, 64), r.message)
            self._let_go(ws)  # now: the close handshake may take close_timeout
            try:
                await ws.send(r.message)  # one line: the client raises RuntimeError with it
                await ws.close(1008, r.key)
            except ConnectionClosed:
                pass
        except ConnectionClosed:  # openpi clients never close; a gone robot is this
            pass
        finally:
            self._let_go(ws)
            self._end(c)

    async def _budgeted_round(self, ws, c: _Conn, msg) -> bytes:
        """A frame's bytes, reserved before it was read (_Gated), are held until it is answered."""
        try:
            return await self._round(c, msg)
        finally:
            ws.release(len(msg) if isinstance(msg, bytes) else len(msg.encode()))

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
        b = self.budgets
        return {"connected": b.active, "peers": len(b.connections), "pending_bytes": b.held_total,
                "waiting_for_budget": len(b.waiting),
                "refused": dict(self.refused), **self.counts, "batches_by_protocols": mix}
