"""The inference server's diagnostics: its stats as one dict and as /diagnostics, and the
memory tools of long runs (a tracemalloc diff, returning freed heap pages to the OS).
Read-only views of the node's fleet (serve/stats.py), taken under its lock."""
from __future__ import annotations

import json
import tracemalloc
from collections import deque
from pathlib import Path

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from ..serve.stats import load_stats, pcts
from .common import ParamError


def server_stats(node) -> dict:
    """What /diagnostics shows of an InferenceServerNode (and what benches read). With the
    engine core in its own process its figures come from there, the node's added where the
    core has none."""
    remote = getattr(node.fleet, "remote", False)
    out = node.fleet.load_stats(node.started_at, node.robots) if remote else load_stats(node.fleet, node.started_at,
                                                                                        node.robots)
    with node.fleet.lock:
        local = {
            "served_by_tier": dict(node.served_by_tier),
            "finished_tasks": node.finished["tasks"], "reaped_tasks": node.finished["reaped"],
            **pcts("refresh", node.refresher.durations_s), **pcts("in_server", node.in_server_s),
            "refresh_clients": len(node.refresher.clients), **pcts("refresh_age", node.refresher.ages_s),
            "refresh_topic_used": node.refresher.topic_used, "refresh_topic_refused": node.refresher.topic_refused,
            "robots": len(set(node.robots.values())),
            "progress_refused": dict(node.progress_refused),
            "protocols": node.fleet.protocol_stats(),
            "metrics_port": node.metrics.port if getattr(node, "metrics", None) is not None else -1,
        }
    out.update({k: v for k, v in local.items() if not remote or k not in out})
    out["services"] = {n: svc.stats() for n, svc in node.side_services.items()}
    return out


def start_metrics(node, c):
    """The node's Prometheus endpoint (serve/metrics.py) per its `metrics` section; None when off.
    Beside the fleet's figures: tasks the node finished and reaped, progress it refused."""
    if c.metrics.port < 0 or c.engine_process == "separate":  # separate: the core process serves them
        return None
    from ..serve.metrics import PROGRESS_REFUSED, TASKS_ENDED, MetricsServer

    def node_counts() -> dict:
        with node.fleet.lock:
            return {TASKS_ENDED: ("Tasks ended: finished by their robot, or reaped after task_timeout_s "
                                               "of silence", {("finished",): node.finished["tasks"],
                                                              ("reaped",): node.finished["reaped"]}, ("how",)),
                    PROGRESS_REFUSED: ("Progress messages not applied, by reason",
                                                    {(k,): v for k, v in node.progress_refused.items()}, ("reason",))}

    try:
        m = MetricsServer(node.fleet, c.metrics.port, c.metrics.address, c.metrics.per_robot, node_counts)
    except ValueError as e:  # the port taken: nothing of the node is left running
        node.cleanup()
        raise ParamError(*e.args) from None
    node.get_logger().info(f"Prometheus metrics on {m.url}")
    return m


class RecentErrors:
    """The diagnostics level from the share of requests refused in the last window_s, not
    from errors ever: a fleet that recovered goes back to OK once a window passes clean."""

    def __init__(self, now: float, window_s: float = 30.0, warn: float = 0.0, error: float = 0.5) -> None:
        self.window_s, self.warn, self.error = window_s, warn, error
        self.samples: deque = deque([(now, 0, 0)])  # (time, errors so far, answered so far)

    def __call__(self, now: float, errors: int, answered: int) -> tuple:
        """(level, share of refused requests in the window)."""
        self.samples.append((now, errors, answered))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()  # the oldest kept is the last one at or before the window's start
        _, e0, a0 = self.samples[0]
        de, da = errors - e0, answered - a0
        share = de / (de + da) if de + da else 0.0
        level = DiagnosticStatus.ERROR if share >= self.error and de else \
            DiagnosticStatus.WARN if share > self.warn else DiagnosticStatus.OK
        return level, share


def diagnostic_array(st: dict, stamp, hardware_id: str, recent=None, now: float = 0.0) -> DiagnosticArray:
    """server_stats as one DiagnosticStatus; nested dicts as `group/key` values. The level
    follows `recent` (RecentErrors) when given, else any error ever."""
    nested = ("errors", "last_error", "wait_ratio", "served_by_tier", "services", "progress_refused", "protocols")
    kv = [KeyValue(key=k, value=str(v)) for k, v in st.items() if k not in nested]
    kv += [KeyValue(key=f"services/{n}/{k}", value=str(v)) for n, ss in sorted(st["services"].items())
           for k, v in sorted(ss.items())]
    kv += [KeyValue(key=f"protocols/{p}/{k}", value=str(v)) for p, c in sorted(st.get("protocols", {}).items())
           for k, v in sorted(c.items())]
    kv += [KeyValue(key=f"served_by_tier/{k}", value=str(v)) for k, v in sorted(st["served_by_tier"].items())]
    kv += [KeyValue(key=f"errors/{k}", value=str(v)) for k, v in sorted(st["errors"].items())]
    kv += [KeyValue(key=f"last_error/{k}", value=v) for k, v in sorted(st.get("last_error", {}).items())]
    kv += [KeyValue(key=f"progress_refused/{k}", value=str(v)) for k, v in sorted(st["progress_refused"].items())]
    kv += [KeyValue(key=f"wait_ratio/{r}", value=f"{w:.4f}") for r, w in sorted(st["wait_ratio"].items())]
    level = DiagnosticStatus.WARN if st["errors"] else DiagnosticStatus.OK
    if recent is not None:
        level, share = recent(now, sum(st["errors"].values()), st["served"])
        kv.append(KeyValue(key="recent_error_share", value=f"{share:.4f}"))
    msg = DiagnosticArray()
    msg.header.stamp = stamp
    msg.status = [DiagnosticStatus(level=level, name="robotserve: inference_server", hardware_id=hardware_id,
                                   message=f"{st['queue_length']} queued, {st['tasks']} tasks", values=kv)]
    return msg


class MemoryTrace:
    """Python allocations (tracemalloc) from a baseline taken after_s into the run to
    close(): the 30 sites that grew most, written to `path` as JSON: where a slow leak lives."""

    def __init__(self, node, path: str, after_s: float) -> None:
        self.path, self.base = path, None
        tracemalloc.start(1)
        self._timer = node.create_timer(after_s, self._baseline)

    def _baseline(self) -> None:
        self._timer.cancel()
        self.base = tracemalloc.take_snapshot()

    def close(self) -> None:
        if self.base is None:
            return
        diff = tracemalloc.take_snapshot().compare_to(self.base, "lineno")
        top = [{"site": str(d.traceback), "size_diff_kb": round(d.size_diff / 1024, 1), "count_diff": d.count_diff,
                "size_kb": round(d.size / 1024, 1)} for d in diff[:30]]
        total = sum(d.size_diff for d in diff) / 1024
        Path(self.path).write_text(json.dumps({"python_growth_kb": round(total, 1), "top": top}))


def trim_heap() -> None:
    """Give the heap pages freed since the last call back to the OS (glibc malloc_trim). A
    long-running server sees peaks of queued observations on ~150 threads' malloc arenas;
    without this its resident set keeps the highest peak's fragments (a 10-minute soak grew
    7 % after its first 2 minutes, with nothing leaking in the server's own structures)."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc: nothing to do
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc = None


def check_interfaces(node) -> None:
    """A robot built from other msg/srv than the server (nodes/interface_check.py): named once in
    the log and counted as `interface_mismatch`, its line the last_error `up`/`status` print."""
    from ..serve import Refused
    from .interface_check import CODE, describe, foreign_peers, own_request

    if node.infer is None:  # not active: no service to compare
        return
    # its name from the config, not the service's handle, which deactivate may destroy meanwhile
    seen, name = vars(node).setdefault("foreign_peers", set()), node.resolve_service_name(node.config.service)
    for peer in foreign_peers(node, name, "server"):
        if peer not in seen:
            seen.add(peer)
            line = describe(*peer, own_request(node, name, "server"), "server")
            node.get_logger().error(line)
            node.fleet.count_error(Refused(CODE, line), "ros")
