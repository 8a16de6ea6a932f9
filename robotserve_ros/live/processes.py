"""Start the nodes of a description as processes and stop them cleanly (there is no
`ros2 launch` here): SIGINT first, SIGKILL only if a process will not stop, and the Fast
DDS shared-memory files of a killed process removed."""
from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ..launch_description import NodeSpec


def _udp_ports() -> set:
    ports = set()
    for f in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            for line in open(f).readlines()[1:]:
                ports.add(int(line.split()[1].rsplit(":", 1)[1], 16))
        except (OSError, IndexError, ValueError):
            pass
    return ports


def pick_free_domain(lo: int = 1, hi: int = 100) -> int:
    """A ROS_DOMAIN_ID nobody on this machine uses now: no UDP port bound in its range of
    the DDS port mapping (7400 + 250 x domain ...), so a demo or benchmark never mixes with
    another run's nodes (they would answer each other's requests). Ids up to 101 only,
    where the ranges do not overlap Linux's ephemeral ports."""
    ports = _udp_ports()
    ids = list(range(lo, hi + 1))
    random.shuffle(ids)
    for d in ids:
        if not any(7400 + 250 * d <= p < 7400 + 250 * (d + 1) for p in ports):
            return d
    raise RuntimeError(f"every ROS domain {lo}..{hi} is in use on this machine")


def ros_env(domain_id: Optional[int] = None, log_dir: Optional[str] = None) -> dict:
    env = dict(os.environ)
    if domain_id is not None:
        env["ROS_DOMAIN_ID"] = str(domain_id)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if log_dir:
        env["ROS_LOG_DIR"] = log_dir
    env["PYTHONUNBUFFERED"] = "1"
    return env


class DomainContext:
    """An rclpy context in this process on `env`'s ROS domain, with `env` applied to
    os.environ while it lives: how the demo and the live benchmarks listen to their run."""

    def __init__(self, env: dict) -> None:
        import rclpy
        from rclpy.signals import SignalHandlerOptions

        self._saved = dict(os.environ)
        os.environ.update(env)
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=int(env["ROS_DOMAIN_ID"]), signal_handler_options=SignalHandlerOptions.NO)

    def close(self) -> None:
        try:
            self.ctx.try_shutdown()
        finally:
            os.environ.clear()
            os.environ.update(self._saved)

    def __enter__(self):
        return self.ctx

    def __exit__(self, *exc) -> None:
        self.close()


def server_diagnostics(msg) -> Optional[dict]:
    """The inference server's key/values from a diagnostic_msgs/DiagnosticArray, or None."""
    for st in msg.status:
        if st.name == "robotserve: inference_server":
            return {kv.key: kv.value for kv in st.values}
    return None


class ProcessGroup:
    def __init__(self, specs: Sequence[NodeSpec], env: dict, log_dir: Path, python: str = sys.executable) -> None:
        self.specs = list(specs)
        self.env, self.log_dir, self.python = env, Path(log_dir), python
        self.procs: list[tuple[NodeSpec, subprocess.Popen]] = []

    def start(self) -> "ProcessGroup":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for s in self.specs:
            out = open(self.log_dir / f"{s.name}.log", "wb")
            p = subprocess.Popen(s.command(self.python), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            self.procs.append((s, p))
        return self

    def failed(self) -> list[tuple[str, int]]:
        """Processes that already exited with an error: (name, code)."""
        return [(s.name, p.returncode) for s, p in self.procs if p.poll() not in (None, 0)]

    def stop(self, timeout: float = 10.0) -> dict:
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        codes = {}
        for s, p in self.procs:
            try:
                codes[s.name] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[s.name] = p.wait()
                for f in glob.glob(f"/dev/shm/fastdds_*{p.pid}*"):
                    Path(f).unlink(missing_ok=True)
        return codes

    def __enter__(self) -> "ProcessGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
