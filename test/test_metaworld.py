"""Meta-World as the study's second task family (issue 28 item 1): env + expert, demos the
trainer reads, a tiny train step, and closed-loop evaluation counting info["success"]."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.study.metaworld_task import metaworld_missing

_why = metaworld_missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


def test_env_is_deterministic_per_seed_and_conditions_on_the_task():
    from robotserve_ros.study.metaworld_task import ACTION_DIM, OBS_DIM, STATE_DIM, TASKS, MetaWorldEnv

    env = MetaWorldEnv(max_steps=5)
    a, b = env.reset(3), env.reset(3)
    assert a.shape == (STATE_DIM,) and np.array_equal(a, b)
    assert env.name == TASKS[3 % len(TASKS)] and a[OBS_DIM + 3] == 1.0 and a[OBS_DIM:].sum() == 1.0
    c = env.reset(3 + len(TASKS))  # same task, another placement
    assert env.name == TASKS[3 % len(TASKS)] and not np.array_equal(a[:OBS_DIM], c[:OBS_DIM])
    while not env.done:
        obs, info = env.step(np.ones(ACTION_DIM))
    assert env.steps == 5 and not info.success and not np.array_equal(obs[:3], c[:3])  # the hand moved
    env.close()


def test_every_expert_succeeds_and_success_comes_from_info():
    from robotserve_ros.study.metaworld_task import TASKS, MetaWorldEnv, run_expert

    env = MetaWorldEnv()
    for seed in range(len(TASKS)):
        states, actions, ok = run_expert(seed, env=env)
        assert ok, env.name
        # The episode ends at Meta-World's first info["success"], so it is shorter than the limit.
        assert len(states) == len(actions) < env.max_steps and np.abs(actions).max() <= 1.0
    env.close()


def test_collect_writes_demos_the_flow_trainer_reads(tmp_path):
    pytest.importorskip("torch")
    from robotserve_ros.study.collect import collect, load_demos, save_demos
    from robotserve_ros.study.metaworld_task import ACTION_DIM, STATE_DIM
    from robotserve_ros.study.train_flow import FlowTrainConfig, train_flow

    data = collect(5, seed=0, task="metaworld")
    save_demos(tmp_path / "d.npz", data)
    d = load_demos(tmp_path / "d.npz")
    assert d["task"] == "metaworld" and d["state"].shape[1] == STATE_DIM and d["action"].shape[1] == ACTION_DIM
    assert len(d["episode_len"]) == 5 and d["episode_len"].sum() == len(d["state"])
    info = train_flow(tmp_path / "d.npz", tmp_path / "pol", FlowTrainConfig(steps=3, batch_size=8, hidden=16, blocks=1,
                                                                              warmup=1), log=lambda *_: None)
    assert info["task"] == "metaworld" and np.isfinite(info["final_loss"])
    from robotserve_ros.study.commands import policy_task

    assert policy_task(tmp_path / "pol") == "metaworld"


def test_closed_loop_evaluation_counts_success_per_task(tmp_path):
    """The horizon study on Meta-World: a tiny random policy (it fails) and rows in the schema,
    with the task family and a per-task success."""
    pytest.importorskip("torch")
    from robotserve_ros.engines.flow_policy import build_net, save_flow_policy
    from robotserve_ros.study.horizon import StudyConfig, run_study
    from robotserve_ros.study.horizon_report import SCHEMA, merge_study, write_reports
    from robotserve_ros.study.metaworld_task import ACTION_DIM, STATE_DIM, TASKS

    net = {"task": "metaworld", "state_dim": STATE_DIM, "action_dim": ACTION_DIM, "chunk": 4, "hidden": 8,
           "blocks": 1, "num_steps": 2, "state_min": [-1.0] * STATE_DIM, "state_max": [1.0] * STATE_DIM,
           "action_min": [-1.0] * ACTION_DIM, "action_max": [1.0] * ACTION_DIM}
    pol = save_flow_policy(tmp_path / "flow", build_net(net), net)
    cfg = StudyConfig(static_h=(2,), thresholds=(), agree_tau=(0.2,), seeds=(0,), episodes=len(TASKS), max_steps=6,
                      profile_batches=(1, 2), task="metaworld")
    rows, meta = run_study(pol, cfg, log=lambda *_: None)
    assert meta["task_family"] == "metaworld" and [r["policy"] for r in rows] == ["static", "agreement"]
    for r in rows:
        assert r["task_family"] == "metaworld" and set(r["success_per_task"]) == set(TASKS)
        assert r["success"] == 0.0 and r["steps_per_episode"] == 6  # 6 random steps solve nothing
    assert rows[0]["mean_horizon"] == 2.0
    write_reports(rows, meta, tmp_path / "out" / "metaworld-flow-matching.json")
    merge_study(tmp_path / "out")
    import json

    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert [tuple(r) for r in data] == [SCHEMA] * 2 and (tmp_path / "out" / "fig11_metaworld.png").exists()


def test_success_is_sticky_and_ends_the_episode():
    """An episode is a success once info["success"] was true (Meta-World's AutoTerminateOnSuccess)."""
    from robotserve_ros.study.metaworld_task import MetaWorldEnv, expert

    env = MetaWorldEnv()
    obs = env.reset(0)  # reach
    pol = expert(env.name)
    while not env.done:
        obs, info = env.step(pol.get_action(obs[:39].astype(np.float64)))
    assert env.success() and info.success and env.done and env.steps < env.max_steps
    env.close()
