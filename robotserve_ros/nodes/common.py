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


def bad_param(name: str, value: Any, why: str) -> ParamError:
    return ParamError(f"parameter '{name}' = {value!r} is invalid: {why}")


def declare_params(node, spec: Mapping[str, tuple], runtime=()) -> dict:
    """Declare each parameter of spec {name: (default, kind, why)}, kind one of str, bool,
    int, float, str[], int[], float[]; check its type. Ints are accepted for floats
    (`rate:=2`); an unset string list reads as None. Raises ParamError naming the parameter
    instead of rclpy's traceback."""
    import math

    from rclpy.exceptions import ParameterException
    from rclpy.parameter import Parameter

    ok = {"str": lambda v: isinstance(v, str),
          "bool": lambda v: isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          "str[]": lambda v: v is None or all(isinstance(x, str) for x in v),
          "int[]": lambda v: all(isinstance(x, int) for x in v),
          "float[]": lambda v: all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)}
    out = {}
    for name, (default, kind, why) in spec.items():
        desc = ParameterDescriptor(description=why, read_only=name not in runtime)
        try:
            if kind == "str[]" and not default:
                value = node.declare_parameter(name, Parameter.Type.STRING_ARRAY, desc).value
            elif kind.endswith("[]"):
                value = node.declare_parameter(name, list(default), desc).value
            else:
                desc.dynamic_typing = True  # so `:=30` can serve a float, checked below
                value = node.declare_parameter(name, default, desc).value
        except ParameterException as e:  # e.g. a string given for a string list
            raise ParamError(f"parameter '{name}' is invalid: {e} ({why})") from None
        if not ok[kind](value):
            raise bad_param(name, value, why or f"expected {kind}")
        if kind.endswith("[]") and value is not None:
            value = [float(x) for x in value] if kind == "float[]" else list(value)
        out[name] = float(value) if kind == "float" else value
    return out


def _kind(default) -> str:
    if isinstance(default, (list, tuple)):
        if all(isinstance(x, str) for x in default):
            return "str[]"
        return "int[]" if all(isinstance(x, int) for x in default) else "float[]"
    return {bool: "bool", int: "int", float: "float", str: "str"}[type(default)]


def declare(node, params: Mapping[str, Any], checks: Mapping[str, Callable[[Any], bool]] = (), why: Mapping[str, str] = ()) -> dict:
    """Declare each parameter with its default (its type taken from the default); return the
    values; raise ParamError naming the first one of the wrong type or failing its check."""
    checks, why = dict(checks), dict(why)
    out = declare_params(node, {k: (v, _kind(v), why.get(k, "")) for k, v in params.items()})
    for name, ok in checks.items():
        if not ok(out[name]):
            raise bad_param(name, out[name], why.get(name, "see the node documentation"))
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
    from rclpy.exceptions import InvalidParameterTypeException, ParameterException
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor

    prepare_process()
    nodes, ex, code = [], None, 0
    try:
        rclpy.init(args=argv if argv is not None else sys.argv)
        nodes = list(make())
        n_threads = threads(nodes) if callable(threads) else threads
        ex = MultiThreadedExecutor(num_threads=n_threads) if n_threads else SingleThreadedExecutor()
        for n in nodes:
            ex.add_node(n)
        ex.spin()
    except (ParamError, ParameterException, InvalidParameterTypeException) as e:
        print(f"robotserve_ros: {e}", file=sys.stderr, flush=True)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        # A second Ctrl-C must not cut the clean-up short (bags half written, shm left behind).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for n in nodes:
            close = getattr(n, "close", None)
            if close:
                close()
        if ex is not None:
            try:
                ex.shutdown(timeout_sec=1.0)
            except Exception:
                pass
        for n in nodes:
            try:
                n.destroy_node()
            except Exception:
                pass
        rclpy.try_shutdown()
    return code
