"""Helpers for node tests: real nodes as subprocesses on an isolated ROS domain.

Import what you need from a test module (test/ is on sys.path under pytest):

    from rosutil import requires_rclpy, ros_ctx, start_node, ros_env, wait_for

    @requires_rclpy
    def test_something(ros_ctx):
        node = ros_ctx.start_node(["robotserve_ros.nodes.sim_robot"])   # same domain as ros_ctx
        msgs = ros_ctx.collect(JointState, "joint_states")
        assert ros_ctx.wait_for(lambda: len(msgs) >= 3, timeout=5)
        assert node.stop() == 0

* `ros_env()`: a copy of os.environ for the current test: a ROS_DOMAIN_ID in 1..200 drawn
  at random once per test (the same for every call within one test, different for every test
  of the session), ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, ROS_LOG_DIR under a temporary
  directory, PYTHONUNBUFFERED=1.
* `start_node(args, env)`: `sys.executable -m <args...>` with stdout/stderr to files; the
  handle's .stop() sends SIGINT, waits up to 10 s, then kills, and removes the Fast DDS
  shared-memory files the process left behind.
* fixture `ros_ctx`: an rclpy Context initialised on the test's domain in the test process
  (the test's ROS env applied to os.environ via monkeypatch), a helper node, an executor,
  and `wait_for(predicate, timeout)` that spins that node.

Nothing here imports rclpy at module import: without rclpy, tests marked `requires_rclpy`
(or using `ros_ctx`) are skipped and the pure-core suite runs.
"""
from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
HAVE_RCLPY = importlib.util.find_spec("rclpy") is not None
requires_rclpy = pytest.mark.skipif(not HAVE_RCLPY, reason="rclpy (ROS 2) is not installed")

# ----------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------
DOMAIN_IDS = range(1, 201)
_domain_pool: List[int] = []
_domain_of_test: Dict[str, int] = {}
_tmp_root: Optional[str] = None


def _current_test() -> str:
    # "test/test_x.py::test_y (call)" -> "test/test_x.py::test_y"; setup/call/teardown share it.
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def domain_id_for_test(test_id: Optional[str] = None) -> int:
    """The ROS_DOMAIN_ID of a test: random, fixed for the test, unique within the session.

    Ids come from a shuffled pool, so two tests of one session never share one (after 200
    tests the pool is reshuffled). Separate sessions running at the same time draw
    independently; a clash between them is unlikely but possible.
    """
    key = _current_test() if test_id is None else test_id
    if key not in _domain_of_test:
        if not _domain_pool:
            _domain_pool.extend(DOMAIN_IDS)
            random.SystemRandom().shuffle(_domain_pool)
        _domain_of_test[key] = _domain_pool.pop()
    return _domain_of_test[key]


def _tmp_dir() -> str:
    global _tmp_root
    if _tmp_root is None:
        _tmp_root = tempfile.mkdtemp(prefix="rosutil-")
    return _tmp_root


def ros_env(extra: Optional[Dict[str, str]] = None, *, test_id: Optional[str] = None) -> Dict[str, str]:
    """A copy of os.environ set up for an isolated ROS graph for the current test."""
    env = dict(os.environ)
    domain = domain_id_for_test(test_id)
    env["ROS_DOMAIN_ID"] = str(domain)
    env.pop("ROS_STATIC_PEERS", None)
    env.pop("ROS_LOCALHOST_ONLY", None)  # deprecated; conflicts with the discovery range
    # DDS traffic itself stays on loopback, not only discovery (a Fast DDS profile; see there)
    from robotserve_ros.live.processes import loopback_dds

    loopback_dds(env)
    log_dir = os.path.join(_tmp_dir(), f"domain{domain}", "log")
    os.makedirs(log_dir, exist_ok=True)
    env["ROS_LOG_DIR"] = log_dir
    env.setdefault("HOME", _tmp_dir())
    env["PYTHONUNBUFFERED"] = "1"
    # Let `python -m robotserve_ros...` find the source checkout, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if extra:
        env.update(extra)
    return env


# ----------------------------------------------------------------------------------------
# Fast DDS shared memory left by killed processes
# ----------------------------------------------------------------------------------------
SHM_DIR = "/dev/shm"


def _shm_maps(pid: int) -> set:
    """/dev/shm/fastdds_* files a live process has mapped."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find(SHM_DIR + "/fastdds_")
                if i >= 0:
                    found.add(line[i:].strip().removesuffix(" (deleted)"))
    except OSError:
        pass
    return found


def _shm_in_use(exclude: int) -> set:
    used = set()
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != exclude:
            used |= _shm_maps(int(d))
    return used


def clean_fastdds_shm(paths: Sequence[str], dead_pid: int) -> List[str]:
    """Remove the given Fast DDS segments (with their _el lock file and semaphore) that no
    live process maps any more. Returns the paths removed."""
    if not paths:
        return []
    in_use = _shm_in_use(exclude=dead_pid)
    removed = []
    for path in paths:
        if path in in_use or not path.startswith(SHM_DIR + "/fastdds_"):
            continue
        name = os.path.basename(path)
        for p in (path, path + "_el", os.path.join(SHM_DIR, f"sem.{name}_mutex")):
            try:
                os.unlink(p)
                removed.append(p)
            except OSError:
                pass
    return removed


# ----------------------------------------------------------------------------------------
# Node subprocesses
# ----------------------------------------------------------------------------------------
class NodeProcess:
    """A node started by start_node(). Use .stop() (or a with block) to end it."""

    def __init__(self, args: Sequence[str], env: Dict[str, str], log_dir: str, name: str) -> None:
        self.args = list(args)
        self.env = env
        self.stdout_path = os.path.join(log_dir, f"{name}.stdout")
        self.stderr_path = os.path.join(log_dir, f"{name}.stderr")
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", *self.args], env=env, cwd=str(REPO_ROOT),
                                     stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err)
        self.pid = self.proc.pid
        self.killed = False
        self._shm: set = set()

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the process to exit by itself; returns its exit status."""
        code = self.proc.wait(timeout=timeout)
        self._close()
        return code

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGINT) -> int:
        """SIGINT (or `sig`), wait up to `timeout` s, then SIGKILL; returns the exit status
        (negative: killed by that signal). Safe to call more than once."""
        if self.proc.poll() is None:
            self._shm |= _shm_maps(self.pid)
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close()
        # A clean exit removes its segments; this only finds what a kill (or crash) left.
        clean_fastdds_shm(sorted(p for p in self._shm if os.path.exists(p)), self.pid)
        self._shm.clear()
        return self.proc.returncode

    def _close(self) -> None:
        for f in (self._out, self._err):
            if not f.closed:
                f.close()

    def stdout(self) -> str:
        return Path(self.stdout_path).read_text(errors="replace")

    def stderr(self) -> str:
        return Path(self.stderr_path).read_text(errors="replace")

    def output(self) -> str:
        """stdout then stderr (what the node logged), for assertion messages."""
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def __enter__(self) -> "NodeProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


_node_count = 0


def start_node(args: Sequence[str], env: Optional[Dict[str, str]] = None, *,
               name: Optional[str] = None) -> NodeProcess:
    """Start `python -m <args...>` (e.g. ["robotserve_ros.nodes.sim_robot", "--ros-args",
    "-p", "robot_type:=drone"]) on the current test's domain (or `env`)."""
    global _node_count
    env = ros_env() if env is None else env
    _node_count += 1
    label = name or f"{args[0].rsplit('.', 1)[-1]}-{_node_count}"
    log_dir = os.path.join(os.path.dirname(env.get("ROS_LOG_DIR", _tmp_dir())), "procs")
    os.makedirs(log_dir, exist_ok=True)
    return NodeProcess(args, env, log_dir, label)


# ----------------------------------------------------------------------------------------
# Waiting
# ----------------------------------------------------------------------------------------
def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, *, spin: Optional[Callable[[float], Any]] = None,
             period: float = 0.02) -> bool:
    """Poll `predicate` until it is true or `timeout` s pass; returns its last value.

    `spin(t)` is called between polls (e.g. an executor's spin_once) to let callbacks run;
    without it the loop sleeps `period`.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return bool(predicate())
        if spin is not None:
            spin(min(period, left))
        else:
            time.sleep(min(period, left))


class RosCtx:
    """What the ros_ctx fixture gives: an rclpy context on the test's domain and a node."""

    def __init__(self, env: Dict[str, str]) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        self.env = env
        self.domain_id = int(env["ROS_DOMAIN_ID"])
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=self.domain_id,
                   signal_handler_options=SignalHandlerOptions.NO)  # leave Ctrl-C to pytest
        self.node = rclpy.create_node(f"test_helper_{os.getpid()}", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.procs: List[NodeProcess] = []

    def spin(self, seconds: float) -> None:
        """Run callbacks for `seconds`."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.executor.spin_once(timeout_sec=min(left, 0.05))

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Spin the helper node until predicate() is true or timeout s pass."""
        return wait_for(predicate, timeout, spin=lambda t: self.executor.spin_once(timeout_sec=t))

    def collect(self, msg_type, topic: str, qos=None, *, keep: int = 10000) -> list:
        """Subscribe and return the list that received messages are appended to."""
        from rclpy.qos import qos_profile_sensor_data

        got: list = []

        def cb(msg):
            got.append(msg)
            if len(got) > keep:
                del got[0]

        self.node.create_subscription(msg_type, topic, cb, qos if qos is not None else qos_profile_sensor_data)
        return got

    def publisher(self, msg_type, topic: str, qos=10):
        return self.node.create_publisher(msg_type, topic, qos)

    def wait_for_subscriber(self, pub, timeout: float = 5.0) -> bool:
        """Until `pub` is matched by at least one subscription (discovery is done)."""
        return self.wait_for(lambda: pub.get_subscription_count() > 0, timeout)

    def start_node(self, args: Sequence[str], **kw) -> NodeProcess:
        """start_node() on this context's domain; stopped at the end of the test."""
        proc = start_node(args, self.env, **kw)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        try:
            self.executor.shutdown(timeout_sec=1.0)
        except Exception:
            pass
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def ros_ctx(monkeypatch) -> RosCtx:
    """An rclpy Context on the test's isolated domain, with a helper node (skips without rclpy)."""
    pytest.importorskip("rclpy")
    env = ros_env()
    for key in ("ROS_STATIC_PEERS", "ROS_LOCALHOST_ONLY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    ctx = RosCtx(env)
    try:
        yield ctx
    finally:
        ctx.close()
