"""One description of what runs: the launch files (ros2 launch) and `robotserve up` (plain
processes) must start the same nodes with the same parameters; and the main job runs."""
from __future__ import annotations

import json
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


def test_live_demo_runs_both_schedulers(tmp_path):
    """The main job in small: 2 robots, short Meta-World-shaped tasks, FIFO then Kairos."""
    pytest.importorskip("rclpy")
    assert main(["demo", "--robots", "2", "--workload", "metaworld-smolvla", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "live_demo.json").read_text())
    for label in ("FIFO", "Kairos"):
        run = res["runs"][label]
        assert len(run["tasks"]) == 2, run
        assert all(t["latency_s"] > 0 and t["chunks"] > 0 for t in run["tasks"].values())
        assert int(run["server"]["served"]) >= 2
    assert (tmp_path / "live_demo.md").read_text().count("|") > 10
    assert (tmp_path / "live_demo.png").read_bytes()[:4] == b"\x89PNG"
