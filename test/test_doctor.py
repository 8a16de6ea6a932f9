"""`robotserve doctor`: pip check's lines against requirements/pip-check-expected.txt, every
expected one with its reason, any other one named and exit 1."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from robotserve_ros.cli_doctor import EXPECTED, classify, expected

ROOT = Path(__file__).resolve().parents[1]


def test_every_expected_line_has_its_reason():
    known = expected()
    assert ("lerobot", "torch") in known and ("lerobot", "torchvision") in known
    assert all(len(why) > 20 for why in known.values()), known


def test_pip_checks_lines_are_matched_by_package_and_requirement():
    known = expected()
    lines = [
        "lerobot 0.4.4 has requirement torch<2.11.0,>=2.2.1, but you have torch 2.13.0+cpu.",
        "lerobot 0.4.4 requires rerun-sdk, which is not installed.",
        "lerobot 0.4.4 requires rerun_sdk, which is not installed.",  # the same name, spelt otherwise
        "transformers 4.57.1 has requirement tokenizers<0.23, but you have tokenizers 0.23.1.",  # not expected
        "No broken requirements found.",
        "",
    ]
    ok, bad = classify(lines, known)
    assert [line for line, _ in ok] == lines[:3]
    assert ok[0][1] == known[("lerobot", "torch")] and ok[1][1] == ok[2][1] == known[("lerobot", "rerun-sdk")]
    assert bad == ["transformers 4.57.1 has requirement tokenizers<0.23, but you have tokenizers 0.23.1."]


def test_doctor_names_an_unexpected_line_and_exits_1(tmp_path, monkeypatch, capsys):
    from robotserve_ros import cli, cli_doctor

    class Done:
        returncode, stderr = 1, ""
        stdout = "lerobot 0.4.4 requires wandb, which is not installed.\nfoo 1.0 requires bar, which is not installed.\n"

    monkeypatch.setattr(cli_doctor.subprocess, "run", lambda *a, **kw: Done())
    assert cli.main(["doctor", "--no-import"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("UNEXPECTED  foo 1.0 requires bar") and "1 expected line(s), 1 unexpected" in out


def test_this_venv_has_only_the_expected_pip_check_lines():
    """The venv `make` built: every line pip check reports is in the expected list."""
    r = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "doctor", "--no-import"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 unexpected" in r.stdout and EXPECTED.name in r.stdout
