"""A fourth client protocol on serve.Fleet, as a new one is meant to be written: a codec plus
a session mapping, importing neither core.runner nor core.serving (test_jsonl_protocol.py
checks both that and that its robots share batches with ROS robots).

JSON lines over TCP, one object a line each way. A robot sends
  {"task": "t", "round": 0, "joints": [..], "left": 0, "hz": 50, "horizon": 10}
and gets {"task": .., "round": .., "actions": [[..], ..]} or {"error": code, "message": ..}.
Each connection is one session; its tasks are namespaced by the connection and dropped when
it closes."""
from __future__ import annotations

import json
import socketserver
import threading

import numpy as np

from robotserve_ros.core.errors import RequestError
from robotserve_ros.core.observation import Observation
from robotserve_ros.core.types import ExecInfo, HorizonChoice, InferenceRequest

MAX_LINE = 1 << 20


def decode(line: bytes, prefix: str, now: float) -> InferenceRequest:
    """One line -> a request (ValueError, KeyError or TypeError when it is not one)."""
    m = json.loads(line)
    if not isinstance(m, dict):
        raise TypeError("a line is one JSON object")
    rnd = int(m["round"])
    info = ExecInfo(now, int(m.get("left", 0)), float(m.get("hz", 50.0))) if rnd > 0 else None
    obs = Observation(joints=np.asarray(m["joints"], np.float32), stamp=now)
    return InferenceRequest(f"{prefix}/{m['task']}", rnd, info, HorizonChoice("static", float(m.get("horizon", 10))),
                            obs, obs_stamp=now)


class JsonLinesProtocol:
    """The protocol's server on `fleet`, on 127.0.0.1:`port` (0: any free one)."""

    def __init__(self, fleet, port: int = 0, reply_timeout_s: float = 10.0) -> None:
        self.fleet, self.reply_timeout_s = fleet, reply_timeout_s
        proto = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proto.serve(self.rfile, self.wfile, "jsonl/%s:%d" % self.client_address[:2])

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="jsonl", daemon=True).start()

    def serve(self, rfile, wfile, peer: str) -> None:
        session = self.fleet.session("jsonl", peer)
        try:
            while line := rfile.readline(MAX_LINE):
                wfile.write((json.dumps(self.answer(session, line, peer)) + "\n").encode())
                wfile.flush()
        except OSError:  # the robot went away
            pass
        finally:
            session.close("task_dropped", "the connection closed")

    def answer(self, session, line: bytes, peer: str) -> dict:
        try:
            req = decode(line, peer, self.fleet.clock.now())
        except (ValueError, KeyError, TypeError) as e:
            err = RequestError(f"not a request line: {type(e).__name__}")
            session.refuse(err)  # counted like any protocol's malformed request
            return {"error": err.code, "message": err.message}
        try:
            reply = session.submit(req).result(self.reply_timeout_s)
        except RequestError as e:  # the fleet's and the core's refusals, one set of codes
            return {"error": e.code, "message": e.message}
        except TimeoutError:
            session.withdraw(req.task_id, req.round_id)
            return {"error": "reply_timeout", "message": f"not served within {self.reply_timeout_s} s"}
        return {"task": req.task_id, "round": reply.round_id, "actions": np.asarray(reply.actions).tolist()}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
