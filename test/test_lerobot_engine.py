"""The LeRobot engine on tiny random-weight checkpoints built here (test/lerobot_policies.py):
chunk shapes and dtypes; x_T plus the captured denoising updates is the normalized chunk;
robots interleaved in one engine get the chunks they get alone (observation history per
task, n_obs_steps=2); a batch equals its requests served one by one; forget() and requeues;
bad observations and bad policy directories get clear errors, also at server start."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("lerobot")

from lerobot_policies import make_policy_dir  # noqa: E402
from rosutil import REPO_ROOT, requires_rclpy, ros_ctx, start_node  # noqa: E402,F401 - ros_ctx is a fixture

from robotserve_ros.core.observation import BadObservation, Observation  # noqa: E402
from robotserve_ros.core.types import InferenceRequest  # noqa: E402
from robotserve_ros.engines import make_engine  # noqa: E402
from robotserve_ros.engines.lerobot_engine import PolicyDirError  # noqa: E402

KINDS = ("diffusion", "smolvla", "act")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies")
    out = {k: make_policy_dir(k, root / k) for k in KINDS}
    # Two observations of history, DDPM (noise added at every step too): the hardest case for
    # "a robot's chunks do not depend on who else is served".
    out["diffusion_h2"] = make_policy_dir("diffusion", root / "dp_h2", n_obs_steps=2, scheduler="DDPM", steps=5)
    return out


def engine(path, **kw):
    return make_engine("lerobot", None, policy_dir=str(path), **kw)


def observations(eng, n, seed=0):
    rng = np.random.default_rng(seed)
    return [eng.example_observation(rng) for _ in range(n)]


def req(task, rnd, obs):
    return InferenceRequest(task_id=task, round_id=rnd, observation=obs)


def serve(eng, task, rnd, obs):
    return eng.infer([req(task, rnd, obs)])[0]


@pytest.mark.parametrize("kind", KINDS)
def test_chunk_shapes_and_dtypes(dirs, kind):
    eng = engine(dirs[kind])
    res = eng.infer([req(f"robot_{i}/task_0", 0, o) for i, o in enumerate(observations(eng, 3))])
    assert len(res) == 3
    for r in res:
        assert r.actions.shape == (eng.chunk_len, 6) and r.actions.dtype == np.float32
        assert np.all(np.isfinite(r.actions))
        if kind == "act":  # no denoising steps: served with static horizons
            assert r.updates is None and r.initial_noise is None
        else:
            assert r.updates.shape == (4, eng.chunk_len, 6) and r.updates.dtype == np.float32
            assert r.initial_noise.shape == (eng.chunk_len, 6)
    assert eng.profile_source == "nominal" and eng.profile.saturation_batch == 1
    eng.close()


@pytest.mark.parametrize("kind", ("diffusion", "diffusion_h2", "smolvla"))
def test_initial_noise_plus_updates_is_the_normalized_chunk(dirs, kind):
    torch = pytest.importorskip("torch")
    eng = engine(dirs[kind])
    for r in eng.infer([req(f"r{i}", 0, o) for i, o in enumerate(observations(eng, 2))]):
        normalized = r.initial_noise + r.updates.sum(0)
        np.testing.assert_allclose(eng.post(torch.from_numpy(normalized[None])).numpy()[0], r.actions, atol=1e-5)
        # The chunk really was unnormalized (the fixture's stats are not the identity) ...
        assert np.abs(normalized - r.actions).max() > 1e-2
        # ... and every step moved it.
        assert np.all(np.abs(r.updates).reshape(len(r.updates), -1).max(1) > 0)


def test_robots_interleaved_get_the_chunks_they_get_alone(dirs):
    path = dirs["diffusion_h2"]
    shared = engine(path, seed=7)
    obs_a = observations(shared, 3, seed=1)
    obs_b = observations(shared, 3, seed=2)
    # Interleaved: a0, b0 alone; then rounds 1 in one batch (b first); then a2, b2.
    got_a, got_b = [serve(shared, "a", 0, obs_a[0])], [serve(shared, "b", 0, obs_b[0])]
    rb, ra = shared.infer([req("b", 1, obs_b[1]), req("a", 1, obs_a[1])])
    got_a.append(ra)
    got_b.append(rb)
    got_b.append(serve(shared, "b", 2, obs_b[2]))
    got_a.append(serve(shared, "a", 2, obs_a[2]))

    for task, obs, got in (("a", obs_a, got_a), ("b", obs_b, got_b)):
        alone = engine(path, seed=7)
        for rnd in range(3):
            ref = serve(alone, task, rnd, obs[rnd])
            np.testing.assert_allclose(got[rnd].actions, ref.actions, atol=1e-5)
            np.testing.assert_allclose(got[rnd].updates, ref.updates, atol=1e-5)

    # The history matters (so mixing it up would show): a different earlier observation
    # changes the round-1 chunk of the same task, round and noise.
    other = engine(path, seed=7)
    serve(other, "a", 0, obs_b[0])
    assert np.abs(serve(other, "a", 1, obs_a[1]).actions - got_a[1].actions).max() > 1e-4


@pytest.mark.parametrize("kind", (*KINDS, "diffusion_h2"))
def test_batch_of_four_equals_four_singles(dirs, kind):
    eng = engine(dirs[kind])
    obs = observations(eng, 4, seed=3)
    if kind == "smolvla":  # instructions of different lengths: padded in the batch
        for o, text in zip(obs, ("pick up the cube", "open the drawer", "push the t block to the target", "")):
            o.instruction = text
    batch = eng.infer([req(f"robot_{i}", 5, o) for i, o in enumerate(obs)])
    singles = engine(dirs[kind])
    for i, o in enumerate(obs):
        one = serve(singles, f"robot_{i}", 5, o)
        np.testing.assert_allclose(batch[i].actions, one.actions, atol=1e-5)
        if one.updates is not None:
            np.testing.assert_allclose(batch[i].updates, one.updates, atol=1e-5)
    # Rows differ: each robot got its own noise and its own observation.
    assert np.abs(batch[0].actions - batch[1].actions).max() > 1e-4


def test_forget_resets_history_and_a_requeued_round_is_not_appended_twice(dirs):
    path = dirs["diffusion_h2"]
    eng = engine(path)
    x, y = observations(eng, 2, seed=4)
    serve(eng, "t", 0, x)
    with_history = serve(eng, "t", 1, y)
    # The same round again (a requeue after an engine fault): same history, same chunk.
    np.testing.assert_allclose(serve(eng, "t", 1, y).actions, with_history.actions, atol=1e-6)
    eng.forget("t")
    after = serve(eng, "t", 1, y)
    fresh = serve(engine(path), "t", 1, y)  # a task whose first observation is y
    np.testing.assert_allclose(after.actions, fresh.actions, atol=1e-6)
    assert np.abs(after.actions - with_history.actions).max() > 1e-4
    eng.forget("never-seen")  # forgetting an unknown task is harmless


@pytest.mark.parametrize("kind", ("diffusion", "smolvla"))
def test_bad_observations_name_what_the_policy_takes_and_touch_nothing(dirs, kind):
    eng = engine(dirs[kind])
    good = observations(eng, 1)[0]
    cases = {
        "joints": (Observation(images=good.images, joints=np.zeros(5, np.float32)), "(6,)"),
        "camera count": (Observation(images=good.images * 2, joints=good.joints), "takes 1"),
        "image shape": (Observation(images=[np.zeros((16, 32, 3), np.uint8)], joints=good.joints), "(32, 32, 3)"),
        "image dtype": (Observation(images=[good.images[0].astype(np.float32)], joints=good.joints), "uint8"),
        "non-finite": (Observation(images=good.images, joints=np.full(6, np.nan, np.float32)), "non-finite"),
    }
    for what, (obs, expected) in cases.items():
        with pytest.raises(BadObservation) as e:
            eng.infer([req("ok", 0, good), req("bad", 0, obs)])
        assert expected in str(e.value) and "'bad'" in str(e.value), what
    assert not eng._hist, "a rejected batch must leave every task's history as it was"
    ref = serve(engine(dirs[kind]), "ok", 0, good)
    np.testing.assert_allclose(serve(eng, "ok", 0, good).actions, ref.actions, atol=1e-6)


def _broken(src, dst, how):
    shutil.copytree(src, dst)
    if how == "no config.json":
        (dst / "config.json").unlink()
    elif how == "not valid JSON":
        (dst / "config.json").write_text("{not json")
    elif how == "unknown policy type":
        cfg = json.loads((dst / "config.json").read_text())
        cfg["type"] = "pi0"
        (dst / "config.json").write_text(json.dumps(cfg))
    elif how == "missing weights":
        (dst / "model.safetensors").unlink()
    elif how == "missing processor file":
        (dst / "policy_postprocessor.json").unlink()
    elif how == "missing processor state file":
        next(dst.glob("policy_preprocessor_step_*.safetensors")).unlink()
    elif how == "cannot load":  # weights of another shape
        (dst / "model.safetensors").write_bytes((src.parent / "act" / "model.safetensors").read_bytes())
    return dst


@pytest.mark.parametrize("how", ["no config.json", "not valid JSON", "unknown policy type", "missing weights",
                                 "missing processor file", "missing processor state file", "cannot load"])
def test_malformed_policy_dir_is_a_clear_error(dirs, tmp_path, how):
    bad = _broken(dirs["diffusion"], tmp_path / "broken", how)
    with pytest.raises(PolicyDirError) as e:
        engine(bad)
    assert isinstance(e.value, ValueError) and str(bad) in str(e.value)
    assert how.split()[-1] in str(e.value) or how == "no config.json" and "config.json" in str(e.value)


def test_missing_policy_dir_is_a_clear_error(tmp_path):
    with pytest.raises(PolicyDirError, match="does not exist") as e:
        engine(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value)


def test_importing_the_engine_registry_does_not_import_torch():
    code = "import sys, robotserve_ros.engines as e; assert 'lerobot' in e.ENGINES; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@requires_rclpy
def test_server_start_with_a_missing_policy_dir_exits_2_naming_it():
    node = start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "-p", "engine.name:=lerobot",
                       "-p", "engine.lerobot.policy_dir:=/nonexistent/policy"])
    try:
        code = node.wait(timeout=60)
    finally:
        node.stop()
    assert code == 2, node.output()
    assert "/nonexistent/policy" in node.stderr() and "does not exist" in node.stderr(), node.output()


@requires_rclpy
def test_server_serves_a_simulated_robot_with_a_lerobot_diffusion_policy(ros_ctx, tmp_path):
    """The whole path with a real policy: sim_robot's camera and joints -> robot_client ->
    inference_server (LeRobot engine, observation checks taken from the policy, confidence
    horizon from captured denoising updates) -> commands on the robot's topic."""
    from test_nodes import fleet_params, start_fleet_of_one
    from trajectory_msgs.msg import JointTrajectory
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from robotserve_ros.msg import ExecutionProgress

    dp = make_policy_dir("diffusion", tmp_path / "dp", n_obs_steps=2, image_hw=(96, 96), horizon=16, n_action_steps=12)
    params = fleet_params(
        tmp_path, tasks=2, task_actions=30,
        server={"engine": {"name": "lerobot", "lerobot": {"policy_dir": str(dp)}},
                "horizon": {"static": {"h": 8}, "confidence": {"t": 0.4, "h_min": 2}}})
    client, diagnostics = start_fleet_of_one(ros_ctx, params)
    progress = ros_ctx.collect(ExecutionProgress, "/robotserve/progress", QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    commands = ros_ctx.collect(JointTrajectory, "/robot_0/command", 10)
    done = lambda: [m for m in progress if m.task_done]  # noqa: E731
    assert ros_ctx.wait_for(lambda: len(done()) >= 1, 90), client.output()
    assert ros_ctx.wait_for(lambda: int(diagnostics().get("served_by_tier/edge", 0)) >= 3, 10), diagnostics()
    assert not [k for k in diagnostics() if k.startswith("errors/")], diagnostics()  # every request was good
    first = done()[0]
    assert first.timestep >= 30 and first.chunks >= 3, first  # 12-action chunks, trimmed by confidence
    assert len(commands) >= 20 and all(len(c.points[0].positions) == 6 for c in commands)  # some before the match
    assert all(np.isfinite(c.points[0].positions).all() for c in commands)
    assert client.stop() == 0, client.output()
