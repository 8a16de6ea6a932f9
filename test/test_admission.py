"""core/admission.py: robots admitted up to a fixed cap or the tiers' measured capacity."""
import pytest

from robotserve_ros.core.admission import Admission, tier_rounds_per_s
from robotserve_ros.core.profile import EngineProfile
from robotserve_ros.core.serving_types import Tier


def test_a_fixed_cap_admits_that_many_robots_and_says_why_it_refuses_the_next():
    a = Admission(max_tasks=2)
    assert a.refuse("/r1", 0.0) is None and a.refuse("/r2", 0.0) is None
    assert a.refuse("/r1", 0.5) is None  # an admitted robot (its next task) keeps its place
    why = a.refuse("/r3", 1.0)
    assert why and "2 robots admitted" in why and "max_tasks" in why
    assert a.refused == 1 and a.admitted() == 2
    a.forget("/r1")  # reaped: its place is free
    assert a.refuse("/r3", 2.0) is None


def test_capacity_is_the_rounds_per_second_the_tiers_serve_against_what_robots_ask():
    prof = EngineProfile({1: 100.0, 4: 200.0})  # saturation: batch 4 in 0.2 s -> 20 rounds/s per slot
    cap = tier_rounds_per_s([Tier("edge", prof, slots=1, max_batch=4), Tier("cloud", prof, slots=2, max_batch=4)])
    assert cap == pytest.approx(60.0)
    a = Admission(capacity_rps=10.0)
    for k in range(4):  # each robot asks a round every 0.5 s: 2 rounds/s
        assert a.refuse(f"/r{k}", 0.0) is None
    for t in (0.5, 1.0, 1.5):
        for k in range(4):
            a.round(f"/r{k}", t)
    assert a.demand_rps() == pytest.approx(8.0)
    assert a.refuse("/r4", 2.0) is None  # 8 + 2 <= 10
    why = a.refuse("/r5", 2.0)  # 10 (the newcomer counted at the mean) + 2 > 10
    assert why and "rounds/s" in why and "by_capacity" in why
    h = Admission(capacity_rps=10.0, headroom=0.5)
    h.refuse("/a", 0.0)
    h.round("/a", 0.25)  # 4 rounds/s of a 5 rounds/s share
    assert h.refuse("/b", 0.3) is not None


def test_robots_silent_for_idle_s_lose_their_place():
    a = Admission(max_tasks=1, idle_s=5.0)
    assert a.refuse("/r1", 0.0) is None
    assert a.refuse("/r2", 3.0) is not None
    assert a.refuse("/r2", 6.0) is None  # /r1 last asked at 0


def test_bad_settings_are_refused():
    for kw in ({"max_tasks": -1}, {"capacity_rps": 0.0}, {"headroom": 0.0}):
        with pytest.raises(ValueError):
            Admission(**kw)
