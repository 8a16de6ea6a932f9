"""The processes of a live fleet run (`robotserve bench fleet-live`, mixed fleet, chaos), as
this process watches them: the params file they run with, the server's /diagnostics
(`_Listener`), the settle before the stop, CPU time and memory read from /proc, and py-spy's
flame graph of the server."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import yaml

from ..live.processes import DomainContext, server_diagnostics
from ..machine import proc_cpu_s


def _flame(svg: str, base_group, duration: float, say):
    """py-spy on the server over the window: a flame graph (svg) of where its CPU goes."""
    exe = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    pid = next((p.pid for s, p in base_group.procs if s.name == "inference_server"), None)
    if exe is None or pid is None:
        say("no py-spy (pip install py-spy) or no server: no flame graph")
        return None
    Path(svg).parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--output", str(svg), "--format", "flamegraph",
                             "--duration", str(max(1, int(duration))), "--rate", "50", "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def thread_cpu_s(pid: int, tid: int) -> Optional[float]:
    """utime + stime of one thread of a process, seconds; None once it is gone."""
    return proc_cpu_s(f"{pid}/task/{tid}")


def proc_status(pid: int, field: str = "VmRSS") -> Optional[int]:
    """A number from /proc/PID/status (VmRSS: resident set in kB; Threads); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def settle(listener, client_group, timeout_s: float, say, grace_s: float = 10.0) -> float:
    """The robots start no new round; wait until two diagnostics in a row show the server
    holding no request (nothing queued, generating or waiting for its reply), then grace_s for
    the clients to take in the last replies (a starved robot process takes seconds to read
    what the server sent). Returns the seconds it took."""
    say("settling: no new rounds; the open ones are re-sent until answered")
    t0 = time.monotonic()
    client_group.signal(signal.SIGUSR1)
    seen, quiet = len(listener.series), 0
    while time.monotonic() - t0 < timeout_s and quiet < 2:
        listener.spin(0.2)
        for _, d in listener.series[seen:]:
            idle = all(d.get(k, "1") == "0" for k in ("queue_length", "in_flight", "waiters"))
            quiet = quiet + 1 if idle else 0
        seen = len(listener.series)
    listener.spin(grace_s)
    return time.monotonic() - t0


class _Listener:
    """/diagnostics on the fleet's domain, in this process."""

    def __init__(self, env: dict) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor

        self._domain = DomainContext(env)
        self.ctx = self._domain.ctx
        self.node = rclpy.create_node("fleet_live_bench_listener", context=self.ctx)
        self.ex = SingleThreadedExecutor(context=self.ctx)
        self.ex.add_node(self.node)
        self.last: dict = {}
        self.series: list = []  # (t, diag) per message
        self.robots_seen: set = set()
        self.tasks_at_end: list = []
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)

    def _on_diag(self, m) -> None:
        d = server_diagnostics(m)
        if d is None:
            return
        self.last = d
        # /diagnostics names robots, never task ids (issue 29): the robots with a task in the server
        self.tasks_at_end = sorted(k.split("/", 1)[1] for k in d if k.startswith("wait_ratio/"))
        self.series.append((time.monotonic(), {k: v for k, v in d.items() if not k.startswith("wait_ratio/")}))
        for k in d:
            if k.startswith("wait_ratio/"):
                self.robots_seen.add(k.split("/")[1])

    def spin(self, seconds: float, until=None) -> bool:
        """Spin for `seconds`, or until `until(self.last)` holds (then True)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.ex.spin_once(timeout_sec=min(left, 0.1))
            if until is not None and self.last and until(self.last):
                return True
        return False

    def close(self) -> None:
        try:
            self.node.destroy_node()
        finally:
            self._domain.close()


LIGHT_INFER_DEPTH = 1000  # --light: srv/Infer's DDS depth unless the config sets it


def _params_file(base: str, stats_pattern: str, out: Path, stage_trace_file: str = "", image_transport: str = "",
                 executor: str = "", refresh_topic: str = "", light: bool = False) -> tuple[str, dict]:
    cfg = yaml.safe_load(Path(base).read_text())
    cfg.setdefault("/**/robot_client", {}).setdefault("ros__parameters", {})["stats_file"] = stats_pattern
    if image_transport:  # how the robots send their cameras (robot_client's image_transport)
        cfg["/**/robot_client"]["ros__parameters"]["image_transport"] = image_transport
    if stage_trace_file:
        cfg.setdefault("inference_server", {}).setdefault("ros__parameters", {})["stage_trace_file"] = stage_trace_file
    if executor:
        cfg.setdefault("inference_server", {}).setdefault("ros__parameters", {})["executor"] = executor
    if refresh_topic:
        cfg.setdefault("inference_server", {}).setdefault("ros__parameters", {})["refresh_topic"] = refresh_topic
    if light:  # one host's client carries 150 robots' calls: a depth of 10 drops its burst of round 0s (docs/scale.md)
        cfg.setdefault("inference_server", {}).setdefault("ros__parameters", {}).setdefault(
            "infer_queue", {}).setdefault("depth", LIGHT_INFER_DEPTH)
    out.write_text(yaml.safe_dump(cfg))
    return str(out), cfg


def engine_profile_ms(srv_cfg: dict) -> dict:
    """batch -> ms of the server's engine as the node reads its parameters (its config
    dataclass: the explicit engine.batch_sizes/engine.latency_ms, else engine.profile)."""
    from ..config import from_tree
    from ..nodes.server_config import InferenceServerConfig

    prof = from_tree(InferenceServerConfig, srv_cfg).engine.engine_profile()
    return {int(b): float(ms) for b, ms in prof.to_dict().items()}


def infer_depth(srv_cfg: dict) -> int:
    """srv/Infer's DDS depth the server runs with (its config dataclass: given, else default)."""
    from ..config import from_tree
    from ..nodes.server_config import InferenceServerConfig

    return from_tree(InferenceServerConfig, srv_cfg).infer_queue.depth
