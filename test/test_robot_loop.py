"""The one robot loop (core/robot_loop.py) as every driver uses it: RobotLoop's restart and
readiness, its fields shown as a driver's own, and ReplayRobot, the closed form the trace
simulator, bench hybrid and bench ray replay recorded rounds on (issue 34 item 1)."""
from __future__ import annotations

import time

import pytest

from robotserve_ros.core.robot_loop import loop_fields, ReplayRobot, RobotLoop
from robotserve_ros.core.robot_timing import alone_latency


class _Queue:
    """A robot whose queue is a count of actions; the task never ends."""

    def __init__(self, queued: int = 0) -> None:
        self.queued = queued

    def execute(self) -> bool:
        if self.queued:
            self.queued -= 1
            return True
        return False

    def left(self) -> int:
        return self.queued

    def task_over(self) -> bool:
        return False

    def needs_more(self) -> bool:
        return True


def test_a_restart_keeps_the_retry_pause_and_the_chunks():
    lp = RobotLoop("r", 10.0, trigger=1, retry_s=0.5)
    bot = _Queue()
    assert lp.tick(0.0, bot)[1] == "send"
    lp.sent(0.0)
    bot.queued = 3
    lp.answered(0.1)
    lp.tick(0.2, bot)
    assert lp.tick(0.3, bot)[1] == "send"
    lp.sent(0.3)
    lp.restart(0.4)  # the server answered unknown_task
    assert lp.task_id == "r/task1" and lp.chunks == 1 and lp.round == 0
    assert lp.tick(0.5, bot)[1] is None  # the pause after the error holds under the new id too
    assert lp.tick(0.9, bot)[1] == "send"


def test_readiness_is_asked_only_when_a_send_is_due():
    lp = RobotLoop("r", 10.0, trigger=1)
    bot = _Queue(queued=4)
    asked = []

    def ready() -> bool:
        asked.append(bot.left())
        return len(asked) > 1  # not ready the first time it is asked

    events = [lp.tick(0.1 * k, bot, ready)[1] for k in range(4)]
    assert asked == [1, 0] and events == [None, None, None, "send"]  # asked at the trigger point, not before


def test_loop_fields_show_the_loop_as_the_drivers_own():
    class Driver:
        def __init__(self) -> None:
            self.rl = RobotLoop("d", 10.0, trigger=0)

    loop_fields(Driver, ("round", "done"), attr="rl", renamed={"tasks_continued": "continued"})
    d = Driver()
    d.round = 3
    d.tasks_continued += 1
    assert d.rl.round == 3 and d.rl.continued == 1 and d.done is False


def test_replay_robot_executes_holds_and_asks_at_the_trigger_point():
    rb = ReplayRobot("t", [4, 4, 2], 10.0, trigger=2, arrival=0.0)
    assert (rb.horizon(), rb.remaining()) == (4, 3)
    what, at, info = rb.answered(0.3)  # the first chunk: held 0.3 s for it
    assert what == "request" and at == pytest.approx(0.5) and (info.exec_start, info.actions_left) == (0.3, 2)
    assert rb.idle == pytest.approx(0.3) and rb.remaining() == 2
    what, at, info = rb.answered(0.6)  # early: it starts when the first chunk ran out (0.7)
    assert at == pytest.approx(0.9) and info.exec_start == pytest.approx(0.7) and rb.idle == pytest.approx(0.3)
    what, at, info = rb.answered(1.4)  # late: held from 1.1 to 1.4
    assert what == "done" and at == pytest.approx(1.6) and info.actions_left == 0
    assert rb.idle == pytest.approx(0.6)


def test_replay_robot_served_at_once_takes_the_contention_free_time():
    rounds, hz, l1 = [5, 3, 8, 1], 20.0, 0.12
    rb = ReplayRobot.for_latency("t", rounds, hz, l1, arrival=0.0)
    t, what = l1, "request"
    while what == "request":
        what, at, _ = rb.answered(t)
        t = at + l1
    assert at == pytest.approx(alone_latency(rounds, hz, l1))


def test_replay_robot_refuses_a_task_without_rounds():
    with pytest.raises(ValueError, match="rounds"):
        ReplayRobot("t", [], 10.0, 0, 0.0)


def test_bench_ray_fleet_runs_its_tasks_on_replay_robots():
    """bench ray's closed-loop robots (no Ray needed: a local simulated engine): every task of
    its rounds finishes, each round answered once."""
    from robotserve_ros.bench.ray import FIXED, SIM_PARAMS, ClosedLoopFleet
    from robotserve_ros.core.clock import WallClock
    from robotserve_ros.core.schedulers import make_scheduler
    from robotserve_ros.core.serving import ServingCore, Tier
    from robotserve_ros.engines.simulated import SimulatedEngine

    eng = SimulatedEngine(FIXED, **{**SIM_PARAMS, "realtime": False})
    rounds = [2, 3, 1, 4]
    fleet = ClosedLoopFleet(ServingCore(make_scheduler("remaining"), [Tier("local", FIXED)], WallClock()),
                            {"local": eng}, len(rounds), rounds_of=rounds, retry_pause_s=0.05)
    fleet.start()
    end = time.monotonic() + 20
    while len(fleet.finished) < len(rounds) and time.monotonic() < end:
        time.sleep(0.01)
    fleet.stop(drain_s=1.0)
    assert sorted(fleet.finished) == fleet.names
    assert fleet.served() == sum(rounds) and fleet.lost() == 0 and fleet.duplicated() == 0
