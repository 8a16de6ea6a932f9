"""Issue 11's horizon plug-ins: schedule-normalised confidence, batch self-consistency, learned
horizon (seed 000 §2.2, §3.1). Contracts: H within [H_min, chunk], the same H for the same
inputs, a clear error for malformed updates; self-consistency rows never exceed the saturation
batch; the §2.2 labels procedure on a hand-made trajectory."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core import ChunkResult, EngineProfile, InferenceRequest, make_horizon_policy
from robotserve_ros.core.engine import Engine
from robotserve_ros.core.horizon import BadUpdates, LearnedHorizon
from robotserve_ros.core.horizon.learned import HorizonModel, horizon_features, round_optimal_horizon, trajectory_cosine
from robotserve_ros.core.horizon.schedule import schedule_normalised_ratio
from robotserve_ros.core.horizon.self_consistency import SelfConsistencyEngine, extra_sample_plan, sample_spread

N, DIM, STEPS = 8, 2, 5


def chunk(seed=0, updates=True, samples=0, spread_from=None):
    rng = np.random.default_rng(seed)
    acts = np.cumsum(rng.normal(0, 1, (N, DIM)), 0)
    u = rng.normal(0, 1, (STEPS, N, DIM)) * np.array([3, 2, 1, 0.5, 0.1])[:, None, None] if updates else None
    s = None
    if samples:
        s = np.repeat(acts[None], samples, 0) + rng.normal(0, 0.01, (samples, N, DIM))
        if spread_from is not None:
            s[:, spread_from:] += rng.normal(0, 5, (samples, N - spread_from, DIM))
    return ChunkResult(acts, u, state=rng.normal(0, 1, 4), samples=s)


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(1)
    rs = [chunk(i) for i in range(40)]
    x = np.stack([horizon_features(r, STEPS) for r in rs])
    y = rng.integers(1, N + 1, len(rs)).astype(float)
    return HorizonModel.fit(x, y, hidden=8, epochs=200, steps=STEPS)


def policies(model):
    return [
        (make_horizon_policy("schedule", h_min=2), [-0.5, 0.0, 0.5, 3.0], chunk(0)),
        (make_horizon_policy("self_consistency", h_min=2), [0.05, 1.0, 100.0], chunk(0, samples=3, spread_from=5)),
        (make_horizon_policy("learned", model=model, h_min=2), [0.1, 1.0, 5.0], chunk(0)),
        (make_horizon_policy("agreement", h_min=2), [0.5, 5.0, 50.0], chunk(0)),
    ]


def test_h_within_bounds_and_deterministic(model):
    for pol, params, res in policies(model):
        for p in params:
            hs = {pol.choose(res, p).horizon for _ in range(3)}
            assert len(hs) == 1, (pol.name, p, hs)  # the same H for the same chunk
            h = hs.pop()
            assert 2 <= h <= N, (pol.name, p, h)


def test_malformed_updates_are_refused_with_a_clear_error(model):
    bad_shape = chunk(0)
    bad_shape.updates = bad_shape.updates[:, :3]
    nan = chunk(0)
    nan.updates[2, 1, 0] = np.nan
    for pol in (make_horizon_policy("schedule"), make_horizon_policy("learned", model=model)):
        with pytest.raises(BadUpdates, match="updates must be"):
            pol.choose(bad_shape)
        with pytest.raises(BadUpdates, match="non-finite"):
            pol.choose(nan)
    sc = make_horizon_policy("self_consistency")
    bad = chunk(0, samples=2)
    bad.samples = bad.samples[:, :3]
    with pytest.raises(BadUpdates, match="samples must be"):
        sc.choose(bad)
    assert sc.check_param(0) and sc.check_param(float("nan")) and sc.check_param(2.0) is None


def test_schedule_normalisation_removes_the_schedule():
    # Every action follows the schedule (norms 4, 2, 1, 0.5, 0.1 per step) except A6, which still
    # moves 10x the schedule at the last step: raw ratios are all small, normalised ones are ~1.
    sched = np.array([4, 2, 1, 0.5, 0.1])
    u = np.zeros((STEPS, N, DIM))
    u[..., 0] = sched[:, None]
    u[-1, 5, 0] = 1.0
    r = schedule_normalised_ratio(u)
    assert np.allclose(np.delete(r, 5), 1.0)
    assert r[5] > 5
    res = ChunkResult(np.zeros((N, DIM)), u)
    assert make_horizon_policy("schedule", h_min=1).choose(res, 0.5).horizon == 5
    # No updates (ACT): the static fallback, not an error.
    assert make_horizon_policy("schedule", fallback_h=3).choose(ChunkResult(np.zeros((N, DIM)))).horizon == 3


def test_self_consistency_cuts_where_samples_disagree():
    res = chunk(0, samples=3, spread_from=5)
    spread = sample_spread(res.actions, res.samples)
    assert spread[:5].max() < 0.1 < spread[5:].min()
    assert make_horizon_policy("self_consistency", h_min=1).choose(res, 1.0).horizon == 5
    # A request that got no extra sample (full batch) falls back.
    assert make_horizon_policy("self_consistency", fallback_h=2).choose(chunk(0), 1.0).horizon == 2


def test_extra_samples_fill_only_spare_slots():
    for n in range(1, 40):
        for k in (1, 2, 3, 7):
            for sat in (1, 4, 8, 16, 32):
                plan = extra_sample_plan(n, k, sat)
                assert len(plan) == n and all(0 <= m <= k for m in plan)
                assert n + sum(plan) <= max(sat, n)  # never past saturation (none added once at/over it)
                assert sum(plan) == min(k * n, max(0, sat - n))  # every spare slot up to k each is used


class CountingEngine(Engine):
    name = "counting"

    def __init__(self, sat):
        self.profile = EngineProfile({1: 10.0, sat: 10.0, 4 * sat: 40.0})
        self.batches = []

    def infer(self, batch):
        self.batches.append([(r.task_id, r.sample) for r in batch])
        return [ChunkResult(np.full((N, DIM), float(r.sample))) for r in batch]


def test_self_consistency_engine_rows_never_exceed_saturation():
    inner = CountingEngine(8)
    assert inner.profile.saturation_batch == 8
    eng = SelfConsistencyEngine(inner, k=3)
    for n in (1, 2, 3, 5, 8, 12):
        reqs = [InferenceRequest(f"t{i}", 0) for i in range(n)]
        out = eng.infer(reqs)
        rows = inner.batches[-1]
        assert len(rows) <= max(8, n)
        assert [r[0] for r in rows[:n]] == [f"t{i}" for i in range(n)] and all(s == 0 for _, s in rows[:n])
        assert len(out) == n
        for i, r in enumerate(out):
            m = sum(1 for t, s in rows if t == f"t{i}" and s > 0)
            assert (0 if r.samples is None else len(r.samples)) == m
            if m:  # the replicas' chunks, each drawn with its own sample index
                assert sorted(r.samples[:, 0, 0]) == list(range(1, m + 1))
    assert eng.stats.rows == sum(len(b) for b in inner.batches)
    assert eng.stats.extra_rows == eng.stats.rows - eng.stats.requests > 0


def test_labels_procedure_on_a_hand_made_trajectory():
    # Re-planned reference: straight along +x for 8 steps. Open-loop H=2,4 follow it; H=6 drifts
    # a little (still > 0.9); H=8 turns away (< 0.9); H=10 would agree again but the walk stopped.
    ref = np.stack([np.arange(1, 9), np.zeros(8)], 1).astype(float)
    bent = lambda k, ang: np.stack([np.r_[np.arange(1, k + 1), k + np.cos(ang) * np.arange(1, 9 - k)],
                                    np.r_[np.zeros(k), np.sin(ang) * np.arange(1, 9 - k)]], 1)
    cands = {2: ref.copy(), 4: ref.copy(), 6: bent(5, 0.6), 8: bent(2, 1.6), 10: ref.copy()}
    assert trajectory_cosine(cands[6], ref) > 0.9 > trajectory_cosine(cands[8], ref)
    assert round_optimal_horizon(ref, cands, h_start=2) == 6
    assert round_optimal_horizon(ref, cands, h_start=2, threshold=0.999) == 4
    assert round_optimal_horizon(ref, {4: bent(0, 2.0)}, h_start=2) == 2  # never below the start
    assert trajectory_cosine(np.zeros((3, 2)), np.zeros((3, 2))) == 1.0
    with pytest.raises(ValueError, match="shape"):
        trajectory_cosine(ref, ref[:4])


def test_learned_model_fits_saves_and_loads(tmp_path, model):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (200, 3))
    y = 4 + 3 * np.tanh(x[:, 0])
    m = HorizonModel.fit(x, y, hidden=16, epochs=1500)
    assert np.abs(m.predict(x) - y).mean() < 0.3
    path = model.save(tmp_path / "h.npz")
    again = LearnedHorizon(str(path), h_min=1)
    res = chunk(3)
    assert again.choose(res, 1.0).horizon == LearnedHorizon(model, h_min=1).choose(res, 1.0).horizon
    with pytest.raises(ValueError, match="needs a model"):
        LearnedHorizon()
    with pytest.raises(ValueError, match="cannot be read"):
        LearnedHorizon(str(tmp_path / "missing.npz"))
    no_state = chunk(3)
    no_state.state = None
    with pytest.raises(BadUpdates, match="joint state"):
        again.choose(no_state)


def plan(offset=0.0, bend_from=None, n=N):
    a = np.stack([np.arange(n, dtype=float) + offset, np.zeros(n)], 1)
    if bend_from is not None:
        a[bend_from:, 1] += 50.0
    return a


def test_agreement_grows_while_plans_agree_and_cuts_where_they_part():
    pol = make_horizon_policy("agreement", h_min=1, growth=2.0)
    hs = []
    shift = 0
    for rnd in range(4):  # the world goes as planned: each new chunk continues the last one
        res = ChunkResult(plan(offset=shift, n=16), task_id="a", round_id=rnd)
        h = pol.choose(res, 1.0).horizon
        hs.append(h)
        shift += h
    assert hs == [1, 2, 4, 8]  # first round H_min, then doubling
    # A re-plan that parts from the previous plan's rest at its 3rd action: H = 2.
    res = ChunkResult(plan(offset=shift, bend_from=2, n=16), task_id="a", round_id=4)
    assert pol.choose(res, 1.0).horizon == 2
    # The same round served again compares with the round before it, and gives the same H.
    assert pol.choose(res, 1.0).horizon == 2
    # Capped by the chunk (8); a plan executed to its end leaves nothing to compare: H_min.
    for rnd, want in ((0, 1), (1, 2), (2, 4), (3, 8), (4, 1), (5, 2)):
        assert pol.choose(ChunkResult(plan(), task_id="c", round_id=rnd), 100.0).horizon == want
    # Another task, a restarted task, or no task id: H_min.
    assert pol.choose(ChunkResult(plan(), task_id="b", round_id=0), 1.0).horizon == 1
    assert pol.choose(ChunkResult(plan(), task_id="a", round_id=0), 1.0).horizon == 1
    assert pol.choose(ChunkResult(plan()), 1.0).horizon == 1
    with pytest.raises(BadUpdates, match="finite"):
        pol.choose(ChunkResult(np.full((N, DIM), np.nan), task_id="d", round_id=0))
    assert pol.check_param(0) and pol.check_param(float("inf")) and pol.check_param(3.0) is None
