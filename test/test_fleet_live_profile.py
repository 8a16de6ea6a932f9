"""bench fleet-live's server profile (issue 26): CPU per served round and per robot-second,
the executor's share, tasks reaped while their robot lived, refresh figures; and the
executors side by side. Computed from made-up samples, no ROS."""
from __future__ import annotations

import pytest

from robotserve_ros.bench.fleet_live import compare_executors, server_profile


def _samples(cpu_a: float, cpu_b: float) -> list:
    return [(0.0, None, {"inference_server": cpu_a}, 0.5), (10.0, None, {"inference_server": cpu_b}, 0.5)]


def test_server_profile_divides_the_windows_cpu_by_rounds_robots_and_spin():
    server = {"refreshes": "30", "refresh_failures": "10", "refreshed_ahead": "50", "refresh_ahead_failures": "10",
              "refresh_skipped": "3", "refresh_ms_p50": "4.5", "refresh_ms_p99": "20.0", "refresh_clients": "2"}
    p = server_profile({}, _samples(1.0, 6.0), [0.5, 2.5], served_per_s=25.0, window=10.0, robots=50,
                       server=server, reaped_alive=4)
    assert p["server_cpu_s"] == 5.0
    assert p["server_cpu_s_per_round"] == pytest.approx(5.0 / 250)
    assert p["server_cpu_s_per_robot_s"] == pytest.approx(5.0 / 500)
    assert p["executor_time_share"] == pytest.approx(2.0 / 5.0)
    assert p["tasks_reaped_alive"] == 4
    r = p["refresh"]
    assert r["success_rate"] == pytest.approx(80 / 100) and r["at_dispatch_failed"] == 10 and r["clients"] == 2
    assert r["call_ms_p99"] == 20.0


def test_server_profile_without_samples_says_none():
    p = server_profile({}, [], [], served_per_s=float("nan"), window=10.0, robots=5, server={}, reaped_alive=None)
    assert p["server_cpu_s_per_round"] is None and p["executor_time_share"] is None
    assert p["refresh"]["success_rate"] is None


def test_executors_side_by_side_keep_the_gap_and_the_cost_of_each():
    def run(cpu, gap):
        return {"server_cpu_s_per_round": cpu, "engine_utilization_when_backlogged": 0.9, "lost_chunks": 0,
                "server_headline": {"gap_to_dispatch_ms_p99": gap}, "machine": {"loadavg_at_start": [1.0]}}

    side = compare_executors({"multithreaded": run(0.002, 12.0), "single": run(0.003, 40.0)})
    assert list(side) == ["multithreaded", "single"]
    assert side["multithreaded"]["gap_to_dispatch_ms_p99"] == 12.0 and side["single"]["server_cpu_s_per_round"] == 0.003
