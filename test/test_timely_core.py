"""TimelyLLM in core (seed 002): TUF (Eq. 1) and TUF_1 (§4.2), PUD priority (Eq. 4), the
latency-guided batch size (§4.4), the baselines, and the segment serving core's steps.
Pure Python: no ROS, no torch."""
import math

import pytest

from robotserve_ros.core.clock import VirtualClock
from robotserve_ros.core.timely import (SCHEDULER_NAMES, SEGMENT_SCHEDULERS, TUF, BadDeadline, Context, LLMProfile,
                                        Plan, SegmentOutcome, SkillTimeModel, TimelyCore, skill_name)

PROFILE = LLMProfile.from_block({"prefill_ms": {"tokens": [16, 128], "ms": [20, 100]},
                                 "decode_step_ms": {"batch": [1, 4, 16], "context": [64, 512], "ms": [[50, 60], [60, 75], [110, 150]]},
                                 "regather_ms": {"batch": [1, 16], "ms": [0, 5]}})
SKILLS = SkillTimeModel({"drone": {"s": 1.5, "g": 2.4, "mf": 1.0}})


def plan(pid, arrival, urgent=False, tokens=64, segments=3):
    tuf = TUF(2, 0.2, 0.5) if urgent else TUF(1, 1, 1.5)
    return Plan(pid, f"agent{pid}", "drone", arrival, tuf, tokens, urgent=urgent, max_segments=segments)


def test_tuf_eq1_and_tuf1():
    t = TUF(1, 1, 1.5)
    assert t.alpha == pytest.approx(-2)
    assert t.utility(0.3) == 1 and t.utility(1.0) == 1
    assert t.utility(1.25) == pytest.approx(0.5) and t.utility(1.5) == pytest.approx(0)
    assert t.utility(2.0) == pytest.approx(-1)  # Eq. 1 keeps falling past the cutoff
    u = TUF(2, 0.2, 0.5)
    assert u.alpha == pytest.approx(-6.6667, abs=1e-3)
    # TUF_1: ERT 0 for a suspended generation; early (w <= 0) earns beta
    assert u.utility_suspended(-3) == 2 and u.utility_suspended(0.15) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [[0, 1, 1.5], [-1, 1, 1.5], [1, 1, 1], [1, 1, 0.5], [1, float("nan"), 2], [1, 2], "x"])
def test_bad_tuf_is_refused_with_its_code(bad):
    with pytest.raises(BadDeadline) as e:
        TUF.from_list(bad)
    assert e.value.code == "bad_deadline"


def test_skill_time_model_keeps_the_minimum_per_skill():
    recs = [{"exe_time_detail": [["s(", 3.7], ["g(", 2.4]]}, {"exe_time_detail": [["s(", 1.5], ["mf", 1.9]]}]
    m = SkillTimeModel.from_records(recs)
    assert m.estimate("drone", "s(cat)") == 1.5 and m.estimate("drone", "mf(50)") == 1.9
    assert m.estimate("drone", "zz(1)") == m.default_s and m.estimate("arm", "s(x)") == m.default_s
    assert skill_name("move_to(red_box)") == "move_to" and skill_name("l") == "l"


def ctx(**kw):
    return Context(PROFILE, kw.get("est", 6.0), kw.get("max", 12), kw.get("batch", 16))


def test_pud_priority_ranks_urgent_first_then_small_slack():
    """Eq. 4: utility over G times slack: an urgent request (beta 2, 0.2 s ERT) over a normal
    one; among suspended generations, the one whose robot finishes first."""
    s = SEGMENT_SCHEDULERS.create("timely")
    now = 10.0
    normal, urgent = plan(1, now), plan(2, now, urgent=True, tokens=16)
    susp_soon, susp_late = plan(3, 5.0), plan(4, 5.0)
    for p, end in ((susp_soon, now + 0.8), (susp_late, now + 5)):
        p.k, p.prefilled, p.exec_end_est = 1, True, end
    order = s.order([susp_late, normal, susp_soon, urgent], now, ctx())
    assert [p.id for p in order] == [2, 3, 1, 4]
    # dynamic update (§4.3): 4.9 s later the robot of the late suspended plan is about to
    # finish its skill: its next segment now goes before a fresh request
    fresh = plan(5, now + 4.9)
    assert [p.id for p in s.order([fresh, susp_late], now + 4.9, ctx())] == [4, 5]
    # near their deadlines both hit the cap (|alpha| / G_ref): earliest deadline first
    assert [p.id for p in s.order([normal, susp_soon], now + 0.7, ctx())] == [3, 1]


def test_segments_past_their_cutoff_rank_by_utility_lost_per_second():
    """Past the cutoff Eq. 1 keeps falling: a late segment ranks as beta at stake over
    (cutoff - ERT), i.e. |alpha| / G_ref: a late urgent one (alpha -6.67), then a late
    normal one (-2), then a fresh normal one that can wait a segment and still be on time;
    among late ones of one TUF the earliest deadline first; a fresh one near its own deadline
    rises to the cap of its TUF, not above: after the late ones of the same TUF."""
    s = SEGMENT_SCHEDULERS.create("timely")
    late, late2, fresh, late_urgent = plan(1, 0.0), plan(4, 0.5, tokens=16), plan(2, 9.99), plan(3, 5.0, urgent=True)
    assert s.priority(late, 10.0, ctx(), 1)[0] == pytest.approx(-2 / ctx().g_ref)
    assert [p.id for p in s.order([late2, late, fresh, late_urgent], 10.0, ctx())] == [3, 1, 4, 2]
    assert s.priority(fresh, 10.6, ctx(), 1)[0] == pytest.approx(-2 / ctx().g_ref)  # 36 ms of slack left: capped
    assert [p.id for p in s.order([late, fresh, late_urgent], 10.6, ctx())] == [3, 1, 2]


def test_latency_guided_batch_stops_admitting_when_the_most_urgent_would_miss():
    """§4.4: a running urgent generation 0.2 s after arrival (past its ERT, 0.3 s before its
    utility reaches 0) with 6 tokens to go at 50 ms/step ends in time alone, not behind a
    newcomer's prefill in a bigger batch."""
    s = SEGMENT_SCHEDULERS.create("timely")
    now = 1.0
    urgent = plan(1, now - 0.2, urgent=True)
    urgent.prefilled, urgent.seg_tokens = True, 6
    waiting = [plan(i, now) for i in range(2, 6)]
    assert s.admit([urgent], waiting, now, ctx()) == []
    # with a relaxed budget (normal deadline 1 s away) they all join
    relaxed = plan(9, now)
    relaxed.prefilled = True
    assert len(s.admit([relaxed], waiting, now, ctx())) == 4
    # the memory bound always holds; FCFS baselines fill up to it
    assert len(SEGMENT_SCHEDULERS.create("fcfs").admit([urgent], waiting, now, ctx(batch=3))) == 2


def test_registry_names_and_orders():
    assert set(SCHEDULER_NAMES) <= set(SEGMENT_SCHEDULERS.names())
    early, urgent_late = plan(1, 0.0), plan(2, 0.5, urgent=True)
    assert [p.id for p in SEGMENT_SCHEDULERS.create("seg_fcfs").order([urgent_late, early], 1, ctx())] == [1, 2]
    assert [p.id for p in SEGMENT_SCHEDULERS.create("seg_edf").order([early, urgent_late], 1, ctx())] == [2, 1]
    with pytest.raises(KeyError):
        SEGMENT_SCHEDULERS.create("nosuch")


def run_plan(name, segs=(2, 3, 2)):
    """Drive the core's two steps by hand: one plan of len(segs) segments."""
    clock = VirtualClock(0.0)
    core = TimelyCore(SEGMENT_SCHEDULERS.create(name), PROFILE, SKILLS, clock)
    core.submit(plan("p", 0.0, segments=len(segs)))
    events, left, k, t = [], list(segs), 0, 0.0
    while True:
        items = core.dispatch()
        if not items:
            break
        [item] = items
        assert core.dispatch() == []  # one item at a time on the engine slot
        t += 0.05
        clock.advance_to(t)
        left[k] -= 1
        done = left[k] == 0
        out = SegmentOutcome(1, f"s(x{k})" if done else None, plan_done=done and k == len(segs) - 1)
        if done:
            k += 1
        events += core.complete(item, {"p": out}, 0.05)
    return core, events, t


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_core_generates_every_segment_and_streams_or_holds_them(name):
    core, events, t_end = run_plan(name)
    segs = [e for e in events if e.kind == "segment"]
    assert [e.text for e in segs] == ["s(x0)", "s(x1)", "s(x2)"] and segs[-1].last
    assert [e.kind for e in events][-1] == "done" and not core.plans and not core.running
    if name == "fcfs":  # the whole plan at the end, as vLLM answers
        assert {e.t for e in segs} == {t_end}
    else:  # each skill as soon as it is generated: 2 tokens, then 3, then 2
        assert [round(e.t, 2) for e in segs] == [0.1, 0.25, 0.35]
    assert core.stats.plans_done == 1 and core.stats.segments == 3


def test_suspended_plan_waits_while_a_new_urgent_one_runs():
    """Segmented generation frees the engine after a segment (§4.1): an urgent request that
    arrives then runs before the suspended plan's next segment, whose robot is busy."""
    clock = VirtualClock(0.0)
    core = TimelyCore(SEGMENT_SCHEDULERS.create("timely"), PROFILE, SKILLS, clock, seg_tokens_max=4)
    core.submit(plan("n", 0.0, segments=2))
    [item] = core.dispatch()
    assert item.kind == "prefill" and item.plan_ids == ["n"]
    clock.advance_to(0.1)
    ev = core.complete(item, {"n": SegmentOutcome(1, "s(cat)")})
    assert [e.kind for e in ev] == ["segment"] and ev[0].expected_exec_s == 1.5
    n = core.plans["n"]
    assert n.state == "waiting" and n.prefilled and n.k == 1  # suspended, KV kept
    core.segment_started("n", 0, 0.11)
    assert math.isclose(n.exec_end_est, 1.61)  # robot's start + the skill model's 1.5 s
    core.submit(plan("u", 0.1, urgent=True, tokens=16))
    [item] = core.dispatch()
    assert item.kind == "prefill" and item.plan_ids == ["u"]  # the urgent prefill goes first


def test_cancel_and_failure_leave_others_served():
    clock = VirtualClock(0.0)
    core = TimelyCore(SEGMENT_SCHEDULERS.create("seg_fcfs"), PROFILE, SKILLS, clock)
    core.submit(plan("a", 0.0))
    core.submit(plan("b", 0.0))
    with pytest.raises(Exception) as e:
        core.submit(plan("a", 0.0))
    assert e.value.code == "duplicate_request"
    [item] = core.dispatch()
    ev = core.fail(item, "engine_failure")
    assert [e.kind for e in ev] == ["done"] and item.plan_ids[0] not in core.plans
    assert core.cancel("zz") is False
    other = "b" if item.plan_ids[0] == "a" else "a"
    assert [i.plan_ids for i in core.dispatch()] == [[other]]
