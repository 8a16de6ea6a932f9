"""Every option of every `robotserve` command says what it is and shows its default, and no
command writes where the user did not say: a non-empty --out needs --force, and no default
output lies inside the package or the git tree."""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from robotserve_ros import cli
from robotserve_ros.cli_types import check_out, UsageError

ROOT = Path(__file__).resolve().parents[1]


def options():
    """(command words, option action) of every option under `robotserve`, help filled in."""
    def walk(p, words):
        p.format_help()  # fills in the common help and the default of every option
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield from walk(sp, words + [name])
            elif a.option_strings and a.dest != "help":
                yield " ".join(words), a
    return list(walk(cli.build_parser(), []))


def test_every_option_has_help_and_shows_its_default():
    no_help, no_default = [], []
    for cmd, a in options():
        h = (a.help or "").strip()
        if not h or h.startswith("(default"):
            no_help.append(f"{cmd} {a.option_strings[-1]}")
        if not any(a.default is x for x in (None, False, argparse.SUPPRESS)) and "default" not in h:
            no_default.append(f"{cmd} {a.option_strings[-1]}")
    assert not no_help and not no_default, (no_help, no_default)


def test_help_text_renders_the_default_value(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--robots ROBOTS robots in the fleet (default: 10)" in out and "(default: 0)" in out


def test_no_default_output_is_in_the_package_or_the_git_tree():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    tracked_dirs = {str(Path(t).parent) for t in tracked}
    inside = []
    for cmd, a in options():
        if a.dest not in ("out", "report_dir") or a.default is None:
            continue
        p = Path(a.default)
        full = (p if p.is_absolute() else ROOT / p).resolve()
        rel = str(full.relative_to(ROOT)) if ROOT in full.parents else None
        if rel is not None and (rel in tracked or rel in tracked_dirs or any(t.startswith(rel + "/") for t in tracked)):
            inside.append(f"{cmd} {a.option_strings[-1]} {a.default}")
    assert not inside, inside


def test_every_command_with_out_takes_force():
    missing = {cmd for cmd, a in options() if a.dest == "out"} - {cmd for cmd, a in options() if a.dest == "force"}
    assert not missing, missing


def test_a_non_empty_out_is_refused_in_one_line_naming_out_and_force(tmp_path, capsys):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "model.safetensors").write_text("trained")
    assert cli.main(["make-policy", "--kind", "act", "--out", str(policy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(policy) in err[0] and "--out" in err[0] and "--force" in err[0], err
    assert (policy / "model.safetensors").read_text() == "trained"  # untouched
    result = tmp_path / "r.json"
    result.write_text("{}")
    assert cli.main(["bench", "scheduler", "--out", str(result), "--sizes", "10", "--repeats", "1"]) == 2
    assert result.read_text() == "{}"
    assert cli.main(["bench", "scheduler", "--out", str(result), "--sizes", "10", "--repeats", "1", "--force"]) == 0
    assert result.read_text() != "{}"


def test_check_out_lets_new_and_empty_paths_through(tmp_path):
    check_out(tmp_path / "new", force=False)
    check_out(tmp_path, force=False)  # empty folder
    (tmp_path / "f").write_text("")
    check_out(tmp_path / "f", force=False)  # an empty file
    with pytest.raises(UsageError):
        check_out(tmp_path, force=False)
    check_out(tmp_path, force=True)
