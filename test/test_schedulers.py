"""Scheduler orderings on a hand-made ledger: FIFO, Autellix (least attained service), EDF, and
Kairos (seed 000 §3.2.2, Algorithm 1 phases 1-2: wait-ratio buckets, promotion every A skipped
rounds, longest estimated execution first with the (1 + skipped) aging factor)."""
from __future__ import annotations

import pytest

from robotserve_ros.core import (
    SCHEDULERS,
    InferenceRequest,
    PendingRequest,
    RequestError,
    SchedulingContext,
    TaskLedger,
    make_scheduler,
)

NOW = 10.0
SOON = 1.25


def pending(tid, seq, *, epoch=0, deadline=NOW, round_index=1):
    return PendingRequest(InferenceRequest(tid, round_index), arrival=0.0, seq=seq, epoch=epoch, deadline=deadline, round_index=round_index)


def order(scheduler, reqs, ledger, *, epoch=0, limit=None, now=NOW):
    return [p.task_id for p in scheduler.select(reqs, SchedulingContext(now, ledger, epoch), limit)]


def test_registry():
    assert {"fifo", "autellix", "kairos", "edf", "srpt", "remaining"} <= set(SCHEDULERS.names())
    with pytest.raises(KeyError):
        make_scheduler("round-robin-ish")
    for bad in (dict(buckets=0), dict(aging=0), dict(min_exec_estimate_s=0.0)):
        with pytest.raises(ValueError):
            make_scheduler("kairos", **bad)


@pytest.fixture
def three_tasks(seeded_round):
    """A: 0.5 s of generation so far, B: 2.0 s, C: 1.0 s. Requests in seq order B, C, A; client
    deadlines C 2.0 < B 3.0 < A 4.0."""
    L = TaskLedger()
    seeded_round(L, "A", t_start=0.0, dispatch=0.0, gen=0.5, exec_len=20.0)
    seeded_round(L, "B", t_start=0.0, dispatch=0.0, gen=2.0, exec_len=20.0)
    seeded_round(L, "C", t_start=0.0, dispatch=0.0, gen=1.0, exec_len=20.0)
    reqs = [pending("A", 2, deadline=4.0), pending("B", 0, deadline=3.0), pending("C", 1, deadline=2.0)]
    return L, reqs


def test_fifo_is_arrival_order(three_tasks):
    L, reqs = three_tasks
    assert order(make_scheduler("fifo"), reqs, L) == ["B", "C", "A"]
    assert order(make_scheduler("fifo"), reqs, L, limit=1) == ["B"]


def test_autellix_is_least_attained_service(three_tasks):
    L, reqs = three_tasks
    assert [L.tasks[t].attained for t in "ABC"] == [0.5, 2.0, 1.0]
    assert order(make_scheduler("autellix"), reqs, L) == ["A", "C", "B"]
    assert order(make_scheduler("autellix"), reqs, L, limit=2) == ["A", "C"]
    # ties in attained service go by arrival order
    L.tasks["A"].attained = 2.0
    assert order(make_scheduler("autellix"), reqs, L) == ["C", "B", "A"]


def test_edf_is_earliest_deadline(three_tasks):
    L, reqs = three_tasks
    assert order(make_scheduler("edf"), reqs, L) == ["C", "B", "A"]
    reqs[0].deadline = 2.0  # tie with C: arrival order (C seq 1 < A seq 2)
    assert order(make_scheduler("edf"), reqs, L) == ["C", "A", "B"]


@pytest.fixture
def kairos_ledger(seeded_round):
    """At NOW = 10, wait ratios X 0.35 (bucket 3), Y 0.55 (bucket 5); both robots still executing
    (no open wait). |E_last|: X 6 s, Y 40 s."""
    L = TaskLedger()
    seeded_round(L, "X", t_start=0.0, dispatch=3.5, gen=0.5, exec_len=6.0)  # E_0 = [4, 10]
    seeded_round(L, "Y", t_start=0.0, dispatch=5.5, gen=0.5, exec_len=40.0)  # E_0 = [6, 46]
    assert L.wait_ratio("X", NOW) == pytest.approx(0.35)
    assert L.wait_ratio("Y", NOW) == pytest.approx(0.55)
    assert (L.tasks["X"].last_exec_len, L.tasks["Y"].last_exec_len) == (6.0, 40.0)
    return L


def test_kairos_higher_wait_ratio_bucket_first(kairos_ledger):
    k = make_scheduler("kairos")
    reqs = [pending("X", 0, epoch=5), pending("Y", 1, epoch=5)]
    assert order(k, reqs, kairos_ledger, epoch=5) == ["Y", "X"]
    reqs = [pending("Y", 0, epoch=5), pending("X", 1, epoch=5)]
    assert order(k, reqs, kairos_ledger, epoch=5) == ["Y", "X"]  # not arrival order


@pytest.mark.parametrize(
    "x_skipped,first",
    [
        (0, "Y"),  # X bucket 3 vs Y bucket 5
        (1, "Y"),  # 3 + 1 // 2 = 3
        (2, "Y"),  # promoted once: bucket 4
        (3, "Y"),
        (4, "Y"),  # promoted twice: bucket 5 = Y's; estimate 6 x 5 = 30 < Y's 40 x 1
        (5, "Y"),  # 6 x 6 = 36 < 40
        (6, "X"),  # promoted three times: bucket 6 beats Y's 5
    ],
)
def test_kairos_promotes_one_bucket_every_a_skipped_rounds(kairos_ledger, x_skipped, first):
    """Aging A = 2: X climbs one bucket per two rounds it is passed over."""
    k = make_scheduler("kairos", aging=2)
    epoch = 10
    reqs = [pending("X", 0, epoch=epoch - x_skipped), pending("Y", 1, epoch=epoch)]
    assert order(k, reqs, kairos_ledger, epoch=epoch)[0] == first


def test_kairos_promotion_stops_at_the_top_bucket(kairos_ledger):
    """With B = 2 both are in the top bucket (1) after at most 2 skips; from then on only the
    estimate decides: X (6 s, skipped 1000) beats Y (40 s, fresh) by aging, but Y beats X when X
    is only a little older."""
    k = make_scheduler("kairos", buckets=2, aging=1)
    reqs = [pending("X", 0, epoch=0), pending("Y", 1, epoch=1000)]
    assert order(k, reqs, kairos_ledger, epoch=1000) == ["X", "Y"]
    reqs = [pending("X", 0, epoch=995), pending("Y", 1, epoch=999)]  # X 6 x 6 = 36 < Y 40 x 2
    assert order(k, reqs, kairos_ledger, epoch=1000) == ["Y", "X"]


@pytest.fixture
def same_bucket(seeded_round):
    """At SOON = 1.25: P, Q, R all with wait ratio 0 (bucket 0), served at once and their robots
    still executing; |E_last| 3 s, 1 s and 0 (R sent no execution info)."""
    L = TaskLedger()
    seeded_round(L, "P", t_start=0.0, dispatch=0.0, gen=0.5, exec_len=3.0)  # E_0 = [0.5, 3.5]
    seeded_round(L, "Q", t_start=0.0, dispatch=0.0, gen=0.5, exec_len=1.0)  # E_0 = [0.5, 1.5]
    L.open_task("R", 0.0)
    L.record_request("R", 0, 0.0, None)
    L.record_dispatch("R", 0, 0.0)
    L.record_complete("R", 0, 0.5)
    L.record_request("R", 1, 0.5, None)
    for t in "PQR":
        assert L.wait_ratio(t, SOON) == 0.0
    assert [L.tasks[t].last_exec_len for t in "PQR"] == [3.0, 1.0, 0.0]
    return L


def test_kairos_longest_estimated_execution_first_within_a_bucket(same_bucket):
    k = make_scheduler("kairos", min_exec_estimate_s=0.25)
    reqs = [pending("R", 0), pending("Q", 1), pending("P", 2)]
    assert order(k, reqs, same_bucket, now=SOON) == ["P", "Q", "R"]


def test_kairos_aging_factor_scales_the_estimate(same_bucket):
    """Q (1 s) skipped 3 rounds: 1 x 4 = 4 > P's 3 x 1. R has no execution on record: its
    estimate is the floor 0.25, and 0.25 x (1 + 15) = 4 > 3."""
    k = make_scheduler("kairos", min_exec_estimate_s=0.25, aging=1000)
    reqs = [pending("P", 0, epoch=20), pending("Q", 1, epoch=17)]
    assert order(k, reqs, same_bucket, epoch=20, now=SOON) == ["Q", "P"]
    reqs = [pending("P", 0, epoch=20), pending("R", 1, epoch=5)]
    assert order(k, reqs, same_bucket, epoch=20, now=SOON) == ["R", "P"]
    reqs = [pending("P", 0, epoch=20), pending("R", 1, epoch=10)]  # 0.25 x 11 < 3
    assert order(k, reqs, same_bucket, epoch=20, now=SOON) == ["P", "R"]


def test_kairos_ties_go_by_arrival(same_bucket):
    """Q skipped 2 (1 x 3 = 3) ties P fresh (3 x 1 = 3): the earlier arrival goes first."""
    k = make_scheduler("kairos", aging=1000)
    assert order(k, [pending("P", 5, epoch=20), pending("Q", 4, epoch=18)], same_bucket, epoch=20, now=SOON) == ["Q", "P"]
    assert order(k, [pending("P", 3, epoch=20), pending("Q", 4, epoch=18)], same_bucket, epoch=20, now=SOON) == ["P", "Q"]


def test_kairos_limit_returns_the_best_prefix(same_bucket):
    k = make_scheduler("kairos", min_exec_estimate_s=0.25)
    reqs = [pending("R", 0), pending("Q", 1), pending("P", 2)]
    assert order(k, reqs, same_bucket, limit=2, now=SOON) == ["P", "Q"]
    assert order(k, reqs, same_bucket, limit=10, now=SOON) == ["P", "Q", "R"]


def test_skipped_rounds_come_from_the_dispatch_epoch(make_core, chunk):
    """ServingCore counts a dispatch round for everyone left pending (Algorithm 1 lines 23-25)."""
    core, clock = make_core("fifo", max_batch=1)
    for tid in ("a", "b", "c"):
        core.submit(InferenceRequest(tid, 0))
    assert core.epoch == 0
    (d,) = core.dispatch()
    assert core.epoch == 1
    assert core.dispatch() == []  # engine busy: not a round, nobody skipped
    assert core.epoch == 1
    clock.advance_to(1.0)
    core.complete(d, [chunk(4)])
    core.dispatch()
    assert core.epoch == 2
    assert core.epoch - core.pending["c"].epoch == 2


def with_hint(p, rounds):
    p.request.remaining_rounds = rounds
    return p


def test_srpt_orders_by_the_remaining_rounds_hint():
    """Shortest remaining rounds first; no hint counts as `unknown_rounds`; ties by arrival."""
    L = TaskLedger()
    reqs = [with_hint(pending("A", 0), 7), with_hint(pending("B", 1), None), with_hint(pending("C", 2), 2),
            with_hint(pending("D", 3), 2)]
    assert order(make_scheduler("srpt"), reqs, L) == ["C", "D", "A", "B"]
    assert order(make_scheduler("srpt", unknown_rounds=5), reqs, L) == ["C", "D", "B", "A"]


def test_srpt_aging_takes_a_round_off_every_a_skipped_rounds():
    """A has 10 rounds left and arrived at epoch 0; B (7) and C (5) arrive at `now`. With A = 4,
    at epoch 16 A has skipped 16 rounds and counts as 10 - 4 = 6: it beats B, not C. At epoch 8
    it counts as 8 and still waits behind B."""
    L = TaskLedger()
    s = make_scheduler("srpt", aging=4)
    for now, expected in ((16, ["C", "A", "B"]), (8, ["C", "B", "A"])):
        reqs = [with_hint(pending("A", 0, epoch=0), 10), with_hint(pending("B", 1, epoch=now), 7),
                with_hint(pending("C", 2, epoch=now), 5)]
        assert order(s, reqs, L, epoch=now) == expected
    with pytest.raises(ValueError):
        make_scheduler("srpt", aging=0)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_a_bad_remaining_rounds_hint_is_refused(make_core, bad):
    core, _ = make_core("srpt")
    with pytest.raises(RequestError, match="remaining_rounds"):
        core.submit(InferenceRequest("a", 0, remaining_rounds=bad))
    assert core.stats.errors["bad_request"] == 1 and not core.pending


class _Rec:
    """What task_finished reads of a ledger record: its number of rounds."""

    def __init__(self, rounds):
        self.rounds = rounds


def typed(tid, seq, kind, round_index, *, epoch=0, hint=None):
    p = pending(tid, seq, epoch=epoch, round_index=round_index)
    p.request.task_type, p.request.remaining_rounds = kind, hint
    return p


def test_remaining_learns_per_type_and_ignores_the_client_hint():
    """Finished 'short' tasks ran 4-6 rounds, 'long' ones 40. At round 3 a short task expects
    mean(4, 5, 6) - 3 = 2 more, a long one at round 30 expects 10: short first, whatever the
    (wrong) remaining_rounds hints say and whatever the arrival order."""
    L = TaskLedger()
    for tid in "SLU":
        L.open_task(tid, 0.0)
    s = make_scheduler("remaining")
    for r in (4, 5, 6):
        s.task_finished(_Rec(r), "short")
    s.task_finished(_Rec(40), "long")
    assert s.expected_remaining("short", 3) == pytest.approx(2.0)
    assert s.expected_remaining("short", 4) == pytest.approx(1.5)  # only the 5 and 6 are still possible
    assert s.expected_remaining("long", 30) == pytest.approx(10.0)
    reqs = [typed("L", 0, "long", 30, hint=1), typed("S", 1, "short", 3, hint=99)]
    assert order(s, reqs, L) == ["S", "L"]
    # A type never seen falls back to every finished task: mean(4, 5, 6, 40) - 3 = 10.75 at round 3.
    assert s.expected_remaining("unseen", 3) == pytest.approx(10.75)
    # Past every finished length of its type a task counts as nearly done (one round), not last.
    assert s.expected_remaining("short", 9) == 1.0


def test_remaining_keeps_a_bounded_number_of_type_tables():
    """Clients name the types (the instruction): 50,000 finished tasks with distinct
    instructions must not grow the server. The type finished longest ago goes first; one that
    keeps finishing stays."""
    import tracemalloc

    s = make_scheduler("remaining", max_kinds=100)
    s.task_finished(_Rec(4), "pick the cube")
    tracemalloc.start()
    try:
        for i in range(50_000):
            s.task_finished(_Rec(5 + i % 7), f"instruction number {i}")
            if i % 50 == 0:  # within the last 100 types finished
                s.task_finished(_Rec(4), "pick the cube")  # a live type keeps its table
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(s._by_kind) == 100 and grown < 5 << 20, grown
    assert "pick the cube" in s._by_kind and "instruction number 0" not in s._by_kind
    assert s.expected_remaining("pick the cube", 2) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="max_kinds"):
        make_scheduler("remaining", max_kinds=0)


def test_remaining_without_any_finished_task_is_fifo():
    L = TaskLedger()
    for tid in "ABC":
        L.open_task(tid, 0.0)
    reqs = [typed("A", 2, "x", 1), typed("B", 0, "y", 50), typed("C", 1, None, 7)]
    assert order(make_scheduler("remaining"), reqs, L) == ["B", "C", "A"]


def test_remaining_aging_takes_a_round_off_every_a_skipped_rounds():
    """Type 'x' ran 20 rounds; A (round 2: 18 left) arrived at epoch 0, B (round 10: 10 left) now.
    With A = 2, after 18 skipped rounds A counts as 18 - 9 = 9 < 10 and goes first; after 14 it
    counts as 11 and still waits."""
    L = TaskLedger()
    for tid in "AB":
        L.open_task(tid, 0.0)
    s = make_scheduler("remaining", aging=2)
    s.task_finished(_Rec(20), "x")
    for now, expected in ((18, ["A", "B"]), (14, ["B", "A"])):
        reqs = [typed("A", 0, "x", 2, epoch=0), typed("B", 1, "x", 10, epoch=now)]
        assert order(s, reqs, L, epoch=now) == expected


def test_remaining_wait_ratio_buckets_and_ties(kairos_ledger):
    """Wait ratios X 0.35, Y 0.55. Equal estimates (nothing learned yet) go by the higher wait
    ratio, not arrival. With X's type short and Y's long, B = 1 puts the shorter X first; with
    B = 10 Kairos' phase 1 comes first and Y's higher bucket wins."""
    L = kairos_ledger
    reqs = [typed("X", 0, "short", 1), typed("Y", 1, "long", 1)]
    assert order(make_scheduler("remaining"), reqs, L) == ["Y", "X"]
    for buckets, first in ((1, "X"), (10, "Y")):
        s = make_scheduler("remaining", buckets=buckets)
        s.task_finished(_Rec(3), "short")
        s.task_finished(_Rec(30), "long")
        assert order(s, reqs, L)[0] == first
    for bad in (dict(buckets=0), dict(aging=0), dict(window=0), dict(unknown_rounds=0), dict(max_estimate_rounds=0.5)):
        with pytest.raises(ValueError):
            make_scheduler("remaining", **bad)


def test_finish_task_tells_the_scheduler_once_with_the_task_type(make_core, chunk):
    core, clock = make_core("remaining")
    seen = []
    core.scheduler.task_finished = lambda rec, kind: seen.append((rec.task_id, rec.rounds, kind))
    core.submit(InferenceRequest("a", 0, task_type="pick"))
    (d,) = core.dispatch()
    clock.advance_to(1.0)
    core.complete(d, [chunk(4)])
    core.finish_task("a")
    core.finish_task("a")  # a repeated final report
    core.submit(InferenceRequest("b", 0))  # no type: dropped, never finished, nothing learned
    core.cancel("b")
    assert seen == [("a", 1, "pick")]
