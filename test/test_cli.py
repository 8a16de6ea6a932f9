"""The `robotserve` command: sim output contract, workload checks, and both benchmarks end to
end on small settings (they must produce their report files; speed is never asserted)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from robotserve_ros.cli import main
from robotserve_ros.bench.fleet import default_workloads
from robotserve_ros.sim.simulator import task_type_of
from robotserve_ros.sim.workloads import MEASURED, SHAPES, builtin_names, builtin_workload, measured_names, regime_names

REQUIRED = {"avg_latency_s", "p25_latency_s", "p95_latency_s", "tasks", "rounds", "mean_wait_ratio", "engine_utilization"}


@pytest.fixture
def small_workload(tmp_path):
    path = tmp_path / "w.json"
    builtin_workload("metaworld-smolvla", tasks=20).save(path)
    return path


def test_sim_online_writes_the_documented_keys(small_workload, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["sim", "--workload", str(small_workload), "--scheduler", "kairos", "--horizon", "dynamic",
            "--rate", "2", "--tasks", "30", "--seed", "3", "--out", str(out)]
    assert main(args) == 0
    first = json.loads(out.read_text())
    assert REQUIRED <= set(first)
    assert first["tasks"] == 30 and first["horizon"] == "dynamic" and first["scheduler"] == "kairos"
    assert main(args) == 2  # a result there already: not written over unless --force
    assert main(args + ["--force"]) == 0  # same seed, same numbers
    assert json.loads(out.read_text()) == first


def test_sim_fleet_and_scheduler_params(small_workload, tmp_path):
    out = tmp_path / "f.json"
    assert main(["sim", "--workload", str(small_workload), "--scheduler", "kairos", "--scheduler-param", "buckets=5",
                 "--horizon", "static", "--robots", "4", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["robots"] == 4 and r["tasks"] == 20


def test_sim_rejects_a_bad_scheduler_param(small_workload, capsys):
    assert main(["sim", "--workload", str(small_workload), "--scheduler", "kairos", "--scheduler-param", "buckets=0",
                 "--robots", "2"]) == 2
    assert "buckets must be >= 1" in capsys.readouterr().err


def test_workload_gen_check_and_bad_file(tmp_path, capsys):
    path = tmp_path / "g.json"
    assert main(["workload", "gen", "pusht-diffusion", "--out", str(path)]) == 0
    assert main(["workload", "check", str(path)]) == 0
    bad = json.loads(path.read_text())
    bad["tasks"][4]["control_hz"] = -30
    path.write_text(json.dumps(bad))
    assert main(["workload", "check", str(path)]) == 2
    assert "tasks[4].control_hz" in capsys.readouterr().err


def test_regime_workloads_are_listed_labelled_and_mix_task_lengths(capsys):
    assert main(["workload", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in regime_names():
        assert any(line.startswith(name + "  (regime: ") for line in lines)
        w = builtin_workload(name)
        assert w.profile.saturation_batch == 1  # an engine that does not batch
        by_type = {}
        for t in w.tasks:
            by_type.setdefault(task_type_of(t.id), []).append(len(t.rounds["static"]))
        means = sorted(sum(v) / len(v) for v in by_type.values())
        assert len(means) >= 3 and means[-1] >= 4 * means[0]  # task types of very different lengths
    assert not set(regime_names()) & set(default_workloads())  # they have their own block


def test_builtin_workloads_are_seeded_and_valid():
    for name in builtin_names() + measured_names():
        a, b = builtin_workload(name), builtin_workload(name)
        assert a == b  # same seed, same workload
        assert builtin_workload(name, seed=1) != a
    # Generated shapes only: a recorded episode may end at a different step under each
    # horizon policy, so a measured task's totals legitimately differ.
    for name in SHAPES:
        for t in builtin_workload(name).tasks:  # the same physical task under both horizon policies
            assert sum(t.rounds["static"]) == sum(t.rounds["dynamic"])


def test_measured_workload_loads_validates_and_simulates(tmp_path, capsys):
    assert "pushgust-diffusion" in measured_names()
    assert main(["workload", "check", str(MEASURED["pushgust-diffusion"])]) == 0
    w = builtin_workload("pushgust-diffusion")
    assert w.name == "pushgust-diffusion" and len(w.tasks) >= 10
    out = tmp_path / "m.json"
    assert main(["sim", "--workload", "pushgust-diffusion", "--scheduler", "kairos", "--horizon", "dynamic",
                 "--rate", "1", "--tasks", "20", "--seed", "0", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert REQUIRED <= set(r) and r["workload"] == "pushgust-diffusion" and r["tasks"] == 20
    # 20 tasks drawn from the recorded episodes: between the fewest and most rounds any has.
    per_task = [len(t.rounds["dynamic"]) for t in w.tasks]
    assert 20 * min(per_task) <= r["rounds"] <= 20 * max(per_task)
    assert 0 < r["lower_bound_avg_s"] <= r["avg_latency_s"] and r["p25_latency_s"] <= r["p95_latency_s"]
    assert 0 < r["engine_utilization"] <= 1


def test_bench_scheduler_writes_its_json(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["bench", "scheduler", "--out", str(out), "--sizes", "10", "50", "--repeats", "5"]) == 0
    r = json.loads(out.read_text())
    assert set(r["sizes"]) == {"10", "50"}
    assert {"fifo", "autellix", "kairos", "edf"} <= set(r["sizes"]["50"])
    assert all(v["median_ms"] > 0 for v in r["sizes"]["50"].values())


def test_bench_fleet_end_to_end_small(tmp_path, capsys):
    out = tmp_path / "fleet"
    assert main(["bench", "fleet", "--out", str(out), "--workloads", "metaworld-smolvla", "pushgust-diffusion",
                 "pusht-mixed-edge", "--seeds", "0", "--tasks", "40", "--workers", "1"]) == 0
    data = json.loads((out / "fleet_bench.json").read_text())
    # The measured workload's Hz and engine profile come from its file, not a generated shape.
    m, w = data["workloads"]["pushgust-diffusion"], builtin_workload("pushgust-diffusion")
    assert m["shape"]["measured"] and not data["workloads"]["metaworld-smolvla"]["shape"]["measured"]
    assert m["shape"]["control_hz"] == w.tasks[0].control_hz
    assert {int(b): v for b, v in m["shape"]["batch_latency_ms"].items()} == w.batch_latency_ms
    assert m["peak"]["rate"] > 0 and m["online"]["Kairos"][-1]["tasks"] == 40
    wd = data["workloads"]["metaworld-smolvla"]
    assert {"FIFO", "Autellix", "Kairos static", "Kairos", "FIFO dynamic", "Autellix dynamic"} <= set(wd["online"])
    assert [r["robots"] for r in wd["fleet"]["Kairos"]] == [10, 50, 100]
    report = (out / "report.md").read_text()
    assert "Table 2 (a) vs FIFO" in report and "Table 2 (b) vs Autellix" in report and "LB" in report
    assert "pushgust-diffusion (measured)" in report and "measured on a real policy (reports/horizon/README.md)" in report
    for png in ("latency_vs_rate.png", "latency_vs_fleet.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "peak: Kairos avg vs FIFO >= 30%" in printed
    # A regime workload named on the command line runs in the regime block, not the main tables.
    assert "pusht-mixed-edge" not in data["workloads"]
    rg = data["regime"]["pusht-mixed-edge"]
    assert {"FIFO", "Kairos static", "SRPT static", "remaining static"} <= set(rg["online"])
    assert [r["fraction_of_peak"] for r in rg["online"]["remaining static"]] == [1.0, 1.2]
    assert rg["shape"]["saturation_batch"] == 1
    assert "Table 2 in the regime" in report and "remaining static Avg" in report


@pytest.mark.parametrize("argv,names", [
    (["sim", "--workload", "libero-smolvla", "--scheduler", "nosuch", "--rate", "1"], ["--scheduler", "nosuch", "kairos"]),
    (["sim", "--workload", "libero-smolvla", "--rate", "-1"], ["--rate", "-1"]),
    (["sim", "--workload", "libero-smolvla", "--scheduler", "kairos", "--scheduler-param", "buckets=-1", "--rate", "1"], ["buckets"]),
    (["sim", "--workload", "nosuch", "--rate", "1"], ["nosuch", "libero-smolvla"]),
    (["bench", "fleet", "--workloads", "nosuch", "--quick"], ["nosuch", "known"]),
    (["demo", "--robots", "0"], ["--robots", "0"]),
    (["workload", "gen", "nosuch", "--out", "x.json"], ["nosuch", "known"]),
    (["bench", "scheduler", "--sizes", "0"], ["--sizes"]),
    (["up", "no/such.yaml", "--dry-run"], ["no/such.yaml"]),
    (["up", "config/fleet.yaml", "--launch", "nosuch", "--dry-run"], ["--launch", "nosuch", "fleet"]),
    (["profile", "--engine", "nosuch", "--out", "p.json"], ["nosuch", "simulated"]),
])
def test_a_wrong_name_or_value_is_one_line_and_exit_2(argv, names, capsys, tmp_path, monkeypatch):
    """Never a traceback: one line naming what was wrong and what is allowed, exit 2."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # config/fleet.yaml is found, nothing written there
    argv = [str(tmp_path / a) if a in ("x.json", "p.json") else a for a in argv]
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse exits itself
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert all(n in err for n in names), err
