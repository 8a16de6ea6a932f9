"""`robotserve profile` on the simulated engine (sleeps a known latency per batch): the JSON
holds the engine profile, every sample, the workload `engine` block and the machine; the
saturation batch is the one core.EngineProfile computes from the measured points."""
from __future__ import annotations

import argparse
import json
import statistics

import pytest

from robotserve_ros.core.profile import EngineProfile
from robotserve_ros.engines.profiling import add_arguments, build_report, measure
from robotserve_ros.profiles import load_profile_file
from robotserve_ros.sim.workload import load_workload

SLEPT_MS = {"1": 8.0, "2": 9.0, "4": 11.0, "8": 22.0}


def run_cli(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(argv)
    return a.func(a)


def test_profile_command_writes_the_engine_profile_and_workload_block(tmp_path):
    out = tmp_path / "sim.json"
    assert run_cli(["--engine", "simulated", "--engine-params", '{"realtime": true, "chunk_size": 8}',
                    "--engine-profile-ms", json.dumps(SLEPT_MS), "--batch-sizes", "1,2,4,8",
                    "--warmup", "1", "--repeats", "4", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["schema"] == "robotserve.engine_profile/1" and rep["engine_name"] == "simulated"
    assert {"cpu", "cores", "loadavg_at_start"} <= set(rep["machine"])
    assert set(rep["samples_ms"]) == {"1", "2", "4", "8"} and all(len(v) == 4 for v in rep["samples_ms"].values())
    table = rep["engine_profile"]["batch_latency_ms"]
    prev = 0.0
    for b, ms in SLEPT_MS.items():  # it timed the engine's sleep (overhead varies with load: no upper bound)
        assert statistics.median(rep["samples_ms"][b]) == pytest.approx(rep["median_ms"][b], abs=1e-3)
        assert ms <= rep["median_ms"][b]
        prev = max(prev, rep["median_ms"][b])
        assert table[b] == pytest.approx(prev, abs=1e-3)  # the profile never falls with batch size
    # The saturation batch is computed from the measured points, not copied from anywhere.
    assert rep["engine_profile"]["saturation_batch"] == EngineProfile(table).saturation_batch
    assert rep["engine"] == {"batch_latency_ms": table}
    s = rep["summary"]
    sat = s["saturation_batch"]
    assert s["throughput_gain"] == pytest.approx(sat * table["1"] / table[str(sat)], rel=1e-2)
    assert s["per_robot_latency_cost"] == pytest.approx(table[str(sat)] / table["1"], rel=1e-2)
    md = out.with_suffix(".md").read_text()
    assert f"**{sat}**" in md and "chunks/s" in md

    # Both consumers read it: the engine's profile_file and a workload file's engine block.
    assert load_profile_file(out).to_dict() == {k: pytest.approx(v) for k, v in table.items()}
    wl = {"name": "measured", "engine": rep["engine"], "tasks": [{"id": "t0", "control_hz": 10.0, "rounds": {"static": [4, 4], "dynamic": [6]}}]}
    (tmp_path / "wl.json").write_text(json.dumps(wl))
    assert load_workload(tmp_path / "wl.json").profile.saturation_batch == sat


def test_saturation_follows_the_measurements():
    # Throughput still doubling at 4, flat after: saturation 4; a noisy dip is raised, listed.
    samples = {1: [10.0, 10.2, 9.9], 2: [10.5, 10.4, 10.6], 4: [11.0, 11.2, 10.9], 8: [10.8, 10.7, 10.9],
               16: [44.0, 45.0, 43.0]}
    rep = build_report(samples, engine_name="x", engine_params={}, warmup=0)
    assert rep["median_ms"]["8"] == 10.8 and rep["engine_profile"]["batch_latency_ms"]["8"] == 11.0
    assert rep["method"]["raised_to_previous"] == [8]
    assert rep["engine_profile"]["saturation_batch"] == 8  # 8 at 11 ms beats 4 by 2x; 16 gains nothing
    cheaper = {**samples, 16: [15.0, 15.0, 15.0]}  # 16 at 15 ms still gains
    assert build_report(cheaper, engine_name="x", engine_params={}, warmup=0)["engine_profile"]["saturation_batch"] == 16


def test_measure_rotates_batch_sizes_and_uses_distinct_robots():
    seen = []

    class Recorder:
        name = "rec"

        def example_observation(self, rng):
            return rng.standard_normal(2)

        def infer(self, batch):
            seen.append((len(batch), len({r.task_id for r in batch})))
            return [None] * len(batch)

    samples = measure(Recorder(), [4, 1, 2], warmup=1, repeats=3)
    assert sorted(samples) == [1, 2, 4] and all(len(v) == 3 for v in samples.values())
    timed = [b for b, _ in seen[3:]]
    assert timed == [1, 2, 4, 2, 4, 1, 4, 1, 2]  # each repeat starts one size later
    assert all(n == distinct for n, distinct in seen)


def test_bad_inputs_are_clear(tmp_path):
    with pytest.raises(ValueError, match="example_observation"):
        measure(object(), [1])
    (tmp_path / "p.json").write_text('{"name": 1}')
    with pytest.raises(ValueError, match="batch_latency_ms"):
        load_profile_file(tmp_path / "p.json")


def test_profiles_of_record_load_by_name():
    """One data folder holds the profiles of record; everything names them."""
    from robotserve_ros import profiles

    assert {"smolvla_tiny", "diffusion_arm", "diffusion_pusht"} <= set(profiles.names())
    for name in profiles.names():
        prof = profiles.profile_of_record(name)
        assert prof.latency_ms(1) > 0 and load_profile_file(name).to_dict() == prof.to_dict()
    with pytest.raises(ValueError, match="unknown engine profile 'nosuch'; profiles of record: act_small"):
        profiles.record("nosuch")


def _tiny_act(tmp_path):
    pytest.importorskip("lerobot")
    from robotserve_ros.engines.tiny_policies import make_policy_dir

    return make_policy_dir("act", tmp_path / "act")


def test_profile_variants_on_cpu_give_speedup_and_action_difference(tmp_path):
    from robotserve_ros.engines.profiling import run_profile

    d = _tiny_act(tmp_path)
    rep = run_profile("lerobot", {"policy_dir": str(d)}, [1, 2], tmp_path / "v.json", warmup=1, repeats=2,
                      variants=["fp32", "bf16", "graphs"])
    v = rep["variants"]
    assert v["fp32"]["max_abs_action_diff_vs_fp32"] == 0.0
    bf = v["bf16"]
    assert bf["engine_params"]["dtype"] == "bf16" and set(bf["median_ms"]) == {"1", "2"}
    for b in ("1", "2"):
        assert bf["speedup_vs_fp32"][b] == pytest.approx(rep["median_ms"][b] / bf["median_ms"][b], rel=1e-2)
    # bf16 arithmetic moves the actions, by a little (actions are O(1) after unnormalisation).
    assert 0.0 < bf["max_abs_action_diff_vs_fp32"] < 1.0
    assert v["graphs"]["skipped"].startswith("CUDA graphs need")
    md = (tmp_path / "v.md").read_text()
    assert "| bf16 |" in md and "CUDA graphs need" in md


def test_engine_refuses_a_bad_dtype_and_graphs_without_cuda(tmp_path):
    from robotserve_ros.engines import make_engine

    d = _tiny_act(tmp_path)
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        make_engine("lerobot", None, policy_dir=str(d), dtype="fp8")
    with pytest.raises(ValueError, match="cuda_graphs needs device cuda"):
        make_engine("lerobot", None, policy_dir=str(d), cuda_graphs=True)


def _cuda():
    torch = pytest.importorskip("torch")
    from robotserve_ros.engines.torch_env import import_torch

    import_torch()
    return torch.cuda.is_available()


@pytest.mark.skipif("not _cuda()", reason="needs a CUDA device")
def test_cuda_profile_synchronises_and_records_the_gpu_and_peak_memory(tmp_path):
    from robotserve_ros.engines.profiling import run_profile

    d = _tiny_act(tmp_path)
    rep = run_profile("lerobot", {"policy_dir": str(d), "device": "cuda"}, [1, 2], tmp_path / "g.json", warmup=1,
                      repeats=2, variants=["fp32", "bf16", "graphs"])
    gpu = rep["torch"]["gpu"]
    assert gpu["name"] and gpu["cuda"]
    assert set(rep["peak_memory_mib"]) == {"1", "2"} and all(v > 0 for v in rep["peak_memory_mib"].values())
    g = rep["variants"]["graphs"]
    assert "median_ms" in g or "error" in g  # recorded either way, never fatal
