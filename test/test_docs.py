"""Every documented command and snippet runs as pasted, and the documented defaults are the code's.

Each fenced `bash`/`sh` and `python` block of README.md and docs/*.md is run, in the order of
its file (a later block may use what an earlier one wrote), from the repository root, with the
project's venv first on PATH and an isolated ROS domain; a block that exits non-zero or outlives
its timeout fails the test with its file, line and output. A block that needs hardware, root, a
ROS install or a long run is listed in test/docs_skip.txt (at most 5 entries, each with its
reason); usage synopses are `text` blocks, not commands. The docs show long-running commands
in a small form (`--duration`, few episodes) so this stays a few minutes."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rosutil import ros_env

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_FILE = ROOT / "test" / "docs_skip.txt"
MAX_SKIPS = 5
RUN = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python", "py": "python"}
TIMEOUT_S = 240.0  # one block; the longest (a short live fleet, a small policy) take well under it
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.M | re.S)
# ```bash until-stopped: each command runs until Ctrl-C (a node, a server); each must still be
# running (or have ended with 0) after STOP_AFTER_S, and stop cleanly on SIGINT.
UNTIL_STOPPED = "until-stopped"
STOP_AFTER_S = 10.0


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    text: str
    info: str = ""

    @property
    def key(self) -> str:
        """`docs/x.md | its first line`: what the skip file names (stable when other text moves)."""
        return f"{self.doc.relative_to(ROOT)} | {self.text.strip().splitlines()[0].strip()}"


def blocks(doc: Path) -> list[Block]:
    s = doc.read_text()
    return [Block(doc, s.count("\n", 0, m.start()) + 1, m.group(1), m.group(3), m.group(2).strip())
            for m in FENCE.finditer(s)]


def runnable(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.lang in RUN]


def skips() -> dict[str, str]:
    """key -> reason, from test/docs_skip.txt (`doc | first line | reason`, # comments)."""
    out = {}
    for ln in SKIP_FILE.read_text().splitlines():
        if ln.strip() and not ln.startswith("#"):
            doc, first, reason = (x.strip() for x in ln.split(" | ", 2))
            out[f"{doc} | {first}"] = reason
    return out


def test_the_skip_file_is_short_and_each_entry_names_a_block_and_why():
    s = skips()
    assert len(s) <= MAX_SKIPS, f"{len(s)} skipped blocks; at most {MAX_SKIPS}"
    keys = {b.key for d in DOCS for b in runnable(d)}
    assert set(s) <= keys, f"skip entries naming no block: {sorted(set(s) - keys)}"
    assert all(len(reason) > 20 for reason in s.values()), s


def test_the_extractor_sees_every_language_and_the_block_lines():
    b = blocks(ROOT / "docs" / "deploy.md")
    assert any(x.lang == "python" for x in b) and any(x.lang == "bash" for x in b)
    text = (ROOT / "docs" / "deploy.md").read_text().splitlines()
    assert all(text[x.line - 1].startswith("```") for x in b)


def commands(text: str) -> list[str]:
    """The commands of a shell block: backslash continuations joined, comments and blanks dropped."""
    out, cur = [], ""
    for ln in text.splitlines():
        cur += ln[:-1] + " " if ln.rstrip().endswith("\\") else ln
        if not ln.rstrip().endswith("\\"):
            if cur.strip() and not cur.strip().startswith("#"):
                out.append(cur.strip())
            cur = ""
    return out


def _default_signals() -> None:
    """In the child: Ctrl-C and SIGTERM as in a user's shell, whatever this test process was left
    with (an ignored signal is inherited, and Python then installs no handler for it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_until_stopped(b: Block, env: dict) -> subprocess.CompletedProcess:
    """Every command of the block at once; after STOP_AFTER_S each must still run (or have ended
    0); then SIGINT, and each must end cleanly (0, or the SIGINT it was stopped by)."""
    import time

    procs = [(c, subprocess.Popen(["bash", "-c", f"exec {c}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                  preexec_fn=_default_signals))
             for c in commands(b.text)]
    time.sleep(STOP_AFTER_S)
    outs, code = [], 0
    for c, p in procs:
        early = p.poll()
        if early is None:
            os.killpg(p.pid, signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            early = "did not stop on SIGINT"
        rc = p.returncode
        ok = (early == 0) if early is not None else rc in (0, -signal.SIGINT, 130)
        if not ok:
            code = 1
            outs.append(f"$ {c}\n(ended {early if early is not None else rc} "
                        f"{'before' if early is not None else 'after'} the stop)\n{out[-2000:]}")
    return subprocess.CompletedProcess(b.text, code, "\n".join(outs))


def run_block(b: Block, env: dict) -> subprocess.CompletedProcess:
    if b.info == UNTIL_STOPPED:
        return run_until_stopped(b, env)
    cmd = ["bash", "-eo", "pipefail", "-c", b.text] if RUN[b.lang] == "shell" else [sys.executable, "-c", b.text]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the block and whatever it started
        out, _ = p.communicate()
        return subprocess.CompletedProcess(cmd, -9, f"{out}\n(killed after {TIMEOUT_S:.0f} s)")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # nothing it started in the background outlives it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, p.returncode, out)


def test_the_runner_fails_a_failing_block_and_an_until_stopped_one_that_dies(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "STOP_AFTER_S", 1.0)
    doc, env = ROOT / "README.md", dict(os.environ)
    assert run_block(Block(doc, 1, "bash", "true\nfalse\ntrue\n"), env).returncode != 0  # any line failing
    assert run_block(Block(doc, 1, "python", "print('ok')\n"), env).returncode == 0
    dies = Block(doc, 1, "bash", "sleep 30\nbash -c 'exit 3'\n", UNTIL_STOPPED)
    r = run_until_stopped(dies, env)
    assert r.returncode == 1 and "exit 3" in r.stdout, r.stdout
    assert run_until_stopped(Block(doc, 1, "bash", "sleep 30  # a server\ntrue\n", UNTIL_STOPPED), env).returncode == 0
    assert commands("a \\\n  b\n# c\n\nd\n") == ["a    b", "d"]


def doc_env(doc: Path) -> dict:
    env = ros_env(test_id=f"docs-{doc.name}")
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded at run time here
    return env


@pytest.mark.parametrize("doc", [d for d in DOCS if runnable(d)], ids=lambda d: d.name)
def test_every_block_of_the_doc_runs_as_pasted(doc):
    skip, failed = skips(), []
    env = doc_env(doc)
    for b in runnable(doc):
        if b.key in skip:
            continue
        r = run_block(b, env)
        if r.returncode != 0:
            failed.append(f"{b.doc.relative_to(ROOT)}:{b.line} ({b.lang}) exit {r.returncode}:\n{b.text}\n"
                          f"--- output (last 3000 chars) ---\n{r.stdout[-3000:]}")
    assert not failed, "\n\n".join(failed)


# --- the defaults docs/parameters.md states are the dataclasses' ---------------------------------

def _doc_value(v) -> str:
    """A default as the parameters tables write it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v else "''"
    if isinstance(v, tuple):
        return str(list(v))
    return str(v)


def _tables(doc: Path) -> dict[str, dict[str, str]]:
    """### heading -> {parameter: default} of each parameters table under it."""
    out, head = {}, None
    for ln in doc.read_text().splitlines():
        if ln.startswith("### "):
            head = ln[4:].split(" (")[0].strip()
            out[head] = {}
        m = re.match(r"^\| `([^`]+)` \| `([^`]*)` \|", ln)
        if m and head is not None:
            out[head][m.group(1)] = m.group(2)
    return out


def test_the_documented_defaults_are_the_config_dataclasses():
    from robotserve_ros.config import flatten
    from robotserve_ros.nodes.bag_player import BagPlayerConfig
    from robotserve_ros.nodes.bag_recorder import BagRecorderConfig
    from robotserve_ros.nodes.planner_robot import PlannerRobotConfig
    from robotserve_ros.nodes.robot_client import RobotClientConfig
    from robotserve_ros.nodes.server_config import InferenceServerConfig, RayTierConfig, RemoteTierConfig
    from robotserve_ros.nodes.sim_robot import SimRobotConfig

    tables = _tables(ROOT / "docs" / "parameters.md")
    sections = {"inference_server": InferenceServerConfig, "a remote tier's section": RemoteTierConfig,
                "a ray tier's section": RayTierConfig, "robot_client": RobotClientConfig, "sim_robot": SimRobotConfig,
                "bag_player": BagPlayerConfig, "bag_recorder": BagRecorderConfig, "planner_robot": PlannerRobotConfig}
    wrong, checked = [], 0
    for head, cls in sections.items():
        assert tables.get(head), f"docs/parameters.md has no table under '### {head}'"
        defaults = {k: v for k, (v, _) in flatten(_defaults(cls)).items()}
        for name, doc_default in tables[head].items():
            if name in defaults:
                checked += 1
                if _doc_value(defaults[name]) != doc_default:
                    wrong.append(f"{head}: {name} is {_doc_value(defaults[name])!r} in the code, {doc_default!r} in the doc")
        missing = set(defaults) - set(tables[head])
        assert not missing, f"{head}: parameters the doc does not list: {sorted(missing)}"
    assert checked > 80 and not wrong, wrong


def _defaults(cls):
    """The dataclass with every field at its default, unchecked (a required field: None)."""
    from dataclasses import fields

    from robotserve_ros.config import defaults_of

    obj, d = object.__new__(cls), defaults_of(cls)
    for f in fields(cls):
        object.__setattr__(obj, f.name, d.get(f.name))
    return obj
