"""Seed 000 §2.3, Figure 5: execution-unaware schedulers (FIFO, fairness / Autellix) starve a
task with short executions behind tasks with long executions; the execution-aware scheduler
(Kairos, Algorithm 1) serves it first and the fleet waits less in total.

The serving loop is core.ServingCore on a core.VirtualClock, driven by a tiny event loop here:
the engine is "1.0 time unit later, call complete()", and every robot runs SYNCHRONOUS
inference (it asks for its next chunk only when the running chunk's execution has finished).
"""
from __future__ import annotations

import heapq
import itertools

import pytest

from robotserve_ros.core import ExecInfo, InferenceRequest

GEN = 1.0  # generation time of one request at batch 1 (EngineProfile({1: 1000.0}))
HZ = 4.0  # control rate; only ExecInfo needs it (actions_left=0 in synchronous mode)

# Execution time of each round, in the same time units as GEN; arrival of each task's first request.
TASKS = {
    "T1": [1.5, 1.5, 1.5],  # long executions, three rounds
    "T2": [0.25, 0.25],  # the short-execution task the paper's figure is about
    "T3": [2.0],
    "T4": [2.0, 2.0],
}
ARRIVALS = {"T1": 0.0, "T4": 0.75, "T2": 2.25, "T3": 2.75}


def run_synchronous(make_core, chunk, scheduler: str):
    """Run TASKS through ServingCore; returns (dispatch log, per-task waits, per-task idle, task end).

    Events at the same instant are all applied (completions, then requests, in the order they were
    scheduled) before the scheduler is asked for one batch; the engine runs one batch at a time.
    wait  = dispatch time - request time (queuing delay; "under synchronous inference, wait time
            equals queuing delay", §2.3), one entry per round, the first one being the initial wait.
    idle  = time the robot sat still before a chunk arrived: from its arrival (round 0) or from the
            end of its previous execution, to the chunk's arrival.
    """
    core, clock = make_core(scheduler, max_batch=1)
    seq = itertools.count()
    events = []  # (time, seq, kind, payload)
    for tid, t in ARRIVALS.items():
        heapq.heappush(events, (t, next(seq), "request", (tid, 0, None)))
    requested_at, log = {}, []
    waits = {tid: [] for tid in TASKS}
    idle = {tid: 0.0 for tid in TASKS}
    end = {}
    while events:
        now = events[0][0]
        clock.advance_to(now)
        while events and events[0][0] == now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == "request":
                tid, k, info = payload
                core.submit(InferenceRequest(tid, k, info))
                requested_at[tid] = now
            else:  # generation done: the robot gets its chunk and executes it at once
                for reply in core.complete(payload, [chunk(4)]):
                    tid, k = reply.task_id, reply.round_id
                    idle[tid] += now - requested_at[tid]
                    done = now + TASKS[tid][k]
                    if k + 1 < len(TASKS[tid]):
                        info = ExecInfo(exec_start=now, actions_left=0, control_hz=HZ)
                        heapq.heappush(events, (done, next(seq), "request", (tid, k + 1, info)))
                    else:
                        end[tid] = done
        for d in core.dispatch():
            assert len(d.requests) == 1
            p = d.requests[0]
            waits[p.task_id].append(now - requested_at[p.task_id])
            log.append((now, p.task_id, p.request.round_id))
            heapq.heappush(events, (now + GEN, next(seq), "done", d))
    assert not core.pending and not core.inflight
    return log, waits, idle, end


COMMON_PREFIX = [(0.0, "T1", 0), (1.0, "T4", 0), (2.25, "T2", 0)]

EXPECTED = {
    "fifo": dict(
        log=COMMON_PREFIX + [(3.25, "T1", 1), (4.25, "T3", 0), (5.25, "T2", 1), (6.25, "T4", 1), (7.25, "T1", 2)],
        waits={"T1": [0.0, 0.75, 1.5], "T2": [0.0, 1.75], "T3": [1.5], "T4": [0.25, 2.25]},
        total=8.0,
    ),
    "autellix": dict(
        log=COMMON_PREFIX + [(3.25, "T3", 0), (4.25, "T1", 1), (5.25, "T2", 1), (6.25, "T4", 1), (7.25, "T1", 2)],
        waits={"T1": [0.0, 1.75, 0.5], "T2": [0.0, 1.75], "T3": [0.5], "T4": [0.25, 2.25]},
        total=7.0,
    ),
    "kairos": dict(
        log=COMMON_PREFIX + [(3.25, "T3", 0), (4.25, "T2", 1), (5.25, "T1", 1), (6.25, "T4", 1), (7.75, "T1", 2)],
        waits={"T1": [0.0, 2.75, 0.0], "T2": [0.0, 0.75], "T3": [0.5], "T4": [0.25, 2.25]},
        total=6.5,
    ),
}


@pytest.mark.parametrize("scheduler", ["fifo", "autellix", "kairos"])
def test_fig5_hand_worked_timeline(make_core, chunk, scheduler):
    """Each scheduler's timeline, worked out by hand (generation = 1 unit, batch limit 1).

    Tasks (execution time per round; arrival): T1 [1.5, 1.5, 1.5] at 0; T4 [2, 2] at 0.75;
    T2 [0.25, 0.25] at 2.25; T3 [2] at 2.75. A robot requests round k+1 the moment round k's
    execution ends, with ExecInfo(exec_start=chunk arrival, actions_left=0).

    Common prefix (no contention yet):
      0     T1r0 arrives, engine idle -> dispatched (wait 0); ready 1, T1 executes 1-2.5.
      0.75  T4r0 arrives (engine busy).
      1     T4r0 dispatched (wait 0.25); ready 2, T4 executes 2-4.
      2.25  T2r0 arrives, engine idle -> dispatched (wait 0); ready 3.25, T2 executes 3.25-3.5.
      2.5   T1r1 requested.   2.75  T3r0 arrives.   3.5  T2r1 requested.   4  T4r1 requested.

    FIFO (request seq order):
      3.25  pending T1r1(2.5), T3r0(2.75) -> T1r1 (wait 0.75); ready 4.25, T1 executes 4.25-5.75.
      4.25  pending T3r0, T2r1(3.5), T4r1(4) -> T3r0 (wait 1.5); T3 executes 5.25-7.25, done.
      5.25  T2r1 (wait 1.75): T2 runs 6.25-6.5, done.       5.75  T1r2 requested.
      6.25  T4r1 (wait 2.25): T4 runs 7.25-9.25.            7.25  T1r2 (wait 1.5).
      Waits: T1 0+0.75+1.5, T2 0+1.75, T3 1.5, T4 0.25+2.25 -> total 8.0.

    Autellix (least attained generation time, ties by seq):
      3.25  T1 attained 1, T3 attained 0 -> T3r0 (wait 0.5); T3 executes 4.25-6.25.
      4.25  T1r1, T2r1, T4r1 all attained 1 -> seq -> T1r1 (wait 1.75); T1 runs 5.25-6.75.
      5.25  T2r1 (wait 1.75) - T2, the short task, is served last of the three again.
      6.25  T4r1 (wait 2.25).   6.75  T1r2 requested.   7.25  T1r2 (wait 0.5).
      Waits: T1 0+1.75+0.5, T2 0+1.75, T3 0.5, T4 0.25+2.25 -> total 7.0.

    Kairos (bucket = floor(10 x wait ratio) + skipped // 4, top bucket first; inside a bucket the
    longest max(|E_last|, 1/30) x (1 + skipped) first; nobody is skipped 4 times here):
      3.25  T1: W_0 is execution-dominated (|E_0| 1.5 > |G_0| 1), open since E_0 end 2.5:
              wr = 0.75 / 3.25 = 0.23 -> bucket 2.
            T3: first request, waiting its whole life: wr = 0.5 / 0.5 = 1 -> bucket 9 -> T3r0
              (wait 0.5); T3 executes 4.25-6.25.
      4.25  T1: wr = 1.75 / 4.25 = 0.41 -> bucket 4.
            T2: round 0 generation-dominated (|G_0| 1 >= |E_0| 0.25), so W_0 runs from G_0 end
              3.25: wr = 1.0 / (4.25 - 2.25) = 0.5 -> bucket 5.
            T4: initial wait 0.25 + open 0.25 since E_0 end 4: wr = 0.5 / 3.5 = 0.14 -> bucket 1.
            -> T2r1 (wait 0.75): the short-execution task is no longer starved; T2 done at 5.5.
      5.25  T1 wr = 2.75 / 5.25 = 0.52 (bucket 5) vs T4 wr = 1.5 / 4.5 = 0.33 (bucket 3)
            -> T1r1 (wait 2.75); T1 executes 6.25-7.75.
      6.25  T4r1 (wait 2.25).   7.75  T1r2 requested, engine idle since 7.25 -> wait 0.
      Waits: T1 0+2.75+0, T2 0+0.75, T3 0.5, T4 0.25+2.25 -> total 6.5.
    """
    log, waits, idle, end = run_synchronous(make_core, chunk, scheduler)
    exp = EXPECTED[scheduler]
    assert log == exp["log"]
    assert waits == exp["waits"]
    total = sum(sum(w) for w in waits.values())
    assert total == exp["total"]
    # The robot's idle time is its queuing delay plus the (unavoidable) generation of each round.
    rounds = sum(len(r) for r in TASKS.values())
    assert sum(idle.values()) == total + rounds * GEN


def test_fig5_execution_aware_waits_less(make_core, chunk):
    """The paper's claim on this example: execution-aware scheduling lowers the total wait below
    both FIFO and fairness, and Task 2 (short executions) finishes sooner than under either."""
    totals, t2_latency = {}, {}
    for s in ("fifo", "autellix", "kairos"):
        _, waits, _, end = run_synchronous(make_core, chunk, s)
        totals[s] = sum(sum(w) for w in waits.values())
        t2_latency[s] = end["T2"] - ARRIVALS["T2"]
    assert totals == {"fifo": 8.0, "autellix": 7.0, "kairos": 6.5}
    assert totals["kairos"] < totals["fifo"]
    assert totals["kairos"] < totals["autellix"]
    assert t2_latency == {"fifo": 4.25, "autellix": 4.25, "kairos": 3.25}
