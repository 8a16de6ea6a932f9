"""The openpi endpoint's frame memory probe (issue 37): a server (simulated engine, the
endpoint's defaults unless told) in a process of its own; `--connections` connections from
one address each send `--frames` frames of `--frame-mb` MB without waiting for replies, then
close. The server's RSS is sampled from /proc: before, its peak (VmHWM) and `--settle` s after
every connection closed. Linux only. Not a test: RSS depends on the allocator and the machine.

    python -m robotserve_ros.bench.openpi_memory [--connections 16 --frames 5 --frame-mb 15]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

SERVE = """
import sys, time
from robotserve_ros.transport.openpi.config import EndpointConfig, OpenPiConfig
from robotserve_ros.transport.openpi.server import OpenPiServer
srv = OpenPiServer(OpenPiConfig(engine="simulated", engine_params={"chunk_size": 8, "action_dim": 6},
                                profile_ms={1: 5.0}, endpoint=EndpointConfig(port=0, **eval(sys.argv[1]))))
print(srv.port, flush=True)
sys.stdin.read()
print(srv.stats()["endpoint"], flush=True)
"""


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _client(port: int, frames: int, frame: bytes, out: list) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    got = []
    try:
        with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, open_timeout=30) as ws:
            ws.recv()  # the metadata
            for _ in range(frames):
                ws.send(frame)
            for _ in range(frames):
                m = ws.recv(timeout=60)
                got.append("chunk" if isinstance(m, bytes) else m[:60])
    except (ConnectionClosed, TimeoutError, OSError) as e:
        got.append(type(e).__name__)
    out.append(got)


def probe(connections: int = 16, frames: int = 5, frame_mb: float = 15.0, settle: float = 3.0,
          endpoint: dict | None = None) -> dict:
    import msgpack

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    srv = subprocess.Popen([sys.executable, "-c", SERVE, repr(endpoint or {})], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(srv.stdout.readline())
        time.sleep(0.5)
        before = rss_mb(srv.pid)
        frame = msgpack.packb({"pad": b"\0" * int(frame_mb * 1e6)})
        out: list = []
        threads = [threading.Thread(target=_client, args=(port, frames, frame, out)) for _ in range(connections)]
        peak, t0 = before, time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, rss_mb(srv.pid))
            time.sleep(0.02)
        took = time.monotonic() - t0
        time.sleep(settle)
        after = rss_mb(srv.pid)
        hwm = rss_mb(srv.pid, "VmHWM")
        srv.stdin.close()
        stats = srv.stdout.readline().strip()
    finally:
        srv.kill()
        srv.wait()
    outcomes: dict = {}
    for got in out:
        for g in got:
            outcomes[g] = outcomes.get(g, 0) + 1
    return {"connections": connections, "frames": frames, "frame_mb": frame_mb, "rss_before_mb": round(before, 1),
            "rss_peak_mb": round(max(peak, hwm), 1), "rss_after_close_mb": round(after, 1), "seconds": round(took, 2),
            "outcomes": outcomes, "endpoint_stats": stats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--frames", type=int, default=5)
    p.add_argument("--frame-mb", type=float, default=15.0)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after the last connection closed")
    p.add_argument("--endpoint", default="{}", help="EndpointConfig fields as a Python dict literal")
    a = p.parse_args(argv)
    import ast

    print(json.dumps(probe(a.connections, a.frames, a.frame_mb, a.settle, ast.literal_eval(a.endpoint)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
