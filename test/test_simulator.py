"""The virtual-clock fleet simulator (seed 000 §5.1, §5.3) and its robot-side timing helpers."""
from __future__ import annotations

import pytest

from robotserve_ros.core.robot_timing import alone_latency, exec_start, request_after, trigger_actions
from robotserve_ros.sim.simulator import Simulator
from robotserve_ros.sim.workload import parse_workload


def small_workload():
    return parse_workload(
        {
            "name": "tiny",
            "engine": {"batch_latency_ms": {"1": 100, "2": 150, "4": 245, "8": 300}},
            "tasks": [
                {"id": "pick", "control_hz": 30, "rounds": {"static": [25, 25, 25, 25], "dynamic": [30, 18, 40]}},
                {"id": "pour", "control_hz": 10, "rounds": {"static": [10, 10, 10], "dynamic": [12, 8, 14]}},
                {"id": "wipe", "control_hz": 50, "rounds": {"static": [25] * 6, "dynamic": [40, 20, 50, 40]}},
                {"id": "stack", "control_hz": 30, "rounds": {"static": [10] * 8, "dynamic": [20, 5, 30, 10]}},
                {"id": "fold", "control_hz": 20, "rounds": {"static": [15] * 5, "dynamic": [25, 25, 10]}},
                {"id": "sort", "control_hz": 30, "rounds": {"static": [5] * 10, "dynamic": [10] * 5}},
            ],
        }
    )


# --- robot helpers --------------------------------------------------------------------------


def test_trigger_actions_hides_batch1_generation():
    """Request when the actions left just cover one batch-1 generation: ceil(latency x rate)."""
    assert trigger_actions(0.1, 30.0) == 3  # exactly 3 actions of 1/30 s (no float round-up to 4)
    assert trigger_actions(0.11, 30.0) == 4
    assert trigger_actions(0.1, 25.0) == 3  # 2.5 actions -> 3
    assert trigger_actions(0.25, 8.0) == 2


def test_exec_start_and_request_after():
    assert exec_start(1.0, None) == 1.0  # first chunk runs when it arrives
    assert exec_start(1.0, 1.5) == 1.5  # ... or when the previous chunk is done
    assert exec_start(2.0, 1.5) == 2.0
    assert request_after(8, 2, 8.0) == 0.75  # 6 actions run before the trigger point
    assert request_after(1, 2, 8.0) == 0.0  # round shorter than the trigger: ask at once


def test_alone_latency_hand_example():
    """Batch-1 latency 0.25 s, 8 Hz, trigger 2 actions.
    [8, 8, 4]: chunk 0 at 0.25, runs to 1.25; request at 1.0 -> chunk 1 at 1.25, runs to 2.25;
    request at 2.0 -> chunk 2 at 2.25, runs to 2.75. Perfect overlap: 0.25 + 20/8 = 2.75.
    [8, 1, 8, 3]: chunk 1 (1 action) runs 1.25-1.375 and is shorter than the trigger, so round 2 is
    asked at 1.25 and ready at 1.5 (robot idle 0.125); it runs to 2.5, request at 2.25, chunk 3
    ready at 2.5 and runs to 2.875."""
    assert alone_latency([8, 8, 4], 8.0, 0.25) == 2.75
    assert alone_latency([8, 1, 8, 3], 8.0, 0.25) == 2.875
    assert alone_latency([8], 8.0, 0.25) == 1.25


@pytest.mark.parametrize("horizon", ["static", "dynamic"])
@pytest.mark.parametrize("scheduler", ["fifo", "kairos"])
def test_single_task_alone_reaches_its_lower_bound(scheduler, horizon):
    """With no contention the simulated robot meets the contention-free latency exactly."""
    wl = parse_workload(
        {
            "name": "one",
            "engine": {"batch_latency_ms": {"1": 250}},
            "tasks": [{"id": "solo", "control_hz": 8, "rounds": {"static": [8, 1, 8, 3], "dynamic": [8, 8]}}],
        }
    )
    for result in (Simulator(wl, scheduler, horizon).run_fleet(1), Simulator(wl, scheduler, horizon).run_online(1.0, 1)):
        (o,) = result.outcomes
        expected = {"static": 2.875, "dynamic": 2.25}[horizon]
        assert o.lower_bound_s == expected
        assert o.latency == pytest.approx(expected, abs=1e-12)
        assert o.idle_s == pytest.approx({"static": 0.375, "dynamic": 0.25}[horizon], abs=1e-12)
        assert result.summary()["slowdown_vs_lower_bound"] == pytest.approx(1.0)


# --- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["fifo", "autellix", "kairos", "edf"])
def test_online_is_deterministic_per_seed(scheduler):
    wl = small_workload()
    a = Simulator(wl, scheduler, seed=7).run_online(rate=4.0, n_tasks=40).summary()
    b = Simulator(wl, scheduler, seed=7).run_online(rate=4.0, n_tasks=40).summary()
    assert a == b
    assert a["tasks"] == 40
    c = Simulator(wl, scheduler, seed=8).run_online(rate=4.0, n_tasks=40).summary()
    assert c["seed"] == 8
    assert c["avg_latency_s"] != a["avg_latency_s"]
    assert c["makespan_s"] != a["makespan_s"]


@pytest.mark.parametrize("horizon", ["static", "dynamic"])
@pytest.mark.parametrize("scheduler", ["fifo", "kairos"])
def test_fleet_is_deterministic_per_seed(scheduler, horizon):
    wl = small_workload()
    a = Simulator(wl, scheduler, horizon, seed=3).run_fleet(robots=3).summary()
    b = Simulator(wl, scheduler, horizon, seed=3).run_fleet(robots=3).summary()
    assert a == b
    assert a["tasks"] == len(wl.tasks)  # every task of the workload ran exactly once
    expected_rounds = sum(len(t.rounds[horizon]) for t in wl.tasks)
    assert a["rounds"] == expected_rounds


def test_simulator_results_are_sane():
    """Latency is never below the contention-free bound and the wait ratio stays in [0, 1]."""
    r = Simulator(small_workload(), "kairos", seed=1).run_online(rate=8.0, n_tasks=60)
    for o in r.outcomes:
        assert o.latency >= o.lower_bound_s - 1e-9
        assert 0.0 <= o.wait_ratio <= 1.0
        assert o.idle_s >= 0.0
    s = r.summary()
    assert 0.0 < s["engine_utilization"] <= 1.0
    assert s["mean_batch"] >= 1.0


def test_simulator_rejects_bad_arguments():
    wl = small_workload()
    with pytest.raises(ValueError):
        Simulator(wl, "fifo", horizon="sometimes")
    with pytest.raises(KeyError):
        Simulator(wl, "no-such-scheduler")
    with pytest.raises(ValueError):
        Simulator(wl, "fifo").run_online(rate=0.0, n_tasks=3)
    with pytest.raises(ValueError):
        Simulator(wl, "fifo").run_fleet(robots=0)


# --- the same Runner steps over several tiers, on the virtual clock ----------------------------


def test_hybrid_placement_offloads_on_the_virtual_clock():
    """An edge tier plus a faster cloud tier behind a link: under load the placement sends
    part of the work to the cloud (Algorithm 1 phase 3), every round is served once, and
    the cloud relieves the edge (lower average latency than edge alone)."""
    from robotserve_ros.sim.simulator import SimTier

    w = small_workload()
    edge_only = Simulator(w, "kairos", seed=1).run_online(rate=8.0, n_tasks=60).summary()
    sim = Simulator(w, "kairos", seed=1, tiers=[SimTier("edge"), SimTier("cloud", speedup=2.0, rtt_s=0.05)])
    res = sim.run_online(rate=8.0, n_tasks=60)
    s = res.summary()
    assert s["tasks"] == 60 and s["rounds"] == sum(o.rounds for o in res.outcomes)
    assert res.served_by_tier.get("cloud", 0) > 0 and res.served_by_tier.get("edge", 0) > 0
    assert sum(res.served_by_tier.values()) == s["rounds"]  # each round once, on one tier
    assert s["avg_latency_s"] < edge_only["avg_latency_s"]


def test_failing_tier_requeues_and_nothing_is_lost_on_the_virtual_clock():
    """The cloud fails every batch for 2 s: its batches are requeued (the runner's fail
    step), the link is marked down so the placement keeps to the edge, and every task still
    finishes with every round served exactly once."""
    from robotserve_ros.sim.simulator import SimTier, TierFault

    w = small_workload()
    tiers = [SimTier("edge"), SimTier("cloud", speedup=2.0, rtt_s=0.05)]
    res = Simulator(w, "kairos", seed=1, tiers=tiers, faults=(TierFault("cloud", 1.0, 3.0, after_s=0.2),)).run_online(8.0, 60)
    s = res.summary()
    assert s["tasks"] == 60
    assert res.tier_failures.get("cloud", 0) >= 1 and res.requeued >= 1
    assert sum(res.served_by_tier.values()) == s["rounds"]
    again = Simulator(w, "kairos", seed=1, tiers=tiers, faults=(TierFault("cloud", 1.0, 3.0, after_s=0.2),)).run_online(8.0, 60)
    assert again.summary() == s  # deterministic, faults included


def test_single_edge_tier_is_the_default_and_bad_tiers_are_refused():
    from robotserve_ros.sim.simulator import SimTier, TierFault

    w = small_workload()
    a = Simulator(w, "fifo", seed=3).run_fleet(4).summary()
    b = Simulator(w, "fifo", seed=3, tiers=[SimTier("edge")]).run_fleet(4).summary()
    assert a == b
    with pytest.raises(ValueError, match="unique"):
        Simulator(w, "fifo", tiers=[SimTier("edge"), SimTier("edge")])
    with pytest.raises(ValueError, match="unknown tier"):
        Simulator(w, "fifo", faults=(TierFault("cloud", 0, 1),))
    with pytest.raises(ValueError, match="speedup"):
        SimTier("edge", speedup=0)


def test_trigger_rule_is_one_function_for_simulated_and_real_robots():
    """0.07 s x 100 Hz is 7.000000000000001 in floats: both sides must ask at 7 actions left."""
    assert trigger_actions(0.07, 100.0) == 7
    import ast
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[1] / "robotserve_ros" / "nodes" / "robot_client.py"
    calls = {n.func.id for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "trigger_actions" in calls  # robot_client computes its trigger with core's rule
