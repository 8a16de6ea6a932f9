"""The house's rules that keep a change cheap (docs/architecture.md, issue 35): every client
protocol reaches the core through serve.Fleet; nothing outside core/ and serve/ touches the
Runner's lock or core or the core's ledger, stats or queue; no front end keeps its own table
of waiting calls; the robot-side rule has one home (core/robot_loop.py); files and functions
stay small enough to read.

Sizes: no package file over MAX_FILE lines and no function over MAX_FUNC lines in nodes/,
transport/ and serve/. The only exception is OVER below, at its size today: it may shrink but
never grow, and leaves the list once it fits; anything else over a limit fails."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from test_layers import PKG, _imports

MAX_FILE, MAX_FUNC = 450, 60
FUNC_DIRS = ("nodes", "transport", "serve")
FREE = ("core", "serve", "bench")  # may import core.runner / core.serving (test/ is outside the package)
# path -> lines (files) or path:function -> lines, for a place not split yet.
OVER: dict = {}  # none left
NOT_ON_FLEET: set = set()  # none left: the simulator drives its fleet's steps (serve.Fleet.dispatch_now, ...)
INTERNALS = re.compile(r"\brunner\.(lock|core)\b|\bcore\.(ledger|stats|pending)\b|\.listen\(|\bon_replies\b")
WAITING_TABLES = re.compile(r"\b(waiters|_waiting|by_task)\b")


def _files():
    return [f for f in sorted(PKG.rglob("*.py")) if "proto" not in f.parts]


def _rel(f: Path) -> str:
    return str(f.relative_to(PKG))


def _top(f: Path) -> str:
    return f.relative_to(PKG).parts[0]


def test_only_core_serve_and_bench_import_the_runner_or_the_serving_core():
    bad = []
    for f in _files():
        if _top(f) in FREE or _rel(f) in NOT_ON_FLEET:
            continue
        for mod, line in _imports(f):
            if mod.endswith(("core.runner", "core.serving")) or ".core.runner." in mod or ".core.serving." in mod:
                bad.append(f"{_rel(f)}:{line} imports {mod}")
    assert not bad, "reach the core through serve.Fleet:\n" + "\n".join(bad)


def test_nothing_outside_core_and_serve_touches_runner_internals_or_keeps_a_waiting_table():
    bad = []
    for f in _files():
        if _top(f) in ("core", "serve", "bench") or _rel(f) in NOT_ON_FLEET:
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if code.lstrip().startswith(("from ", "import ")):
                continue  # module paths (core.ledger's Span) are the import test's business
            if INTERNALS.search(code):
                bad.append(f"{_rel(f)}:{i}: {line.strip()}")
            # nodes/services: the language services' calls wait on language ids, not on (task, round)
            if _top(f) in ("nodes", "transport") and WAITING_TABLES.search(code) and "services" not in f.parts:
                bad.append(f"{_rel(f)}:{i} (a table of waiting calls): {line.strip()}")
    assert not bad, "Runner internals / waiting calls belong to serve.Fleet:\n" + "\n".join(bad)


def test_the_robot_side_rule_is_imported_by_the_robot_loop_alone():
    """Every robot driver runs core/robot_loop.py (its RobotLoop per control tick, or its
    ReplayRobot for replayed rounds), so no driver re-implements the trigger point, hold and
    execution rule around core/robot_timing (issue 34)."""
    bad = [f"{_rel(f)}:{line} imports {mod}" for f in _files() if _rel(f) != "core/robot_loop.py"
           for mod, line in _imports(f) if mod.endswith(".robot_timing") or ".robot_timing." in mod]
    assert not bad, "take the robot-side rule from core/robot_loop.py:\n" + "\n".join(bad)


def _sizes() -> dict:
    out = {}
    for f in _files():
        n = len(f.read_text().splitlines())
        if n > MAX_FILE:
            out[_rel(f)] = n
        if _top(f) in FUNC_DIRS:
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNC:
                        out[f"{_rel(f)}:{node.name}"] = n
    return out


def test_no_file_or_function_grows_past_its_limit():
    grown = {k: n for k, n in _sizes().items() if n > OVER.get(k, MAX_FILE if ":" not in k else MAX_FUNC)}
    assert not grown, f"over {MAX_FILE} lines a file / {MAX_FUNC} a function (split it): {grown}"


def test_the_over_list_only_shrinks():
    """A file that fits now leaves OVER, so it cannot grow back to its old size unnoticed."""
    sizes = _sizes()
    fits = sorted(k for k in OVER if k not in sizes or sizes[k] < OVER[k])
    assert not fits, f"these shrank: lower or drop their OVER entry: {fits}"


def test_the_inference_server_stays_a_thin_translator():
    assert len((PKG / "nodes" / "inference_server.py").read_text().splitlines()) <= 250


def test_the_checks_see_what_they_look_for():
    assert INTERNALS.search("with self.runner.lock:") and INTERNALS.search("node.core.ledger.tasks")
    assert WAITING_TABLES.search("self.waiters[key] = w") and not INTERNALS.search("self.fleet.lock")
    assert any(m.endswith("core.runner") for m, _ in _imports(PKG / "serve" / "fleet.py"))
