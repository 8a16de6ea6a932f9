"""What every node needs: the node's clock as a core Clock, time conversions, its parameters
as one frozen dataclass (NodeConfig + declare_config: declared with defaults and help,
validated at start), and one way to run and stop nodes."""
from __future__ import annotations

import math
import os
import signal
import sys
import tempfile
import threading
import types
from collections.abc import Iterable
from dataclasses import MISSING, field, fields
from typing import Any, Callable, Sequence, TypeVar, Union, get_args, get_origin, get_type_hints

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
    """A parameter value a node cannot start with; the node exits with code 2, printing it."""


def bad_param(name: str, value: Any, what: str) -> ParamError:
    """`parameter 'rate': 0.0 is not > 0`: the parameter, its value, what is allowed."""
    if isinstance(value, (list, tuple)):
        value = list(value)
    return ParamError(f"parameter '{name}': {value!r} {what}")


def check(ok: bool, name: str, value: Any, what: str) -> None:
    if not ok:
        raise bad_param(name, value, what)


def check_one_of(name: str, value: Any, choices) -> None:
    choices = list(choices)
    check(value in choices, name, value, f"is not one of {', '.join(map(str, choices))}")


def param(default: Any, help: str, *, runtime: bool = False):
    """A NodeConfig field: its default, its description (shown by `ros2 param describe`),
    and whether it may be set while the node runs (read-only otherwise)."""
    return field(default=default, metadata={"help": help, "runtime": runtime})


class NodeConfig:
    """Base of a node's parameters as a frozen dataclass: each field is one ROS parameter
    (declare_config). Construction checks each field's type (ints accepted for floats,
    lists become tuples), then `check()`; a bad value raises ParamError naming it."""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            object.__setattr__(self, f.name, _typed(f.name, hints[f.name], getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """A node's own rules (ranges, choices, combinations)."""


def _typed(name: str, hint, value):
    """value as the field's type (float, int, bool, str, tuple[X, ...], Optional[...])."""
    if get_origin(hint) in (Union, types.UnionType):  # Optional[X]: None means "not set"
        if value is None:
            return None
        (hint,) = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) is tuple:
        item = get_args(hint)[0]
        listed = not isinstance(value, (str, bytes)) and isinstance(value, Iterable)
        value = list(value) if listed else value
        check(listed and all(_KINDS[item][0](x) for x in value), name, value, f"is not a list of {_KINDS[item][2]}")
        return tuple(float(x) if item is float else x for x in value)
    ok, one, _ = _KINDS[hint]
    check(ok(value), name, value, f"is not {one}")
    return float(value) if hint is float else value


_KINDS = {  # type: (accepts, "is not ...", "is not a list of ...")
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            "a finite number", "finite numbers"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", "integers"),
    bool: (lambda v: isinstance(v, bool), "true or false", "booleans"),
    str: (lambda v: isinstance(v, str), "a string", "strings"),
}


C = TypeVar("C", bound=NodeConfig)


def declare_config(node, config_class: type[C]) -> C:
    """Declare each field of config_class as a ROS parameter of the node (its default, its
    help as description; dynamically typed so `rate:=2` can serve a float: the dataclass
    checks the type) and return the config built from the values given. Raises ParamError
    naming the first bad one."""
    from rclpy.exceptions import ParameterException

    values = {}
    for f in fields(config_class):
        default = f.default if f.default is not MISSING else f.default_factory()
        desc = ParameterDescriptor(description=f.metadata.get("help", ""), dynamic_typing=True,
                                   read_only=not f.metadata.get("runtime", False))
        initial = list(default) if isinstance(default, tuple) else default
        try:  # an empty list has no ROS type: declared unset, the default stands unless given
            value = node.declare_parameter(f.name, initial if initial != [] else None, desc).value
        except ParameterException as e:
            raise ParamError(f"parameter '{f.name}': {e}") from None
        values[f.name] = default if value is None else value
    return config_class(**values)


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


def prepare_process() -> None:
    """Before rclpy.init: a log dir even without HOME, and a first SIGINT that stops us."""
    if "ROS_LOG_DIR" not in os.environ and "HOME" not in os.environ:
        os.environ["ROS_LOG_DIR"] = os.path.join(tempfile.gettempdir(), "robotserve_ros_log")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)  # stop on SIGTERM the same clean way


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serving_executor(num_threads: int):
    """A MultiThreadedExecutor whose spin does O(1) work per callback.

    rclpy's keeps every submitted callback in a list that it scans, and removes from, on every
    spin: with hundreds of Infer calls each holding a thread while its round generates, that
    scan took half of the inference server's CPU (py-spy, 300 light robots: Future.done and
    _spin_once_impl, 50 % of samples). Here each callback reports its own exception, and the
    next spin raises it, as rclpy's would."""
    import queue

    from rclpy.executors import (ConditionReachedException, ExternalShutdownException, MultiThreadedExecutor,
                                 ShutdownException, TimeoutException)

    class ServingExecutor(MultiThreadedExecutor):
        def __init__(self, n: int) -> None:
            super().__init__(num_threads=n)
            self._raised: queue.SimpleQueue = queue.SimpleQueue()

        def _run(self, handler) -> None:
            handler()
            exc = handler.exception()
            if exc is not None:
                self._raised.put(exc)

        def _spin_once_impl(self, timeout_sec=None, wait_condition=lambda: False) -> None:
            if not self._raised.empty():
                raise self._raised.get()
            try:
                handler, _, _ = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
            except (ExternalShutdownException, ShutdownException, TimeoutException, ConditionReachedException):
                return
            self._executor.submit(self._run, handler)

    return ServingExecutor(num_threads)


def _start_pool(ex, n: int) -> None:
    """Start all of a MultiThreadedExecutor's threads now. Its thread pool otherwise grows one
    thread at a time as calls block (a server waits in one thread per queued round), so its
    memory climbs for minutes into a run (~160 kB per thread: stack and malloc arena, seen as
    a 5 % RSS rise in a 20-minute soak with the Python heap flat); started up front, the
    pool's memory is paid at start-up and stays flat."""
    pool = getattr(ex, "_executor", None)  # rclpy's concurrent.futures.ThreadPoolExecutor
    if pool is None:
        return
    gate = threading.Barrier(n, timeout=10.0)

    def hold() -> None:
        try:
            gate.wait()  # every submit finds no idle thread, so the pool starts a new one
        except threading.BrokenBarrierError:
            pass

    for f in [pool.submit(hold) for _ in range(n)]:
        f.result()


def run_nodes(make: Callable[[], Sequence], argv=None, threads=None) -> int:
    """rclpy.init, build nodes with make(), spin until SIGINT/SIGTERM, shut down cleanly.
    threads: None for a single-threaded executor, else a count or a function of the nodes.
    Returns the process exit code: 0 on a normal stop, 2 on a bad parameter."""
    import rclpy
    from rclpy.exceptions import InvalidParameterTypeException, ParameterException
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

    prepare_process()
    nodes, ex, code = [], None, 0
    try:
        try:
            rclpy.init(args=argv if argv is not None else sys.argv)
        except RuntimeError as e:  # rclpy's RCLError: malformed --ros-args
            print(f"robotserve_ros: bad ROS arguments: {e}", file=sys.stderr, flush=True)
            return 2
        nodes = list(make())
        n_threads = threads(nodes) if callable(threads) else threads
        ex = serving_executor(n_threads) if n_threads else SingleThreadedExecutor()
        if n_threads:
            _start_pool(ex, n_threads)
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
