"""Seed 000 §3.2.2: "after every A skipped rounds, the request is promoted by one bucket,
guaranteeing progress regardless of its current wait ratio", and the (1 + skipped) aging of the
execution estimate keeps generation-dominated requests from starving inside the top bucket.

Property: with a batch limit of 1 and every task asking again as soon as it is served, no request
is passed over more than a bound that follows from kairos.py alone.
"""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robotserve_ros.core import ExecInfo, InferenceRequest

HZ = 8.0  # control rate; with LATENCY_S = 1/8 every time and execution length is exact in binary
LATENCY_MS = 125.0
LATENCY_S = LATENCY_MS / 1000.0
ROUNDS = 300


def kairos_skip_bound(n: int, aging: int, buckets: int, e_max: float, min_exec: float) -> int:
    """Most dispatch rounds one Kairos request can be passed over (batch limit 1, n tasks).

    From kairos.py: bucket = min(B-1, floor(B * wait_ratio) + skipped // A) and, inside a bucket,
    larger est = max(|E_last|, min_exec) * (1 + skipped) first, ties by arrival seq.
    1. bucket >= skipped // A, so after S0 = A * (B - 1) skips a request p is in the top bucket; a
       request dispatched instead of p must then be in the top bucket with est_r >= est_p.
    2. est_p >= min_exec * (1 + s_p) and est_r <= E_max * (1 + s_r), so r beats p only if
       1 + s_r >= (1 + s_p) * min_exec / E_max.
    3. Once s_p >= S1 = ceil(n * E_max / min_exec) - 1, that needs s_r >= n - 1. A task served at
       round e asks again right after, so at round e' its new request has skipped e' - e - 1
       rounds: it can win again only if e' - e >= n. Hence in any n consecutive rounds that skip
       p (all past max(S0, S1)), each of the other n - 1 tasks wins at most once: n - 1 winners
       for n rounds is impossible, so p is passed over at most n - 1 more times.
    Bound: max(A * (B - 1), ceil(n * E_max / min_exec) - 1) + n - 1.
    """
    s0 = aging * (buckets - 1)
    s1 = math.ceil(n * e_max / min_exec) - 1
    return max(s0, s1) + n - 1


def run_closed_loop(make_core, chunk, scheduler, execs, arrivals, **params):
    """Each task joins at dispatch round arrivals[i]; whenever it is served it asks again right
    away, reporting its next execution of execs[i][k % len] actions (at HZ) as still to run.
    Returns the largest number of dispatch rounds any request was passed over."""
    core, clock = make_core(scheduler, batch_latency_ms={1: LATENCY_MS}, max_batch=1, **params)
    n = len(execs)
    skipped, next_round = {}, {}
    worst = 0
    t = 0.0
    for rnd in range(ROUNDS):
        for i in range(n):
            if arrivals[i] == rnd:
                tid = f"t{i}"
                core.submit(InferenceRequest(tid, 0))
                skipped[tid], next_round[tid] = 0, 1
        if not core.pending:
            continue
        (d,) = core.dispatch()
        (p,) = d.requests
        winner = p.task_id
        for tid in core.pending:
            skipped[tid] += 1
        worst = max(worst, skipped[winner])
        skipped[winner] = 0
        t += LATENCY_S
        clock.advance_to(t)
        (reply,) = core.complete(d, [chunk(4)])
        assert reply.task_id == winner
        i, k = int(winner[1:]), next_round[winner]
        actions = execs[i][k % len(execs[i])]
        core.submit(InferenceRequest(winner, k, ExecInfo(exec_start=t, actions_left=actions, control_hz=HZ)))
        next_round[winner] = k + 1
    # requests still queued at the end count too
    return max([worst] + [skipped[tid] for tid in core.pending])


fleets = st.integers(min_value=2, max_value=8).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.integers(0, 16), min_size=1, max_size=4), min_size=n, max_size=n),
        st.lists(st.sampled_from([0, 0, 0, 1, 2, 5, 17, 40]), min_size=n, max_size=n),
    )
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fleet=fleets,
    aging=st.integers(1, 4),
    buckets=st.integers(1, 10),
    min_exec=st.sampled_from([1 / 32, 1 / 16, 1 / 8, 1 / 4]),
)
def test_kairos_never_starves_a_request(make_core, chunk, fleet, aging, buckets, min_exec):
    execs, arrivals = fleet
    n = len(execs)
    e_max = max(min_exec, max(a for e in execs for a in e) / HZ)
    worst = run_closed_loop(
        make_core, chunk, "kairos", execs, arrivals, buckets=buckets, aging=aging, min_exec_estimate_s=min_exec
    )
    assert worst <= kairos_skip_bound(n, aging, buckets, e_max, min_exec)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=fleets)
def test_fifo_passes_a_request_over_at_most_n_minus_1_times(make_core, chunk, fleet):
    """FIFO: only requests that arrived earlier go first, and there is one per other task."""
    execs, arrivals = fleet
    assert run_closed_loop(make_core, chunk, "fifo", execs, arrivals) <= len(execs) - 1


def test_generation_dominated_task_is_served_despite_long_execution_competitors(make_core, chunk):
    """A concrete instance of the starvation the aging factor prevents: one task reports no
    execution (estimate = min_exec), three report 2 s executions. Without the (1 + skipped)
    factor the short task would lose every within-bucket comparison once all share the top
    bucket; with it, it is served within the bound."""
    execs = [[0], [16], [16], [16]]
    worst = run_closed_loop(make_core, chunk, "kairos", execs, [0, 0, 0, 0], aging=1, buckets=2)
    bound = kairos_skip_bound(4, 1, 2, 16 / HZ, 1 / 30)
    assert worst <= bound


def remaining_skip_bound(n: int, aging: int, buckets: int, e_max: float) -> int:
    """Most dispatch rounds one `remaining` request can be passed over (batch limit 1, n tasks).

    From remaining.py: bucket = min(B-1, floor(B * wait_ratio) + skipped // A) and, inside a
    bucket, smaller key = est - skipped / A first, with 1 <= est <= E_max.
    1. After S0 = A * (B - 1) skips p is in the top bucket; a winner r must be there too with
       key_r <= key_p, so s_r / A >= est_r - est_p + s_p / A >= 1 - E_max + s_p / A.
    2. Once s_p >= S1 = ceil(A * (E_max - 1)) + n - 1, a winner needs s_r >= n - 1, and (as for
       Kairos above) each other task can then win at most once in n consecutive rounds.
    Bound: max(S0, S1) + n - 1.
    """
    return max(aging * (buckets - 1), math.ceil(aging * (e_max - 1)) + n - 1) + n - 1


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fleet=fleets,
    aging=st.integers(1, 4),
    buckets=st.integers(1, 4),
    finished=st.lists(st.integers(1, 60), max_size=6),
)
def test_remaining_never_starves_a_request(make_core, chunk, fleet, aging, buckets, finished):
    """Learned lengths of finished tasks (`finished`) shape the estimates; none may starve."""
    execs, arrivals = fleet
    n = len(execs)
    state = {}

    def core_with_history(*a, **kw):
        core, clock = make_core(*a, **kw)
        for r in finished:
            core.scheduler.task_finished(type("Rec", (), {"rounds": r})(), None)
        state["s"] = core.scheduler
        return core, clock

    worst = run_closed_loop(core_with_history, chunk, "remaining", execs, arrivals, buckets=buckets, aging=aging,
                            unknown_rounds=50.0)
    s = state["s"]
    e_max = max(s.expected_remaining(None, k) for k in range(ROUNDS + 1))
    assert worst <= remaining_skip_bound(n, aging, buckets, e_max)
