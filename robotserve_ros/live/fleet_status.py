"""What a person watching a fleet sees: the inference server's /diagnostics as one line
(`robotserve up` prints it every few seconds) or in full (`robotserve status`), and why a
node died, from the last lines of its log.

    robotserve status [--timeout 5] [--domain-id N] [--json]

/diagnostics keys robots by their namespace (issue 29), never by task id; the line counts
them ("robots connected": robots with a task in the server's ledger)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from ..cli_types import positive
from .processes import DomainContext, ros_env, server_diagnostics

STATUS_NAME = "robotserve: inference_server"


def _num(d: dict, key: str, kind=float, default=0):
    try:
        return kind(float(d[key])) if kind is int else kind(d[key])
    except (KeyError, TypeError, ValueError):
        return default


def error_count(d: dict) -> int:
    """All errors the server counted (the `errors/<kind>` values of its status)."""
    return sum(_num(d, k, int) for k in d if k.startswith("errors/"))


def plural(n: int, word: str, words: str = "") -> str:
    """'1 robot', '3 robots'; '1 process', '2 processes' (words: the plural when not word + s)."""
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def typed(v: str):
    """A diagnostics value (always a string on the wire) as JSON would say it: numbers as
    numbers, None as null, True/False as booleans, anything else the string."""
    if v in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[v]
    try:
        x = json.loads(v)
    except ValueError:
        return v
    return x if isinstance(x, (int, float)) else v


def last_errors(d: dict, previous: Optional[dict] = None) -> list[str]:
    """`kind: reason` of the newest refusal of each error kind (the server's last_error/<kind>);
    with the previous values, only the kinds whose count grew since."""
    out = []
    for k in sorted(d):
        if k.startswith("errors/"):
            kind = k[len("errors/"):]
            if previous is not None and _num(d, k, int) <= _num(previous, k, int):
                continue
            reason = d.get(f"last_error/{kind}")
            if reason:
                out.append(f"{kind}: {reason}")
    return out


def status_line(d: dict, previous: Optional[dict] = None) -> str:
    """One line of fleet status from the server's diagnostics key/values; with the previous
    ones, what changed since (rounds and errors)."""
    served, errors = _num(d, "served", int), error_count(d)
    since = ""
    if previous is not None:
        since = f" (+{served - _num(previous, 'served', int)})"
    err_since = f" (+{errors - error_count(previous)})" if previous is not None else ""
    util = _num(d, "engine_utilization", float, 0.0)
    return (f"{plural(_num(d, 'robots', int), 'robot')} connected, {served} rounds served{since}, engine {100 * util:.0f}% busy, "
            f"queue {_num(d, 'queue_length', int)}, in flight {_num(d, 'in_flight', int)}, errors {errors}{err_since}")


def death_reason(log: Path, lines: int = 6) -> tuple[str, list[str]]:
    """(one-line reason, last lines) of a dead node's log: a traceback's exception line, else
    the last line that says error/refused/exit, else the last line; '' when the log is empty."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"no log ({e.strerror})", []
    tail = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not tail:
        return "", []
    last = tail[-lines:]
    if any(ln.startswith("Traceback") for ln in tail):
        exc = [ln for ln in tail if ln and not ln.startswith((" ", "\t", "Traceback", "During handling", "The above"))]
        return (exc[-1] if exc else tail[-1]).strip(), last
    said = [ln for ln in tail if any(w in ln.lower() for w in ("error", "refus", "fail", "cannot", "exit", "invalid", " not ",
                                                              "must", "unknown", "no such"))]
    return (said[-1] if said else tail[-1]).strip(), last


class DiagnosticsWatch:
    """Listens to /diagnostics on one ROS domain from this process (its own rclpy context):
    `latest` is the server's newest key/values, `heard_at` when (monotonic)."""

    def __init__(self, env: dict) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor

        env = dict(env)
        env.setdefault("ROS_DOMAIN_ID", os.environ.get("ROS_DOMAIN_ID", "0"))
        self.domain = int(env["ROS_DOMAIN_ID"])
        self._ctx = DomainContext(env)
        import rclpy

        self.node = rclpy.create_node("robotserve_watch", context=self._ctx.ctx)
        self.latest: Optional[dict] = None
        self.level: int = 0
        self.message = ""
        self.heard_at: Optional[float] = None
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on, 10)
        self._exec = SingleThreadedExecutor(context=self._ctx.ctx)
        self._exec.add_node(self.node)

    def _on(self, msg) -> None:
        d = server_diagnostics(msg)
        if d is not None:
            st = next(s for s in msg.status if s.name == STATUS_NAME)
            level = st.level[0] if isinstance(st.level, (bytes, bytearray)) else int(st.level)  # an octet
            self.latest, self.level, self.message, self.heard_at = d, level, st.message, time.monotonic()

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._exec.spin_once(timeout_sec=min(left, 0.1))

    def close(self) -> None:
        try:
            self._exec.shutdown()
            self.node.destroy_node()
        finally:
            self._ctx.close()


LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def add_arguments(p) -> None:
    p.add_argument("--timeout", type=positive(), default=5.0, help="seconds to wait for the server's /diagnostics")
    p.add_argument("--domain-id", type=positive(int, zero_ok=True), help="ROS domain (default: $ROS_DOMAIN_ID or 0)")
    p.add_argument("--json", action="store_true", help="print the key/values as one JSON object")


def cli(a) -> int:
    watch = DiagnosticsWatch(ros_env(a.domain_id))
    try:
        end = time.monotonic() + a.timeout
        while watch.latest is None and time.monotonic() < end:
            watch.spin(min(0.2, max(0.0, end - time.monotonic())))
    finally:
        watch.close()
    if watch.latest is None:
        print(f"robotserve status: no inference server published /diagnostics within {a.timeout:g} s "
              f"(ROS domain {watch.domain})", file=sys.stderr)
        return 1
    if a.json:
        values = {k: typed(v) for k, v in watch.latest.items()}
        print(json.dumps({"level": LEVELS.get(watch.level, str(watch.level)), "message": watch.message, **values}))
        return 0
    print(f"inference server: {LEVELS.get(watch.level, watch.level)}, {watch.message}")
    print(f"  {status_line(watch.latest)}")
    for line in last_errors(watch.latest):
        print(f"  last refusal, {line}")
    for k, v in watch.latest.items():
        print(f"  {k}: {v}")
    return 0
