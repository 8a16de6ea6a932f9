"""The flow-matching action head behind the Engine role (engines/flow_engine.py): per-step Euler
updates sum to the chunk, batching does not change a row, self-consistency replicas draw other
noise, bad observations and checkpoints are refused clearly. Tiny random weights."""
from __future__ import annotations

import json

import numpy as np
import pytest

from robotserve_ros.core import InferenceRequest
from robotserve_ros.core.horizon import SelfConsistencyEngine, make_horizon_policy
from robotserve_ros.core.observation import BadObservation, Observation
from robotserve_ros.engines import make_engine


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from robotserve_ros.engines.flow_policy import build_net, save_flow_policy
    from robotserve_ros.engines.torch_env import import_torch

    torch = import_torch()
    torch.manual_seed(0)
    cfg = {"state_dim": 3, "action_dim": 2, "chunk": 6, "hidden": 16, "blocks": 1, "num_steps": 4,
           "state_min": [0, 0, 0], "state_max": [1, 1, 1], "action_min": [0, 0], "action_max": [10, 20]}
    return save_flow_policy(tmp_path_factory.mktemp("flow"), build_net(cfg), cfg)


def req(task, rnd=0, q=(0.1, 0.5, 0.9), sample=0):
    return InferenceRequest(task, rnd, observation=Observation(joints=np.array(q, np.float32)), sample=sample)


def test_updates_sum_to_the_chunk_and_batching_is_row_independent(policy_dir):
    eng = make_engine("flow", None, policy_dir=str(policy_dir), seed=3)
    one = eng.infer([req("a")])[0]
    assert one.actions.shape == (6, 2) and one.updates.shape == (4, 6, 2)
    x1 = one.initial_noise + one.updates.sum(0)
    assert np.allclose(eng.an.unnorm(x1), one.actions, atol=1e-4)
    both = eng.infer([req("b", q=(0.3, 0.3, 0.3)), req("a")])
    assert np.allclose(both[1].actions, one.actions, atol=1e-5)
    assert np.allclose(both[1].state, [0.1, 0.5, 0.9])


def test_replicas_draw_other_noise_and_self_consistency_engine_uses_them(policy_dir):
    eng = make_engine("flow", None, policy_dir=str(policy_dir), seed=3)
    a, b = eng.infer([req("a"), req("a", sample=1)])
    assert not np.allclose(a.initial_noise, b.initial_noise)
    sc = SelfConsistencyEngine(eng, k=2, saturation_batch=4)
    out = sc.infer([req("a"), req("b")])
    assert [len(r.samples) for r in out] == [1, 1] and sc.stats.extra_rows == 2  # 2 spare slots below 4
    assert np.allclose(out[0].samples[0], b.actions, atol=1e-5)
    h = make_horizon_policy("self_consistency", h_min=1).choose(out[0], 1e-6).horizon
    assert 1 <= h <= 6


def test_bad_observation_and_checkpoint_are_refused(policy_dir, tmp_path):
    eng = make_engine("flow", None, policy_dir=str(policy_dir))
    with pytest.raises(BadObservation, match="shape"):
        eng.infer([req("a", q=(1.0, 2.0))])
    with pytest.raises(BadObservation, match="non-finite"):
        eng.infer([req("a", q=(1.0, np.nan, 2.0))])
    with pytest.raises(ValueError, match="no config.json"):
        make_engine("flow", None, policy_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"type": "diffusion"}))
    with pytest.raises(ValueError, match="not a flow_matching"):
        make_engine("flow", None, policy_dir=str(tmp_path))


def test_sampled_engine_wraps_any_registered_engine(policy_dir):
    from robotserve_ros.core import EngineProfile

    prof = EngineProfile({1: 10.0, 4: 10.0, 8: 20.0})  # saturation batch 4
    eng = make_engine("sampled", prof, inner="flow", k=3, policy_dir=str(policy_dir))
    out = eng.infer([req("a"), req("b")])
    assert [len(r.samples) for r in out] == [1, 1] and eng.stats.rows == 4  # 2 spare slots up to 4
    with pytest.raises(ValueError, match="'inner': 'sampled' is not one of .* \\(what engine 'sampled' can wrap\\)"):
        make_engine("sampled", prof, inner="sampled")
