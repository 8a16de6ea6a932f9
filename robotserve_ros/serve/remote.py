"""The front end's side of the engine core process (`engine_process: separate`): a
RemoteFleet has the part of the Fleet's interface the ROS inference server uses, and
speaks serve/wire.py's messages to serve/core_process.py over a ZMQ DEALER socket.

It attaches to a core already serving at its address with the same parameters (a front end
restarted after a crash: the core kept every queued round, and a re-sent round is answered
once by the Fleet's de-duplication), else starts one (a child in its own session, so a
Ctrl-C to the front end's group does not kill it first; the front end stops it on close).
One thread owns the socket: it sends what others queue, reads replies, pings the core every
ping_s and restarts it when it stops answering (dead_after_s) or exits: the rounds waiting
on it are answered `engine_failure` (send it again), the event logged and counted
(`core_restarts`), as when a whole server is killed and its robots start their tasks again.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional

import zmq

from ..core.task_auth import NotTaskOwner
from . import wire
from .fleet import Refused, _settle


def core_address(key: str) -> str:
    """ipc://<private dir>/core-<hash of key>.sock, the dir this user's alone (0700)."""
    d = os.path.join(tempfile.gettempdir(), f"robotserve-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ValueError("engine_process", f"{d} is not this user's private directory (0700): refusing its sockets")
    return f"ipc://{d}/core-{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock"


class _Session:
    def __init__(self, fleet: "RemoteFleet", robot: str) -> None:
        self.fleet, self.robot = fleet, robot

    def submit(self, req, proof=None) -> Future:
        return self.fleet._submit(self.robot, req, proof)


class RemoteFleet:
    """See the module docstring. tree: the inference server's parameter tree (JSON-able);
    log(level, line): the node's logger; refresher: the node's ObservationRefresher."""

    remote = True

    def __init__(self, tree: dict, address: str, log: Callable[[str, str], None], *, auth: bool = False,
                 ping_s: float = 0.25, dead_after_s: float = 3.0, start_timeout_s: float = 120.0,
                 orphan_s: float = 30.0) -> None:
        self.tree, self.address, self.log, self.auth = tree, address, log, auth
        self.ping_s, self.dead_after_s, self.start_timeout_s, self.orphan_s = ping_s, dead_after_s, start_timeout_s, orphan_s
        self.fingerprint = hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()
        self.lock = threading.RLock()  # the node's own state (the core's lock is in the other process)
        self._wlock = threading.Lock()  # the waiting calls: never held while waiting on the core
        self.engines: dict = {}
        self.pools: list = []
        self.batch_listeners: list = []
        self.refresher = None
        self.ctx = zmq.Context()
        self._out = wire.Outbox()
        self._waiting: dict = {}  # message id -> (Future, request or None)
        self._reqs: dict = {}  # (task, round) -> its request while it waits: what a refresh ask names
        self._next_id = 0
        self._up = False
        self._stop = threading.Event()
        self.proc: Optional[subprocess.Popen] = None
        self.core_pid = 0
        self.counts = {"core_restarts": 0, "ipc_refused_by_front": 0, "refused_core_down": 0}
        self._expected_wait_s, self._reaped, self._last_pong = 0.0, [], time.monotonic()
        self.sock = None
        self.facts = self._connect()
        self._io = threading.Thread(target=self._loop, name="engine-core-io", daemon=True)
        self._io.start()

    # --- the core process -------------------------------------------------------------------
    def _socket(self):
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.address)
        return s

    def _hello(self, sock, timeout_s: float) -> Optional[dict]:
        """The core's answer to Hello within timeout_s (re-sent every 0.5 s while it starts)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            sock.send(wire.encode(wire.Hello(wire.WIRE_VERSION, self.fingerprint)))
            if sock.poll(int(min(500, 1000 * max(0.01, end - time.monotonic())))):
                try:
                    m = wire.decode_to_front(sock.recv())
                except wire.DecodeError:
                    continue
                if isinstance(m, wire.Result) and m.id == 0:
                    return m.value
            if self.proc is not None and self.proc.poll() is not None:
                raise ValueError("engine_process", f"the engine core process exited {self.proc.returncode} at start "
                                 "(its error is in this node's log)")
        return None

    def _connect(self) -> dict:
        """Attach to the core serving at the address with these parameters, else start one."""
        self.sock = self._socket()
        got = self._hello(self.sock, 0.3) if self.address.startswith("ipc://") and \
            os.path.exists(self.address[len("ipc://"):]) else None
        if got is not None and got["same"]:
            self.log("info", f"attached to the engine core process {got['pid']} at {self.address}")
        else:
            if got is not None:  # another build's or other parameters': it goes
                self.log("warning", f"the engine core at {self.address} runs other parameters: restarting it")
                self.sock.send(wire.encode(wire.Bye(stop=True)))
                time.sleep(0.5)
            got = self._spawn()
        self.core_pid, self._up, self._last_pong = got["pid"], True, time.monotonic()
        return got["facts"]

    def _spawn(self) -> dict:
        cfg = tempfile.NamedTemporaryFile("w", prefix="robotserve-core-", suffix=".json", delete=False)
        with cfg:
            json.dump(self.tree, cfg)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "robotserve_ros.serve.core_process", "--address", self.address, "--config", cfg.name,
             "--fingerprint", self.fingerprint, "--orphan-s", str(self.orphan_s)], start_new_session=True)
        try:
            got = self._hello(self.sock, self.start_timeout_s)
        finally:
            os.unlink(cfg.name)
        if got is None:
            self.proc.kill()
            raise ValueError("engine_process", f"the engine core process did not answer within {self.start_timeout_s:g} s")
        self.log("info", f"started the engine core process {got['pid']} at {self.address}")
        return got

    def _core_down(self, why: str) -> None:
        """In the socket's thread: answer every waiting round, count, start a new core."""
        self._up = False
        self.counts["core_restarts"] += 1
        self.log("error", f"the engine core process {self.core_pid} {why}: its rounds are answered engine_failure "
                          "and its tasks are gone (robots start them again); starting a new one")
        with self._wlock:
            waiting, self._waiting, self._reqs = self._waiting, {}, {}
        for fut, _ in waiting.values():
            _settle(fut, error=Refused("engine_failure", f"the engine core process {why}; send the round again"))
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        self.sock.close(0)
        while not self._stop.is_set():
            try:
                self.facts = self._connect()
                return
            except (ValueError, zmq.ZMQError) as e:
                self.log("error", f"the engine core process could not be started again: {e}; retrying")
                self._stop.wait(1.0)

    # --- the socket's thread ------------------------------------------------------------------------
    def _send(self, msg) -> None:
        self._out.put(wire.encode(msg))

    def _loop(self) -> None:
        next_ping = 0.0
        while not self._stop.is_set():
            poller = zmq.Poller()
            poller.register(self.sock, zmq.POLLIN)
            poller.register(self._out.wake_r, zmq.POLLIN)
            self._out.wait(poller, int(1000 * self.ping_s), self.sock.send)
            while self.sock.poll(0, zmq.POLLIN):
                self._handle(self.sock.recv())
            now = time.monotonic()
            if now >= next_ping:
                next_ping = now + self.ping_s
                self.sock.send(wire.encode(wire.Ping(1)))
            if self.proc is not None and self.proc.poll() is not None:
                self._core_down(f"exited ({self.proc.returncode})")
            elif now - self._last_pong > self.dead_after_s:
                self._core_down(f"did not answer for {self.dead_after_s:g} s")

    def _handle(self, data: bytes) -> None:
        try:
            m = wire.decode_to_front(data)
        except wire.DecodeError as e:
            self.counts["ipc_refused_by_front"] += 1
            self.log("warning", f"refused a message from the engine core: {e}")
            return
        if isinstance(m, wire.Pong):
            self._last_pong, self._expected_wait_s, self.core_pid = time.monotonic(), m.expected_wait_s, m.pid
            with self._wlock:
                self._reaped.extend(m.reaped)
        elif isinstance(m, wire.RefreshAsk):
            threading.Thread(target=self._refresh, args=(m,), daemon=True).start()
        elif isinstance(m, (wire.Reply, wire.Result)):
            with self._wlock:
                fut, req = self._waiting.pop(m.id, (None, None))
                if req is not None:
                    self._reqs.pop((req.task_id, req.round_id), None)
            if fut is None:
                return
            if m.code:
                _settle(fut, error=Refused(m.code, m.message))
            elif isinstance(m, wire.Reply):
                try:
                    _settle(fut, wire.chunk_in(m.chunk))
                except (wire.BadWire, TypeError) as e:
                    self.counts["ipc_refused_by_front"] += 1
                    _settle(fut, error=Refused("engine_failure", f"the engine core's reply did not decode: {e}"))
            else:
                _settle(fut, m.value)

    def _refresh(self, m: wire.RefreshAsk) -> None:
        """The core asks for fresher observations: the node's refresher asks the robots."""
        with self._wlock:
            reqs = [self._reqs.get(tuple(k)) for k in m.rounds]
        got = [None] * len(reqs)
        known = [r for r in reqs if r is not None]
        if known and self.refresher is not None:
            fresh = iter(self.refresher(known))
            got = [next(fresh) if r is not None else None for r in reqs]
        self._send(wire.RefreshReply(m.id, [(wire.obs_out(g[0]), float(g[1])) if g is not None else None for g in got]))

    # --- what the node calls ----------------------------------------------------------------------
    def _register(self, req=None) -> tuple[int, Future]:
        fut: Future = Future()
        with self._wlock:
            self._next_id += 1
            self._waiting[self._next_id] = (fut, req)
            if req is not None:
                self._reqs[(req.task_id, req.round_id)] = req
            return self._next_id, fut

    def _submit(self, robot: str, req, proof) -> Future:
        if not self._up:
            self.counts["refused_core_down"] += 1
            fut: Future = Future()
            fut.set_exception(Refused("engine_failure", "the engine core process is restarting; send the round again"))
            return fut
        msg_id, fut = self._register(req)
        self._send(wire.Submit(msg_id, robot, wire.request_out(req), wire.proof_out(proof)))
        return fut

    def call(self, name: str, *args, timeout_s: float = 5.0):
        msg_id, fut = self._register()
        self._send(wire.Call(msg_id, name, list(args)))
        return fut.result(timeout=timeout_s)

    def session(self, protocol: str, robot: str = "", auth=None, untrimmed: bool = False) -> _Session:
        return _Session(self, robot)

    def start(self) -> "RemoteFleet":
        return self

    def count_error(self, err, protocol: str = "?", robot: str = "") -> None:
        self._send(wire.Call(0, "count_error", [err.code, str(err), protocol, robot]))

    def check_owner(self, task_id: str, robot: str, proof) -> None:
        if self.auth:  # without task auth the core checks nothing here either
            try:
                self.call("check_owner", task_id, robot, proof.stamp_ns, proof.mac, proof.body, proof.kind)
            except Refused as e:
                raise NotTaskOwner(e.message) from None

    def progress(self, task_id: str, robot: str, proof, done=None) -> None:
        """One-way: the core applies it (serve/progress.py) and counts what it refuses."""
        self._send(wire.Progress(task_id, robot, wire.proof_out(proof), done is not None,
                                 *((done.exec_start, done.control_hz) if done is not None else ())))

    def knows(self, task_id: str) -> bool:
        return bool(self.call("knows", task_id))

    def tasks(self) -> list:
        return list(self.call("tasks"))

    def drop(self, task_id: str, code: str = "task_dropped", message: str = "the task was dropped") -> None:
        self._send(wire.Call(0, "drop", [task_id, code, message]))

    def reap(self) -> list:
        """The tasks the core reaped since the last call (it reaps them itself)."""
        with self._wlock:
            out, self._reaped = self._reaped, []
        return out

    def protocol_stats(self) -> dict:
        return {}  # the core's, in load_stats

    def expected_wait_s(self) -> float:
        return self._expected_wait_s

    def load_stats(self, started_at: Optional[float], robots: dict) -> dict:
        """The core's figures (serve/stats.py's, taken there) and this front end's."""
        try:
            out = dict(self.call("stats"))
        except Exception as e:  # down or restarting: what the front end knows
            out = {"core_unreachable": repr(e), "errors": {}, "served": 0, "queue_length": 0, "tasks": 0,
                   "wait_ratio": {}, "protocols": {}, "served_by_tier": {}, "progress_refused": {}}
        out.update({"engine_process": "separate", "front_pid": os.getpid(), **self.counts})
        return out

    def close(self) -> None:
        if self._up:
            self._send(wire.Bye(stop=True))
            time.sleep(0.1)
        self._stop.set()
        self._io.join(timeout=2.0)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.sock.close(0)
        self.ctx.term()
        self._out.close()
