"""PushGust (pymunk) task, expert, demo collection, and the horizon study's runner (seed 000 §5.2)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from robotserve_ros.study.collect import collect, load_demos, save_demos
from robotserve_ros.study.pushgust import ACTION_DIM, STATE_DIM, PushGustEnv, expert_action, run_expert


def rollout(seed: int, actions) -> np.ndarray:
    env = PushGustEnv()
    out = [env.reset(seed)]
    for a in actions:
        out.append(env.step(a)[0])
    return np.stack(out)


def test_env_is_deterministic_per_seed_and_physics_moves_things():
    acts = [np.array([256.0, 256.0])] * 15
    a, b, c = rollout(3, acts), rollout(3, acts), rollout(4, acts)
    assert a.shape == (16, STATE_DIM) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[0], c[0])  # another seed, another arena
    # The PD controller drives the agent towards the commanded target.
    assert np.linalg.norm(a[-1, :2] - 256.0) < 0.3 * np.linalg.norm(a[0, :2] - 256.0)


def test_pushing_moves_the_puck_and_gusts_blow_only_in_the_band():
    env = PushGustEnv()
    obs = env.reset(0)
    puck0 = obs[2:4].copy()
    for _ in range(40):
        obs, _ = env.step(expert_action(obs))
    assert np.linalg.norm(obs[2:4] - puck0) > 20  # contact through Chipmunk moved it
    # A puck parked in the calm region is never kicked; in the band it is, sometimes.
    env.reset(1)
    env.puck.position = (256.0, 450.0)
    assert not any(env.step(env.observe()[:2])[1].gust for _ in range(40))
    env.reset(1)
    gusts = 0
    for _ in range(40):
        env.puck.position, env.puck.velocity = (256.0, 260.0), (0.0, 0.0)
        gusts += env.step(env.observe()[:2])[1].gust
    assert 0 < gusts < 40


def test_expert_succeeds_on_most_seeds():
    results = [run_expert(s) for s in range(10)]
    assert sum(ok for _, _, ok in results) >= 8
    obs, act, _ = results[0]
    assert obs.shape[1] == STATE_DIM and act.shape == (len(obs), ACTION_DIM)


def test_collect_writes_the_expected_arrays(tmp_path):
    path = save_demos(tmp_path / "d.npz", collect(3, seed=5))
    d = load_demos(path)
    n = d["episode_len"].sum()
    assert d["state"].shape == (n, STATE_DIM) and d["action"].shape == (n, ACTION_DIM)
    assert d["state"].dtype == np.float32 and d["action"].dtype == np.float32
    assert len(d["episode_seed"]) == 3 and int(d["attempts"]) >= 3
    assert np.array_equal(np.bincount(d["episode_index"]), d["episode_len"])
    # Frames are the expert's own: replaying episode 0's seed gives the same first episode.
    obs, act, _ = run_expert(int(d["episode_seed"][0]))
    np.testing.assert_array_equal(d["state"][: len(obs)], obs)
    np.testing.assert_array_equal(d["action"][: len(act)], act)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """A barely trained, tiny DiffusionPolicy written the way `robotserve study train` writes one."""
    pytest.importorskip("torch")
    from robotserve_ros.study.train import TrainConfig, train

    root = tmp_path_factory.mktemp("study")
    demos = save_demos(root / "d.npz", collect(2, seed=1))
    cfg = TrainConfig(steps=2, batch_size=8, warmup=1, horizon=8, n_action_steps=8, down_dims=(8, 16), kernel_size=3,
                      n_groups=2, diffusion_step_embed_dim=8, num_train_timesteps=10, num_inference_steps=3)
    train(demos, root / "policy", cfg, log=lambda *_: None)
    return root / "policy"


def test_horizon_study_writes_the_schema_with_consistent_numbers(tiny_policy, tmp_path):
    from robotserve_ros.sim.workload import load_workload
    from robotserve_ros.study.horizon import StudyConfig, run_study
    from robotserve_ros.study.horizon_report import write_reports

    cfg = StudyConfig(static_h=(3,), thresholds=(0.5,), seeds=(0,), episodes=2, max_steps=10, profile_batches=(1, 2))
    rows, meta = run_study(tiny_policy, cfg, log=lambda *_: None)
    out = tmp_path / "hs.json"
    write_reports(rows, meta, out, workload_out=tmp_path / "wl.json")
    data = json.loads(out.read_text())
    assert isinstance(data, list) and [r["policy"] for r in data] == ["static", "confidence"]
    for r in data:
        assert {"policy", "param", "episodes", "success", "mean_horizon", "rounds_per_episode"} <= set(r)
        assert r["episodes"] == 2 == len(r["rounds"]) == len(r["episode_success"])
        flat = [n for ep in r["rounds"] for n in ep]
        assert r["mean_horizon"] == pytest.approx(np.mean(flat))
        assert r["rounds_per_episode"] == pytest.approx(np.mean([len(ep) for ep in r["rounds"]]))
        assert r["success"] == pytest.approx(np.mean(r["episode_success"]))
        assert all(1 <= n <= meta["chunk"] for n in flat)
        for ep, ok in zip(r["rounds"], r["episode_success"]):
            assert sum(ep) <= 10 and (ok or sum(ep) == 10)  # a failed episode ran to the step limit
    static = data[0]
    assert static["param"] == 3
    for ep in static["rounds"]:  # every round H, except a final partial one
        assert all(n == 3 for n in ep[:-1]) and 1 <= ep[-1] <= 3
    assert data[1]["param"] == 0.5 and all(n >= cfg.confidence_h_min for ep in data[1]["rounds"] for n in ep[:-1])
    assert (tmp_path / "hs.md").read_text().count("| static |") == 1
    assert (tmp_path / "hs.png").stat().st_size > 0
    w = load_workload(tmp_path / "wl.json")
    assert len(w.tasks) == 2 and set(w.batch_latency_ms) == {1, 2}
    assert [list(t.rounds["static"]) for t in w.tasks] == static["rounds"]
    assert [list(t.rounds["dynamic"]) for t in w.tasks] == data[1]["rounds"]


def test_measured_workload_is_registered_and_seeded():
    from robotserve_ros.sim.workloads import MEASURED, builtin_workload, measured_names

    for name in measured_names():
        if not MEASURED[name].exists():
            pytest.skip(f"{MEASURED[name]} not written yet (robotserve study horizon --workload-out)")
        a = builtin_workload(name)
        assert a == builtin_workload(name) and a.tasks
        b = builtin_workload(name, seed=1, tasks=50)
        assert len(b.tasks) == 50 and len({t.id for t in b.tasks}) == 50
        assert {t.rounds["static"] for t in b.tasks} <= {t.rounds["static"] for t in a.tasks}


def test_study_runs_every_horizon_policy_and_writes_the_issue_schema(tmp_path):
    """Issue 11: static, confidence, schedule, self-consistency and learned rows on a tiny random
    flow-matching head; study.json has exactly the issue's keys; extra samples are counted."""
    pytest.importorskip("torch")
    from robotserve_ros.engines.flow_policy import build_net, save_flow_policy
    from robotserve_ros.study.horizon import StudyConfig, run_study
    from robotserve_ros.study.horizon_report import SCHEMA, merge_study, write_reports

    cfg_net = {"state_dim": STATE_DIM, "action_dim": ACTION_DIM, "chunk": 6, "hidden": 16, "blocks": 1,
               "num_steps": 3, "state_min": [0.0] * STATE_DIM, "state_max": [512.0] * STATE_DIM,
               "action_min": [0.0, 0.0], "action_max": [512.0, 512.0]}
    pol = save_flow_policy(tmp_path / "flow", build_net(cfg_net), cfg_net)
    cfg = StudyConfig(static_h=(2, 4), thresholds=(0.0,), schedule_t=(0.5,), sc_tau=(5.0,), sc_k=2,
                      robots_per_batch=2, learned_scale=(1.0,), label_episodes=2, seeds=(0, 1), episodes=2,
                      max_steps=12, profile_batches=(1, 2, 4, 8))
    rows, meta = run_study(pol, cfg, log=lambda *_: None, learned_out=tmp_path / "h.npz")
    assert [r["policy"] for r in rows] == ["static", "static", "confidence", "schedule", "self_consistency", "learned"]
    assert (tmp_path / "h.npz").exists() and meta["learned_labels"]["rounds"] > 0
    sat = meta["self_consistency"]["saturation_batch"]
    for r in rows:
        lo, hi = r["success_ci95"]
        assert 0 <= lo <= r["success"] <= hi <= 1 and r["episodes"] == 4 and r["seeds"] == 2
        if r["policy"] != "self_consistency":
            assert r["batch_rows_per_round"] == 1.0
        elif sat >= 6:  # two robots per batch, two extras each fit below saturation
            assert r["batch_rows_per_round"] == pytest.approx(3.0)
        else:  # fewer spare slots: fewer extras
            assert 1.0 <= r["batch_rows_per_round"] <= 3.0  # at most k = 2 extras each
    write_reports(rows, meta, tmp_path / "out" / "pushgust-flow-matching.json")
    paths = merge_study(tmp_path / "out")
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert len(data) == len(rows) and all(tuple(r) == SCHEMA for r in data)
    assert (tmp_path / "out" / "fig11_pushgust.png") in paths


def test_study_fleet_compares_kairos_and_fifo_on_a_measured_workload(capsys):
    from robotserve_ros.cli import main
    from robotserve_ros.bench.study_fleet import markdown, run_fleet_check
    from robotserve_ros.sim.workloads import MEASURED

    if not MEASURED["pushgust-flow-matching"].exists():
        pytest.skip("measured workload not written yet (robotserve study workload)")
    data = run_fleet_check(["pushgust-flow-matching"], seeds=(0,), tasks=30, robots=10, log=lambda *_: None)
    wd = data["workloads"]["pushgust-flow-matching"]
    for key in ("peak", "robots"):
        d = wd[key]
        if key == "peak":
            assert d["FIFO"]["tasks"] == d["Kairos"]["tasks"] == 30
        want = (d["FIFO"]["avg_latency_s"] - d["Kairos"]["avg_latency_s"]) / d["FIFO"]["avg_latency_s"]
        assert d["kairos_vs_fifo_avg"] == pytest.approx(want)
        assert d["Kairos"]["rounds"] < d["FIFO"]["rounds"]  # the dynamic horizon's rounds are fewer on this workload
    assert "pushgust-flow-matching | peak load" in markdown(data)
    assert main(["study", "fleet", "--workloads", "nope"]) == 2
    assert "--workloads 'nope' is not a measured workload" in capsys.readouterr().err
