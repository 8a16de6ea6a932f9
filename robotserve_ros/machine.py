"""What machine a measurement ran on (every benchmark report records it), and how busy it
and a process were while it ran (/proc)."""
from __future__ import annotations

import os
import platform
from typing import Optional


def machine_info() -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        rclpy_version = version("ros-kilted-rclpy")
    except Exception:
        rclpy_version = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "rclpy": rclpy_version,
        "rmw": os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp (default)"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all cores from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [float(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already in user
    return total - idle, total


def busy_fraction(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Fraction of all cores busy between two cpu_times() samples."""
    dt = b[1] - a[1]
    return (b[0] - a[0]) / dt if dt > 0 else float("nan")


def tree_cpu_s(pid: int) -> Optional[float]:
    """CPU seconds of a process and every process under it: its own, its children's that
    exited (cutime + cstime), and each live descendant's, so a server whose engine core runs
    in a child process (engine_process: separate) is counted whole; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        own = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        kids = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(k) for k in f.read().split())
    except (OSError, IndexError, ValueError):
        return None
    return own + sum(filter(None, (tree_cpu_s(k) for k in kids)))


def proc_cpu_s(pid: int) -> Optional[float]:
    """utime + stime of a process (its threads included), seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
