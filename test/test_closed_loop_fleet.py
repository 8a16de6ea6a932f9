"""The robot loop (core/robot_loop.py), the closed-loop virtual fleet (sim/closed_loop.py) and the
paired statistics of its study (bench/paired_stats.py) — issue 34."""
from __future__ import annotations

import math

import numpy as np
import pytest

from robotserve_ros.core.robot_loop import RobotLoop


class _Counter:
    """A robot whose queue is a count of actions; the task is over after `length` actions."""

    def __init__(self, length: int) -> None:
        self.queued = self.executed = 0
        self.length = length

    def execute(self) -> bool:
        if self.queued:
            self.queued -= 1
            self.executed += 1
            return True
        return False

    def left(self) -> int:
        return self.queued

    def task_over(self) -> bool:
        return self.executed >= self.length

    def needs_more(self) -> bool:
        return self.executed + self.queued < self.length


def test_robot_loop_triggers_holds_and_finishes():
    hz = 10.0
    lp = RobotLoop("r", hz, trigger=2, resend_after_s=100.0)
    bot = _Counter(length=6)
    assert lp.tick(0.0, bot) == (False, "send")  # nothing queued: ask at once; not idle before the first send
    assert lp.idle == 0.0 and lp.exec_info(bot) is None  # round 0 carries no execution info
    lp.sent(0.0)
    assert lp.tick(0.1, bot) == (False, None)  # waiting: holds, the tick is idle
    assert lp.idle == pytest.approx(0.1) and lp.held == 1
    bot.queued = 4
    lp.answered(0.15)
    assert lp.round == 1 and lp.chunks == 1 and lp.exec_start == 0.15
    assert lp.tick(0.2, bot) == (True, None)  # 3 left > trigger 2
    assert lp.tick(0.3, bot) == (True, "send")  # 2 left: the trigger point
    info = lp.exec_info(bot)
    assert (info.exec_start, info.actions_left, info.control_hz) == (0.15, 2, hz)
    lp.sent(0.3)
    bot.queued += 2
    lp.answered(0.35)
    events = [lp.tick(0.4 + 0.1 * k, bot)[1] for k in range(4)]
    assert events[-1] == "finished" and lp.done and lp.steps == 6
    assert "send" not in events  # the queue finishes the task: no round it does not need
    lp.next_task(1.0)
    assert lp.task_id == "r/task1" and lp.round == 0 and lp.idle == 0.0 and not lp.done


def test_robot_loop_resends_a_late_round_with_backoff_and_retries_after_refusal():
    lp = RobotLoop("r", 10.0, trigger=0, resend_after_s=1.0, request_timeout_s=2.5)
    bot = _Counter(length=5)
    assert lp.tick(0.0, bot)[1] == "send"
    lp.sent(0.0)
    assert lp.tick(0.9, bot)[1] is None
    assert lp.tick(1.1, bot)[1] == "send"  # re-send of the same round
    assert lp.round == 0
    lp.sent(1.1)
    assert lp.tick(2.0, bot)[1] is None  # the interval doubled: 2 s after the re-send
    assert lp.tick(2.6, bot)[1] == "overdue"  # said once
    assert lp.tick(2.7, bot)[1] is None
    lp.refused(3.0)
    assert lp.tick(3.1, bot)[1] is None  # retry_s (0.2 s) not passed
    assert lp.tick(3.25, bot)[1] == "send"


def test_robot_loop_restart_keeps_the_motion():
    lp = RobotLoop("r", 10.0, trigger=1)
    bot = _Counter(length=9)
    lp.tick(0.0, bot)
    lp.sent(0.0)
    lp.tick(0.1, bot)
    lp.restart(0.2)
    assert lp.task_id == "r/task1" and lp.continued == 1 and lp.round == 0
    assert lp.task_start == 0.0 and lp.idle == pytest.approx(0.1)  # the same motion goes on


# --- paired statistics on crafted data --------------------------------------------------------------
@pytest.fixture
def ps():
    pytest.importorskip("scipy", reason="the study's statistics use scipy (installed with metaworld)")
    from robotserve_ros.bench import paired_stats

    return paired_stats


def _rows(success, times):
    return {s: (bool(ok), float(t) if ok else None) for s, (ok, t) in enumerate(zip(success, times))}


def test_mcnemar_is_the_exact_binomial_of_the_discordant_pairs(ps):
    a = _rows([1] * 10 + [1] * 20, [1.0] * 30)
    b = _rows([0] * 10 + [1] * 20, [1.0] * 30)
    assert ps.mcnemar_p(a, b) == pytest.approx(2 * 0.5 ** 10)
    assert ps.mcnemar_p(a, a) == 1.0
    c = _rows([1, 0, 1, 0], [1.0] * 4)
    d = _rows([0, 1, 0, 1], [1.0] * 4)
    assert ps.mcnemar_p(c, d) == pytest.approx(1.0)  # 2 vs 2 discordant: no evidence either way


def test_paired_bootstrap_reduction_and_its_ci(ps):
    rng = np.random.default_rng(1)
    base_t = rng.uniform(1.0, 3.0, 200)
    base = _rows([1] * 200, base_t)
    faster = _rows([1] * 200, 0.7 * base_t * rng.uniform(0.95, 1.05, 200))
    r = ps.reduction(faster, base)
    assert r["co_solved"] == 200
    assert 0.25 < r["reduction"] < 0.35 and r["ci95"][0] > 0.25 and r["ci95"][1] < 0.35
    same = ps.reduction(_rows([1] * 200, base_t + rng.normal(0, 0.2, 200)), base)
    assert same["ci95"][0] < 0 < same["ci95"][1]  # no difference: the CI holds 0
    # only co-solved episodes count: a row's unsolved episode drops that pair
    part = _rows([1] * 100 + [0] * 100, 0.5 * base_t)
    assert ps.reduction(part, base)["co_solved"] == 100
    assert ps.reduction(part, base)["reduction"] == pytest.approx(0.5)


def test_restricted_mean_counts_failures_at_the_cap(ps):
    row = _rows([1, 1, 0, 1], [1.0, 2.0, 0.0, 30.0])
    assert ps.restricted_mean(row, cap_s=10.0) == pytest.approx((1 + 2 + 10 + 10) / 4)


def test_baseline_is_the_fastest_static_row_not_significantly_worse(ps):
    n = 100
    t = np.linspace(1.0, 2.0, n)
    static = {
        "static H=1": _rows([1] * n, 3.0 * t),  # best success, slowest
        "static H=4": _rows([1] * 95 + [0] * 5, 1.5 * t),  # 5 discordant: p = 0.0625, still eligible
        "static H=16": _rows([1] * 80 + [0] * 20, 1.0 * t),  # fastest but significantly worse (p ~ 2e-6)
    }
    pick = ps.pick_baseline(static)
    assert pick["best"] == "static H=1"
    assert pick["p_vs_best"]["static H=16"] < 0.05 <= pick["p_vs_best"]["static H=4"]
    assert pick["eligible"] == ["static H=1", "static H=4"]
    assert pick["baseline"] == "static H=4"
    assert pick["co_solved_by_eligible"] == 95


# --- the closed-loop fleet on real Meta-World physics and the trained policy ---------------------------
def _metaworld_or_skip():
    from robotserve_ros.study.metaworld_task import metaworld_missing

    why = metaworld_missing()
    if why:
        pytest.skip(why)
    pytest.importorskip("torch")


@pytest.fixture(scope="module")
def policy():
    _metaworld_or_skip()
    from robotserve_ros.sim.closed_loop import POLICY_DIR, load_policy
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return load_policy(str(root / POLICY_DIR))


class _Counting:
    """The policy engine, counting the rows it computes (the fleet must run every batch for real)."""

    def __init__(self, engine) -> None:
        self.engine, self.rows, self.calls = engine, 0, 0

    def infer(self, batch):
        self.rows += len(batch)
        self.calls += 1
        return self.engine.infer(batch)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_closed_loop_fleet_runs_real_episodes_through_the_core_and_is_deterministic(policy):
    from robotserve_ros.core.runner import Runner
    from robotserve_ros.sim.closed_loop import ClosedLoopFleet, EnvPool, FleetConfig

    cfg = FleetConfig(robots=3, profile="gpu_like", scheduler="remaining", horizon="agreement", param=0,
                      episodes=2, max_steps=40)
    pool = EnvPool(cfg.max_steps)
    eng = _Counting(policy)
    fleet = ClosedLoopFleet(cfg, eng, pool)
    from robotserve_ros.serve import Fleet

    assert type(fleet.fleet) is Fleet and type(fleet.fleet._runner) is Runner  # the production serving port
    res = fleet.run()
    assert len(res.episodes) == 6
    assert sorted(e.seed for e in res.episodes) == sorted(
        fleet_seed for i in range(3) for fleet_seed in (30_000_000 + 101 * i, 30_000_000 + 101 * i + 1))
    for e in res.episodes:
        assert 0 < e.steps <= 40 and e.rounds > 0
        assert e.success == (e.time_to_success_s is not None)
        if e.success:
            assert 0 < e.time_to_success_s <= e.duration_s + 1e-9
    # every dispatched row was computed by the policy, from the robots' observations at dispatch
    st = fleet.fleet.core.stats
    assert eng.rows >= st.completed > 0 and eng.calls >= 1
    assert st.refreshes > 0 and st.obs_age_max == 0.0
    assert res.batches > 0 and 0 < res.engine_busy_s <= res.makespan_s + 1e-9
    # robots done with their scored episodes kept running unscored ones: the fleet stayed at 3
    assert sum(r.unscored_k for r in fleet.robots) >= 1 and all(r.scored_k == 2 for r in fleet.robots)
    # the same configuration again, on reused envs: the same episodes, to the bit
    again = ClosedLoopFleet(cfg, policy, pool).run()
    assert [(e.seed, e.success, e.time_to_success_s, e.steps, e.rounds) for e in again.episodes] == \
        [(e.seed, e.success, e.time_to_success_s, e.steps, e.rounds) for e in res.episodes]
    assert again.makespan_s == res.makespan_s


def test_closed_loop_fleet_static_horizon_trims_every_chunk(policy):
    from robotserve_ros.sim.closed_loop import ClosedLoopFleet, FleetConfig

    cfg = FleetConfig(robots=2, profile="cpu", scheduler="fifo", horizon="static", param=3, episodes=1, max_steps=30)
    fleet = ClosedLoopFleet(cfg, policy)
    res = fleet.run()
    assert res.trigger == math.ceil(fleet.profile.latency_s(2) * 80 - 1e-9)
    for e in res.episodes:
        assert e.steps <= 3 * e.rounds  # never more than H actions a round


class _Guided(_Counting):
    """The policy engine, keeping per guided row how far its first d actions are from the leftover, and how
    far the same row generated without the guide would be (the same noise: seeded by task and round)."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.guided, self.unguided_rows, self.err, self.free_err = 0, 0, [], []

    def infer(self, batch):
        out = super().infer(batch)
        rows = [i for i, q in enumerate(batch) if q.rtc is not None and q.rtc.delay_steps]
        self.unguided_rows += len(batch) - sum(q.rtc is not None for q in batch)
        if rows:
            from dataclasses import replace

            free = self.engine.infer([replace(q, rtc=None) for q in batch])
            for i in rows:
                g, res = batch[i].rtc, out[i]
                assert res.rtc_delay_steps == g.delay_steps <= len(g.leftover)
                d = g.delay_steps
                self.err.append(float(np.abs(res.actions[:d] - g.leftover[:d]).mean()))
                self.free_err.append(float(np.abs(free[i].actions[:d] - g.leftover[:d]).mean()))
            self.guided += len(rows)
        return out


def test_closed_loop_robots_with_rtc_get_chunks_whose_prefix_follows_their_leftover(policy):
    from robotserve_ros.sim.closed_loop import ClosedLoopFleet, FleetConfig

    kw = dict(robots=3, profile="cpu", scheduler="fifo", horizon="static", param=8, episodes=1, max_steps=40)
    eng = _Guided(policy)
    fleet = ClosedLoopFleet(FleetConfig(**kw, rtc=True), eng)
    res = fleet.run()
    assert res.config.horizon_label == "static H=8 + rtc"
    # every round after the first carried the robot's leftover; the server set d at dispatch, the engine
    # inpainted with it, and the robots spliced the chunks at d
    assert eng.guided > 0 and res.rtc["robots"] == 3 and res.rtc["guided"] > 0
    assert res.rtc["unguided"] <= sum(r.scored_k + r.unscored_k for r in fleet.robots)  # round 0s: nothing left yet
    assert all(d >= 0 for d in res.rtc["delays"]) and sum(res.rtc["delays"].values()) == res.rtc["guided"]
    # the frozen prefix follows the leftover (the paper form pulls a trained head gently: 0.055 vs 0.095 here)
    assert np.mean(eng.err) < 0.75 * np.mean(eng.free_err)
    # the same fleet without RTC: no guide reaches the engine, nothing is accounted
    off = _Guided(policy)
    plain = ClosedLoopFleet(FleetConfig(**kw), off).run()
    assert off.guided == 0 and off.unguided_rows == off.rows and plain.rtc == {}
    assert plain.config.horizon_label == "static H=8"


def test_study_report_names_the_baseline_and_what_did_not_run(policy, tmp_path):
    from robotserve_ros.bench import fleet_closed as fc

    runs = fc.run_study([(2, "gpu_like")], episodes=2, seed=0, runs_path=tmp_path / "runs.jsonl",
                        max_wall_s=math.inf, log=lambda *_: None, rtc=True)
    # 8 static rows, then the execution-aware ones, then the RTC rows
    n_rtc = len(fc.RTC_ROWS)
    assert len(runs) == len(fc.STATIC_H) + 8 + n_rtc
    again = fc.run_study([(2, "gpu_like")], episodes=2, seed=0, runs_path=tmp_path / "runs.jsonl", log=lambda *_: None,
                         rtc=True)
    assert len(again) == len(runs)  # resumable: nothing runs twice
    paths = fc.write_report(runs, tmp_path / "out", {"episodes_per_row": 2}, [(2, "gpu_like"), (5, "cpu")], 2, 0, True)
    import json

    rep = json.loads(paths[0].read_text())
    rtc = [r for r in rep["rows"] if "rtc" in r]
    assert len(rtc) == n_rtc and all(r["horizon"].endswith(" + rtc") for r in rtc)
    assert {r["scheduler"] for r in rtc} == {s for s, _, _ in fc.RTC_ROWS}
    for r in rtc:  # the delays the fleet's dispatcher set, and the row against its plain twin where it has one
        assert r["rtc"]["guided"] > 0 and r["rtc"]["d_p50"] is not None
        if ", trigger " in r["horizon"]:  # s = d: the whole chunk, the next round once ~d of it ran
            assert r["horizon"].startswith("static H=16, trigger ") and "vs_plain" not in r["rtc"]
            assert r["actions_per_round"] < 16 / 2
            continue
        assert r["rtc"]["vs_plain"] in {f"{x['scheduler']} + {x['horizon']}" for x in rep["rows"] if "rtc" not in x}
        assert 0 <= r["rtc"]["mcnemar_p_vs_plain"] <= 1
    assert "## Real-time chunking rows" in paths[1].read_text()
    assert not any(r["baseline"] for r in rtc)  # the baseline is picked among plain static rows only
    assert rep["primary"]["result"] == "not run"  # the primary regime (100 robots) is not among these
    assert {"robots": 5, "profile": "cpu", "rows": "all"} in rep["not_run"]
    base = [r for r in rep["rows"] if r["baseline"]]
    assert len(base) == 1 and base[0]["scheduler"] == "fifo" and base[0]["horizon"].startswith("static H=")
    assert set(rep["episodes"][0]) == {"robots", "profile", "scheduler", "horizon", "seed", "task", "success",
                                       "time_to_success_s"}
    assert len(rep["episodes"]) == (16 + n_rtc) * 2


@pytest.mark.parametrize("argv,names", [
    (["study", "fleet-closed", "--profiles", "nosuch"], ["--profiles", "nosuch", "gpu_like"]),
    (["study", "fleet-closed", "--robots", "0"], ["--robots", "0"]),
    (["study", "fleet-closed", "--episodes", "-3"], ["--episodes", "-3"]),
    (["study", "fleet-closed", "--live-demo", "/no/such/dir"], ["--live-demo", "/no/such/dir", "live_demo.json"]),
])
def test_fleet_closed_cli_refuses_a_wrong_value_in_one_line(argv, names, capsys):
    from robotserve_ros.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert all(n in err for n in names), err


def test_engine_profiles_are_the_fixed_curves():
    from robotserve_ros.sim.closed_loop import engine_profile

    g = engine_profile("gpu_like")
    assert g.latency_ms(1) == pytest.approx(28.0) and g.latency_ms(32) == pytest.approx(28.0 * (1 + 0.08 * 31))
    assert g.saturation_batch == 32
    assert engine_profile("cpu").saturation_batch == 32
    with pytest.raises(ValueError, match="gpu_like"):
        engine_profile("a100")
