"""SmolVLA real-time chunking through LeRobot 0.4.4's RTC processor, served per row (issue 28
item 2): LeRobot's prefix weights take one delay per batch, so the engine groups rows by
(d, leftover length); a row comes out as it would alone, guided rows are pulled to their
leftover, unguided rows are untouched by the processor being on. Tiny random-weight SmolVLA."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lerobot")

from lerobot_policies import make_policy_dir  # noqa: E402

from robotserve_ros.core.rtc import RtcGuide  # noqa: E402
from robotserve_ros.core.types import InferenceRequest  # noqa: E402
from robotserve_ros.engines import make_engine  # noqa: E402


@pytest.fixture(scope="module")
def smolvla(tmp_path_factory):
    return make_engine("lerobot", None, policy_dir=str(make_policy_dir("smolvla", tmp_path_factory.mktemp("sv") / "sv")))


def rows(eng, guides):
    rng = np.random.default_rng(0)
    obs = [eng.example_observation(rng) for _ in guides]
    return [InferenceRequest(f"robot_{i}", 1, observation=o, rtc=g) for i, (o, g) in enumerate(zip(obs, guides))]


def guide(eng, k, d, value):
    return RtcGuide(np.full((k, eng.action_dim), value, np.float32), delay_steps=d)


def test_smolvla_supports_rtc_and_other_policies_do_not(smolvla, tmp_path):
    assert smolvla.supports_rtc
    dp = make_engine("lerobot", None, policy_dir=str(make_policy_dir("diffusion", tmp_path / "dp")))
    assert not dp.supports_rtc
    (r,) = dp.infer(rows(dp, [guide(dp, 4, 2, 0.3)]))
    assert r.rtc_delay_steps is None  # unguided, and it says so


def test_batched_rows_with_different_d_equal_the_rows_run_alone(smolvla):
    guides = [guide(smolvla, 4, 2, 0.3), guide(smolvla, 4, 3, -0.2), None, guide(smolvla, 3, 2, 0.1)]
    batch = smolvla.infer(rows(smolvla, guides))
    assert [r.rtc_delay_steps for r in batch] == [2, 3, None, 2]
    for i, req in enumerate(rows(smolvla, guides)):
        (alone,) = smolvla.infer([req])
        np.testing.assert_allclose(batch[i].actions, alone.actions, atol=1e-5)
        np.testing.assert_allclose(batch[i].updates, alone.updates, atol=1e-5)


def test_a_guided_row_is_pulled_to_its_leftover_and_an_unguided_one_is_untouched(smolvla):
    free = smolvla.infer(rows(smolvla, [None, None]))
    guided = smolvla.infer(rows(smolvla, [guide(smolvla, 4, 2, 0.3), None]))
    err = lambda r: np.abs(r.actions[:2] - 0.3).mean()  # noqa: E731 - the frozen prefix vs the leftover
    assert err(guided[0]) < 0.5 * err(free[0]), (err(guided[0]), err(free[0]))
    np.testing.assert_allclose(guided[1].actions, free[1].actions, atol=1e-5)
    # the updates the horizon policies read are the guided steps: x_T + their sum is the chunk (normalized)
    norm = smolvla._action_norm._normalize_action
    chunk = norm(smolvla.torch.from_numpy(guided[0].actions), inverse=False).numpy()
    np.testing.assert_allclose(guided[0].initial_noise + guided[0].updates.sum(0), chunk, atol=1e-4)
