"""Engine profile (seed 000 §3.2.2, §4): latency vs batch size, and the saturation batch past which
"additional batching increases latency without improving throughput"."""
from __future__ import annotations

import pytest

from robotserve_ros.core import EngineProfile, Tier


def test_interpolation_between_and_past_measured_points():
    p = EngineProfile({1: 100, 2: 150, 4: 245, 8: 300})
    assert p.latency_ms(1) == 100.0
    assert p.latency_ms(4) == 245.0
    assert p.latency_ms(3) == 197.5  # halfway between 150 and 245
    assert p.latency_ms(6) == 272.5  # halfway between 245 and 300
    assert p.latency_ms(16) == 300.0 + (300 - 245) / 4 * 8  # last segment's slope extended
    assert p.latency_s(2) == 0.15
    assert p.throughput(4) == pytest.approx(4 / 0.245)
    with pytest.raises(ValueError):
        p.latency_ms(0)


def test_saturation_batch_when_throughput_keeps_growing():
    """Throughput 10, 13.3, 16.3, 26.7 req/s: the largest measured batch still wins by far."""
    assert EngineProfile({1: 100, 2: 150, 4: 245, 8: 300}).saturation_batch == 8


def test_saturation_batch_of_a_linear_profile_is_one():
    """Latency proportional to batch size: batching buys no throughput at all."""
    p = EngineProfile({1: 100, 2: 200, 4: 400, 8: 800})
    assert p.saturation_batch == 1
    assert Tier("edge", p).batch_limit == 1


def test_saturation_batch_where_throughput_flattens():
    """Throughput 10, 13.3, 13.3, 13.3 req/s: batch 2 is where it stops improving."""
    p = EngineProfile({1: 100, 2: 150, 4: 300, 8: 600})
    assert p.saturation_batch == 2
    assert Tier("edge", p).batch_limit == 2
    assert Tier("edge", p, max_batch=5).batch_limit == 5


def test_saturation_gain_tolerance():
    """Batch 4 beats batch 2's throughput by 3.4%: within the default 5% tolerance, not within 1%."""
    assert EngineProfile({1: 100, 2: 150, 4: 290}).saturation_batch == 2
    assert EngineProfile({1: 100, 2: 150, 4: 290}, gain_tol=0.01).saturation_batch == 4


def test_single_point_profile_is_flat():
    p = EngineProfile({1: 100})
    assert p.saturation_batch == 1
    assert p.latency_ms(5) == 100.0


def test_string_keys_and_round_trip():
    p = EngineProfile({"1": 100, "2": 150})
    assert p.latency_ms(2) == 150.0
    assert p.to_dict() == {"1": 100.0, "2": 150.0}


@pytest.mark.parametrize(
    "table",
    [
        {2: 100},  # no batch-1 latency
        {1: 100, 2: 90},  # latency falls as the batch grows
        {1: 0},
        {1: -5},
        {1: float("nan")},
        {1: float("inf")},
        {0: 5, 1: 10},
        {"1.5": 100, 1: 100},
        {" 2x": 100, 1: 100},
    ],
)
def test_bad_profiles_are_refused(table):
    with pytest.raises(ValueError):
        EngineProfile(table)
