"""`robotserve study rtc` (study/rtc.py): the closed-loop delay semantics on PushGust with the
trained flow policy, a few short episodes: the row schema, d = 0 run with and without RTC,
RTC's d <= s <= H - d (and no row where it has no s), holding only without RTC, the fleet
simulator on the measured rounds. No ROS, no network."""
from __future__ import annotations

import json

import numpy as np
import pytest

from robotserve_ros.study.rtc import (ROW_KEYS, RtcStudyConfig, boundary_jerk, delay_steps, merge_runs,
                                     read_study, run_family, target_check, write_study)
from robotserve_ros.study.rtc_fleet import fleet_on_rounds


class _Unit:
    def norm(self, x):
        return x


def test_delay_steps_and_boundary_jerk():
    assert [delay_steps(x, 10.0) for x in (0.0, 0.05, 0.2, 0.6)] == [0, 1, 2, 6]
    assert delay_steps(0.1, 80.0) == 8
    a = [np.array([t ** 2], np.float32) for t in range(6)]  # a quadratic ramp: third difference 0
    assert boundary_jerk(a, [0, 3, 5], _Unit()) == [0.0, 0.0]  # t < 3 has no third difference
    a[4] = a[4] + 1.0  # a jump of 1 at t = 4: jerk 1 there, 3 one step later
    assert boundary_jerk(a, [4, 5], _Unit()) == pytest.approx([1.0, 3.0])


def test_target_check():
    def row(delay, config, p, lo, h):
        return {"task": "t", "delay_s": delay, "config": config, "success": p, "success_ci95": [lo, 1.0],
                "mean_horizon": h}
    rows = [row(0, "static", 0.9, 0.8, 1.0), row(0.2, "static+rtc", 0.85, 0.7, 1.6), row(0.1, "static+rtc", 0.95, 0.9, 3)]
    assert target_check(rows, "t")["met"] and target_check(rows, "t")["meeting"] == [("static+rtc", 0.2)]
    rows[1]["mean_horizon"] = 1.4  # below 1.5x; the 0.1 s row is below the delay floor
    assert not target_check(rows, "t")["met"] and target_check(rows, "t")["closest"]["delay_s"] == 0.2


@pytest.fixture(scope="module")
def study():
    cfg = RtcStudyConfig(tasks=("pushgust",), seeds=(0,), episodes=3, delays=(0.0, 0.2, 0.9, 1.8),
                         max_steps=40)
    return run_family("pushgust", cfg, log=lambda *_: None)


def test_rows_and_semantics(study, tmp_path):
    rows, meta = study
    by = {(r["delay_s"], r["config"]): r for r in rows}
    names = ("static", "static+rtc", "dynamic:schedule", "dynamic:schedule+rtc")
    assert {c for _, c in by} == set(names)
    # d = 0: nothing runs during generation, but RTC is guided like any other d (issue 39).
    for c in names:
        assert by[0.0, c]["_extra"]["s_range"] == [1, 16] and by[0.0, c]["_extra"]["held_steps_per_episode"] == 0
    # d = 2 of H = 16: s in [2, 14] with RTC, and the robot holds only before its first chunk.
    for c in names:
        x = by[0.2, c]["_extra"]
        assert x["delay_steps"] == 2 and x["s_range"] == ([2, 14] if c.endswith("+rtc") else [2, 16])
        assert by[0.2, c]["mean_horizon"] >= 2 - 1e-9 or x["steps_per_episode"] < 40
        if c.endswith("+rtc"):
            assert x["held_steps_per_episode"] == 2.0
    # d = 9 > H / 2: RTC has no s; without it the robot holds past its leftover.
    assert (0.9, "static+rtc") not in by and (0.9, "dynamic:schedule+rtc") not in by
    assert {s["config"] for s in meta["skipped"]} == {"static+rtc", "dynamic:schedule+rtc"}
    assert by[0.9, "static"]["_extra"]["held_steps_per_episode"] > 9
    # d = 18 > H: without RTC the robot runs whole chunks and holds the rest of each delay.
    x = by[1.8, "static"]["_extra"]
    assert x["s_range"] == [16, 16] and by[1.8, "static"]["mean_horizon"] <= 16
    assert (1.8, "static+rtc") not in by
    paths = write_study(rows, {"families": {"pushgust": meta}}, tmp_path)
    assert "Target (delay >= 0.2 s" in paths[2].read_text()
    out = json.loads(paths[0].read_text())
    assert all(tuple(r) == ROW_KEYS for r in out) and len(out) == len(rows)
    assert all(0 <= r["success_ci95"][0] <= r["success"] <= r["success_ci95"][1] <= 1 for r in out)
    # --append: a rerun of one row replaces it, the rest stays; extras survive the round trip.
    back, bmeta = read_study(tmp_path)
    assert back[0]["_extra"] == rows[0]["_extra"]
    redo = {**by[0.2, "static"], "success": 0.5}
    merged, mmeta = merge_runs(back, bmeta, [redo], {"families": {"pushgust": {**meta, "skipped": []}},
                                                     "command": "again", "delays_s": [0.2]})
    assert len(merged) == len(rows) and [r["success"] for r in merged if (r["delay_s"], r["config"]) ==
                                         (0.2, "static")] == [0.5]
    assert mmeta["appended"] == ["again"] and len(mmeta["families"]["pushgust"]["skipped"]) == len(meta["skipped"])


def test_fleet_on_measured_rounds(study):
    rows, meta = study
    data = fleet_on_rounds(rows, {"families": {"pushgust": meta}}, seeds=(0,), tasks=12, robots=3)
    e = data["families"]["pushgust"]
    assert e["static_row"]["delay_s"] == 0 and e["rtc_row"]["config"].endswith("+rtc") and e["rtc_row"]["delay_s"] >= 0.2
    for key in ("peak", "robots"):
        assert set(e[key]) == {"FIFO", "Kairos", "remaining", "FIFO rtc-rounds"}
        assert e[key]["FIFO"]["tasks"] == (12 if key == "peak" else 3) and e[key]["Kairos"]["avg_latency_s"] > 0
