"""RTC served remotely, the core's side (issue 28 item 2): the delay d predicted at dispatch
from the request's place in the schedule, the engine profile and the control rate (RTC arXiv
2506.07339 §4, seed 000 §3.2); d <= s <= H - d held by every horizon policy; a bad leftover
refused with its own code, counted, nobody else's round touched."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core import (ChunkResult, EngineProfile, ExecInfo, HorizonChoice, InferenceRequest,
                                 ServingCore, Tier, VirtualClock, make_scheduler)
from robotserve_ros.core.errors import BadRtc
from robotserve_ros.core.horizon import respect_rtc_delay
from robotserve_ros.core.rtc import RtcGuide
from robotserve_ros.core.rtc_delay import predict_delay_steps
from robotserve_ros.core.types import HorizonDecision
from robotserve_ros.engines.simulated import SimulatedEngine

DIM, CHUNK, HZ = 2, 20, 4.0


def core_with(latency_ms, max_batch=1):
    clock = VirtualClock()
    core = ServingCore(make_scheduler("fifo"), [Tier("edge", EngineProfile(latency_ms), max_batch=max_batch)],
                       clock, rtc_shape=(DIM, CHUNK))
    return core, clock


def rtc_request(tid, k=10, dim=DIM, rnd=1, horizon=None, exec_info=True):
    left = np.arange(k * dim, dtype=np.float32).reshape(k, dim)
    return InferenceRequest(tid, rnd, ExecInfo(0.0, k, HZ) if exec_info else None,
                            horizon or HorizonChoice("static", 12.0), rtc=RtcGuide(left))


def open_tasks(core, clock, *tids):
    """Round 0 of each task served (no RTC: nothing executed yet), so round 1 may carry a leftover."""
    for t in tids:
        core.submit(InferenceRequest(t, 0))
    while core.pending:
        for d in core.dispatch():
            core.complete(d, [ChunkResult(np.zeros((CHUNK, DIM), np.float32)) for _ in d.requests])


def test_delay_is_the_steps_executed_from_send_to_arrival_at_most_the_leftover():
    # sent at 0, dispatched at 0.5, generated in 0.2 s at 10 Hz: 7 steps
    assert predict_delay_steps(0.0, 0.5, 0.2, 10.0, 20) == 7
    assert predict_delay_steps(0.0, 0.5, 0.2, 10.0, 5) == 5  # the leftover ran out: the robot held
    assert predict_delay_steps(0.0, 0.0, 0.3, 10.0, 20) == 3  # no float ceil(2.9999..) surprise
    assert predict_delay_steps(1.0, 0.0, 0.0, 10.0, 20) == 0  # a clock out of step never gives d < 0


def test_the_dispatcher_sets_each_rows_d_from_its_place_in_the_queue():
    core, clock = core_with({1: 1000.0}, max_batch=1)  # 1 s a batch, one at a time
    open_tasks(core, clock, "a", "b")
    core.submit(rtc_request("a"))
    core.submit(rtc_request("b"))
    (d1,) = core.dispatch()
    assert d1.requests[0].request.rtc.delay_steps == 4  # 1 s of generation at 4 Hz
    clock.advance_to(1.0)
    core.complete(d1, [ChunkResult(np.zeros((CHUNK, DIM), np.float32))])
    (d2,) = core.dispatch()
    assert d2.requests[0].request.rtc.delay_steps == 8  # 1 s queued + 1 s generated


def test_the_batch_size_chosen_sets_the_latency_d_is_predicted_from():
    core, clock = core_with({1: 1000.0, 2: 1500.0}, max_batch=2)
    open_tasks(core, clock, "a", "b")
    core.submit(rtc_request("a"))
    core.submit(rtc_request("b"))
    (d,) = core.dispatch()
    assert [p.request.rtc.delay_steps for p in d.requests] == [6, 6]  # ceil(1.5 s x 4 Hz)


def test_a_requeued_round_gets_a_new_d_at_its_next_dispatch():
    core, clock = core_with({1: 1000.0})
    open_tasks(core, clock, "a")
    core.submit(rtc_request("a"))
    (d,) = core.dispatch()
    assert d.requests[0].request.rtc.delay_steps == 4
    clock.advance_to(1.0)
    core.requeue(d.id)
    (d,) = core.dispatch()
    assert d.requests[0].request.rtc.delay_steps == 8


@pytest.mark.parametrize("s, d, n, want", [
    (12, 4, 20, 12),   # inside [d, H - d]: unchanged
    (2, 4, 20, 4),     # raised to d: the robot starts this chunk at action d
    (18, 4, 20, 16),   # lowered to H - d: the next chunk's frozen prefix must be in this one
    (5, 12, 20, 12),   # d > H/2: both cannot hold, s >= d wins
])
def test_the_clamp_holds_d_le_s_le_h_minus_d(s, d, n, want):
    out = respect_rtc_delay(HorizonDecision(s, "static H"), d, n)
    assert out.horizon == want
    assert ("RTC d=" in out.reason) == (want != s)


def test_unguided_chunks_are_not_clamped():
    dec = HorizonDecision(2, "static H=2")
    assert respect_rtc_delay(dec, None, 20) is dec


def test_every_horizon_policy_goes_through_the_clamp_and_the_reply_says_d():
    core, clock = core_with({1: 1000.0})
    open_tasks(core, clock, "a")
    core.submit(rtc_request("a", horizon=HorizonChoice("static", 2.0)))
    (d,) = core.dispatch()
    eng = SimulatedEngine(EngineProfile({1: 1000.0}), chunk_size=CHUNK, action_dim=DIM)
    res = eng.infer([p.request for p in d.requests])
    (r,) = core.complete(d, res)
    assert r.rtc_delay_steps == 4 and r.horizon == 4 and "RTC d=4" in r.reason
    # the stand-in engine froze the leftover's first d rows
    np.testing.assert_array_equal(r.actions[:4], d.requests[0].request.rtc.leftover[:4])


def test_an_engine_without_rtc_reports_none_and_no_clamp():
    core, clock = core_with({1: 1000.0})
    open_tasks(core, clock, "a")
    core.submit(rtc_request("a", horizon=HorizonChoice("static", 2.0)))
    (d,) = core.dispatch()
    (r,) = core.complete(d, [ChunkResult(np.zeros((CHUNK, DIM), np.float32))])
    assert r.rtc_delay_steps is None and r.horizon == 2


@pytest.mark.parametrize("why, req", [
    ("wrong width", rtc_request("a", dim=3)),
    ("NaN", InferenceRequest("a", 1, ExecInfo(0.0, 2, HZ), rtc=RtcGuide(np.array([[0, np.nan]] * 2, np.float32)))),
    ("too long", rtc_request("a", k=CHUNK + 1)),
    ("no control rate", rtc_request("a", exec_info=False, rnd=0)),
    ("not 2-D", InferenceRequest("a", 1, ExecInfo(0.0, 2, HZ), rtc=RtcGuide(np.zeros(4, np.float32)))),
])
def test_a_bad_leftover_is_refused_counted_and_costs_no_one_else(why, req):
    core, clock = core_with({1: 1000.0})
    open_tasks(core, clock, "a", "b")
    if req.round_id == 0:
        req.task_id = "fresh"
    core.submit(rtc_request("b"))
    with pytest.raises(BadRtc) as e:
        core.submit(req)
    assert "rtc" in e.value.message and e.value.code == "bad_rtc"
    assert core.stats.errors["bad_rtc"] == 1
    (d,) = core.dispatch()
    assert [p.task_id for p in d.requests] == ["b"]


def test_a_spliced_chunk_keeps_the_frozen_leftover_and_replaces_the_rest():
    from robotserve_ros.core.action_queue import ActionQueue

    q = ActionQueue("weighted_average")
    q.merge(0, np.zeros((10, 1), np.float32))  # the current chunk, timesteps 0..9
    for _ in range(4):
        q.pop()  # request sent at timestep 4 with 6 left; then 2 more executed while waiting
    sent_at = q.timestep
    q.pop(), q.pop()
    new = np.full((8, 1), 7.0, np.float32)  # row i is timestep sent_at + i
    assert q.splice(sent_at, new, 3) == (3, 1)  # timestep 6 executed: 1 frozen action still to run
    assert [float(a[0]) for a in q.queued()] == [0.0] + [7.0] * 5
    # the chunk came after the robot passed d (later than predicted): resume where it is
    q2 = ActionQueue()
    q2.merge(0, np.zeros((10, 1), np.float32))
    for _ in range(6):
        q2.pop()
    assert q2.splice(2, new, 1) == (4, 0)
    assert len(q2.queued()) == 4


def test_the_fleet_rtc_account_and_the_bench_summary_count_what_the_robots_saw():
    from robotserve_ros.bench.rtc_live import summarize
    from robotserve_ros.nodes.rtc_client import merge_rtc

    robots = [{"guided": 3, "unguided": 1, "held": 1, "delays": {"2": 2, "4": 1}, "d_error": {"-1": 1, "0": 1, "2": 1},
               "horizons": [(2, 10, 50), (4, 4, 50), (2, 49, 50)]},
              {"guided": 1, "unguided": 0, "held": 0, "delays": {"3": 1}, "d_error": {"0": 1}, "horizons": [(3, 20, 50)]}]
    rtc = merge_rtc(robots)
    assert (rtc["robots"], rtc["guided"], rtc["held"]) == (2, 4, 1)
    assert rtc["delays"] == {2: 2, 3: 1, 4: 1} and rtc["d_error"] == {-1: 1, 0: 2, 2: 1}
    assert rtc["clamp_held"] == 3  # (2, 49, 50): s > H - d
    side = {"idle_fraction": 0.2, "chunks_served": 10}
    s = summarize(side, {**side, "idle_fraction": 0.1, "rtc": rtc})
    r = s["rtc"]
    assert r["late_fraction"] == 0.25 and r["early_fraction"] == 0.25 and r["held_fraction"] == 0.25
    assert r["d_p50"] == 2.5 and r["clamp_held_fraction"] == 0.75
    assert s["idle_fraction_ratio_rtc_over_without"] == 0.5


def test_self_consistency_replicas_keep_their_requests_guide():
    from robotserve_ros.core.horizon import SelfConsistencyEngine

    eng = SelfConsistencyEngine(SimulatedEngine(EngineProfile({1: 10.0, 4: 12.0}), chunk_size=CHUNK, action_dim=DIM), k=2)
    assert eng.supports_rtc
    req = rtc_request("a")
    req.rtc = req.rtc.with_delay(3)
    (r,) = eng.infer([req])
    assert r.rtc_delay_steps == 3 and r.samples.shape[0] == 2
    for s in r.samples:  # every replica froze the same leftover rows
        np.testing.assert_array_equal(s[:3], req.rtc.leftover[:3])


def test_a_refreshed_observation_takes_the_leftover_and_d_from_its_own_timestep_on():
    # Sent at timestep 10 with 10 actions left; refreshed at dispatch from timestep 13: the new chunk's
    # row 0 is timestep 13, so the 3 actions run meanwhile leave the leftover and d (RTC §4).
    from robotserve_ros.core.observation import Observation

    clock = VirtualClock()
    fresh = Observation(joints=np.zeros(2, np.float32), timestep=13, stamp=0.75)
    core = ServingCore(make_scheduler("fifo"), [Tier("edge", EngineProfile({1: 1000.0}), max_batch=1)], clock,
                       rtc_shape=(DIM, CHUNK), refresher=lambda reqs: [(fresh, 0.75) for _ in reqs], stale_obs_s=0.1)
    open_tasks(core, clock, "a")
    req = rtc_request("a")
    req.observation, req.obs_stamp = Observation(joints=np.zeros(2, np.float32), timestep=10, stamp=0.0), 0.0
    core.submit(req)
    clock.advance_to(0.75)  # queued 0.75 s at 4 Hz, then 1 s of generation: d = ceil(7) = 7 from the send
    (d,) = core.dispatch()
    assert d.requests[0].request.rtc.delay_steps == 7
    core.refresh_stale(d)
    g = d.requests[0].request.rtc
    assert d.requests[0].request.observation.timestep == 13
    assert g.delay_steps == 4 and len(g.leftover) == 7
    np.testing.assert_array_equal(g.leftover, rtc_request("a").rtc.leftover[3:])
