"""core/runner.py under load: the backlog accounting the server's diagnostics report
(engine busy fraction while more than a full batch waits, the engine's gaps between
batches) and the refresh ahead, on a virtual clock with fake engines and refreshers."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core.clock import VirtualClock
from robotserve_ros.core.profile import EngineProfile
from robotserve_ros.core.runner import Runner
from robotserve_ros.core.schedulers import make_scheduler
from robotserve_ros.core.serving import ServingCore, Tier
from robotserve_ros.core.types import ChunkResult, InferenceRequest


class Engine:
    def infer(self, batch):
        return [ChunkResult(np.zeros((8, 2), np.float32)) for _ in batch]


def make(refresher=None, **kw):
    clock = VirtualClock()
    # Saturation batch 2: the core is backlogged with 3 or more waiting.
    core = ServingCore(make_scheduler("fifo"), [Tier("edge", EngineProfile({1: 100.0, 2: 150.0}))], clock,
                       refresher=refresher, stale_obs_s=0.25 if refresher else None)
    return Runner(core, {"edge": Engine()}, lambda rs, d, res: None, **kw), core, clock


def test_engine_busy_time_while_backlogged_and_the_gaps_are_counted():
    runner, core, clock = make()
    assert runner.backlog_threshold == 2
    for k in range(5):
        runner.submit(InferenceRequest(f"t{k}", 0))
    (d,) = runner.dispatch()  # 3 left waiting: backlogged from here
    clock.advance_to(1.0)  # 1 s of refresh/hand-off: the engine idles while backlogged
    started = runner.begin(d)
    clock.advance_to(3.0)
    runner.finish(d, runner.engines["edge"].infer([p.request for p in d.requests]), started)
    clock.advance_to(3.5)  # the slot is free, nothing dispatched yet
    (d2,) = runner.dispatch()  # 1 left: no longer backlogged
    with runner.lock:
        runner.account()
    assert runner.backlogged_s == pytest.approx(3.5)
    assert runner.busy_backlogged_s["edge"] == pytest.approx(2.0)  # busy 1.0..3.0 of 0..3.5
    assert list(runner.gap_refresh_s) == [pytest.approx(1.0)]  # dispatched -> engine start
    assert list(runner.gap_dispatch_s) == [pytest.approx(0.5)]  # slot freed -> next dispatch
    assert len(runner.dispatch_s) == 2 and runner.running["edge"] == 0
    clock.advance_to(9.0)  # not backlogged: none of this counts
    with runner.lock:
        runner.account()
    assert runner.backlogged_s == pytest.approx(3.5)


def test_refresh_ahead_refreshes_the_next_batch_only_and_never_a_request_taken_meanwhile():
    asked = []

    def refresher(reqs):
        asked.append([r.task_id for r in reqs])
        return [(f"fresh-{r.task_id}", clock.now()) for r in reqs]

    runner, core, clock = make(refresher, prefresh_lead_s=0.1)
    for k in range(4):
        runner.submit(InferenceRequest(f"t{k}", 0, observation="old", obs_stamp=0.0))
    clock.advance_to(0.2)  # 0.2 s old: stale within the 0.1 s lead
    assert runner.prefresh("edge") == 2
    assert asked == [["t0", "t1"]]  # FIFO's next batch of 2, not the whole queue
    assert [core.pending[t].request.observation for t in ("t0", "t1", "t2", "t3")] == ["fresh-t0", "fresh-t1", "old", "old"]
    (d,) = runner.dispatch()
    core.refresh_stale(d)  # fresh now: the dispatch asks the robots nothing
    assert asked == [["t0", "t1"]] and core.stats.refreshes == 0

    # A request dispatched while its refresh was on the way keeps what it has.
    def slow(reqs):
        taken = runner2.dispatch()  # (the engine's slot freed meanwhile)
        assert taken
        return [("late", clock.now()) for _ in reqs]

    runner2, core2, clock2 = make(slow, prefresh_lead_s=0.1)
    for k in range(2):
        runner2.submit(InferenceRequest(f"u{k}", 0, observation="old", obs_stamp=0.0))
    clock2.advance_to(0.3)
    assert runner2.prefresh("edge") == 0 and runner2.prefreshes["skipped"] == 2


def test_refresh_ahead_failures_are_counted_and_cost_nothing():
    runner, core, clock = make(lambda reqs: [None] * len(reqs), prefresh_lead_s=0.1)
    runner.submit(InferenceRequest("a", 0, observation="old", obs_stamp=0.0))
    clock.advance_to(1.0)
    assert runner.prefresh("edge") == 0 and runner.prefreshes["failed"] == 1
    assert core.pending["a"].request.observation == "old"
