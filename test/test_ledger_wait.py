"""Seed 000 §3.2.1, Figure 8 and Eq. 1 on core.TaskLedger directly.

Round j has a generation interval G_j (dispatch -> chunk ready) and an execution interval E_j.
(a) execution-dominated round (|E_j| > |G_j|): W_j = E_{j+1}.start - E_j.end
(b) generation-dominated round (|G_j| >= |E_j|): W_j = G_{j+1}.start - G_j.end
(c) the ledger picks the dominant side per round.
wait ratio = sum W / (now - t_start); E_{i-1}.end = request time + actions_left / control_hz.
"""
from __future__ import annotations

import pytest

from robotserve_ros.core import ExecInfo, TaskLedger


def first_round_served(L: TaskLedger, tid: str, gen_end: float) -> None:
    """Task `tid` arrives at 0 and its round 0 is generated at once, ready at gen_end."""
    L.open_task(tid, 0.0)
    L.record_request(tid, 0, 0.0, None)
    L.record_dispatch(tid, 0, 0.0)
    L.record_complete(tid, 0, gen_end)


def test_exec_info_end_is_request_time_plus_actions_left_over_rate():
    info = ExecInfo(exec_start=1.0, actions_left=10, control_hz=4.0)
    assert info.end(3.0) == 3.0 + 10 / 4.0
    assert ExecInfo(0.0, 0, 30.0).end(7.25) == 7.25


def test_fig8a_execution_dominated_round_measures_on_execution_side():
    """G_0 = [0, 1]; E_0 = [1, 4] (3 s of actions); round 1 is requested at 3 with 10 actions left
    at 10 Hz (so E_0 ends 3 + 1 = 4), dispatched at 3.5 and ready at 4.5; E_1 starts at 4.5.
    W_0 = E_1.start - E_0.end = 0.5, not the generation-side gap G_1.start - G_0.end = 2.5."""
    L = TaskLedger()
    L.open_task("a", 0.0)
    assert L.record_request("a", 0, 0.0, None) == 0
    L.record_dispatch("a", 0, 0.0)
    L.record_complete("a", 0, 1.0)
    assert L.record_request("a", 1, 3.0, ExecInfo(exec_start=1.0, actions_left=10, control_hz=10.0)) == 1
    rec = L.tasks["a"]
    assert (rec.execs[0].start, rec.execs[0].end) == (1.0, 4.0)
    assert rec.last_exec_len == 3.0
    assert L.total_wait("a", 3.9) == 0.0  # robot still executing E_0: nothing to wait for yet
    L.record_dispatch("a", 1, 3.5)
    assert rec.waits == []  # E_1's start is not known yet
    assert L.total_wait("a", 4.25) == 0.25  # robot idle since E_0 ended at 4, chunk 1 not ready
    L.record_complete("a", 1, 4.5)
    # The open wait stops growing when chunk 1 is ready (E_1 can start then).
    assert L.total_wait("a", 5.0) == 0.5
    assert L.total_wait("a", 100.0) == 0.5
    assert L.wait_ratio("a", 5.0) == 0.5 / 5.0
    # Round 2's request reports E_1 = [4.5, 6 + 5/10]: W_0 closes on the execution side.
    L.record_request("a", 2, 6.0, ExecInfo(exec_start=4.5, actions_left=5, control_hz=10.0))
    assert rec.waits == [0.5]
    assert rec.closed_wait == 0.5
    assert (rec.execs[1].start, rec.execs[1].end) == (4.5, 6.5)
    # Round 2 is still queued: E_1 (2 s) dominates G_1 (1 s), so a new gap opens when E_1 ends at 6.5.
    assert L.wait_ratio("a", 6.5) == 0.5 / 6.5
    assert L.wait_ratio("a", 8.0) == (0.5 + 1.5) / 8.0


def test_fig8b_generation_dominated_round_measures_on_generation_side():
    """G_0 = [0, 1]; E_0 = [1, 1.5]; round 1 requested at 1.25 with 1 action left at 4 Hz (E_0 ends
    1.5); dispatched at 2.0. W_0 = G_1.start - G_0.end = 1.0, not E_1.start - E_0.end = 1.5."""
    L = TaskLedger()
    first_round_served(L, "b", 1.0)
    L.record_request("b", 1, 1.25, ExecInfo(exec_start=1.0, actions_left=1, control_hz=4.0))
    rec = L.tasks["b"]
    assert (rec.execs[0].start, rec.execs[0].end) == (1.0, 1.5)
    # Open (in-progress) wait of the pending request: counted from G_0's end.
    assert L.total_wait("b", 1.75) == 0.75
    assert L.wait_ratio("b", 1.75) == 0.75 / 1.75
    L.record_dispatch("b", 1, 2.0)
    assert rec.waits == [1.0]  # closed as soon as G_1 starts
    assert rec.closed_wait == 1.0
    L.record_complete("b", 1, 3.0)
    assert L.total_wait("b", 10.0) == 1.0
    assert L.wait_ratio("b", 4.0) == 1.0 / 4.0


def _mixed(count_initial_wait: bool) -> TaskLedger:
    """Four rounds at 4 Hz, generation 1.0 each; robot requests while still executing.

    r0: arrives 0, dispatched 0.5 (initial wait 0.5), G_0 = [0.5, 1.5]
        E_0 = [1.5, 2.0] (2 actions); r1 requested at 1.75 with 1 left -> generation-dominated
    r1: dispatched 2.5 -> W_0 = 2.5 - 1.5 = 1.0;  G_1 = [2.5, 3.5]
        E_1 = [3.5, 6.5] (12 actions); r2 requested at 5.5 with 4 left -> execution-dominated
    r2: dispatched 6.0, G_2 = [6.0, 7.0]; E_2 starts 7.0 -> W_1 = 7.0 - 6.5 = 0.5
        E_2 = [7.0, 7.25] (1 action); r3 requested at 7.0 with 1 left -> generation-dominated
    r3: dispatched 7.25 -> W_2 = 7.25 - 7.0 = 0.25;  G_3 = [7.25, 8.25]; finish at 9.25.
    """
    L = TaskLedger(count_initial_wait=count_initial_wait)
    L.open_task("c", 0.0)
    L.record_request("c", 0, 0.0, None)
    L.record_dispatch("c", 0, 0.5)
    L.record_complete("c", 0, 1.5)
    L.record_request("c", 1, 1.75, ExecInfo(1.5, 1, 4.0))
    L.record_dispatch("c", 1, 2.5)
    L.record_complete("c", 1, 3.5)
    L.record_request("c", 2, 5.5, ExecInfo(3.5, 4, 4.0))
    L.record_dispatch("c", 2, 6.0)
    L.record_complete("c", 2, 7.0)
    L.record_request("c", 3, 7.0, ExecInfo(7.0, 1, 4.0))
    L.record_dispatch("c", 3, 7.25)
    L.record_complete("c", 3, 8.25)
    L.record_finish("c", 9.25, ExecInfo(8.25, 0, 4.0))
    return L


def test_fig8c_mixed_rounds_pick_the_dominant_side_per_round():
    L = _mixed(count_initial_wait=True)
    rec = L.tasks["c"]
    assert rec.waits == [1.0, 0.5, 0.25]
    assert rec.closed_wait == 0.5 + 1.75  # initial wait + sum W_j
    assert [(e.start, e.end) for e in rec.execs] == [(1.5, 2.0), (3.5, 6.5), (7.0, 7.25), (8.25, 9.25)]
    assert rec.attained == 4.0
    assert rec.finished_at == 9.25
    assert L.wait_ratio("c", 9.25) == pytest.approx(2.25 / 9.25)
    assert L.total_wait("c", 20.0) == 2.25  # nothing open once the last round is done


def test_mixed_rounds_open_waits_along_the_way():
    """The in-progress wait the scheduler sees between events (O(1) per query)."""
    L = TaskLedger()
    L.open_task("c", 0.0)
    L.record_request("c", 0, 0.0, None)
    assert L.total_wait("c", 0.25) == 0.25  # initial wait, still open
    assert L.wait_ratio("c", 0.25) == 1.0  # waited its whole life so far
    L.record_dispatch("c", 0, 0.5)
    L.record_complete("c", 0, 1.5)
    L.record_request("c", 1, 1.75, ExecInfo(1.5, 1, 4.0))
    assert L.total_wait("c", 2.25) == 0.5 + 0.75  # gen-dominated gap open since G_0 end 1.5
    L.record_dispatch("c", 1, 2.5)
    L.record_complete("c", 1, 3.5)
    L.record_request("c", 2, 5.5, ExecInfo(3.5, 4, 4.0))
    L.record_dispatch("c", 2, 6.0)
    assert L.total_wait("c", 6.25) == 1.5  # E_1 still running until 6.5: nothing open
    assert L.total_wait("c", 6.75) == 1.5 + 0.25  # robot idle since 6.5
    L.record_complete("c", 2, 7.0)
    assert L.total_wait("c", 50.0) == 1.5 + 0.5  # capped when chunk 2 became ready


def test_count_initial_wait_false_starts_at_zero():
    """Algorithm 1 alone starts the sum at zero; Eq. 1's lifetime view counts the first queueing."""
    with_initial = _mixed(True).tasks["c"]
    without = _mixed(False).tasks["c"]
    assert with_initial.waits == without.waits == [1.0, 0.5, 0.25]
    assert without.closed_wait == 1.75
    assert with_initial.closed_wait == 2.25
    L = TaskLedger(count_initial_wait=False)
    L.open_task("d", 0.0)
    L.record_request("d", 0, 0.0, None)
    assert L.total_wait("d", 3.0) == 0.0
    assert L.wait_ratio("d", 3.0) == 0.0
    L2 = TaskLedger(count_initial_wait=True)
    L2.open_task("d", 0.0)
    L2.record_request("d", 0, 0.0, None)
    assert L2.total_wait("d", 3.0) == 3.0
    assert L2.wait_ratio("d", 3.0) == 1.0


def test_exec_start_before_chunk_ready_is_clamped():
    """A chunk cannot run before it exists: clock skew in exec_start is clamped to G_j's end."""
    L = TaskLedger()
    first_round_served(L, "e", 1.0)
    L.record_request("e", 1, 2.0, ExecInfo(exec_start=0.5, actions_left=4, control_hz=4.0))
    e0 = L.tasks["e"].execs[0]
    assert (e0.start, e0.end) == (1.0, 3.0)
    assert L.tasks["e"].last_exec_len == 2.0


def test_requeue_after_generation_dominated_round_keeps_counting_the_wait():
    """G_0 = [0, 1], E_0 = [1, 1.25] (generation-dominated). Round 1 is dispatched at 2.0 (W_0 closes
    at 1.0), the batch fails and round 1 is requeued, then dispatched again at 4.0. The robot's
    gap on the generation side is G_0.end -> the successful G_1.start = 3.0."""
    L = TaskLedger()
    first_round_served(L, "x", 1.0)
    L.record_request("x", 1, 1.25, ExecInfo(1.0, 0, 4.0))
    L.record_dispatch("x", 1, 2.0)
    L.record_requeue("x", 1)
    assert L.total_wait("x", 3.0) == 2.0  # waiting again in the queue, gap open since 1.0
    L.record_dispatch("x", 1, 4.0)
    L.record_complete("x", 1, 5.0)
    assert L.tasks["x"].waits == [3.0]
