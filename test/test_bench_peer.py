"""`robotserve make-policy` and `robotserve bench peer` on tiny random-weight policies: a made
directory loads and serves; the peer report holds exactly the keys of record with values that
agree with each other and with the samples beside them; LeRobot's own server really ran (and,
without its diffusion queues filled, fails as upstream reports)."""
from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

pytest.importorskip("lerobot")

from robotserve_ros.cli import main  # noqa: E402
from robotserve_ros.core.profile import EngineProfile  # noqa: E402
from robotserve_ros.core.types import InferenceRequest  # noqa: E402
from robotserve_ros.engines import make_engine  # noqa: E402
from robotserve_ros.bench.peer import REPORT_KEYS, LeRobotPeer  # noqa: E402
from robotserve_ros.engines.lerobot_engine import check_policy_dir  # noqa: E402
from robotserve_ros.engines.tiny_policies import META_FILE, make_sized_policy_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dp(tmp_path_factory):
    d = tmp_path_factory.mktemp("peer") / "dp"
    assert main(["make-policy", "--kind", "diffusion", "--size", "default", "--out", str(d), "--n-obs-steps", "2"]) == 0
    return d


def test_make_policy_writes_a_loadable_directory(tiny_dp, tmp_path):
    cfg = check_policy_dir(tiny_dp)
    assert cfg["type"] == "diffusion" and cfg["n_obs_steps"] == 2
    meta = json.loads((tiny_dp / META_FILE).read_text())
    assert meta["random_weights"] is True and meta["size"] == "default"
    act = tmp_path / "act"
    assert main(["make-policy", "--kind", "act", "--out", str(act), "--set", "chunk_size=12",
                 "--set", "n_action_steps=6"]) == 0
    eng = make_engine("lerobot", None, policy_dir=str(act))
    obs = eng.example_observation(np.random.default_rng(0))
    res = eng.infer([InferenceRequest(task_id="r0", round_id=0, observation=obs)])
    assert res[0].actions.shape == (6, 6) and np.all(np.isfinite(res[0].actions))
    assert json.loads((act / META_FILE).read_text())["parameters"] == sum(p.numel() for p in eng.policy.parameters())
    with pytest.raises(ValueError, match="size 'huge'"):
        make_sized_policy_dir("act", tmp_path / "x", "huge")


def test_bench_peer_writes_exactly_the_report_of_record(tiny_dp, tmp_path):
    out = tmp_path / "peer.json"
    assert main(["bench", "peer", "--policy-dir", str(tiny_dp), "--out", str(out), "--max-batch", "4",
                 "--repeats", "2", "--warmup", "1"]) == 0
    rep = json.loads(out.read_text())
    assert tuple(rep) == REPORT_KEYS
    assert rep["policy"].startswith("diffusion") and "random weights" in rep["policy"]
    assert rep["device"].startswith("cpu")
    sat = rep["saturation_batch"]
    assert sat in (1, 2, 4)
    lr, bt = rep["lerobot_sequential_robots_per_s"], rep["batched_robots_per_s"]
    assert lr > 0 and bt > 0
    assert rep["ratio"] == pytest.approx(bt / lr, rel=1e-2)
    lat = rep["per_robot_latency_ms"]
    assert set(lat) == {"lerobot", "batched"} and lat["lerobot"] > 0 and lat["batched"] > 0
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    # Both figures come from the same alternating rounds of `sat` robots.
    assert len(meta["batched_round_ms"]) == len(meta["lerobot_round_ms"]) >= 1
    assert bt == pytest.approx(sat / (statistics.median(meta["batched_round_ms"]) / 1000), rel=1e-3)
    assert lat["batched"] == pytest.approx(statistics.median(meta["batched_round_ms"]), rel=1e-3)
    for r in meta["lerobot_round_ms"]:
        assert len(r) == sat and r == sorted(r)  # robot after robot: each finished after the one before
    # The sweep found `sat` from what it measured.
    assert sat == EngineProfile(meta["sweep"]["profile_ms"]).saturation_batch
    assert meta["sweep"]["stopped"] in ("saturated", "max_batch", "time cap")
    assert lr == pytest.approx(sat / (meta["lerobot_last_robot_ms"] / 1000), rel=1e-3)
    assert lat["lerobot"] <= meta["lerobot_last_robot_ms"]
    sustained = bt * meta["chunk_actions"] / meta["control_hz"]
    assert meta["robots_sustained"]["batched"] == pytest.approx(sustained, rel=1e-2)
    assert {"loadavg_start", "loadavg_end", "machine"} <= set(meta)
    assert "x" in out.with_suffix(".md").read_text()


def test_lerobot_server_path_serves_chunks_and_fails_on_diffusion_without_the_queues(tiny_dp):
    cfg = check_policy_dir(tiny_dp)
    cams = [("cam0", (3, 32, 32))]
    peer = LeRobotPeer(str(tiny_dp), state_dim=6, cameras=cams, chunk=cfg["n_action_steps"], fps=10)
    rng = np.random.default_rng(0)
    acts = peer.serve("robot_0", peer.raw_observation(rng))
    assert len(acts) == cfg["n_action_steps"] and [a.get_timestep() for a in acts] == list(range(1, 1 + len(acts)))
    assert acts[0].get_action().shape == (6,)
    peer.close()
    stock = LeRobotPeer(str(tiny_dp), state_dim=6, cameras=cams, chunk=cfg["n_action_steps"], fps=10,
                        fill_diffusion_queues=False)
    with pytest.raises(RuntimeError, match="returned no actions"):
        stock.serve("robot_0", stock.raw_observation(rng))
    stock.close()


def test_bench_peer_refuses_a_missing_policy_dir(tmp_path, capsys):
    assert main(["bench", "peer", "--policy-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "o.json")]) == 2
    assert "nope" in capsys.readouterr().err


def test_bench_peer_at_a_given_batch_says_it_was_not_swept(tiny_dp, tmp_path):
    from robotserve_ros.bench.peer import run_peer

    out = tmp_path / "b2.json"
    rep = run_peer(str(tiny_dp), out, batch=2, repeats=1, warmup=1)
    assert tuple(rep) == REPORT_KEYS and rep["saturation_batch"] == 2
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["sweep"]["stopped"].startswith("given") and set(meta["sweep"]["profile_ms"]) == {"1", "2"}
    assert all(len(r) == 2 for r in meta["lerobot_round_ms"])
    assert "not swept" in out.with_suffix(".md").read_text()
