"""serve/: the Fleet and its sessions (pure Python, fake engines, the live runner)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from rosutil import wait_for

from robotserve_ros.core.clock import WallClock
from robotserve_ros.core.errors import RequestError
from robotserve_ros.core.profile import EngineProfile
from robotserve_ros.core.schedulers import make_scheduler
from robotserve_ros.core.types import ChunkReply, ChunkResult, HorizonChoice, InferenceRequest
from robotserve_ros.serve import REFUSALS, Refused, fleet_over


class Gate:
    """A fake engine whose batches wait until `open` is set; it remembers every batch."""

    profile = EngineProfile({1: 1.0, 8: 2.0})
    name = "gate"

    def __init__(self, fail: int = 0) -> None:
        self.open, self.batches, self.forgot, self.fail = threading.Event(), [], [], fail

    def infer(self, batch):
        assert self.open.wait(10)
        self.batches.append([q.task_id for q in batch])
        if self.fail:
            self.fail -= 1
            raise RuntimeError("engine down")
        return [ChunkResult(np.full((8, 2), i, np.float32)) for i, _ in enumerate(batch)]

    def forget(self, task_id: str) -> None:
        self.forgot.append(task_id)



def req(task: str, rnd: int = 0) -> InferenceRequest:
    return InferenceRequest(task, rnd, horizon=HorizonChoice("static", 4.0))


@pytest.fixture
def fleet_of():
    made = []

    def make(engine=None, **kw):
        eng = engine or Gate()
        f = fleet_over(eng, make_scheduler("fifo"), WallClock(), **kw).start()
        made.append(f)
        return f, eng

    yield make
    for f in made:
        f.close()


def code_of(fut) -> str:
    e = fut.exception(timeout=10)
    assert isinstance(e, RequestError), e
    return e.code


def test_two_protocols_share_a_batch_and_each_gets_its_own_reply(fleet_of):
    fleet, eng = fleet_of()
    a, b = fleet.session("ros", "/r1"), fleet.session("jsonl", "peer")
    first = a.submit(req("warm"))  # holds the slot while the next two queue up
    assert wait_for(lambda: fleet.generating("warm"), 10.0)
    fa, fb = a.submit(req("a")), b.submit(req("b"))
    eng.open.set()
    first.result(10)
    ra, rb = fa.result(10), fb.result(10)
    assert isinstance(ra, ChunkReply) and (ra.task_id, rb.task_id) == ("a", "b") and ra.horizon == 4
    assert ["a", "b"] in eng.batches
    assert fleet.batches_by_protocols().get("jsonl+ros") == 1
    stats = fleet.protocol_stats()
    assert stats["ros"]["served"] == 2 and stats["jsonl"]["served"] == 1


def test_a_resent_round_goes_to_the_newer_call_and_an_answered_one_is_replayed(fleet_of):
    fleet, eng = fleet_of()
    s = fleet.session("ros")
    old = s.submit(req("a"))
    new = s.submit(req("a"))  # the same (task, round) again while it waits
    assert code_of(old) == "duplicate_request"
    eng.open.set()
    reply = new.result(10)
    again = s.submit(req("a"))  # answered already: the cached reply, nothing generated again
    assert again.done() and again.result() is reply
    assert len(eng.batches) == 1 and fleet.protocol_stats()["ros"]["replayed"] == 1


def test_max_waiting_refuses_with_overloaded_and_counts_it(fleet_of):
    fleet, eng = fleet_of(max_waiting=1)
    s = fleet.session("openpi")
    held = s.submit(req("a"))
    refused = s.submit(req("b"))
    assert code_of(refused) == "overloaded" and "overloaded" in REFUSALS
    assert fleet.core_stats()["errors"]["overloaded"] == 1
    assert fleet.protocol_stats()["openpi"]["refused:overloaded"] == 1
    eng.open.set()
    assert held.result(10).task_id == "a"
    assert s.submit(req("b")).result(10).task_id == "b"  # room again once answered


def test_a_dropped_task_answers_its_waiting_call_and_frees_its_engine_state(fleet_of):
    fleet, eng = fleet_of()
    s = fleet.session("lerobot")
    busy = s.submit(req("x"))  # generating (the gate is shut): "a" waits in the queue
    assert wait_for(lambda: fleet.generating("x"), 10.0)
    fa = s.submit(req("a"))
    s.drop("a", "task_dropped", "the robot left")
    assert code_of(fa) == "task_dropped" and "a" in eng.forgot and not fleet.knows("a")
    eng.open.set()
    busy.result(10)
    s.close()
    assert not fleet.knows("x") and s.tasks == set()


def test_a_silent_task_is_reaped(fleet_of):
    now = [0.0]
    fleet, eng = fleet_of(task_timeout_s=5.0, now=lambda: now[0])
    s = fleet.session("ros")
    busy = s.submit(req("x"))
    assert wait_for(lambda: fleet.generating("x"), 10.0)
    fa = s.submit(req("a"))
    now[0] = 3.0
    fleet.touch("x")  # heard (progress): kept
    now[0] = 6.0
    assert fleet.reap() == ["a"]
    assert code_of(fa) == "task_dropped"
    eng.open.set()
    busy.result(10)


def test_refusals_from_the_core_and_engine_failures_reach_the_future(fleet_of):
    fleet, eng = fleet_of(Gate(fail=5), max_attempts=2, retry_pause_s=0.0)
    s = fleet.session("ros")
    assert code_of(s.submit(req("nobody", 3))) == "unknown_task"  # round 3 of a task never started
    f = s.submit(req("a"))
    eng.open.set()
    assert code_of(f) == "engine_failure"
    assert isinstance(Refused("engine_failure", "x"), RequestError)


def test_an_untrimmed_session_gets_the_engines_full_result(fleet_of):
    fleet, eng = fleet_of()
    eng.open.set()
    out = fleet.session("gpu", untrimmed=True).submit(req("a")).result(10)
    assert isinstance(out, ChunkResult) and out.actions.shape == (8, 2)


def test_a_withdrawn_call_leaves_the_round_queued(fleet_of):
    fleet, eng = fleet_of()
    s = fleet.session("openpi")
    f = s.submit(req("a"))
    s.withdraw("a", 0)
    assert fleet.waiting() == 0 and fleet.queued("a") or fleet.generating("a")
    eng.open.set()
    with pytest.raises(TimeoutError):
        f.result(0.5)  # nobody routes it any more


def test_a_resent_round_is_run_once_counted_and_the_older_call_told_where_it_is(fleet_of):
    fleet, eng = fleet_of()
    s = fleet.session("ros", "/r1")
    busy = s.submit(req("x"))  # generating (the gate is shut): the next rounds queue behind it
    assert wait_for(lambda: fleet.generating("x"), 10.0)
    first, other = s.submit(req("a")), s.submit(req("b"))
    calls = [s.submit(req("b")) for _ in range(3)]  # an unchanged client asking again and again
    assert code_of(other) == "duplicate_request"
    msg = str(other.exception())
    assert "queued behind 1" in msg and "expected in about" in msg  # "a" arrived first
    assert [code_of(c) for c in calls[:2]] == ["duplicate_request"] * 2
    x_again = s.submit(req("x"))
    assert "generating" in str(busy.exception(timeout=10))
    eng.open.set()
    assert calls[2].result(10).task_id == "b" and first.result(10).task_id == "a" and x_again.result(10).task_id == "x"
    assert sorted(t for b in eng.batches for t in b) == ["a", "b", "x"]  # each round generated once
    st = fleet.protocol_stats()["ros"]
    assert st["resent"] == 4 and st["served"] == 3 and st["submitted"] == 7
    assert fleet.core_stats()["errors"].get("duplicate_request") is None  # a re-send is no refusal


def test_admission_refuses_robots_past_capacity_with_the_reason_and_serves_the_admitted(fleet_of):
    from robotserve_ros.core.admission import Admission

    fleet, eng = fleet_of(admission=Admission(max_tasks=2))
    eng.open.set()
    r1, r2, r3 = (fleet.session("ros", f"/r{k}") for k in (1, 2, 3))
    assert r1.submit(req("r1/t0")).result(10).task_id == "r1/t0"
    assert r2.submit(req("r2/t0")).result(10).task_id == "r2/t0"
    refused = r3.submit(req("r3/t0"))
    assert code_of(refused) == "overloaded" and "'/r3' not admitted" in str(refused.exception())
    assert r1.submit(req("r1/t1")).result(10).task_id == "r1/t1"  # a robot's next task keeps its place
    assert fleet.core_stats()["admission_refused"] == 1 and fleet.core_stats()["admitted"] == 2
    assert fleet.protocol_stats()["ros"]["refused:overloaded"] == 1
    assert not fleet.knows("r3/t0")  # nothing of the refused robot is kept


def test_no_chunk_is_generated_from_an_observation_older_than_its_robots_maximum(fleet_of):
    fleet, eng = fleet_of(stale_obs_s=0.1, refresher=lambda reqs: [None] * len(reqs))  # (refreshes fail)
    s = fleet.session("ros", "/r1")
    busy = s.submit(req("x"))  # generating: the next two share the next batch
    assert wait_for(lambda: fleet.generating("x"), 10.0)
    now = fleet.clock.now()
    old = InferenceRequest("old", 0, horizon=HorizonChoice("static", 4.0), obs_stamp=now - 2.0, max_obs_age_s=1.0)
    fresh = InferenceRequest("fresh", 0, horizon=HorizonChoice("static", 4.0), obs_stamp=now - 2.0, max_obs_age_s=30.0)
    f_old, f_fresh = s.submit(old), s.submit(fresh)
    eng.open.set()
    busy.result(10)
    assert code_of(f_old) == "stale_observation" and "over its maximum 1 s" in str(f_old.exception())
    assert f_fresh.result(10).task_id == "fresh"  # its batch-mate is served
    assert ["fresh"] in eng.batches and not any("old" in b for b in eng.batches)  # never generated
    assert fleet.core_stats()["errors"]["stale_observation"] == 1
    again = InferenceRequest("old", 0, horizon=HorizonChoice("static", 4.0), obs_stamp=fleet.clock.now(),
                             max_obs_age_s=1.0)
    assert s.submit(again).result(10).task_id == "old"  # the round sent again with a fresh observation


def test_a_batch_whose_every_observation_is_too_old_runs_nothing_and_the_slot_goes_on(fleet_of):
    fleet, eng = fleet_of()
    eng.open.set()
    s = fleet.session("ros", "/r1")
    stale = InferenceRequest("a", 0, horizon=HorizonChoice("static", 4.0), obs_stamp=fleet.clock.now() - 5.0,
                             max_obs_age_s=0.5)
    assert code_of(s.submit(stale)) == "stale_observation" and eng.batches == []
    assert s.submit(req("b")).result(10).task_id == "b"
    assert fleet.batches_by_protocols() == {"ros": 1}


def test_the_expected_wait_grows_with_the_queue_at_the_tiers_rate(fleet_of):
    fleet, eng = fleet_of()  # Gate: batch 8 in 2 ms -> 4000 rounds/s
    s = fleet.session("ros")
    assert fleet.expected_wait_s() == pytest.approx(0.002)  # one batch
    busy = s.submit(req("x"))
    assert wait_for(lambda: fleet.generating("x"), 10.0)
    for k in range(8):
        s.submit(req(f"q{k}"))
    assert fleet.expected_wait_s() == pytest.approx(8 / 4000 + 0.002)
    eng.open.set()
    busy.result(10)
