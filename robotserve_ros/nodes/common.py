"""What every node needs: the node's clock as a core Clock, time conversions, its parameters
as one frozen config dataclass (robotserve_ros/config.py; declare_config: declared as nested
ROS parameters with defaults and help, validated at start), and one way to run and stop nodes."""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import tempfile
import threading
from dataclasses import fields
from typing import Callable, NoReturn, Sequence, TypeVar

from builtin_interfaces.msg import Time
from rcl_interfaces.msg import ParameterDescriptor

from ..config import (Config, ConfigError, bad, check, check_one_of, defaults_of, flatten, from_tree,  # noqa: F401
                      param, unflatten)
from ..core.task_auth import body_mac
from .canonical import canonical

C = TypeVar("C", bound=Config)


def service_qos(depth: int = 1000):
    """A service's queues. The default (keep last 10) drops replies and requests at fleet
    scale: with Fast DDS every reply lands in every client's reply queue until its executor
    takes it, so a batch of 16 replies pushed out others' (80 of 1413 lost at 100 robots),
    and requests past 10 waiting for a thread are lost unanswered (issue 29: 86 of 100
    concurrent srv/Generate calls)."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
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


# A node's parameters are a config dataclass (robotserve_ros/config.py), read by the
# transports and the CLI alike; these names stay here for the nodes that import them.
ParamError = ConfigError  # a parameter value a node cannot start with: exit 2, printing it
NodeConfig = Config
bad_param = bad

# Set by ROS itself or by lean_node_kwargs on every node, not by our configs.
_ROS_OWN = ("use_sim_time", "start_type_description_service", "start_parameter_services",
            "autostart")  # the last: a lifecycle node's (nodes/managed.py), beside its config


def node_options(kw: dict | None = None) -> dict:
    """Node keyword arguments under which the node sees every parameter it is given (so
    declare_config can refuse a key its config does not have)."""
    return {**(kw or {}), "automatically_declare_parameters_from_overrides": True}


def declare_config(node, config_class: type[C], writable: bool = False) -> C:
    """Declare every leaf of config_class's default tree as a ROS parameter of the node
    (dotted names for nested sections, its help as description; dynamically typed so
    `rate:=2` can serve a float: the dataclass checks the type), then build the config from
    every parameter the node has: the given values over the defaults. A key the config does
    not have (seen when the node was made with node_options) or a bad value raises
    ParamError naming it and what is allowed. Read-only unless `runtime` or `writable` (a
    lifecycle node: settable while unconfigured, nodes/managed.py)."""
    from rclpy.exceptions import ParameterException

    try:
        leaves = flatten(config_class())
    except ConfigError:  # a parameter without a usable default (required): each field's default
        d = defaults_of(config_class)
        leaves = {f.name: (d.get(f.name), f.metadata.get("help", "")) for f in fields(config_class)}
    for name, (value, help) in leaves.items():
        if node.has_parameter(name):
            continue  # given (automatically declared from the overrides)
        desc = ParameterDescriptor(description=help, dynamic_typing=True,
                                   read_only=not (writable or _field_meta(config_class, name).get("runtime", False)))
        initial = list(value) if isinstance(value, tuple) else value
        try:  # an empty list has no ROS type: declared unset, the default stands unless given
            node.declare_parameter(name, initial if initial != [] else None, desc)
        except ParameterException as e:
            raise ParamError(f"parameter '{name}': {e}") from None
    return config_from(node, config_class)


def config_from(node, config_class: type[C], changes=()) -> C:
    """config_class from every parameter the node has, with `changes` (rclpy Parameters about
    to be set) over them: what configure would read, so a set can be refused before it lands."""
    values = {n: p.value for n, p in node.get_parameters_by_prefix("").items()}
    values.update((p.name, p.value) for p in changes)
    given = {n: v for n, v in values.items()
             if n not in _ROS_OWN and not n.startswith("qos_overrides.") and v is not None}
    return from_tree(config_class, unflatten(given))


def _field_meta(config_class, dotted: str) -> dict:
    """The metadata of a top-level field (a nested one's runtime flag is its section's)."""
    for f in fields(config_class):
        if f.name == dotted.split(".")[0]:
            return dict(f.metadata)
    return {}


class NodeClock:
    """A core Clock on the node's time (system time, or /clock with use_sim_time):
    robots stamp exec info on the same time line, so the ledger can compare them."""

    def __init__(self, node) -> None:
        self._clock = node.get_clock()

    def now(self) -> float:
        return self._clock.now().nanoseconds * 1e-9


# The server's expected queue wait (s) for a round sent now: std_msgs/Float64, the newest only.
QUEUE_WAIT_DEPTH = 1


def publish_queue_wait(node, topic: str, hz: float, expected_wait_s: Callable[[], float]) -> None:
    """The server says `hz` times a second how long a round sent now should wait (nothing
    when topic is ''): its robots re-send a queued round no sooner (queue_hint)."""
    if not topic:
        return
    from std_msgs.msg import Float64

    pub = node.create_publisher(Float64, topic, QUEUE_WAIT_DEPTH)
    node.create_timer(1.0 / hz, lambda: pub.publish(Float64(data=float(expected_wait_s()))))


def queue_hint(node, topic: str):
    """A robot's QueueHint (core/robot_loop), fed from the server's `topic` (none when topic
    is ''): its re-send intervals are at least the wait the server expects."""
    if not topic:
        return None
    from std_msgs.msg import Float64

    from ..core.robot_loop import QueueHint

    # One subscription per process and topic (a `--robots 25` process would otherwise put 25 in
    # its executor's wait set), kept while the node that made it still holds it.
    key = (id(node.context), node.resolve_topic_name(topic))
    held = _QUEUE_HINTS.get(key)
    if held is not None and held[2] in list(held[1].subscriptions):
        return held[0]
    hint, clock = QueueHint(), NodeClock(node)
    sub = node.create_subscription(Float64, topic, lambda m: hint.heard(m.data, clock.now()), QUEUE_WAIT_DEPTH)
    _QUEUE_HINTS[key] = (hint, node, sub)
    return hint


_QUEUE_HINTS: dict = {}  # (context, topic) -> (QueueHint, the node holding its subscription, the subscription)


def to_sec(t: Time) -> float:
    return t.sec + t.nanosec * 1e-9


def to_ns(t: Time) -> int:
    """A stamp in integer ns: what a task MAC covers (core/task_auth.py), exact both ends."""
    return int(t.sec) * 1_000_000_000 + int(t.nanosec)


def signed_body(msg) -> bytes:
    """What a task MAC covers (core/task_auth.py): the whole message, canonical, its auth_mac empty."""
    mac, msg.auth_mac = msg.auth_mac, []
    try:
        return canonical(msg)
    finally:
        msg.auth_mac = mac


class Stamps:
    """Strictly increasing stamps for one signer: a signed message's stamp is its sequence
    number (core/task_auth.py), and a coarse clock (sim time) can read the same twice."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self, now: float) -> Time:
        self.last = ns = max(int(round(now * 1e9)), self.last + 1)
        return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def sign(msg, key: bytes, kind: str) -> None:
    """Set msg.auth_mac to the MAC of everything else in it (its auth stamp set before)."""
    msg.auth_mac = body_mac(key, kind, signed_body(msg))


def to_time(s: float) -> Time:
    ns = int(round(s * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def prepare_process() -> None:
    """Before rclpy.init: a log dir even without HOME, a first SIGINT that stops us, and a
    C-level traceback on stderr should the process ever crash (faulthandler)."""
    faulthandler.enable()
    STOP_SIGNALS.clear()
    if "ROS_LOG_DIR" not in os.environ and "HOME" not in os.environ:
        os.environ["ROS_LOG_DIR"] = os.path.join(tempfile.gettempdir(), "robotserve_ros_log")
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)  # stop on SIGTERM the same clean way


STOP_SIGNALS: list = []  # the stop signals this process received (_interrupt)


def _interrupt(signum, frame):
    STOP_SIGNALS.append(signum)
    raise KeyboardInterrupt


def stopped_by_signal(e: BaseException) -> bool:
    """A stop, not a failure: KeyboardInterrupt, or any error raised once a stop signal came.
    The signal's KeyboardInterrupt can be raised inside Python code that rclpy's C++ calls (a
    message's constructor while a subscription's message is taken), and pybind11 turns it into
    `RuntimeError: Unable to convert call argument '0' to Python object` (seen in a 100-robot
    bench's robot_clients process at the stop: a traceback and exit 1 instead of a clean stop)."""
    return isinstance(e, KeyboardInterrupt) or bool(STOP_SIGNALS)


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


def exit_process(code: int) -> NoReturn:
    """End a node process once run_nodes has shut everything down, without the interpreter's
    teardown: there rclpy's remaining handles (timers, clocks, guard conditions) are finalised
    in arbitrary order after the context is gone, which now and then crashed a node that had
    stopped cleanly (SIGSEGV, exit -11, seen on sim_robot and robot_client at SIGINT)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    logging.shutdown()
    os._exit(code)


def quiet_signals() -> dict:
    """At shutdown, before any executor or node is destroyed: stop rclpy's signal handling and
    ignore further SIGINT/SIGTERM. rclpy's handler wakes executors from a thread of its own that
    triggers their guard conditions; on a loaded machine that thread can still be running when
    executor.shutdown() frees them, a use-after-free that crashed robot_client at stop now and
    then (SIGSEGV in a non-Python thread, main thread in destroy_node). Uninstalling joins that
    thread. A second Ctrl-C must not cut the clean-up short either (bags half written, shm left)."""
    import rclpy

    try:
        rclpy.uninstall_signal_handlers()
    except Exception:  # never installed (rclpy.init failed): nothing to join
        pass
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return before


def restore_signals(before: dict) -> None:
    """After the clean-up: the handlers quiet_signals replaced (a caller that goes on, e.g. a
    test running nodes in its own process, must not be left ignoring Ctrl-C, nor its children)."""
    for sig, handler in before.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def make_executor(n_threads: int, kind: str = "multithreaded"):
    """The executor of a process serving many calls: rclpy's MultiThreadedExecutor, or its
    SingleThreadedExecutor ('single': srv/Infer's replies are deferred, nodes/deferred.py, so
    one thread can take every call). rclpy's EventsExecutor is not offered: in Kilted's wheels
    a reply sent from another thread deadlocks it (docs/scale.md)."""
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

    return SingleThreadedExecutor() if kind == "single" else MultiThreadedExecutor(num_threads=n_threads)


def run_nodes(make: Callable[[], Sequence], argv=None, threads=None, executor=None) -> int:
    """rclpy.init, build nodes with make(), spin until SIGINT/SIGTERM, shut down cleanly.
    threads: None for a single-threaded executor, else a count or a function of the nodes;
    executor: make_executor's kind, or a function of the nodes giving it.
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
        kind = (executor(nodes) if callable(executor) else executor) or "multithreaded"
        ex = make_executor(n_threads, kind) if n_threads else SingleThreadedExecutor()
        if n_threads and kind != "single":
            _start_pool(ex, n_threads)
        for n in nodes:
            ex.add_node(n)
        ex.spin()
    except (ParamError, ParameterException, InvalidParameterTypeException) as e:
        print(f"robotserve_ros: {e}", file=sys.stderr, flush=True)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception as e:  # noqa: BLE001 - re-raised unless a stop signal explains it
        if not stopped_by_signal(e):
            raise
    finally:
        before = quiet_signals()
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
        restore_signals(before)
    return code
