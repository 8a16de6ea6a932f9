"""The engine core in its own process (issue 38 item 3; anchor: vLLM v1's EngineCore, a
busy loop holding scheduler and engine, fed by front-end processes over ZMQ + msgspec).

`python -m robotserve_ros.serve.core_process --address ipc://... --config FILE` holds one
Fleet (core, scheduler, engine, Runner: build_fleet) and serves it on a ZMQ ROUTER socket to
the ROS front ends (serve/remote.py's RemoteFleet), in serve/wire.py's messages. One thread
owns the socket (ZMQ sockets are not thread-safe): it reads the front ends' messages, and
sends what the Runner's threads queue (replies, refresh asks), woken through a pipe.

A message that does not decode, or carries a bad array, is refused and counted
(`ipc_refused`), never fatal. With no front end heard for orphan_s the process exits: a
front end killed hard leaves no core behind for long, and one restarted within orphan_s
attaches to it and loses no round (the Fleet's de-duplication answers re-sent rounds once).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict

import zmq

from ..core.errors import RequestError
from ..core.types import ExecInfo
from . import wire
from .fleet import Proof, Refused

log = logging.getLogger("robotserve.engine_core")


class SystemClock:
    """The front end's ROS clock without ROS: system time, the time line robots stamp on."""

    def now(self) -> float:
        return time.time()


def _proof(p) -> Proof | None:
    return Proof(p.stamp_ns, p.mac, p.body, p.kind) if p is not None else None


class CoreServer:
    """A Fleet served on a ROUTER socket at `address` (see the module docstring)."""

    def __init__(self, fleet, address: str, fingerprint: str, facts: dict, *, orphan_s: float = 30.0,
                 refresh_timeout_s: float = 0.05, reap_every_s: float = 1.0, ctx=None) -> None:
        self.fleet, self.fingerprint, self.facts = fleet, fingerprint, facts
        self.orphan_s, self.refresh_timeout_s, self.reap_every_s = orphan_s, refresh_timeout_s, reap_every_s
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._out = wire.Outbox()
        self._sessions: dict = {}  # robot -> its Session ("ros" protocol, as the inline server's)
        self._front: dict = {}  # task id -> the identity of the front end that last submitted it
        self._asks: dict = {}  # refresh ask id -> Future of its fresh observations
        self._ask_id = 0
        self.counts = {"ipc_refused": 0, "finished": 0, "reaped": 0, "wait_sum": 0.0}
        self.progress_refused: dict = {}
        self.served_by_tier: dict = {}
        self.reaped: list = []  # task ids reaped since the last ping
        self.heard_at = time.monotonic()
        self.stopping = threading.Event()
        self.started_at = fleet.clock.now()
        self.metrics_port = -1
        fleet.batch_listeners.append(self._count_tiers)

    # --- out (any thread) ----------------------------------------------------------------------
    def send(self, ident: bytes, msg) -> None:
        self._out.put((ident, wire.encode(msg)))

    def _count_tiers(self, replies, _d, _r) -> None:
        for r in replies:
            self.served_by_tier[r.tier] = self.served_by_tier.get(r.tier, 0) + 1

    # --- the loop (the socket's own thread) ------------------------------------------------------
    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._out.wake_r, zmq.POLLIN)
        next_reap = time.monotonic() + self.reap_every_s
        while not self.stopping.is_set():
            self._out.wait(poller, 250, self.sock.send_multipart)
            while self.sock.poll(0, zmq.POLLIN):
                ident, *frames = self.sock.recv_multipart()
                self.heard_at = time.monotonic()
                self._handle(ident, frames[-1] if frames else b"")
            now = time.monotonic()
            if now >= next_reap:
                next_reap = now + self.reap_every_s
                self._reap()
            if now - self.heard_at > self.orphan_s:
                log.warning("no front end heard for %.0f s: the engine core stops", self.orphan_s)
                break

    def _handle(self, ident: bytes, data: bytes) -> None:
        try:
            m = wire.decode_to_core(data)
        except wire.DecodeError as e:  # not one of ours: counted, the sender told when it said who it is
            self._refuse(ident, None, f"undecodable message: {e}")
            return
        try:
            if isinstance(m, wire.Submit):
                self._submit(ident, m)
            elif isinstance(m, wire.Ping):
                reaped, self.reaped = self.reaped, []
                self.send(ident, wire.Pong(m.id, self.fleet.expected_wait_s(), reaped, os.getpid()))
            elif isinstance(m, wire.Progress):
                self._progress(m)
            elif isinstance(m, wire.Call):
                self._call(ident, m)
            elif isinstance(m, wire.RefreshReply):
                self._refreshed(m)
            elif isinstance(m, wire.Hello):
                same = m.version == wire.WIRE_VERSION and m.fingerprint == self.fingerprint
                self.send(ident, wire.Result(0, {"pid": os.getpid(), "facts": self.facts, "same": same}))
            elif isinstance(m, wire.Bye) and m.stop:
                self.stopping.set()
        except wire.BadWire as e:
            self._refuse(ident, getattr(m, "id", None), str(e))

    def _refuse(self, ident: bytes, msg_id, why: str) -> None:
        self.counts["ipc_refused"] += 1
        log.warning("refused an IPC message: %s", why)
        self.fleet.count_error(Refused("bad_request", f"IPC: {why}"), "ipc")
        if msg_id:
            self.send(ident, wire.Reply(msg_id, code="bad_request", message=why))

    def _submit(self, ident: bytes, m: wire.Submit) -> None:
        req = wire.request_in(m.req)  # BadWire: refused
        s = self._sessions.get(m.robot)
        if s is None:
            s = self._sessions[m.robot] = self.fleet.session("ros", m.robot)
        self._front[req.task_id] = ident
        s.submit(req, _proof(m.proof)).add_done_callback(lambda f: self.send(ident, reply_of(m.id, f)))

    def _progress(self, m: wire.Progress) -> None:
        """A robot's progress, as the inline server applies it (nodes/server_progress.py)."""
        from .progress import apply_progress

        info = ExecInfo(m.exec_start, 0, m.control_hz or 1.0) if m.done else None
        out = apply_progress(self.fleet, m.task_id, m.robot, _proof(m.proof), info)
        if isinstance(out, str):
            self.progress_refused[out] = self.progress_refused.get(out, 0) + 1
        elif out is not None:
            self.counts["finished"] += 1
            self.counts["wait_sum"] += out.closed_wait
            self._front.pop(m.task_id, None)

    def _call(self, ident: bytes, m: wire.Call) -> None:
        f = self.fleet
        try:
            if m.name == "knows":
                value = f.knows(str(m.args[0]))
            elif m.name == "tasks":
                value = f.tasks()
            elif m.name == "drop":
                f.drop(*[str(a) for a in m.args[:3]])
                value = None
            elif m.name == "check_owner":
                f.check_owner(str(m.args[0]), str(m.args[1]), Proof(int(m.args[2]), bytes(m.args[3]),
                                                                    bytes(m.args[4]), str(m.args[5])))
                value = None
            elif m.name == "count_error":
                f.count_error(Refused(str(m.args[0]), str(m.args[1])), str(m.args[2]), str(m.args[3]))
                value = None
            elif m.name == "stats":
                value = self.stats(float(m.args[0]) if m.args else None)
            else:
                raise wire.BadWire(f"no call {m.name!r}")
        except RequestError as e:
            if m.id:
                self.send(ident, wire.Result(m.id, None, e.code, e.message))
            return
        except (IndexError, TypeError, ValueError) as e:
            raise wire.BadWire(f"call {m.name}: {type(e).__name__}: {e}") from None
        if m.id:
            self.send(ident, wire.Result(m.id, value))

    def stats(self, started_at=None) -> dict:
        from .stats import load_stats

        f = self.fleet
        with f.lock:
            robots = {t: f.robot_of(t) for t in f.tasks()}
        out = load_stats(f, self.started_at if started_at is None else started_at, robots)
        out.update({"protocols": f.protocol_stats(), "served_by_tier": dict(self.served_by_tier),
                    "finished_tasks": self.counts["finished"], "reaped_tasks": self.counts["reaped"],
                    "progress_refused": dict(self.progress_refused), "ipc_refused": self.counts["ipc_refused"],
                    "metrics_port": self.metrics_port, "core_pid": os.getpid()})
        return out

    def _reap(self) -> None:
        for tid in self.fleet.reap():
            log.warning("task %r silent: reaped", tid)
            self.counts["reaped"] += 1
            self.reaped.append(tid)
            self._front.pop(tid, None)

    # --- refresh through the front end (seed 000 Algorithm 1 lines 20-21) -------------------------
    def refresh(self, reqs) -> list:
        """The core's refresher: the front end holding the robots' refresh services asks them."""
        ident = self._front.get(reqs[0].task_id) if reqs else None
        if ident is None:
            return [None] * len(reqs)
        fut: Future = Future()
        with self.fleet.lock:
            self._ask_id += 1
            ask = self._ask_id
            self._asks[ask] = fut
        self.send(ident, wire.RefreshAsk(ask, [(r.task_id, r.round_id) for r in reqs]))
        try:
            got = fut.result(timeout=self.refresh_timeout_s + 0.25)
        except Exception:  # the front end did not answer in time: the rounds go with what they have
            got = None
        finally:
            self._asks.pop(ask, None)
        if got is None or len(got) != len(reqs):
            return [None] * len(reqs)
        return [(wire.obs_in(g[0]), g[1]) if g is not None else None for g in got]

    def _refreshed(self, m: wire.RefreshReply) -> None:
        fut = self._asks.get(m.id)
        if fut is not None and not fut.done():
            fut.set_result(m.fresh)

    def close(self) -> None:
        self.stopping.set()
        self.sock.close(0)
        if self.address.startswith("ipc://"):  # a clean stop leaves no socket file behind
            try:
                os.unlink(self.address[len("ipc://"):])
            except OSError:
                pass
        self._out.close()


def reply_of(msg_id: int, fut) -> wire.Reply:
    err = fut.exception()
    if err is None:
        return wire.Reply(msg_id, wire.chunk_out(fut.result()))
    return wire.Reply(msg_id, None, getattr(err, "code", "internal"), getattr(err, "message", repr(err)))


def engine_facts(engine, spec) -> dict:
    """What the front end needs of the engine without holding it: its observation spec (the
    checks before a request is sent), action columns, chunk length."""
    return {"spec": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()} if spec else None,
            "action_dim": engine.action_dim, "chunk_len": getattr(engine, "chunk_len", None),
            "action_names": list(engine.action_names or []),
            "saturation_batch": engine.profile.saturation_batch}


def build_server(tree: dict, address: str, fingerprint: str, orphan_s: float):
    """The Fleet of an inference server's parameter tree, and its CoreServer (not yet serving)."""
    from ..config import from_tree
    from ..core.task_auth import TaskBinder
    from ..nodes.server_config import InferenceServerConfig
    from .build import build_tiers, server_fleet

    c = from_tree(InferenceServerConfig, tree)
    clock = SystemClock()
    tiers = build_tiers(c, clock)
    binder = TaskBinder(c.task_auth.key_dir, c.task_auth.max_skew_s) if c.task_auth.key_dir else None
    holder: list = []  # the server, once built: the core's refresher asks through it
    fleet = server_fleet(c, clock, tiers, refresher=lambda reqs: holder[0].refresh(reqs), binder=binder,
                         on_error=lambda d, e: log.error("tier %s failed a batch of %d: %r; requeued",
                                                         d.tier, len(d.requests), e))
    srv = CoreServer(fleet, address, fingerprint, engine_facts(tiers.engine, tiers.engine.observation_spec),
                     orphan_s=orphan_s, refresh_timeout_s=c.refresh_timeout_s,
                     reap_every_s=min(1.0, c.task_timeout_s / 4))
    holder.append(srv)
    if c.metrics.port >= 0:  # the figures live here: the endpoint too
        from .metrics import MetricsServer

        m = MetricsServer(fleet, c.metrics.port, c.metrics.address, c.metrics.per_robot)
        srv.metrics_port, srv.metrics = m.port, m
    return srv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="robotserve-engine-core", description=__doc__.splitlines()[0])
    ap.add_argument("--address", required=True, help="ipc://PATH or tcp://127.0.0.1:PORT to bind")
    ap.add_argument("--config", required=True, help="the inference server's parameter tree, JSON")
    ap.add_argument("--fingerprint", default="", help="what a front end checks it attaches to")
    ap.add_argument("--orphan-s", type=float, default=30.0, help="stop when no front end is heard this long")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[engine core %(process)d] %(levelname)s %(message)s")
    if a.address.startswith("tcp://") and not a.address.startswith("tcp://127.0.0.1:"):
        print(f"robotserve-engine-core: --address {a.address}: only ipc:// or tcp://127.0.0.1 (loopback)", file=sys.stderr)
        return 2
    srv = build_server(json.loads(open(a.config).read()), a.address, a.fingerprint, a.orphan_s)
    srv.fleet.start()
    log.info("engine core serving on %s", srv.address)
    try:
        srv.serve()
    finally:
        srv.fleet.close()
        for eng in {id(e): e for e in srv.fleet.engines.values()}.values():
            eng.close()
        if getattr(srv, "metrics", None) is not None:
            srv.metrics.close()
        srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
