"""`robotserve doctor` (make doctor): is this venv the one `make` builds? `pip check`'s lines,
each matched against requirements/pip-check-expected.txt (the declared requirements left unmet
on purpose, each with its reason), and the torch / torchvision pair the policies import.

Exit 0 when every `pip check` line is an expected one, 1 when one is not (printed first, with
what to do). Imports no torch: the pair is read from the installed metadata and torchvision's
ops library is loaded in a child process, the way torch_env does."""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

EXPECTED = Path(__file__).resolve().parents[1] / "requirements" / "pip-check-expected.txt"
# "lerobot 0.4.4 requires cmake, which is not installed." / "x 1 has requirement torch<2.11, but you have ..."
LINE = re.compile(r"^(?P<pkg>\S+) \S+ (?:requires|has requirement) (?P<req>[A-Za-z0-9_.\-]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def expected(path: Path = EXPECTED) -> dict:
    """(package, requirement) -> why, from the expected list."""
    out = {}
    for raw in path.read_text().splitlines():
        body, _, why = raw.partition("#")
        words = body.split()
        if len(words) == 2:
            out[(_norm(words[0]), _norm(words[1]))] = why.strip()
    return out


def classify(lines, known: dict) -> tuple:
    """pip check's lines -> (expected [(line, why)], unexpected [line])."""
    ok, bad = [], []
    for line in (x.strip() for x in lines):
        m = LINE.match(line)
        key = (_norm(m["pkg"]), _norm(m["req"])) if m else None
        if key in known:
            ok.append((line, known[key]))
        elif line and not line.startswith("No broken requirements"):
            bad.append(line)
    return ok, bad


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def torchvision_ops() -> str:
    """How torchvision's compiled ops load here: natively, or only through torch_env's shim."""
    code = ("from robotserve_ros.engines import torch_env as t; t.import_torch(); "
            "print('shim' if t.shim_applied() else 'native')")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "unknown (importing torch took over 120 s)"
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"does not import: {last}"
    return {"native": "its ops library loads (no shim)",
            "shim": "its ops library does not load beside this torch: torch_env.import_torch() declares the two "
                    "operators the policies need; import torch through it before LeRobot (docs/building.md)"
            }.get(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "", r.stdout.strip())


def cmd_doctor(a) -> int:
    r = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    ok, bad = classify(r.stdout.splitlines() + r.stderr.splitlines(), expected())
    for line in bad:
        print(f"UNEXPECTED  {line}")
    if bad:
        print(f"  -> not what `make` builds: re-run `make interfaces ml llm ray`, or add the line to {EXPECTED.name} "
              "with its reason if it is meant")
    print(f"pip check: {len(ok)} expected line(s), {len(bad)} unexpected ({EXPECTED.relative_to(EXPECTED.parents[1])})")
    if a.verbose:
        for line, why in ok:
            print(f"  expected  {line}\n            {why}")
    tv = torchvision_ops() if _version("torchvision") != "not installed" and not a.no_import else "not checked"
    print(f"torch {_version('torch')}, torchvision {_version('torchvision')}, lerobot {_version('lerobot')}; "
          f"torchvision: {tv}")
    return 1 if bad else 0


def add_parser(sub) -> None:
    d = sub.add_parser("doctor", help="is this venv the one `make` builds: pip check against the expected list "
                                      "(requirements/pip-check-expected.txt), the torch/torchvision pair")
    d.add_argument("--verbose", action="store_true", help="print every expected line with its reason")
    d.add_argument("--no-import", action="store_true", help="do not import torch to see how torchvision's ops load")
    d.set_defaults(func=cmd_doctor)


__all__ = ["EXPECTED", "add_parser", "classify", "cmd_doctor", "expected"]
