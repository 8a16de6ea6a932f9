"""Issue 39's RTC arms study (study/rtc_arms.py) and its multimodal task (study/viapoint.py):
the task's physics, the arms' invariants on the committed ViaPoint policy (a few short episodes),
and the statistics. CPU, no ROS."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from robotserve_ros.study import viapoint as vp
from robotserve_ros.study.rtc_arms import (Cell, adjust, cells_of, compare, holm, mcnemar_exact, run_cell,
                                           target_check)

SEEDS = list(range(vp.EVAL_SEED_BASE, vp.EVAL_SEED_BASE + 12))
CAP = int(vp.TIME_CAP_S * vp.CONTROL_HZ)


def test_viapoint_expert_acceleration_limit_and_collision():
    obs, act, ok = vp.run_expert(5)
    assert ok and len(obs) < vp.MAX_STEPS
    dv = np.linalg.norm(np.diff(obs[:, 2:4], axis=0), axis=1)
    assert dv.max() <= vp.A_MAX / vp.CONTROL_HZ + 1e-6  # the actuator's limit holds
    sides = {vp.draw_episode(s)[2] for s in range(40)}
    assert sides == {-1, 1}  # both modes occur
    b = vp.ViaPointBatch([1, 2])
    for _ in range(40):  # straight up into the obstacle
        b.step(np.array([[0.0, 1.0], [0.0, 1.0]]))
    assert b.collided.all() and not b.success.any()
    y = b.p[:, 1].copy()
    b.step(np.array([[0.0, 1.0], [0.0, 1.0]]))
    assert np.array_equal(b.p[:, 1], y)  # a finished episode stays as it is


@pytest.fixture(scope="module")
def engines():
    from robotserve_ros.study.rtc_arms import engine_for

    return {a: engine_for("viapoint", a, {}) for a in ("naive", "rtc_soft", "rtc_trained")}


def _run(engines, arm, d, s):
    eng = engines["naive" if arm in ("sync", "naive", "ensemble") else arm]
    return run_cell(eng, Cell("viapoint", arm, d, s), SEEDS, CAP, vp.CONTROL_HZ)


def test_sync_pauses_count_in_time_and_ensemble_is_naive_without_overlap(engines):
    a0, n0 = _run(engines, "sync", 0, 8), _run(engines, "naive", 0, 8)
    assert a0 == n0  # d = 0: nothing to wait for, the same noise: the same episodes
    s4, z4 = _run(engines, "sync", 4, 4), _run(engines, "sync", 0, 4)
    # The world waits: the same chunks and episodes as at d = 0, each round 4 steps (0.2 s) later.
    assert [a["success"] for a in s4] == [b["success"] for b in z4] and any(a["success"] for a in s4)
    for a, b in zip(s4, z4):
        if a["success"]:
            rounds = np.ceil(b["time_to_success_s"] * vp.CONTROL_HZ / 4 - 1e-9)
            assert a["time_to_success_s"] == pytest.approx(b["time_to_success_s"] + rounds * 4 / vp.CONTROL_HZ)
    # s = H - d: a chunk arrives as its predecessor ends, nothing overlaps, nothing is averaged.
    assert _run(engines, "ensemble", 4, 12) == _run(engines, "naive", 4, 12)
    with pytest.raises(ValueError, match="d <= s"):
        _run(engines, "rtc_soft", 6, 12)


def test_rtc_at_zero_delay_is_guided_and_the_trained_head_runs(engines):
    n0, r0 = _run(engines, "naive", 0, 8), _run(engines, "rtc_soft", 0, 8)
    assert any(a["jerks"] != b["jerks"] for a, b in zip(n0, r0))  # guided at d = 0: other commands
    t4 = _run(engines, "rtc_trained", 4, 4)
    assert len(t4) == len(SEEDS) and all(set(e) == {"seed", "success", "time_to_success_s", "jerks"} for e in t4)


def test_statistics():
    a = np.array([1] * 30 + [0] * 5 + [1] * 10, bool)
    b = np.array([0] * 30 + [1] * 5 + [1] * 10, bool)
    from scipy.stats import binomtest

    assert mcnemar_exact(a, b) == pytest.approx(binomtest(5, 35, 0.5).pvalue)
    assert mcnemar_exact(a, a) == 1.0
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    ea = [{"success": bool(x), "time_to_success_s": 2.0 + 0.01 * i if x else None} for i, x in enumerate(a)]
    eb = [{"success": bool(x), "time_to_success_s": 4.0 + 0.03 * i if x else None} for i, x in enumerate(b)]
    t = compare("viapoint", 16, 4, 4, "rtc_soft", "sync", ea, eb)
    assert t["co_solved"] == 10 and t["success_diff"] == pytest.approx(25 / 45)
    assert t["time_ratio_ci95"][0] <= t["time_ratio"] <= t["time_ratio_ci95"][1] < 1
    tests = [t, compare("viapoint", 16, 4, 4, "rtc_soft", "naive", ea, eb)]
    adjust(tests)
    assert all(x["target"] for x in tests) and tests[0]["mcnemar_p_holm"] >= tests[0]["mcnemar_p"]
    chk = target_check(tests)
    assert chk["met"] and chk["cells"][0]["vs_baseline"] and chk["cells"][0]["vs_sync_success"]
    slow = [dict(e, time_to_success_s=e["time_to_success_s"] and e["time_to_success_s"] * 2) for e in ea]
    tests = [compare("viapoint", 16, 4, 4, "rtc_soft", b, slow, eb) for b in ("sync", "naive")]
    adjust(tests)
    assert not target_check(tests)["met"] and not target_check(tests)["cells"][0]["vs_sync_time"]
    assert cells_of(16, [0, 6], ["naive"]) == [(0, 8, "naive"), (6, 6, "naive"), (6, 8, "naive"), (6, 10, "naive")]


def test_cli_refuses_bad_names_in_one_line():
    r = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "study", "rtc-arms", "--out", "/tmp/x",
                        "--tasks", "mujoco=3", "--frozen-commit", "HEAD"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--tasks 'mujoco=3'" in r.stderr and "Traceback" not in r.stderr


def test_training_time_rtc_trains_and_serves(tmp_path):
    from robotserve_ros.engines import make_engine
    from robotserve_ros.study.collect import collect, save_demos
    from robotserve_ros.study.train_flow import FlowTrainConfig, train_flow

    demos = save_demos(tmp_path / "d.npz", collect(3, task="viapoint"))
    info = train_flow(demos, tmp_path / "p", FlowTrainConfig(steps=20, batch_size=16, warmup=5, hidden=32, blocks=1,
                                                             prefix_max_delay=6), log=lambda *_: None)
    assert np.isfinite(info["final_loss"])
    eng = make_engine("flow", None, policy_dir=str(tmp_path / "p"))
    assert eng.prefix_cond and eng.cfg["prefix_max_delay"] == 6
