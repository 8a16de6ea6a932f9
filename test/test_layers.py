"""The house's arrows point down (docs/architecture.md): core imports nothing above it."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "robotserve_ros"
FORBIDDEN_TOP = {"rclpy", "grpc", "torch", "torchvision", "lerobot", "rosidl_runtime_py", "cv2"}
OUTER = {"nodes", "transport", "engines", "sim", "live", "study", "net", "cli", "bags", "launch_description",
         "profiles", "msg", "srv", "slo", "timely", "bench"}


def _imports(path: Path, pkg: Path = PKG):
    """(module, line) of every import in a file, relative imports resolved against the package."""
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    here = parts[:-1] if path.name != "__init__.py" else parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, node.lineno
            for a in node.names:  # `from pkg import sub` may name a submodule: the graph keeps those that are
                yield f"{mod}.{a.name}", node.lineno
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            yield "__import__(...)", node.lineno


def test_core_imports_nothing_above_it():
    bad = []
    for f in sorted((PKG / "core").rglob("*.py")):
        for mod, line in _imports(f):
            top = mod.split(".")[0]
            inner = mod.split(".")[1] if mod.startswith("robotserve_ros.") and mod.count(".") >= 1 else None
            if top in FORBIDDEN_TOP or inner in OUTER or mod == "__import__(...)":
                bad.append(f"{f.relative_to(PKG.parent)}:{line} imports {mod}")
    assert not bad, "core/ must stay pure (docs/architecture.md):\n" + "\n".join(bad)


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """The scan above must be able to fail: a relative import of nodes from core is caught."""
    fake = PKG / "core" / "_layer_probe_tmp.py"
    fake.write_text("from ..nodes import common\nimport torch\n")
    try:
        found = [m for m, _ in _imports(fake)]
    finally:
        fake.unlink()
    assert "robotserve_ros.nodes" in found and "torch" in found


def test_no_string_imports_of_project_modules():
    """Imports go through the import statement, so the layering above can see them."""
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        if "proto" in f.parts:
            continue
        for mod, line in _imports(f):
            if mod == "__import__(...)":
                bad.append(f"{f.relative_to(PKG.parent)}:{line}")
    assert not bad, "string imports (__import__) hide the layering:\n" + "\n".join(bad)


def _module_name(path: Path, pkg: Path = PKG) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(pkg: Path = PKG) -> dict:
    """module -> the package modules it imports, at module level or inside a function alike.
    `from pkg import sub` counts as importing the submodule; importing a.b.c runs the `__init__`
    of a and a.b, so those count too, except a package the importer sits in (already running)."""
    files = {_module_name(f, pkg): f for f in pkg.rglob("*.py") if "proto" not in f.parts}
    graph = {}
    for name, f in files.items():
        deps = set()
        for mod, _ in _imports(f, pkg):
            parts = mod.split(".")
            while parts and ".".join(parts) not in files:  # `from x import Name`: x is the module
                parts.pop()
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                inside = name == target or name.startswith(target + ".")
                if i == len(parts) or not inside:
                    deps.add(target)
        graph[name] = deps - {name}
    return graph


def _cycles(graph: dict) -> list:
    """Each strongly connected set of two or more modules (Tarjan), as a sorted list."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere():
    """Arrows point down (docs/architecture.md), so no module can reach itself through imports, deferred ones included."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_cycle(tmp_path):
    """The check above must be able to fail: a deferred import back through a package __init__ is a cycle."""
    pkg = tmp_path / "robotserve_ros"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("def make():\n    from ..high import thing\n")
    (pkg / "low" / "leaf.py").write_text("X = 1\n")
    (pkg / "high.py").write_text("from .low.leaf import X\nthing = X\n")
    graph = _import_graph(pkg)
    assert "robotserve_ros.low" in graph["robotserve_ros.high"]  # the package __init__ runs first
    assert _cycles(graph) == [["robotserve_ros.high", "robotserve_ros.low"]]


def test_only_the_cli_imports_the_benchmarks():
    """bench/ is the top floor but one (docs/architecture.md): production code never imports a benchmark, and
    every benchmark module lives there."""
    graph = _import_graph()
    bad = [f"{m} imports {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
           if d.split(".")[:2] == ["robotserve_ros", "bench"]
           and m.split(".")[:2] != ["robotserve_ros", "bench"] and m != "robotserve_ros.cli"]
    assert not bad, "only cli.py and bench/ may import robotserve_ros.bench:\n" + "\n".join(bad)
    stray = [str(f.relative_to(PKG.parent)) for f in PKG.rglob("bench*.py") if f.parent != PKG / "bench"]
    assert not stray, "benchmarks belong in robotserve_ros/bench/: " + ", ".join(stray)
