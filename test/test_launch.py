"""One description of what runs: the launch files (ros2 launch) and `robotserve up` (plain
processes) must start the same nodes with the same parameters; and the main job runs."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from robotserve_ros.cli import main
from robotserve_ros.launch_description import NodeSpec, default_config, load_launch_file

CONFIG = str(Path(default_config()).resolve())


@pytest.mark.parametrize("launch,extra,args", [
    ("fleet", {"robots": "30", "per_process": "25"}, ["--robots", "30", "--per-process", "25"]),
    ("server", {}, []),
    ("robot", {"robots": "3"}, ["--robots", "3"]),
])
def test_launch_file_and_robotserve_up_read_one_description(launch, extra, args, capsys):
    specs = load_launch_file(launch).specs(params_file=CONFIG, **extra)
    assert specs and all(isinstance(s, NodeSpec) and s.params_file == CONFIG for s in specs)
    assert main(["up", CONFIG, "--launch", launch, "--dry-run", *args]) == 0
    printed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert printed == [s.command() for s in specs]


def test_fleet_layout_puts_every_robot_in_one_namespace_once():
    specs = load_launch_file("fleet").specs(params_file=CONFIG, robots="30", per_process="25")
    assert [s.executable for s in specs] == ["inference_server", "sim_robot", "robot_client", "sim_robot", "robot_client"]
    clients = [s for s in specs if s.executable == "robot_client"]
    assert [s.arguments for s in clients] == [("--robots", "25", "--first-index", "0"), ("--robots", "5", "--first-index", "25")]


def test_launch_files_build_a_ros2_launch_description():
    pytest.importorskip("launch_ros")  # only where ros2 launch exists (not on PyPI)
    for name in ("fleet", "server", "robot"):
        assert load_launch_file(name).generate_launch_description().entities


def test_live_demo_runs_fifo_kairos_and_remaining(tmp_path):
    """The main job in small: 2 robots, short Meta-World-shaped tasks, three configurations."""
    pytest.importorskip("rclpy")
    assert main(["demo", "--robots", "2", "--workload", "metaworld-smolvla", "--tasks", "1", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "live_demo.json").read_text())
    assert list(res["runs"]) == ["FIFO", "Kairos", "remaining"]
    for label, run in res["runs"].items():
        assert len(run["tasks"]) == 2, run
        assert all(t["latency_s"] > 0 and t["chunks"] > 0 for t in run["tasks"].values())
        assert int(run["server"]["served"]) >= 2
        s = run["summary"]
        assert {"avg_latency_s", "p25_latency_s", "p95_latency_s", "mean_idle_s", "chunks_served"} <= set(s), s
        assert s["p25_latency_s"] <= s["avg_latency_s"] <= s["p95_latency_s"] * 1.0001 and s["chunks_served"] >= 2
    md = (tmp_path / "live_demo.md").read_text()
    assert md.count("|") > 10 and "Why: " in md and "fewer rounds" in md
    assert (tmp_path / "live_demo.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_reports_a_dead_fleet_process_at_once(tmp_path, monkeypatch, capsys):
    """A robot process that dies must fail the demo with its name, not a 4-minute wait."""
    pytest.importorskip("rclpy")
    from robotserve_ros.live import demo

    real = demo.fleet

    def broken_fleet(params, robots):  # the robot clients' process cannot start: it exits at once
        import dataclasses

        return [dataclasses.replace(s, executable="no_such_node") if s.executable == "robot_client" else s
                for s in real(params, robots)]

    monkeypatch.setattr(demo, "fleet", broken_fleet)
    t0 = time.monotonic()
    assert main(["demo", "--robots", "1", "--workload", "metaworld-smolvla", "--tasks", "1", "--out", str(tmp_path)]) == 1
    assert time.monotonic() - t0 < 60
    assert "robot_clients" in capsys.readouterr().err
