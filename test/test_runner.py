"""core/runner.py: the one serving loop's steps, on a virtual clock, with fake engines."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core.clock import VirtualClock
from robotserve_ros.core.profile import EngineProfile
from robotserve_ros.core.runner import STAGES, Runner, StageTrace
from robotserve_ros.core.schedulers import make_scheduler
from robotserve_ros.core.serving import ServingCore, Tier
from robotserve_ros.core.types import ChunkResult, ExecInfo, InferenceRequest


class Engine:
    def __init__(self, fail: int = 0) -> None:
        self.fail, self.calls = fail, []

    def infer(self, batch):
        self.calls.append([q.task_id for q in batch])
        if self.fail:
            self.fail -= 1
            raise RuntimeError("engine down")
        return [ChunkResult(np.zeros((8, 2), np.float32)) for _ in batch]


def make(engine, **kw):
    clock = VirtualClock()
    core = ServingCore(make_scheduler("fifo"), [Tier("edge", EngineProfile({1: 10.0, 4: 20.0}))], clock)
    got, gave_up, seen = [], [], []
    runner = Runner(core, {"edge": engine}, lambda rs, d, res: got.extend(rs),
                    on_given_up=lambda ps, e: gave_up.extend(p.task_id for p in ps),
                    observer=lambda stage, rounds: seen.append((stage, tuple(rounds))), **kw)
    return runner, core, clock, got, gave_up, seen


def step(runner, clock, t):
    """One dispatch on the virtual clock: every batch runs and ends at t."""
    for d in runner.dispatch():
        started = runner.begin(d)
        clock.advance_to(t)
        try:
            results = runner.engines[d.tier].infer([p.request for p in d.requests])
        except RuntimeError as e:
            runner.fail(d, e, started)
            runner.end_cooldown(d.tier)
            continue
        runner.finish(d, results, started)


def test_a_round_passes_every_stage_in_order_and_engine_time_is_counted():
    runner, core, clock, got, _, seen = make(Engine())
    runner.submit(InferenceRequest("a", 0))
    step(runner, clock, 0.5)
    assert [(r.task_id, r.round_id) for r in got] == [("a", 0)]
    assert [s for s, _ in seen] == list(STAGES) and all(r == (("a", 0),) for _, r in seen)
    assert runner.busy_s["edge"] == pytest.approx(0.5)


def test_failed_batches_requeue_then_give_up_after_max_attempts():
    """An engine that keeps failing: requeued twice, then answered with an error; the
    robot can send the same round again and it is served once the engine is back."""
    eng = Engine(fail=3)
    runner, core, clock, got, gave_up, _ = make(eng, max_attempts=3)
    runner.submit(InferenceRequest("a", 0))
    for t in (1.0, 2.0, 3.0):
        step(runner, clock, t)
    assert gave_up == ["a"] and not core.pending and not core.inflight
    assert core.stats.given_up == 1 and core.stats.requeued == 2 and runner.failures["edge"] == 3
    assert core.tier("edge").busy == 0  # every cool-down ended
    runner.submit(InferenceRequest("a", 0))  # the same round again: accepted as new
    step(runner, clock, 4.0)
    assert [(r.task_id, r.round_id) for r in got] == [("a", 0)] and len(eng.calls) == 4


def test_a_late_reply_for_a_requeued_batch_is_discarded():
    runner, core, clock, got, _, _ = make(Engine())
    runner.submit(InferenceRequest("a", 0))
    (d,) = runner.dispatch()
    started = runner.begin(d)
    with runner.lock:
        core.requeue(d.id)  # e.g. its deadline passed: served elsewhere
    assert runner.finish(d, [ChunkResult(np.zeros((8, 2), np.float32))], started) is False
    assert runner.late_replies == 1 and got == [] and "a" in core.pending


def test_a_failing_observer_costs_no_round():
    def broken(stage, rounds):
        raise RuntimeError("diagnostics bug")

    runner, core, clock, got, _, _ = make(Engine())
    runner.observe(broken)
    runner.submit(InferenceRequest("a", 0))
    step(runner, clock, 1.0)
    assert len(got) == 1


def test_stage_trace_keeps_the_newest_rounds_only():
    t = iter(range(100))
    trace = StageTrace(lambda: next(t), max_rounds=2)
    for k in range(3):
        trace("submit", [("a", k)])
    trace("reply", [("a", 2)])
    assert trace.snapshot() == {"a#1": {"submit": 1}, "a#2": {"submit": 2, "reply": 3}}


def test_threaded_driver_serves_rounds_and_stops():
    """The live driver: dispatcher + slot thread on the wall clock, closed cleanly."""
    import threading

    from robotserve_ros.core.clock import WallClock

    core = ServingCore(make_scheduler("fifo"), [Tier("edge", EngineProfile({1: 1.0}))], WallClock())
    done = threading.Event()
    got = []

    def on_replies(rs, d, res):
        got.extend(rs)
        if len(got) == 3:
            done.set()

    runner = Runner(core, {"edge": Engine()}, on_replies).start()
    try:
        for i in range(3):
            runner.submit(InferenceRequest(f"t{i}", 0))
        assert done.wait(5.0)
        runner.submit(InferenceRequest("t0", 1, ExecInfo(0.0, 0, 10.0)))
    finally:
        runner.close()
    assert sorted(r.task_id for r in got[:3]) == ["t0", "t1", "t2"]
    assert all(not th.is_alive() for th in runner._threads)


def test_a_listener_sees_every_batch_after_on_replies():
    """Runner.listen: a second front end on the same fleet (the openpi endpoint beside the ROS
    service) gets each batch's replies, under the lock, after on_replies."""
    runner, core, clock, got, _, _ = make(Engine())
    heard = []
    runner.listen(lambda rs, d, res: heard.append(([r.task_id for r in rs], len(got), len(res))))
    runner.submit(InferenceRequest("a", 0))
    runner.submit(InferenceRequest("b", 0))
    step(runner, clock, 0.5)
    assert heard == [(["a", "b"], 2, 2)]  # on_replies had already run (got holds both)


# --- one request cannot fail its batch-mates ----------------------------------------------------
class PoisonEngine(Engine):
    """Raises on any batch holding a poisoned task, as an engine does on a row it cannot take."""

    def __init__(self, poisoned, exc=None) -> None:
        super().__init__()
        self.poisoned, self.exc = set(poisoned), exc

    def infer(self, batch):
        self.calls.append([q.task_id for q in batch])
        if any(q.task_id in self.poisoned for q in batch):
            raise self.exc or IndexError("index 17 is out of bounds for axis 0 with size 16")
        return [ChunkResult(np.full((8, 2), i, np.float32)) for i in range(len(batch))]


def _batch_of(runner, core, tasks):
    for t in tasks:
        runner.submit(InferenceRequest(t, 0))
    (d,) = runner.dispatch()
    assert [p.task_id for p in d.requests] == list(tasks)
    return d


@pytest.mark.parametrize("exc", [None, "bad_observation"])
def test_a_row_the_engine_fails_on_is_answered_alone_and_its_batch_mates_are_served(exc):
    from robotserve_ros.core.observation import BadObservation

    err = BadObservation("image 0: 96x96 but the policy takes 32x32") if exc else None
    eng = PoisonEngine({"c"}, err)
    runner, core, clock, got, gave_up, _ = make(eng, retry_pause_s=0.0)
    d = _batch_of(runner, core, ["a", "b", "c", "d"])
    runner.run_batch(d)
    assert sorted(r.task_id for r in got) == ["a", "b", "d"]  # served in the same dispatch
    assert gave_up == ["c"]  # answered with the error now, not retried behind others' backs
    assert runner.rows_failed == 1 and not core.pending and not core.inflight
    assert core.tier("edge").busy == 0  # the slot is free, not cooled down
    assert core.stats.errors[exc or "engine_failure"] == 1 and runner.failures["edge"] == 0
    # halves until the row that fails alone is found: whole, [a b] ok, [c d] fails, [c], [d]
    assert eng.calls == [["a", "b", "c", "d"], ["a", "b"], ["c", "d"], ["c"], ["d"]]
    replies = {r.task_id: float(r.actions[0, 0]) for r in got}
    assert replies == {"a": 0.0, "b": 1.0, "d": 0.0}  # each got its own row's result


def test_an_engine_refusing_a_batch_of_one_answers_it_without_retrying():
    from robotserve_ros.core.observation import BadObservation

    eng = PoisonEngine({"a"}, BadObservation("joint state has shape (5,), the policy takes (6,)"))
    runner, core, clock, got, gave_up, _ = make(eng, retry_pause_s=0.0)
    runner.run_batch(_batch_of(runner, core, ["a"]))
    assert gave_up == ["a"] and eng.calls == [["a"]] and core.stats.errors["bad_observation"] == 1
    assert core.tier("edge").busy == 0 and not core.pending


def test_a_tier_failure_requeues_the_whole_batch_without_splitting_it():
    class Down(Exception):
        tier_failure = True

    eng = PoisonEngine({"a", "b", "c"}, Down("GPU server unreachable"))
    runner, core, clock, got, gave_up, _ = make(eng, retry_pause_s=0.0)
    runner.run_batch(_batch_of(runner, core, ["a", "b", "c"]))
    assert eng.calls == [["a", "b", "c"]]  # one call: a down tier is not asked again per row
    assert sorted(core.pending) == ["a", "b", "c"] and not gave_up and runner.rows_failed == 0
    assert runner.failures["edge"] == 1


def test_every_row_failing_alone_is_the_engine_failing_and_requeues_the_batch():
    eng = PoisonEngine({"a", "b"})
    runner, core, clock, got, gave_up, _ = make(eng, retry_pause_s=0.0)
    runner.run_batch(_batch_of(runner, core, ["a", "b"]))
    assert sorted(core.pending) == ["a", "b"] and not gave_up and runner.failures["edge"] == 1
