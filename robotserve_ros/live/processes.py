"""Start the nodes of a description as processes and stop them cleanly (there is no
`ros2 launch` here): SIGINT first, SIGKILL only if a process will not stop, and the Fast
DDS shared-memory files of a killed process removed. Also what the live benchmarks share:
a free ROS domain, an rclpy context on it, the nodes on it that are not ours, percentiles."""
from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..launch_description import NodeSpec, default_config


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


def loopback_dds(env: dict) -> dict:
    """Keep every DDS byte of a run on this machine: config/fastdds_loopback.xml limits Fast
    DDS to UDP on 127.0.0.1 and shared memory. The discovery range is SUBNET on purpose:
    rmw_fastrtps's LOCALHOST mode adds transports of its own that open sockets on every
    interface (seen with ss), while the profile's allow-list leaves only loopback ones."""
    profile = default_config("fastdds_loopback.xml")
    if not os.path.exists(profile):  # installed without config/: discovery stays local at least
        env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        return env
    env["FASTDDS_DEFAULT_PROFILES_FILE"] = profile  # Fast DDS 3 (ROS Kilted); FASTRTPS_* is deprecated there
    env.pop("FASTRTPS_DEFAULT_PROFILES_FILE", None)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "SUBNET"
    env.pop("ROS_LOCALHOST_ONLY", None)
    return env


def ros_env(domain_id: Optional[int] = None, log_dir: Optional[str] = None) -> dict:
    env = loopback_dds(dict(os.environ))
    if domain_id is not None:
        env["ROS_DOMAIN_ID"] = str(domain_id)
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


def foreign_nodes(node, ours) -> list:
    """Nodes on the domain that are not ours (a shared machine: another session's fleet),
    and ours that run more than once."""
    from collections import Counter

    names = Counter(f"{ns.rstrip('/')}/{n}" for n, ns in node.get_node_names_and_namespaces())
    return sorted(n for n in names if not ours(n)) + sorted(f"{n} (x{k})" for n, k in names.items() if k > 1 and ours(n))


def pct(xs, q: float) -> float:
    """The q-th percentile of xs; NaN for none."""
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


def read_stage_trace(path: Path, exit_code) -> tuple[dict, Optional[str]]:
    """The inference server's stage trace (its `stage_trace_file` parameter), which it writes
    as it stops: read it once its process has exited (ProcessGroup.stop waits for that).
    (marks, None), or ({}, why not): a server killed before or while writing it."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return {}, f"the server wrote no stage trace (exit code {exit_code})"
    except ValueError as e:
        return {}, f"the server's stage trace is not whole JSON (exit code {exit_code}): {e}"


def server_diagnostics(msg) -> Optional[dict]:
    """The inference server's key/values from a diagnostic_msgs/DiagnosticArray, or None."""
    for st in msg.status:
        if st.name == "robotserve: inference_server":
            return {kv.key: kv.value for kv in st.values}
    return None


class ModuleSpec:
    """A process for ProcessGroup that is not a node of the suite: `python -m <module> <args...>`."""

    def __init__(self, name: str, module: str, args=()) -> None:
        self.name, self.module, self.args = name, module, list(args)

    def command(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", self.module, *self.args]


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

    def signal(self, sig: int) -> None:
        """Send `sig` to every process still running (e.g. SIGUSR1: robot clients drain)."""
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

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
