"""Start the nodes of a description as processes and stop them cleanly (there is no
`ros2 launch` here): SIGINT first, SIGKILL only if a process will not stop, and the Fast
DDS shared-memory files of a killed process removed."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ..launch_description import NodeSpec


def pick_free_domain(candidates: Sequence[int] = range(1, 101), probe_s: float = 0.6, seed=None) -> int:
    """A ROS domain with no other participants on this host, so a demo or benchmark never
    mixes with another run's nodes (they would answer each other's requests). Domains
    above 101 use ports in Linux's ephemeral range, so the default stays below it."""
    import random

    import rclpy

    order = list(candidates)
    random.Random(seed).shuffle(order)
    for d in order:
        ctx = rclpy.Context()
        rclpy.init(context=ctx, domain_id=d)
        try:
            node = rclpy.create_node("robotserve_domain_probe", context=ctx, start_parameter_services=False)
            time.sleep(probe_s)  # discovery on localhost settles well within this
            others = [n for n, _ in node.get_node_names_and_namespaces() if n != "robotserve_domain_probe"]
            node.destroy_node()
        finally:
            rclpy.shutdown(context=ctx)
        if not others:
            return d
    raise RuntimeError("no free ROS domain found among the candidates")


def ros_env(domain_id: Optional[int] = None, log_dir: Optional[str] = None) -> dict:
    env = dict(os.environ)
    if domain_id is not None:
        env["ROS_DOMAIN_ID"] = str(domain_id)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if log_dir:
        env["ROS_LOG_DIR"] = log_dir
    env["PYTHONUNBUFFERED"] = "1"
    return env


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
