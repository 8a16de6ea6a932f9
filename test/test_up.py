"""Issue 27, the deployment half: launch arguments with descriptions and named nodes (tested
through the loader `robotserve up` uses: launch_ros is not on PyPI), and a fleet one can
watch: `robotserve up` prints a fleet status line from /diagnostics and the reason a node
died; `robotserve status` reads the server's diagnostics once."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from robotserve_ros.cli import main
from robotserve_ros.launch_description import COMMON_ARGS, default_config, load_launch_file
from robotserve_ros.live.fleet_status import death_reason, last_errors, plural, status_line, typed
from rosutil import REPO_ROOT, requires_rclpy, ros_env

CONFIG = str(Path(default_config()).resolve())
ISSUE_ARGS = {"use_sim_time", "namespace", "log_level", "params_file", "policy"}


@pytest.mark.parametrize("name", ["fleet", "server", "robot"])
def test_every_launch_argument_has_a_default_and_a_description(name):
    args = load_launch_file(name).ARGS
    assert ISSUE_ARGS <= set(COMMON_ARGS) <= set(args) and (name == "server" or "robots" in args)
    for arg, (default, description) in args.items():
        assert isinstance(default, str) and len(description) > 15, arg
    assert args["params_file"][0] == default_config()


def _commands(capsys, *argv):
    assert main(["up", CONFIG, *argv, "--dry-run"]) == 0
    return [line.split() for line in capsys.readouterr().out.splitlines()]


def test_common_arguments_reach_every_node(capsys):
    cmds = _commands(capsys, "namespace:=lab", "log_level:=debug", "use_sim_time:=true", "policy:=/models/act",
                     "--robots", "2", "--per-process", "1")
    assert [c[2].rsplit(".", 1)[1] for c in cmds] == ["inference_server", "sim_robot", "robot_client", "sim_robot",
                                                     "robot_client"]
    for c in cmds:
        ros = " ".join(c[c.index("--ros-args"):])
        assert "--log-level debug" in ros and "-p use_sim_time:=true" in ros and f"--params-file {CONFIG}" in ros
    server, robot1 = " ".join(cmds[0]), " ".join(cmds[4])
    assert "-r __node:=inference_server --params-file" in server  # the server keeps /inference_server
    assert "-p engine.name:=lerobot -p engine.lerobot.policy_dir:=/models/act" in server
    assert "-r __node:=robot_client -r __ns:=/lab/robot_1" in robot1 and "policy_dir" not in robot1


def test_defaults_keep_the_params_files_engine_and_several_robots_per_process(capsys):
    cmds = _commands(capsys, "--robots", "3")
    server = " ".join(cmds[0])
    assert "--log-level info" in server and "use_sim_time:=false" in server and "engine.name" not in server
    assert "__ns" not in " ".join(" ".join(c) for c in cmds)  # robots keep their robot_<i> namespaces
    assert not any("__node" in " ".join(c) for c in cmds[1:])  # a remap would rename all 3 robots alike


@pytest.mark.parametrize("argv,wrong", [
    (["log_level:=loud"], "loud"),
    (["use_sim_time:=maybe"], "maybe"),
    (["namespace:=9lab"], "9lab"),
    (["robot:=2"], "robot:=2"),
    (["namespace:=lab", "--robots", "3"], "per_process:=1"),
])
def test_a_wrong_launch_argument_is_one_line(argv, wrong, capsys):
    assert main(["up", CONFIG, *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and wrong in err[0], err


def test_launch_files_declare_described_arguments_and_named_nodes(monkeypatch):
    """generate_launch_description() against minimal stand-ins for launch/launch_ros (which
    have no wheel on PyPI): every argument declared with its description, nodes named."""
    made = {}

    def record(kind):
        def make(*args, **kw):
            made.setdefault(kind, []).append((args, kw))
            return (kind, args, kw)
        return make

    class Config:
        def __init__(self, name):
            self.name = name

        def perform(self, context):
            return context[self.name]

    launch = types.ModuleType("launch")
    launch.LaunchDescription = lambda entities: list(entities)
    actions = types.ModuleType("launch.actions")
    actions.DeclareLaunchArgument, actions.OpaqueFunction = record("arg"), record("opaque")
    subst = types.ModuleType("launch.substitutions")
    subst.LaunchConfiguration = Config
    lr, lr_actions = types.ModuleType("launch_ros"), types.ModuleType("launch_ros.actions")
    lr_actions.Node = record("node")
    for name, mod in {"launch": launch, "launch.actions": actions, "launch.substitutions": subst,
                      "launch_ros": lr, "launch_ros.actions": lr_actions}.items():
        monkeypatch.setitem(sys.modules, name, mod)

    ld = load_launch_file("fleet").generate_launch_description()
    declared = {a[0]: kw for a, kw in made["arg"]}
    assert set(declared) == set(load_launch_file("fleet").ARGS) and ISSUE_ARGS | {"robots"} <= set(declared)
    assert all(kw["description"] for kw in declared.values())
    context = {k: kw["default_value"] for k, kw in declared.items()} | {"robots": "2", "per_process": "1"}
    nodes = made["opaque"][0][1]["function"](context)
    assert ld[-1][0] == "opaque"
    assert [n[2]["name"] for n in nodes] == ["inference_server", "sim_robot", "robot_client", "sim_robot", "robot_client"]
    assert [n[2]["namespace"] for n in nodes] == [None, "/robot_0", "/robot_0", "/robot_1", "/robot_1"]
    assert all("--log-level" in n[2]["ros_arguments"] for n in nodes)


def test_status_line_counts_robots_rounds_errors():
    before = {"robots": "2", "served": "10", "engine_utilization": "0.25", "queue_length": "1", "in_flight": "2",
              "errors/bad_observation": "1"}
    now = dict(before, served="25", **{"errors/bad_observation": "3", "errors/stale": "1"})
    assert status_line(before) == "2 robots connected, 10 rounds served, engine 25% busy, queue 1, in flight 2, errors 1"
    assert "25 rounds served (+15)" in status_line(now, before) and "errors 4 (+3)" in status_line(now, before)


def test_status_names_the_last_refusal_of_each_kind_and_types_its_values():
    before = {"robots": "1", "served": "10", "errors/bad_observation": "1",
              "last_error/bad_observation": "robot_0.images[0]: 96x96, the policy takes 32x32"}
    now = dict(before, **{"errors/bad_observation": "3", "errors/stale": "1", "last_error/stale": "round 4 is old"})
    assert status_line(before).startswith("1 robot connected,")
    assert last_errors(before) == ["bad_observation: robot_0.images[0]: 96x96, the policy takes 32x32"]
    assert last_errors(now, now) == []  # nothing new since: nothing repeated
    assert last_errors(now, before) == [last_errors(before)[0], "stale: round 4 is old"]
    assert [typed(v) for v in ("3", "0.25", "None", "True", "nan-ish", "1e3")] == [3, 0.25, None, True, "nan-ish", 1000.0]
    assert plural(1, "process", "processes") == "1 process" and plural(2, "robot") == "2 robots"


def test_death_reason_is_the_error_line_not_see_its_log(tmp_path):
    log = tmp_path / "n.log"
    log.write_text("[INFO] starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "ValueError: engine 'nope' is not one of simulated, lerobot\n")
    assert death_reason(log)[0] == "ValueError: engine 'nope' is not one of simulated, lerobot"
    log.write_text("[INFO] starting\nrobotserve: scheduler.name 'nope' is not one of fifo, kairos\n[INFO] bye\n")
    assert death_reason(log)[0] == "robotserve: scheduler.name 'nope' is not one of fifo, kairos"
    assert death_reason(tmp_path / "none.log")[0].startswith("no log")


def _robotserve(*argv, env):
    return subprocess.Popen([sys.executable, "-m", "robotserve_ros.cli", *argv], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@requires_rclpy
def test_a_newcomer_sees_the_fleet_work_within_10_s(tmp_path):
    """`robotserve up config/fleet.yaml --robots 2`: status lines on stdout showing both robots
    connected and rounds served, 10 s after start at the latest; `robotserve status` reads the
    same server once."""
    env = ros_env()
    up = _robotserve("up", "config/fleet.yaml", "--robots", "2", "--duration", "25", "--status-every", "1",
                     "--log-dir", str(tmp_path / "logs"), env=env)
    seen, status = None, None
    try:
        for line in up.stdout:
            m = re.match(r"\[\s*([\d.]+) s\] (\d+) robots connected, (\d+) rounds served", line)
            if m and int(m[2]) == 2 and int(m[3]) > 0:
                seen = float(m[1])
                break
        status = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "status", "--timeout", "10", "--json"],
                                cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    finally:
        up.terminate()
        out, err = up.communicate(timeout=30)
    assert seen is not None, f"no status line with 2 robots and rounds served: {out[-2000:]} {err[-2000:]}"
    assert seen <= 10.0, f"the fleet showed it works only after {seen} s"
    assert status.returncode == 0, status.stderr
    d = json.loads(status.stdout)
    assert d["level"] in ("OK", "WARN") and d["served"] > 0 and d["robots"] == 2  # numbers as numbers
    assert "None" not in d.values() and isinstance(d["engine_utilization"], float)
    assert re.search(r"robotserve up: stopped \d+ process(es)? after \d+ s", out), out[-2000:]  # it says when it stops


@requires_rclpy
def test_up_refuses_a_wrong_knob_in_its_params_file_before_starting_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(CONFIG).read_text().replace("name: remaining", "name: no_such_scheduler", 1))
    up = _robotserve("up", str(bad), "--robots", "1", "--duration", "60", "--log-dir", str(tmp_path / "logs"),
                     env=ros_env())
    out, err = up.communicate(timeout=60)
    assert up.returncode == 2 and len(err.strip().splitlines()) == 1, (out, err)
    assert "inference_server: parameter 'scheduler.name': 'no_such_scheduler' is not one of" in err, err
    assert not (tmp_path / "logs").exists()  # nothing started


@requires_rclpy
def test_up_says_why_a_node_died(tmp_path):
    import yaml

    cfg = yaml.safe_load(Path(CONFIG).read_text())  # a policy folder that is not there: the node finds out, not the file
    cfg["inference_server"]["ros__parameters"]["engine"] = {"name": "flow", "flow": {"policy_dir": "/nonexistent/p"}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    up = _robotserve("up", str(bad), "--robots", "1", "--duration", "60", "--log-dir", str(tmp_path / "logs"),
                     env=ros_env())
    out, err = up.communicate(timeout=90)
    assert up.returncode == 1, (out, err)
    first = err.strip().splitlines()[0]
    assert first.startswith("robotserve up: inference_server exited with code 2: ") and "/nonexistent/p" in first, err
    assert "see its log" not in err


@requires_rclpy
def test_status_without_a_server_is_one_line_and_non_zero():
    t0 = time.monotonic()
    st = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "status", "--timeout", "1"], cwd=REPO_ROOT,
                        env=ros_env(), capture_output=True, text=True, timeout=60)
    assert st.returncode == 1 and len(st.stderr.strip().splitlines()) == 1, st
    assert "no inference server" in st.stderr and time.monotonic() - t0 < 50
