"""Seed 000 §3.1, Figure 7: the execution horizon from diffusion confidence, the static horizon,
and user-registered horizon policies (the "horizon policy" field of Figure 6)."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core import (
    HORIZON_POLICIES,
    ChunkResult,
    HorizonChoice,
    HorizonDecision,
    HorizonPolicy,
    InferenceRequest,
    make_horizon_policy,
    register_horizon_policy,
)
from robotserve_ros.core.errors import BadPolicyParam, UnknownPolicy
from robotserve_ros.core.horizon import ConfidenceHorizon, StaticHorizon, confidence_horizon

DIM = 2
EARLIER = [1.6, 0.9, 0.5]  # coarse-to-fine earlier-step update norms: mean exactly 1.0


def fig7_updates(final_norms) -> np.ndarray:
    """U of shape [steps=4, actions=len(final_norms), DIM]: every action's earlier steps have norms
    1.6, 0.9, 0.5 (mean 1.0); the final step's norm of action i is final_norms[i]. Vectors point
    along (0.6, 0.8), so a norm n is the vector (0.6 n, 0.8 n)."""
    direction = np.array([0.6, 0.8])
    u = np.zeros((len(EARLIER) + 1, len(final_norms), DIM))
    for a, final in enumerate(final_norms):
        for s, n in enumerate(EARLIER):
            u[s, a] = n * direction
        u[-1, a] = final * direction
    return u


# A1-A4 converged (tiny final update), A5's final update is 1.5x its earlier mean, A6's is 2x.
FIG7 = [0.1, 0.1, 0.1, 0.1, 1.5, 2.0]


def fig7_chunk(final_norms=FIG7) -> ChunkResult:
    n = len(final_norms)
    actions = np.arange(n * DIM, dtype=np.float32).reshape(n, DIM)
    return ChunkResult(actions, fig7_updates(final_norms))


def test_fig7_t40_gives_h4():
    """A5 is the first action whose final update exceeds (1 + 0.4) x its earlier mean: H = 4."""
    d = ConfidenceHorizon(t=0.4, h_min=1).choose(fig7_chunk())
    assert isinstance(d, HorizonDecision)
    assert d.horizon == 4
    assert "A5" in d.reason


def test_fig7_looser_threshold_keeps_more_actions():
    """t = 0.6: A5 (1.5x) is now within the threshold; A6 (2x) is the first to exceed it -> H = 5.
    t = 1.5: nothing exceeds -> the whole chunk."""
    assert ConfidenceHorizon(t=0.6, h_min=1).choose(fig7_chunk()).horizon == 5
    assert ConfidenceHorizon(t=1.5, h_min=1).choose(fig7_chunk()).horizon == 6
    # The client's knob overrides the server default per request.
    assert ConfidenceHorizon(t=0.4, h_min=1).choose(fig7_chunk(), param=0.6).horizon == 5


def test_fig7_h_min_raises_the_horizon():
    """H = max(H_thresh, H_min)."""
    d = ConfidenceHorizon(t=0.4, h_min=5).choose(fig7_chunk())
    assert d.horizon == 5
    assert "H_min=5" in d.reason
    assert ConfidenceHorizon(t=0.4, h_min=3).choose(fig7_chunk()).horizon == 4
    # H_min never returns more actions than the chunk has.
    assert ConfidenceHorizon(t=0.4, h_min=10).choose(fig7_chunk()).horizon == 6


def test_first_action_unconverged_gives_h_min():
    d = ConfidenceHorizon(t=0.4, h_min=1).choose(fig7_chunk([3.0, 0.1, 0.1]))
    assert d.horizon == 1


def test_no_exceeding_action_gives_chunk_length():
    d = ConfidenceHorizon(t=0.4, h_min=1).choose(fig7_chunk([0.1] * 6))
    assert d.horizon == 6
    assert "converged" in d.reason


def test_walk_stops_at_first_unconverged_even_if_later_ones_converge():
    """The robot executes in order: an unconverged A3 ends the prefix even though A4-A6 converged."""
    assert ConfidenceHorizon(t=0.4, h_min=1).choose(fig7_chunk([0.1, 0.1, 1.5, 0.1, 0.1, 0.1])).horizon == 2


def test_exceeds_is_strict():
    """An action exactly at (1 + t) x its earlier mean has not exceeded it."""
    u = np.zeros((3, 2, 1))
    u[:2, :, 0] = 1.0  # earlier mean 1.0
    u[2, 0, 0] = 1.5  # exactly (1 + 0.5) x 1.0
    u[2, 1, 0] = 1.75  # above
    assert confidence_horizon(u, 0.5) == (1, 1)
    assert confidence_horizon(u, 0.75) == (2, -1)


def test_missing_or_malformed_updates_fall_back_to_static():
    actions = np.zeros((6, DIM), np.float32)
    assert ConfidenceHorizon(t=0.4, h_min=3).choose(ChunkResult(actions)).horizon == 3
    d = ConfidenceHorizon(t=0.4, h_min=3, fallback_h=5).choose(ChunkResult(actions, None))
    assert d.horizon == 5
    assert "fallback" in d.reason
    assert ConfidenceHorizon(t=0.4, h_min=3, fallback_h=50).choose(ChunkResult(actions)).horizon == 6
    one_step = fig7_updates(FIG7)[-1:]  # a single step has no "earlier" mean
    assert ConfidenceHorizon(t=0.4, h_min=3).choose(ChunkResult(actions, one_step)).horizon == 3
    wrong_len = fig7_updates(FIG7[:5])  # updates for 5 actions, chunk has 6
    assert ConfidenceHorizon(t=0.4, h_min=3).choose(ChunkResult(actions, wrong_len)).horizon == 3


def test_confidence_param_and_constructor_checks():
    pol = ConfidenceHorizon()
    assert pol.check_param(None) is None
    assert pol.check_param(0.0) is None
    assert pol.check_param(0.4) is None
    assert pol.check_param(-0.85) is None  # (1 + t) > 0 is all the rule needs
    for bad in (-1.0, -1.5, float("nan"), float("inf")):
        assert pol.check_param(bad)
    with pytest.raises(ValueError):
        ConfidenceHorizon(t=-1.0)
    with pytest.raises(ValueError):
        ConfidenceHorizon(h_min=0)


def test_static_horizon_caps_at_chunk_length():
    chunk = ChunkResult(np.zeros((10, DIM), np.float32))
    assert StaticHorizon(h=5).choose(chunk).horizon == 5
    d = StaticHorizon(h=25).choose(chunk)
    assert d.horizon == 10
    assert "capped" in d.reason
    assert StaticHorizon(h=5).choose(chunk, param=7.0).horizon == 7
    assert StaticHorizon(h=5).choose(chunk, param=12.0).horizon == 10


def test_static_horizon_rejects_bad_param():
    pol = StaticHorizon()
    assert pol.check_param(None) is None
    assert pol.check_param(3.0) is None
    for bad in (0.0, -2.0, 2.5, float("nan"), float("inf")):
        assert pol.check_param(bad), bad
    with pytest.raises(ValueError):
        StaticHorizon(h=0)


def test_registry_knows_builtin_policies():
    assert {"static", "confidence"} <= set(HORIZON_POLICIES.names())
    assert isinstance(make_horizon_policy("static", h=3), StaticHorizon)
    with pytest.raises(KeyError):
        make_horizon_policy("no-such-policy")


class FirstNegative(HorizonPolicy):
    """A user policy: keep every action up to and including the first one whose value is negative
    in dimension 0 (capped at `cap`). Param: a cap override."""

    name = "first-negative"

    def __init__(self, cap: int = 100) -> None:
        self.cap = cap

    def check_param(self, param):
        if param is not None and param < 1:
            return "cap must be >= 1"
        return None

    def choose(self, result, param=None):
        cap = self.cap if param is None else int(param)
        neg = np.nonzero(result.actions[:, 0] < 0)[0]
        h = int(neg[0]) + 1 if len(neg) else len(result.actions)
        return HorizonDecision(min(h, cap), "user policy")


@pytest.fixture
def user_policy():
    name = "test-first-negative"
    register_horizon_policy(name, FirstNegative)
    yield name
    HORIZON_POLICIES._items.pop(name, None)  # keep the global registry as we found it


def test_register_horizon_policy_is_used_by_serving_core(make_core, user_policy):
    core, clock = make_core("fifo", horizon_params={user_policy: {"cap": 4}})
    core.submit(InferenceRequest("a", 0, horizon=HorizonChoice(user_policy)))
    core.submit(InferenceRequest("b", 0, horizon=HorizonChoice(user_policy, 2.0)))
    actions = np.ones((8, DIM), np.float32)
    actions[5, 0] = -1.0  # policy keeps A1..A6, the server-side cap param makes it 4
    d = core.dispatch()[0]
    clock.advance_to(1.0)
    (ra,) = core.complete(d, [ChunkResult(actions)])
    assert (ra.task_id, ra.horizon, ra.reason, ra.chunk_len) == ("a", 4, "user policy", 8)
    assert ra.actions.shape == (4, DIM)
    d = core.dispatch()[0]
    (rb,) = core.complete(d, [ChunkResult(actions)])
    assert rb.horizon == 2  # the client's own knob
    # The user policy's check_param guards requests too.
    with pytest.raises(BadPolicyParam):
        core.submit(InferenceRequest("c", 0, horizon=HorizonChoice(user_policy, 0.0)))
    # Names are unique: another factory cannot take the name over.
    with pytest.raises(ValueError):
        register_horizon_policy(user_policy, StaticHorizon)


def test_unregistered_policy_is_refused(make_core):
    core, _ = make_core("fifo")
    with pytest.raises(UnknownPolicy):
        core.submit(InferenceRequest("a", 0, horizon=HorizonChoice("test-not-registered")))
