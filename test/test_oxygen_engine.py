"""OxyGen on a tiny random-weight SmolVLA (seed 001): one prefill per observation serves the
action expert and that frame's language request.

- actions (and the captured per-step updates) equal the isolated LeRobot path's for the
  same observations and noise: tolerance 1e-6 absolute (the same ops run; seen exactly 0);
- language tokens equal the isolated VLM's greedy decoding (LeRobot's own forward over
  prefix + prompt + tokens, no cache) token for token, also for requests that span frames
  while other robots' requests join and leave the batch;
- a finished request's KV is really freed (the tensors are collected; the manager holds 0 B);
- bad input gets a clear error and the other robots keep being served.
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

pytest.importorskip("lerobot")

from lerobot_policies import make_policy_dir  # noqa: E402

from robotserve_ros.core.errors import UnknownTask  # noqa: E402
from robotserve_ros.core.kv_manager import BadPrompt, NoObservation, Overloaded  # noqa: E402
from robotserve_ros.core.observation import Observation  # noqa: E402
from robotserve_ros.core.types import InferenceRequest  # noqa: E402
from robotserve_ros.engines import make_engine  # noqa: E402

ATOL = 1e-6


@pytest.fixture(scope="module")
def vla(tmp_path_factory):
    return make_policy_dir("smolvla", tmp_path_factory.mktemp("oxy") / "vla", steps=4)


def oxygen(path, chaotic=False, **kw):
    eng = make_engine("oxygen", None, policy_dir=str(path), seed=3, **kw)
    if chaotic:
        # The tiny model's random init decodes one token forever; larger weights make every
        # token depend on the prefix, so "token for token" really compares something.
        torch = eng.torch
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in [*eng._text.parameters(), *eng._lm_head.parameters()]:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return eng


@pytest.fixture(scope="module")
def chaotic(vla):
    return oxygen(vla, chaotic=True)


@pytest.fixture
def plain(vla):
    return oxygen(vla)


def fresh(eng, k, max_active=64):
    """The module's engine with no request left over and this test's k."""
    eng.kv.close()
    eng.kv.k, eng.kv.max_active = k, max_active
    eng.kv.counts.update(frames=0, batch_sum=0)
    return eng


def observations(eng, n, seed=1):
    rng = np.random.default_rng(seed)
    out = [eng.example_observation(rng) for _ in range(n)]
    words = ["pick up the cube", "push the t block to the target now", "open the drawer", "place it in the bin"]
    return [Observation(images=o.images, joints=o.joints, instruction=words[i % 4]) for i, o in enumerate(out)]


def reqs(obs, rnd):
    return [InferenceRequest(task_id=f"r{i}", round_id=rnd, observation=o) for i, o in enumerate(obs)]


def drain(eng, outs):
    while len(eng.kv):
        for st, new in eng.decode_frame():
            outs.setdefault(st.rid, []).extend(new)


def test_shared_kv_actions_equal_isolated_path(vla, plain):
    eng = plain
    ref = make_engine("lerobot", None, policy_dir=str(vla), seed=3)
    obs = observations(eng, 3)  # instructions of different lengths: padded prefixes in one batch
    eng.request_language("r1", 0, "open the drawer", 4)
    for rnd in range(2):
        got, want = eng.infer(reqs(obs, rnd)), ref.infer(reqs(obs, rnd))
        for g, w in zip(got, want):
            assert g.actions.shape == w.actions.shape
            np.testing.assert_allclose(g.actions, w.actions, atol=ATOL, rtol=0)
            np.testing.assert_allclose(g.updates, w.updates, atol=ATOL, rtol=0)
            np.testing.assert_allclose(g.initial_noise, w.initial_noise, atol=ATOL, rtol=0)
    assert len(eng.kv) == 1  # round 0's request started from that frame's prefix


def test_language_equals_isolated_greedy_across_frames_and_robots(chaotic):
    """Three robots; requests start at frames 0, 1, 2 with k=3 and 8 tokens, a fourth robot
    joins at frame 2 and asks a short question: all decode in one batch and each equals the
    isolated VLM's greedy output."""
    eng = fresh(chaotic, 3)
    obs = observations(eng, 4)
    prompts = {"r0": "place it in the bin", "r1": "the cube", "r2": "pick up the cube", "r3": "open the drawer"}
    budget = {"r0": 8, "r1": 8, "r2": 8, "r3": 2}
    outs, batches = {}, []
    for frame in range(3):
        for i in range(3):
            if i == frame:
                eng.request_language(f"r{i}", frame, prompts[f"r{i}"], budget[f"r{i}"])
        served = obs[:3] if frame < 2 else obs
        if frame == 2:
            eng.request_language("r3", frame, prompts["r3"], budget["r3"])
        eng.infer(reqs(served, frame))
        step = eng.decode_frame()
        batches.append(len(step))
        for st, new in step:
            assert len(new) <= 3
            outs.setdefault(st.task_id, []).extend(new)
    while len(eng.kv):
        for st, new in eng.decode_frame():
            outs.setdefault(st.task_id, []).extend(new)
    assert batches == [1, 2, 4]
    for i, o in enumerate(obs):
        tid = f"r{i}"
        want = eng.isolated_generate(o, prompts[tid], budget[tid])
        assert outs[tid] == want, tid
    assert len(set(map(tuple, outs.values()))) == 4  # the outputs differ: the comparison can fail
    assert eng.kv.avg_decode_batch() > 1


def test_standalone_question_about_an_observation_or_the_current_frame(chaotic):
    eng = fresh(chaotic, 4)
    obs = observations(eng, 2)
    a = eng.start_language("q", "place it in the bin", 6, observation=obs[0])
    eng.infer(reqs(obs, 0))
    b = eng.start_language("r1", "pick up the cube", 8)  # no observation: r1's latest frame
    outs = {}
    drain(eng, outs)
    assert outs[a.rid] == eng.isolated_generate(obs[0], "place it in the bin", 6)
    assert outs[b.rid] == eng.isolated_generate(obs[1], "pick up the cube", 8)
    assert b.reason == "eos" and len(outs[b.rid]) < 8 and outs[b.rid][-1] == eng.eos_id  # ended early
    assert a.reason == "length" and len(outs[a.rid]) == 6
    assert eng.decode_text(outs[a.rid])


def test_finished_requests_free_their_kv(plain):
    eng = fresh(plain, 5)
    obs = observations(eng, 2)
    refs = []
    for rnd in range(4):  # N = 8 requests over 4 frames
        for i in range(2):
            eng.request_language(f"r{i}", rnd, "open the drawer", 7)
        eng.infer(reqs(obs, rnd))
        refs.append(weakref.ref(eng._frames["r0"][1].kv[0]["key_states"]))
        eng.decode_frame()
        refs += [weakref.ref(s.kv.k[0]) for s in eng.kv.active()]
        assert eng.kv.kv_bytes() > 0
    drain(eng, {})
    assert len(eng.kv) == 0 and eng.kv.kv_bytes() == 0 and eng.freed == 8
    for i in range(2):
        eng.forget(f"r{i}")  # the kept frames go too
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


def test_bad_input_gets_clear_errors_and_others_keep_being_served(vla):
    eng = oxygen(vla, max_active=2)  # (also: the constructor's knobs reach the manager)
    assert eng.kv.max_active == 2 and eng.kv.k == 5
    obs = observations(eng, 2)
    with pytest.raises(UnknownTask, match="no frame of task 'ghost'"):
        eng.start_language("ghost", "open the drawer", 4)
    with pytest.raises(NoObservation, match="needs an observation"):
        eng.start_language("", "open the drawer", 4)
    with pytest.raises(BadPrompt, match="context limit of 512"):
        eng.request_language("r0", 0, "open the drawer " * 200, 4)
    with pytest.raises(BadPrompt, match="context limit"):
        eng.start_language("q", "open the drawer", 600, observation=obs[0])
    with pytest.raises(BadPrompt, match="empty"):
        eng.request_language("r0", 0, "   ", 4)
    eng.request_language("r0", 0, "open the drawer", 30)
    eng.request_language("r1", 0, "open the drawer", 30)
    eng.infer(reqs(obs, 0))
    with pytest.raises(Overloaded):
        eng.start_language("q", "open the drawer", 4, observation=obs[0])
    before = [len(s.tokens) for s in eng.kv.active()]
    eng.decode_frame()
    assert [len(s.tokens) for s in eng.kv.active()] == [b + 5 for b in before]
    res = eng.infer(reqs(obs, 1))  # the action path is unaffected
    assert len(res) == 2 and all(np.isfinite(r.actions).all() for r in res)


def test_oxygen_engine_refuses_a_policy_without_a_language_model(tmp_path):
    from robotserve_ros.engines.lerobot_engine import PolicyDirError

    d = make_policy_dir("act", tmp_path / "act")
    with pytest.raises(PolicyDirError, match="serves SmolVLA"):
        make_engine("oxygen", None, policy_dir=str(d))


def test_isolated_language_baseline_decodes_the_same_tokens(chaotic):
    """The bench's isolated baseline (its own prefill of observation + prompt) is the same
    model: same tokens as the shared-KV path and the uncached reference."""
    eng = fresh(chaotic, 5)
    o = observations(eng, 1)[0]
    assert eng.isolated_language(o, "place it in the bin", 9) == eng.isolated_generate(o, "place it in the bin", 9)
    assert len(eng.kv) == 0


def test_a_request_cancelled_mid_round_does_not_disturb_the_others(chaotic):
    """The Generate deadline or a failed round can cancel a request while the decode worker
    is inside its round: the round completes for the others, the cancelled one gets nothing."""
    eng = fresh(chaotic, 3)
    obs = observations(eng, 2)
    a = eng.start_language("q", "place it in the bin", 6, observation=obs[0])
    b = eng.start_language("q2", "the cube", 6, observation=obs[1])
    orig, calls = eng._layers, []

    def layers(*args):
        if not calls:
            eng.cancel_language(b.rid)
        calls.append(1)
        return orig(*args)

    eng._layers = layers
    try:
        step = eng.decode_frame()
    finally:
        del eng._layers
    assert [s.rid for s, _ in step] == [a.rid] and b.reason == "cancelled"
    outs = {a.rid: list(step[0][1])}
    drain(eng, outs)
    assert outs[a.rid] == eng.isolated_generate(obs[0], "place it in the bin", 6)
