"""What every node needs: the node's clock as a core Clock, time conversions, parameters
declared with defaults and validated at start, and one way to run and stop nodes."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
from typing import Any, Callable, Mapping, Sequence

from builtin_interfaces.msg import Time
from rcl_interfaces.msg import ParameterDescriptor


def service_qos():
    """srv/Infer's queues. The default (keep last 10) drops replies and requests at fleet
    scale: with Fast DDS every reply lands in every client's reply queue until its executor
    takes it, so a batch of 16 replies pushed out others' (80 of 1413 lost at 100 robots)."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def lean_node_kwargs(node_kwargs: dict | None = None) -> dict:
    """Node options without parameter and type-description services. A process hosting many
    robots spends most of its executor's time rebuilding the wait set over every node's
    entities, and those services are most of them (py-spy: 70% of a 25-robot client)."""
    from rclpy.parameter import Parameter

    kw = dict(node_kwargs or {})
    kw.setdefault("start_parameter_services", False)
    kw["parameter_overrides"] = list(kw.get("parameter_overrides") or []) + [
        Parameter("start_type_description_service", value=False)]
    return kw


class ParamError(ValueError):
    """A parameter value a node cannot start with; the node exits with code 2."""


class NodeClock:
    """A core Clock on the node's time (system time, or /clock with use_sim_time):
    robots stamp exec info on the same time line, so the ledger can compare them."""

    def __init__(self, node) -> None:
        self._clock = node.get_clock()

    def now(self) -> float:
        return self._clock.now().nanoseconds * 1e-9


def to_sec(t: Time) -> float:
    return t.sec + t.nanosec * 1e-9


def to_time(s: float) -> Time:
    ns = int(round(s * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def declare(node, params: Mapping[str, Any], checks: Mapping[str, Callable[[Any], bool]] = (), why: Mapping[str, str] = ()) -> dict:
    """Declare each parameter with its default; return the values; raise ParamError naming
    the first one whose check fails."""
    checks, why = dict(checks), dict(why)
    out = {}
    for name, default in params.items():
        value = node.declare_parameter(name, default, ParameterDescriptor(description=why.get(name, ""))).value
        ok = checks.get(name)
        if ok is not None and not ok(value):
            raise ParamError(f"parameter '{name}' = {value!r} is invalid: {why.get(name, 'see the node documentation')}")
        out[name] = value
    return out


def prepare_process() -> None:
    """Before rclpy.init: a log dir even without HOME, and a first SIGINT that stops us."""
    if "ROS_LOG_DIR" not in os.environ and "HOME" not in os.environ:
        os.environ["ROS_LOG_DIR"] = os.path.join(tempfile.gettempdir(), "robotserve_ros_log")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)  # stop on SIGTERM the same clean way


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_nodes(make: Callable[[], Sequence], argv=None, threads=None) -> int:
    """rclpy.init, build nodes with make(), spin until SIGINT/SIGTERM, shut down cleanly.
    threads: None for a single-threaded executor, else a count or a function of the nodes.
    Returns the process exit code: 0 on a normal stop, 2 on a bad parameter."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor

    prepare_process()
    rclpy.init(args=argv if argv is not None else sys.argv)
    nodes = []
    code = 0
    try:
        nodes = list(make())
        n_threads = threads(nodes) if callable(threads) else threads
        ex = MultiThreadedExecutor(num_threads=n_threads) if n_threads else SingleThreadedExecutor()
        for n in nodes:
            ex.add_node(n)
        ex.spin()
    except ParamError as e:
        print(f"robotserve_ros: {e}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        for n in nodes:
            close = getattr(n, "close", None)
            if close:
                close()
            n.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()
    return code
