"""A node process's stop: rclpy's signal thread is joined before anything it could touch is freed."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("rclpy")

# run_nodes on a node that interrupts itself; the executor's shutdown reports whether rclpy's
# signal handling (its thread triggers the executor's guard conditions) was still installed then.
SCRIPT = textwrap.dedent("""
    import os, signal
    import rclpy.executors as E
    from rclpy.node import Node
    from rclpy.signals import get_current_signal_handlers_options
    from robotserve_ros.nodes.common import exit_process, run_nodes

    real = E.SingleThreadedExecutor.shutdown

    def shutdown(self, *a, **k):
        print("at executor shutdown:", get_current_signal_handlers_options().name, flush=True)
        return real(self, *a, **k)

    E.SingleThreadedExecutor.shutdown = shutdown

    def make():
        n = Node("stopper")
        n.create_timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
        return [n]

    exit_process(run_nodes(make, ["stopper"]))
""")


def test_signal_thread_is_stopped_before_the_executor_frees_its_guard_conditions(tmp_path):
    env = dict(os.environ, ROS_DOMAIN_ID=str(150 + os.getpid() % 50), ROS_LOG_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "at executor shutdown: NO" in p.stdout, p.stdout + p.stderr


# A callback that turns the stop signal's KeyboardInterrupt into another error, the way pybind11
# does when the signal lands in Python code rclpy's C++ called (a message constructor while a
# subscription's message is taken): "RuntimeError: Unable to convert call argument '0' ...".
WRAPPED = textwrap.dedent("""
    import os, signal, sys
    from rclpy.node import Node
    from robotserve_ros.nodes.common import exit_process, run_nodes

    SIGNAL = sys.argv[1] == "signal"

    def tick():
        try:
            if SIGNAL:
                os.kill(os.getpid(), signal.SIGINT)
                signal.pause()  # the handler runs here and raises KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        raise RuntimeError("Unable to convert call argument '0' to Python object")

    def make():
        n = Node("wrapper")
        n.create_timer(0.2, tick)
        return [n]

    exit_process(run_nodes(make, ["wrapper"]))
""")


@pytest.mark.parametrize("stop", ["signal", "none"])
def test_an_error_raised_by_the_stop_signal_is_a_clean_stop_and_any_other_error_is_not(tmp_path, stop):
    env = dict(os.environ, ROS_DOMAIN_ID=str(151 + os.getpid() % 49), ROS_LOG_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", WRAPPED, stop], capture_output=True, text=True, timeout=60, env=env)
    if stop == "signal":
        assert p.returncode == 0, p.stdout + p.stderr
        assert "Traceback" not in p.stderr, p.stderr
    else:  # a real failure still ends the process with its traceback
        assert p.returncode != 0 and "Unable to convert" in p.stderr, p.stdout + p.stderr
