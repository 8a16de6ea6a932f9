"""Every `robotserve` subcommand refuses a wrong value with one line naming it, exit 2, no traceback.

The walker discovers the subcommands from the parser itself (nested ones such as `bench fleet`
and `study train` included), so a new subcommand is covered the day it is added. Each case runs
the real command as a subprocess; a wrong value must be refused before anything heavy starts, so
every run has a short timeout and is killed (its whole process group) when it outlives it."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from robotserve_ros.cli import build_parser
from robotserve_ros.core.errors import ConfigError
from robotserve_ros.core.horizon import make_horizon_policy
from robotserve_ros.core.schedulers import make_scheduler

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60.0  # generous for a loaded machine; a refusal takes well under a second alone
MISSING = "/nonexistent/robotserve-no-such-file"
# Values an option's `type` is tried with, in turn; the first it refuses is the wrong value.
BAD_VALUES = ("not-a-number", "-1", "0", "nan")
# Options that name a file or directory to read: a path that does not exist must be refused.
INPUT_PATHS = ("--config", "--policy-dir", "--demos", "--trace", "--run", "--token-file", "--tls-cert", "--tls-key",
               "--add", "--into")
# Options that only make sense together: the partner gets a file that exists, so the refusal is
# about the missing one, not about the pair being incomplete.
PARTNERS = {"--tls-cert": "--tls-key", "--tls-key": "--tls-cert"}
# A command that wrongly starts serving listens on 127.0.0.1 and a free port, never a fixed one.
FREE = "127.0.0.1:0"
LISTEN = {"--port": "0", "--address": FREE, "--host": "127.0.0.1"}


def leaves(parser: argparse.ArgumentParser, path=()):
    """(words, parser) for every runnable subcommand, nested subparsers walked to their leaves."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, path + (name,))


def _refused(action: argparse.Action, value: str) -> bool:
    try:
        v = action.type(value) if action.type else value
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return True
    return action.choices is not None and v not in action.choices


def bad_value(parser: argparse.ArgumentParser):
    """(option, value) the option's `type` or `choices` refuses; None when no option has either."""
    for a in parser._actions:
        if not a.option_strings or (a.type is None and a.choices is None) or a.nargs == 0:
            continue
        for v in ("no-such-choice",) if a.type is None else BAD_VALUES:
            if _refused(a, v):
                return a.option_strings[-1], v
    return None


def _filler(a: argparse.Action, tmp: Path) -> str:
    """A value a required argument accepts, so the command gets as far as the wrong one."""
    if a.choices:
        return str(next(iter(a.choices)))
    for v in ("1", "0.5") if a.type else ():
        if not _refused(a, v):
            return v
    return str(tmp / a.dest)  # a path (--out, --demos): inside the test's own folder


def _input_path(a: argparse.Action):
    """The option string (or positional name) of an argument that names a file to read, else None."""
    if a.option_strings:
        return a.option_strings[-1] if a.option_strings[-1] in INPUT_PATHS else None
    return a.dest if a.dest == "config" else None


def path_cases():
    """(words, option) for every input-path option of every subcommand. Where another required
    argument is an input path too (`study merge --into F --add G`), only that one is tried: no
    generic filler makes a valid input file, so the command rightly names the filler first."""
    for words, p in leaves(build_parser()):
        inputs = [(a, _input_path(a)) for a in p._actions if _input_path(a)]
        for a, name in inputs:
            if not any(b.required and b is not a for b, _ in inputs):
                yield words, name


def argv_with(words, parser, option, value, tmp: Path) -> list:
    """The subcommand with `option` set to `value`, every other required argument filled, and
    any listening address on 127.0.0.1 with a free port."""
    argv, tail = list(words), []
    for a in parser._actions:
        if a.option_strings and a.option_strings[-1] in LISTEN and a.option_strings[-1] != option:
            argv += [a.option_strings[-1], LISTEN[a.option_strings[-1]]]
        key = a.option_strings[-1] if a.option_strings else a.dest
        if key == option or (a.required and not isinstance(a, argparse._SubParsersAction)):
            v = value if key == option else _filler(a, tmp)
            if a.option_strings:
                argv += [key, v]
            else:
                tail.append(v)
    return argv + tail


def run_cli(argv, cwd=ROOT, cmd=None, timeout=TIMEOUT_S):
    """Run `robotserve ARGV` (or `cmd`) in its own process group; kill the group if it outlives
    `timeout` (a wrong value that started a server). Returns (returncode or None, stdout, stderr)."""
    cmd = cmd or [sys.executable, "-m", "robotserve_ros.cli", *argv]
    env = {**os.environ, "ROS_DOMAIN_ID": "231", "ROBOTSERVE_GPU_TOKEN": ""}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def check_refused(argv, wrong: str, cmd=None, timeout=TIMEOUT_S, also=()) -> str:
    """Assert the command refused `wrong`: exit 2, one stderr line naming it, no traceback."""
    code, _, err = run_cli(argv, cmd=cmd, timeout=timeout)
    shown = " ".join(argv) if cmd is None else " ".join(cmd)
    assert code is not None, f"`{shown}` was still running after {timeout:.0f} s (started instead of refusing)"
    assert "Traceback" not in err, f"`{shown}` ended in a traceback:\n{err}"
    lines = err.strip().splitlines()
    assert code == 2, f"`{shown}` exited {code}, not 2; stderr: {err.strip()[-600:]}"
    assert len(lines) == 1, f"`{shown}`: stderr is {len(lines)} lines, not one:\n{err}"
    for word in (wrong, *also):
        assert word in lines[0], f"`{shown}`: stderr does not name {word!r}: {lines[0]}"
    return lines[0]


SUBCOMMANDS = {" ".join(w): p for w, p in leaves(build_parser())}


def test_the_walker_finds_nested_subcommands():
    assert {"sim", "bench fleet", "study train", "gpu-server", "lerobot-server", "demo", "profile"} <= set(SUBCOMMANDS)
    assert not any(name in SUBCOMMANDS for name in ("bench", "study"))  # groups, not leaves


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_refuses_a_wrong_typed_value(name, tmp_path):
    parser = SUBCOMMANDS[name]
    option, value = bad_value(parser) or (None, "--no-such-option")
    argv = argv_with(name.split(), parser, option, value, tmp_path)
    if option is None:  # no typed option: one it does not have must still be refused in one line
        argv.append(value)
    check_refused(argv, value)


@pytest.mark.parametrize("words,option", list(path_cases()), ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_every_input_path_option_refuses_a_missing_file(words, option, tmp_path):
    argv = argv_with(words, SUBCOMMANDS[" ".join(words)], option, MISSING, tmp_path)
    if option in PARTNERS:
        argv += [PARTNERS[option], str(ROOT / "Makefile")]
    check_refused(argv, MISSING, timeout=20.0)


# --- paths that tracebacked or started serving (issue 21) --------------------------------------

@pytest.mark.parametrize("argv,wrong", [
    (["gpu-server", "--address", FREE, "--token-file", MISSING], MISSING),
    (["gpu-server", "--address", "bad"], "bad"),
    (["gpu-server", "--address", FREE, "--engine-params", "notjson"], "notjson"),
    (["gpu-server", "--address", FREE, "--tls-cert", MISSING, "--tls-key", MISSING], MISSING),
    (["gpu-server", "--address", FREE, "--tls-cert", str(ROOT / "Makefile"), "--tls-key", MISSING], MISSING),
    (["lerobot-server", "--policy-dir", MISSING, "--port", "0"], MISSING),
], ids=["token-file", "address", "engine-params", "tls-cert", "tls-key", "lerobot-policy-dir"])
def test_servers_refuse_before_serving(argv, wrong):
    check_refused(argv, wrong, timeout=20.0)


def test_profile_refuses_a_missing_policy_dir(tmp_path):
    check_refused(["profile", "--engine", "lerobot", "--engine-params", json.dumps({"policy_dir": MISSING}),
                   "--out", str(tmp_path / "p.json")], MISSING)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("argv,wrong", [
    (["profile", "--engine", "simulated", "--engine-params", "notjson"], "notjson"),
    (["profile", "--engine", "simulated", "--engine-params", "[1]"], "[1]"),
    (["profile", "--engine", "simulated", "--batch-sizes", "1,x"], "1,x"),
    (["profile", "--engine", "simulated", "--variants", "fp33"], "fp33"),
    (["profile", "--engine", "no-such-engine"], "no-such-engine"),
])
def test_profile_refuses_wrong_arguments(argv, wrong, tmp_path):
    check_refused([*argv, "--out", str(tmp_path / "p.json")], wrong)


@pytest.mark.parametrize("argv", [
    ["sim", "--workload", "metaworld-mixed-edge", "--robots", "4"],
    ["lerobot-server", "--port", "0", "--engine", "simulated", "--latency-ms", "1:10"],
], ids=["sim", "lerobot-server"])
def test_an_unknown_scheduler_knob_names_the_knobs_there_are(argv):
    line = check_refused([*argv, "--scheduler", "kairos", "--scheduler-param", "nosuch=3"], "nosuch",
                         timeout=20.0, also=("buckets", "aging"))
    assert "TypeError" not in line and "__init__" not in line


@pytest.mark.parametrize("argv,wrong", [
    (["sim", "--workload", "metaworld-mixed-edge", "--robots", "2", "--seed", "-1"], "-1"),
    (["bench", "fleet", "--workers", "-1"], "-1"),
    (["bench", "transport", "--out", "{tmp}/t.json", "--warmup", "-1"], "-1"),
    (["study", "collect", "--episodes", "-1", "--out", "{tmp}/d.npz"], "-1"),
    (["study", "merge", "--into", MISSING, "--add", MISSING], MISSING),
    (["demo", "--workload", "no-such-workload"], "no-such-workload"),
    (["demo", "--robots", "100000"], "100000"),  # once accepted: thousands of robot processes started
    (["bench", "soak", "--config", MISSING, "--out", "{tmp}/s.json"], MISSING),
    (["make-policy", "--kind", "act", "--out", "{tmp}/p", "--set", "no-equals-sign"], "no-equals-sign"),
], ids=["sim-seed", "fleet-workers", "transport-warmup", "collect-episodes", "merge-into", "demo-workload",
        "demo-robots", "soak-config", "make-policy-set"])
def test_values_that_tracebacked_are_refused(argv, wrong, tmp_path):
    check_refused([x.format(tmp=tmp_path) for x in argv], wrong, timeout=20.0)


def test_every_seed_option_refuses_a_negative_seed():
    """numpy's generators take seeds >= 0: -1 must be refused by the parser, not by numpy later."""
    seeds = [(name, a) for name, p in SUBCOMMANDS.items() for a in p._actions if "seed" in a.dest]
    assert len(seeds) >= 10
    takes = [f"{name} {a.option_strings[-1]}" for name, a in seeds if not _refused(a, "-1")]
    assert not takes, f"these take a negative seed: {takes}"


# --- the registry, where the knob check lives -------------------------------------------------

def test_registries_refuse_unknown_or_mistyped_knobs():
    with pytest.raises(ConfigError, match=r"'nosuch': given 3, but scheduler 'kairos' has no such knob; its knobs: "
                                          r"buckets, aging"):
        make_scheduler("kairos", nosuch=3)
    with pytest.raises(ConfigError, match=r"'buckets': 'x' is not an integer"):
        make_scheduler("kairos", buckets="x")
    with pytest.raises(ConfigError, match=r"'buckets': 2.5 is not an integer"):
        make_scheduler("kairos", buckets=2.5)
    with pytest.raises(ConfigError, match=r"'k': given 1, but scheduler 'fifo' has no such knob; it takes none"):
        make_scheduler("fifo", k=1)
    with pytest.raises(ConfigError, match=r"'hh': given 3, but horizon policy 'static' has no such knob; its knobs: h"):
        make_horizon_policy("static", hh=3)
    assert make_scheduler("kairos", buckets=5).buckets == 5  # a knob it takes still works
    assert make_horizon_policy("static", h=7).h == 7


# --- the walker can fail ----------------------------------------------------------------------

@pytest.mark.parametrize("script,why", [
    ("raise ValueError('x')", "traceback"),
    ("import sys; sys.stderr.write('bad value x\\nusage: ...\\n'); sys.exit(2)", "lines, not one"),
    ("import sys; sys.stderr.write('bad value x\\n'); sys.exit(1)", "not 2"),
    ("import sys; sys.stderr.write('something is wrong\\n'); sys.exit(2)", "does not name"),
    ("import time; time.sleep(30)", "still running"),
])
def test_the_check_fails_on_a_bad_refusal(script, why):
    with pytest.raises(AssertionError, match=why):
        check_refused([], "x", cmd=[sys.executable, "-c", script], timeout=3.0)


def test_a_fake_subcommand_whose_handler_raises_is_caught(tmp_path):
    """A subcommand the walker finds (nested, typed option) whose handler tracebacks fails the check."""
    p = argparse.ArgumentParser(prog="fake")
    group = p.add_subparsers(dest="cmd").add_parser("group").add_subparsers(dest="sub")
    leaf = group.add_parser("leaf")
    leaf.add_argument("--count", type=int)
    found = dict((" ".join(w), q) for w, q in leaves(p))
    assert list(found) == ["group leaf"] and bad_value(found["group leaf"]) == ("--count", "not-a-number")
    script = tmp_path / "fake.py"
    script.write_text("import sys\nint(sys.argv[-1])\n")  # the handler forgets to check: ValueError traceback
    with pytest.raises(AssertionError, match="traceback"):
        check_refused([], "not-a-number", cmd=[sys.executable, str(script), "group", "leaf", "--count", "not-a-number"])


# --- `robotserve demo` writes to scratch unless told -------------------------------------------

def test_demo_writes_to_scratch_unless_out_says_otherwise(monkeypatch, capsys):
    from robotserve_ros import cli
    from robotserve_ros.live import demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out, robots, **kw: seen.append(out) or {"runs": {}})
    assert cli.main(["demo", "--robots", "1"]) == 0
    assert cli.main(["demo", "--robots", "1", "--out", str(ROOT / "reports/live")]) == 2  # the record: --force
    assert cli.main(["demo", "--robots", "1", "--out", str(ROOT / "reports/live"), "--force"]) == 0
    assert seen == [cli.demo_scratch_dir(), ROOT / "reports/live"]
    assert ROOT not in cli.demo_scratch_dir().resolve().parents  # never over the tracked reports
    out = capsys.readouterr().out
    assert f"report: {cli.demo_scratch_dir() / 'live_demo.md'}" in out  # it says where the report went
    make_demo = (ROOT / "Makefile").read_text().split("\ndemo:")[1].split("\n\n")[0]
    assert "robotserve demo" in make_demo and "reports/live" not in make_demo


def test_demo_refuses_a_wrong_workload_before_starting_anything(monkeypatch, capsys):
    from robotserve_ros import cli
    from robotserve_ros.live import demo

    monkeypatch.setattr(demo, "run_demo", lambda *a, **kw: pytest.fail("the demo started"))
    assert cli.main(["demo", "--workload", "no-such-workload"]) == 2
    assert "'no-such-workload'" in capsys.readouterr().err


def test_a_wrong_horizon_knob_fails_when_the_core_is_built(make_core):
    with pytest.raises(ConfigError, match=r"'hh': given 25, but horizon policy 'static' has no such knob; its knobs: h"):
        make_core(horizon_params={"static": {"hh": 25}})
    core, _ = make_core(horizon_params={"static": {"h": 25}})  # the knobs it takes still build
    assert core is not None


@pytest.mark.parametrize("param,wrong,knobs", [
    ("scheduler.remaining.nosuch:=3", "nosuch", "buckets"),
    ("horizon.static.hh:=25", "hh", "its knobs: h"),
    ("engine.name:=sampled engine.sampled.inner:=simulated engine.sampled.chunk_sise:=30", "chunk_sise",
     "(inner, k, saturation_batch) nor the engine 'simulated' it wraps"),
], ids=["scheduler", "horizon", "sampled-inner"])
def test_the_inference_server_names_a_wrong_knob_at_start(param, wrong, knobs):
    pytest.importorskip("rclpy")
    from rosutil import start_node

    params = [x for p in param.split() for x in ("-p", p)]  # the wrong one last
    proc = start_node(["robotserve_ros.nodes.inference_server", "--ros-args", *params])
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.stop()
    lines = [ln for ln in proc.stderr().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, proc.output()
    key = param.split()[-1].split(":=")[0]  # the dotted key, named whole
    assert f"'{key}'" in lines[0] and knobs in lines[0] and "Traceback" not in proc.output(), proc.output()


# --- `robotserve study ...` and `demo`: every flag's wrong value or file, before anything runs -------

@pytest.fixture
def bad_files(tmp_path):
    """Files of the wrong kind: junk bytes, an npz without the demos' arrays, a JSON-lines file
    without a runs record, YAML that does not parse, YAML that is no ROS params file."""
    import numpy as np

    (tmp_path / "junk.npz").write_bytes(b"not an npz\n")
    np.savez(tmp_path / "nokeys.npz", a=np.zeros(3))
    (tmp_path / "runs.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "bad.yaml").write_text("inference_server: [unclosed\n")
    (tmp_path / "flat.yaml").write_text("nosuch_key: 3\n")
    (tmp_path / "knob.yaml").write_text("inference_server:\n  ros__parameters:\n    engine:\n      name: simulated\n"
                                        "      simulated: {chunk_sise: 30}\n")
    return tmp_path


FC = "HEAD"  # rtc-arms needs a commit of this repository to get as far as its other flags
STUDY_CASES = [
    (["study", "train", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o", "--steps", "-1"], "--steps"),
    (["study", "train", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o", "--batch-size", "0"], "--batch-size"),
    (["study", "train", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o", "--lr", "nan"], "--lr"),
    (["study", "train", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o", "--threads", "0"], "--threads"),
    (["study", "train", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o"], "junk.npz"),
    (["study", "train", "--demos", "{tmp}/nokeys.npz", "--out", "{tmp}/o"], "'state'"),
    (["study", "train-flow", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o", "--lr", "-1"], "--lr"),
    (["study", "train-flow", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o"], "junk.npz"),
    (["study", "train-flow", "--demos", "{tmp}/junk.npz", "--out", "{tmp}/o", "--prefix-max-delay", "-1"],
     "--prefix-max-delay"),
    (["study", "horizon", "--policy", MISSING], MISSING),
    (["study", "horizon", "--policy", "models/pushgust_flow", "--thresholds", "nan"], "--thresholds"),
    (["study", "horizon", "--policy", "models/pushgust_flow", "--schedule-t", "-1"], "--schedule-t"),
    (["study", "horizon", "--policy", "models/pushgust_flow", "--learned-cos", "2"], "--learned-cos"),
    (["study", "horizon", "--policy", "models/pushgust_flow", "--profile", MISSING], MISSING),
    (["study", "horizon", "--policy", "models/pushgust_flow", "--profile", "{tmp}/junk.npz"], "--profile"),
    (["study", "horizon", "--policy", "models/pushgust_flow", "--static"], "--h-min"),
    (["study", "workload", "--run", "reports/horizon/pushgust-diffusion.json", "--out", "{tmp}/w.json",
      "--profile", MISSING], MISSING),
    (["study", "rtc", "--out", "{tmp}/r", "--tasks", "pushgust", "--policy", "pushgust"], "--policy"),
    (["study", "rtc-arms", "--out", "{tmp}/ra", "--frozen-commit", FC, "--tasks", "nosuch=1"], "nosuch=1"),
    (["study", "rtc-arms", "--out", "{tmp}/ra", "--frozen-commit", FC, "--arms", "nosuch"], "nosuch"),
    (["study", "rtc-arms", "--out", "{tmp}/ra", "--frozen-commit", FC, "--delays", "9"], "--delays"),
    (["study", "rtc-arms", "--out", "{tmp}/ra", "--frozen-commit", FC, "--delays", "-1"], "--delays"),
    (["study", "rtc-arms", "--out", "{tmp}/ra", "--frozen-commit", "nosuchcommit"], "nosuchcommit"),
    (["study", "rtc-profile", "--policy", MISSING], MISSING),
    (["study", "fleet", "--workloads", "nosuch", "--out", "{tmp}/f"], "nosuch"),
    (["study", "fleet-closed", "--runs", "{tmp}/junk.npz", "--report-only", "--out", "{tmp}/fc"], "--runs"),
    (["study", "fleet-closed", "--runs", "{tmp}/runs.jsonl", "--report-only", "--out", "{tmp}/fc"], "--runs"),
    (["study", "fleet-closed", "--live-demo", MISSING, "--out", "{tmp}/fc"], MISSING),
    (["demo", "--robots", "0"], "--robots"),
    (["demo", "--tasks", "0"], "--tasks"),
    (["demo", "--seed", "-1"], "--seed"),
    (["demo", "--workload", "pushgust-flow-matching", "--config", "{tmp}/bad.yaml"], "bad.yaml"),
    (["demo", "--workload", "pushgust-flow-matching", "--config", "{tmp}/flat.yaml"], "nosuch_key"),
    (["demo", "--workload", "pushgust-flow-matching", "--config", "{tmp}/knob.yaml"], "engine.simulated.chunk_sise"),
    (["up", "{tmp}/bad.yaml"], "bad.yaml"),
    (["up", "{tmp}/knob.yaml"], "engine.simulated.chunk_sise"),
    (["sim", "--workload", "pushgust-flow-matching", "--robots", "2", "--tasks", "5"], "--tasks"),  # was ignored
    (["bench", "soak", "--config", "{tmp}/bad.yaml", "--out", "{tmp}/s.json"], "bad.yaml"),
    (["bench", "chaos", "--config", "{tmp}/knob.yaml", "--out", "{tmp}/c"], "engine.simulated.chunk_sise"),
    (["bench", "fleet-live", "--fault-drop", "0.01", "--out", "{tmp}/f.json"], "--fault-drop"),  # robot_client drops nothing
    (["bench", "fleet-live", "--light", "--fault-drop", "1", "--out", "{tmp}/f.json"], "--fault-drop"),
    (["bench", "peer", "--policy-dir", "models/pushgust_diffusion", "--device", "gpu0", "--out", "{tmp}/p.json"],
     "--device"),
    (["lerobot-server", "--port", "0", "--host", "nosuch.invalid"], "--host"),
    (["openpi-server", "--port", "0", "--host", "nosuch.invalid", "--policy", "x"], "--host"),
]


@pytest.mark.parametrize("argv,wrong", STUDY_CASES, ids=[" ".join(a[:2]) + f" {w}" for a, w in STUDY_CASES])
def test_study_demo_up_and_sim_flags_refuse_a_wrong_value_before_running(argv, wrong, bad_files):
    check_refused([x.format(tmp=bad_files) for x in argv], wrong.format(tmp=bad_files), timeout=30.0)


@pytest.mark.parametrize("argv,wrong", [
    (["make-policy", "--kind", "act", "--out", "{tmp}/p", "--set", "nosuch=1"], "'nosuch'"),
    (["make-policy", "--kind", "act", "--out", "{tmp}/p", "--set", "chunk_size=abc"], "chunk_size=abc"),
    (["make-policy", "--kind", "act", "--out", "{tmp}/p", "--cameras", "0"], "--cameras"),
    (["make-policy", "--kind", "diffusion", "--out", "{tmp}/p", "--scheduler", "nosuch"], "nosuch"),
    (["llm-profile", "--out", "{tmp}/l.json", "--model", MISSING], MISSING),
    (["llm-profile", "--out", "{tmp}/l.json", "--threads", "0"], "--threads"),
], ids=["set-key", "set-json", "cameras", "scheduler", "llm-model", "llm-threads"])
def test_make_policy_and_llm_profile_name_a_wrong_value(argv, wrong, tmp_path):
    line = check_refused([x.format(tmp=tmp_path) for x in argv], wrong, timeout=60.0)
    assert "__init__" not in line and "Expecting value" not in line
    assert not (tmp_path / "p").exists()
    if "nosuch=1" in argv:
        assert "chunk_size" in line  # the fields there are
