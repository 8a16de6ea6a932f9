"""core.ServingCore: request validation, superseding, requeue after failures, dropped tasks,
deadlines and stale-observation refresh (seed 000 Algorithm 1 lines 20-25; docs/architecture.md: "Bad
input gets a clear error back to its sender, is counted, and never stops the server or loses
another robot's work")."""
from __future__ import annotations

import math

import pytest

from robotserve_ros.core import (
    EngineProfile,
    ExecInfo,
    HorizonChoice,
    InferenceRequest,
    RequestError,
    ServingCore,
    Tier,
    VirtualClock,
    make_scheduler,
)
from robotserve_ros.core.observation import BadObservation
from robotserve_ros.core.errors import (
    RoundInFlight,
    BadExecInfo,
    BadPolicyParam,
    DuplicateRequest,
    RoundOutOfOrder,
    UnknownPolicy,
    UnknownTask,
)

NAN = float("nan")


def serve_round(core, clock, chunk, t_done):
    """Dispatch one batch, let it generate until t_done, complete it; returns the replies."""
    (d,) = core.dispatch()
    clock.advance_to(t_done)
    return core.complete(d, [chunk(4) for _ in d.requests])


@pytest.fixture
def busy_core(make_core, chunk):
    """Task 'a' has been served round 0 and has round 1 queued; task 'good' has round 0 queued."""
    core, clock = make_core("fifo", max_batch=1)
    core.submit(InferenceRequest("a", 0))
    serve_round(core, clock, chunk, 1.0)
    clock.advance_to(1.5)
    core.submit(InferenceRequest("a", 1, ExecInfo(1.0, 4, 8.0)))
    core.submit(InferenceRequest("good", 0))
    return core, clock


BAD_REQUESTS = [
    ("unknown task", InferenceRequest("ghost", 5), UnknownTask),
    ("round goes back", InferenceRequest("a", 0), RoundOutOfOrder),
    ("negative round", InferenceRequest("b", -1), RoundOutOfOrder),
    ("non-integer round", InferenceRequest("a", 2.0), RoundOutOfOrder),
    ("NaN exec start", InferenceRequest("a", 2, ExecInfo(NAN, 4, 8.0)), BadExecInfo),
    ("negative actions left", InferenceRequest("a", 2, ExecInfo(1.0, -1, 8.0)), BadExecInfo),
    ("zero control rate", InferenceRequest("a", 2, ExecInfo(1.0, 4, 0.0)), BadExecInfo),
    ("NaN control rate", InferenceRequest("a", 2, ExecInfo(1.0, 4, NAN)), BadExecInfo),
    ("unknown horizon policy", InferenceRequest("a", 2, ExecInfo(1.0, 4, 8.0), HorizonChoice("psychic")), UnknownPolicy),
    ("bad static H", InferenceRequest("a", 2, ExecInfo(1.0, 4, 8.0), HorizonChoice("static", 0.5)), BadPolicyParam),
    ("bad confidence t", InferenceRequest("a", 2, ExecInfo(1.0, 4, 8.0), HorizonChoice("confidence", -1.0)), BadPolicyParam),
    ("empty task id", InferenceRequest("", 0), RequestError),
    ("later round without exec info", InferenceRequest("a", 2), BadExecInfo),
    ("NaN observation stamp", InferenceRequest("a", 2, ExecInfo(1.0, 4, 8.0), obs_stamp=NAN), BadObservation),
]


@pytest.mark.parametrize("label,req,error", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_is_refused_counted_and_harmless(busy_core, chunk, label, req, error):
    core, clock = busy_core
    before = dict(core.pending)
    rounds_before = core.ledger.tasks["a"].round_ids[:]
    with pytest.raises(error) as exc:
        core.submit(req)
    assert type(exc.value) is error
    assert exc.value.message
    assert core.stats.errors == {error.code: 1}
    assert core.stats.submitted == 3  # only the three good ones
    assert core.pending == before  # the same PendingRequest objects, untouched
    assert core.ledger.tasks["a"].round_ids == rounds_before
    assert "ghost" not in core.ledger.tasks and "" not in core.ledger.tasks
    # Everyone else's work still goes through.
    served = [r.task_id for r in serve_round(core, clock, chunk, 3.0)]
    served += [r.task_id for r in serve_round(core, clock, chunk, 4.0)]
    assert served == ["a", "good"]
    assert not core.pending


def test_errors_are_counted_by_code(busy_core):
    core, _ = busy_core
    for req in (InferenceRequest("ghost", 5), InferenceRequest("ghost", 3), InferenceRequest("a", 0)):
        with pytest.raises(RequestError):
            core.submit(req)
    assert core.stats.errors == {"unknown_task": 2, "round_out_of_order": 1}


def test_finished_task_cannot_submit_again(make_core, chunk):
    core, clock = make_core("fifo")
    core.submit(InferenceRequest("a", 0))
    serve_round(core, clock, chunk, 1.0)
    rec = core.finish_task("a", ExecInfo(1.0, 0, 8.0))
    assert rec.finished_at == 1.0
    with pytest.raises(UnknownTask):
        core.submit(InferenceRequest("a", 1))
    with pytest.raises(UnknownTask):
        core.finish_task("never-seen")


def test_superseding_a_pending_round(make_core, chunk):
    """The robot moved on: round 2 replaces its still-queued round 1, and queues behind requests
    that arrived in between (it is a new arrival)."""
    core, clock = make_core("fifo", max_batch=1)
    core.submit(InferenceRequest("a", 0))
    serve_round(core, clock, chunk, 1.0)
    core.submit(InferenceRequest("a", 1, ExecInfo(1.0, 8, 8.0)))
    core.submit(InferenceRequest("b", 0))
    clock.advance_to(1.5)
    core.submit(InferenceRequest("a", 2, ExecInfo(1.0, 4, 8.0)))
    assert core.stats.superseded == 1
    assert core.pending["a"].request.round_id == 2
    rec = core.ledger.tasks["a"]
    assert rec.round_ids == [0, 2]
    assert rec.rounds == 2
    assert (rec.execs[0].start, rec.execs[0].end) == (1.0, 2.0)  # from the newer request's info
    replies = serve_round(core, clock, chunk, 2.5) + serve_round(core, clock, chunk, 3.5)
    assert [(r.task_id, r.round_id) for r in replies] == [("b", 0), ("a", 2)]


def test_requeue_puts_the_batch_back_none_lost_none_twice(make_core, chunk):
    core, clock = make_core("fifo", batch_latency_ms={1: 1000.0, 4: 1000.0}, max_batch=3)
    for tid in ("a", "b", "c", "d"):
        core.submit(InferenceRequest(tid, 0))
    clock.advance_to(0.5)
    (d,) = core.dispatch()
    assert [p.task_id for p in d.requests] == ["a", "b", "c"]
    assert core.ledger.total_wait("a", 0.5) == 0.5
    clock.advance_to(1.0)
    assert core.requeue(d.id) == 3
    assert core.stats.requeued == 3
    assert not core.inflight
    assert core.tiers[0].busy == 0
    assert sorted(core.pending) == ["a", "b", "c", "d"]
    # The failed attempt does not count as served: the initial wait is open again.
    assert core.ledger.total_wait("a", 2.0) == 2.0
    assert core.ledger.tasks["a"].attained == 0.0
    clock.advance_to(2.0)
    (d2,) = core.dispatch()
    assert [p.task_id for p in d2.requests] == ["a", "b", "c"]  # original order kept
    clock.advance_to(3.0)
    replies = core.complete(d2, [chunk(4)] * 3)
    assert [(r.task_id, r.round_id) for r in replies] == [("a", 0), ("b", 0), ("c", 0)]
    assert core.stats.completed == 3
    assert core.ledger.tasks["a"].closed_wait == 2.0
    assert sorted(core.pending) == ["d"]
    with pytest.raises(KeyError):
        core.requeue(d.id)  # a dispatch can be requeued once


def test_requeue_skips_dropped_requests_and_refuses_a_round_while_one_generates(make_core, chunk):
    """A robot cannot use two chunks at once: a new round while its last one is generating is
    refused (round_in_flight), so a failed batch always goes back whole, minus dropped tasks."""
    core, clock = make_core("fifo", batch_latency_ms={1: 1000.0, 4: 1000.0}, max_batch=3)
    for tid in ("a", "b", "c"):
        core.submit(InferenceRequest(tid, 0))
    (d,) = core.dispatch()
    assert core.cancel("b")
    clock.advance_to(0.5)
    with pytest.raises(RoundInFlight):
        core.submit(InferenceRequest("c", 1, ExecInfo(0.0, 0, 8.0)))
    assert core.stats.errors["round_in_flight"] == 1
    assert core.requeue(d.id) == 2
    assert sorted(core.pending) == ["a", "c"]
    assert core.pending["c"].request.round_id == 0


def test_cancel_drops_replies_in_flight(make_core, chunk):
    core, clock = make_core("fifo", batch_latency_ms={1: 1000.0, 2: 1000.0}, max_batch=2)
    core.submit(InferenceRequest("a", 0))
    core.submit(InferenceRequest("b", 0))
    core.submit(InferenceRequest("c", 0))
    (d,) = core.dispatch()
    assert core.cancel("a")
    assert core.cancel("c")  # a queued request goes too
    assert not core.cancel("a")
    assert not core.pending
    clock.advance_to(1.0)
    replies = core.complete(d, [chunk(4), chunk(4)])
    assert [r.task_id for r in replies] == ["b"]
    assert core.stats.dropped_replies == 1
    assert core.stats.completed == 1
    assert "a" not in core.ledger.tasks


def test_reply_is_trimmed_by_the_horizon(make_core, chunk):
    core, clock = make_core("fifo", horizon_params={"static": {"h": 3}})
    core.submit(InferenceRequest("a", 0))
    (d,) = core.dispatch()
    clock.advance_to(1.0)
    (r,) = core.complete(d, [chunk(10)])
    assert (r.horizon, r.chunk_len, r.actions.shape, r.tier, r.generated_at) == (3, 10, (3, 2), "edge", 1.0)


def test_deadline_derivation(make_core):
    """EDF's deadline: the client's, else the end of the running execution, else now (idle)."""
    core, clock = make_core("edf")
    clock.advance_to(2.0)
    assert core.submit(InferenceRequest("a", 0)).deadline == 2.0
    assert core.submit(InferenceRequest("b", 0, deadline=7.5)).deadline == 7.5
    assert core.submit(InferenceRequest("c", 0, ExecInfo(1.0, 8, 8.0))).deadline == 3.0
    assert core.submit(InferenceRequest("d", 0, ExecInfo(1.0, 8, 8.0), deadline=NAN)).deadline == 3.0


def test_stale_observation_is_refreshed_before_dispatch(chunk):
    """Algorithm 1 lines 20-21: a request whose observation grew stale while queued is refreshed."""
    calls = []

    def refresher(reqs):
        calls.append([r.task_id for r in reqs])  # one call for the whole batch
        return [None if r.task_id == "offline" else (f"fresh-{r.task_id}", 2.9) for r in reqs]

    clock = VirtualClock()
    tier = Tier("edge", EngineProfile({1: 1000.0, 4: 1000.0}), max_batch=4)
    core = ServingCore(make_scheduler("fifo"), [tier], clock, refresher=refresher, stale_obs_s=0.5)
    core.submit(InferenceRequest("stale", 0, observation="old", obs_stamp=0.0))
    core.submit(InferenceRequest("fresh", 0, observation="new", obs_stamp=2.8))
    core.submit(InferenceRequest("offline", 0, observation="old", obs_stamp=1.0))
    core.submit(InferenceRequest("no-stamp", 0, observation="x"))
    clock.advance_to(3.0)
    (d,) = core.dispatch()
    assert not calls  # dispatch itself never waits on a robot
    core.refresh_stale(d)
    obs = {p.task_id: p.request.observation for p in d.requests}
    assert obs == {"stale": "fresh-stale", "fresh": "new", "offline": "old", "no-stamp": "x"}
    assert calls == [["stale", "offline"]]
    assert core.stats.refreshes == 1
    assert core.stats.refresh_failures == 1
    assert core.stats.obs_age_n == 3
    assert core.stats.obs_age_max == pytest.approx(2.0)  # the offline robot's observation
    assert core.stats.obs_age_sum == pytest.approx(0.1 + 0.2 + 2.0)


def test_refresh_gate_closes_while_robots_do_not_answer_and_probes_to_reopen(chunk):
    """Algorithm 1 line 20 under overload: when recent refreshes fail, a dispatch goes with the
    observation it has instead of waiting a refresh timeout per batch (counted); every
    probe_every-th batch still asks, and answers reopen the gate."""
    answering = {"on": False}
    calls = []

    def refresher(reqs):
        calls.append(len(reqs))
        return [("fresh", 100.0) if answering["on"] else None for _ in reqs]

    clock = VirtualClock()
    tier = Tier("edge", EngineProfile({1: 10.0}), max_batch=1)
    core = ServingCore(make_scheduler("fifo"), [tier], clock, refresher=refresher, stale_obs_s=0.5)

    def one_round(k):
        core.submit(InferenceRequest(f"t{k}", 0, observation="old", obs_stamp=0.0))
        clock.advance_to(clock.now() + 1.0)
        (d,) = core.dispatch()
        core.refresh_stale(d)
        core.requeue(d.id)
        core.cancel(f"t{k}")

    for k in range(40):
        one_round(k)
    asked_while_failing = len(calls)
    assert core.refresh_gate.success < core.refresh_gate.floor
    assert core.stats.refresh_skipped > 0
    assert core.stats.refresh_skipped + asked_while_failing == 40  # every stale batch asked or counted as skipped
    assert asked_while_failing < 40  # the engine stopped waiting on silent robots
    answering["on"] = True
    for k in range(40, 80):
        one_round(k)
    assert core.refresh_gate.open()
    assert core.stats.refreshes > 0


def test_serving_core_needs_a_tier():
    with pytest.raises(ValueError):
        ServingCore(make_scheduler("fifo"), [], VirtualClock())


# --- faults that once lost work -------------------------------------------------------------


@pytest.mark.parametrize("actions_left", [NAN, math.inf])
def test_non_finite_actions_left_is_refused(make_core, chunk, actions_left):
    core, clock = make_core("kairos")
    core.submit(InferenceRequest("a", 0))
    serve_round(core, clock, chunk, 1.0)
    with pytest.raises(BadExecInfo):
        core.submit(InferenceRequest("a", 1, ExecInfo(1.0, actions_left, 8.0)))


def test_engine_result_count_mismatch_loses_no_request(make_core, chunk):
    core, clock = make_core("fifo", batch_latency_ms={1: 1000.0, 2: 1000.0}, max_batch=2)
    core.submit(InferenceRequest("a", 0))
    core.submit(InferenceRequest("b", 0))
    (d,) = core.dispatch()
    clock.advance_to(1.0)
    with pytest.raises(ValueError, match="requeued"):
        core.complete(d, [chunk(4)])  # engine fault: one result for two requests
    assert sorted(core.pending) == ["a", "b"]  # both back in the queue, none lost
    assert not core.inflight and core.tiers[0].busy == 0
    assert core.stats.requeued == 2


def test_task_restarted_under_same_id_does_not_get_stale_reply(make_core, chunk):
    core, clock = make_core("fifo", batch_latency_ms={1: 1000.0, 2: 1000.0}, max_batch=2)
    core.submit(InferenceRequest("a", 0))
    core.submit(InferenceRequest("b", 0))
    (d,) = core.dispatch()
    core.cancel("a")
    clock.advance_to(0.5)
    core.submit(InferenceRequest("a", 0))  # the robot starts its task again
    clock.advance_to(1.0)
    replies = core.complete(d, [chunk(4), chunk(4)])
    assert [r.task_id for r in replies] == ["b"]  # the old round's chunk is dropped
    assert core.stats.dropped_replies == 1
    assert core.pending["a"].request.round_id == 0
    assert core.ledger.tasks["a"].gens == [None]


# --- a re-sent round (issue: no lost rounds) ---------------------------------------------------


def test_resent_round_while_queued_attaches_to_it(busy_core, chunk):
    """Task 'a' round 1 is queued; asking again returns the same request: one engine run."""
    core, clock = busy_core
    queued = core.pending["a"]
    again = core.submit(InferenceRequest("a", 1, ExecInfo(1.0, 4, 8.0)))
    assert again is queued and core.stats.resent_requests == 1 and core.stats.submitted == 3
    replies = serve_round(core, clock, chunk, 3.0) + serve_round(core, clock, chunk, 4.0)
    assert sorted((r.task_id, r.round_id) for r in replies) == [("a", 1), ("good", 0)]
    assert core.stats.dispatched == 3  # a0, a1, good0: nothing ran twice


def test_resent_round_while_generating_attaches_to_the_batch(make_core, chunk):
    core, clock = make_core("fifo")
    core.submit(InferenceRequest("a", 0))
    (d,) = core.dispatch()
    again = core.submit(InferenceRequest("a", 0))
    assert again is d.requests[0] and core.stats.resent_requests == 1 and not core.pending
    clock.advance_to(1.0)
    assert [(r.task_id, r.round_id) for r in core.complete(d, [chunk(4)])] == [("a", 0)]
    assert core.dispatch() == []


def test_resent_round_after_its_reply_is_replayed_from_the_cache(make_core, chunk):
    """A reply lost on the way (an RMW drop): the robot asks again, gets the same chunk,
    and the engine is not asked; the cache holds one reply per task and goes with the task."""
    core, clock = make_core("fifo")
    core.submit(InferenceRequest("a", 0))
    (first,) = serve_round(core, clock, chunk, 1.0)
    p = core.submit(InferenceRequest("a", 0))
    assert p.replay is first and core.stats.replies_replayed == 1
    assert core.dispatch() == [] and not core.pending
    core.submit(InferenceRequest("a", 1, ExecInfo(1.0, 2, 8.0)))  # the next round goes on as usual
    (second,) = serve_round(core, clock, chunk, 2.0)
    with pytest.raises(RoundOutOfOrder):  # only the latest round can be asked again
        core.submit(InferenceRequest("a", 0))
    assert core.submit(InferenceRequest("a", 1)).replay is second
    core.cancel("a")
    assert "a" not in core.last_reply


def test_resent_round_whose_reply_is_gone_is_refused(make_core, chunk):
    core, clock = make_core("fifo")
    core.submit(InferenceRequest("a", 0))
    serve_round(core, clock, chunk, 1.0)
    del core.last_reply["a"]
    with pytest.raises(DuplicateRequest, match="reply is gone"):
        core.submit(InferenceRequest("a", 0))


def test_a_broken_refresher_costs_freshness_never_the_round(chunk):
    """A refresher that answers the wrong number of observations: the batch keeps what it
    has (counted as failed refreshes) and is served."""
    clock = VirtualClock()
    tier = Tier("edge", EngineProfile({1: 10.0, 4: 10.0}), max_batch=4)
    core = ServingCore(make_scheduler("fifo"), [tier], clock, refresher=lambda reqs: [], stale_obs_s=0.5)
    for t in ("a", "b"):
        core.submit(InferenceRequest(t, 0, observation="old", obs_stamp=0.0))
    clock.advance_to(2.0)
    (d,) = core.dispatch()
    core.refresh_stale(d)
    assert [p.request.observation for p in d.requests] == ["old", "old"] and core.stats.refresh_failures == 2
    assert len(core.complete(d, [chunk(4), chunk(4)])) == 2
