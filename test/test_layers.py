"""The house's arrows point down (DESIGN.md): core imports nothing above it."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "robotserve_ros"
FORBIDDEN_TOP = {"rclpy", "grpc", "torch", "torchvision", "lerobot", "rosidl_runtime_py", "cv2"}
OUTER = {"nodes", "transport", "engines", "sim", "live", "study", "net", "cli", "bags", "launch_description",
         "profiles", "msg", "srv"}


def _imports(path: Path):
    """(module, line) of every import in a file, relative imports resolved against the package."""
    rel = path.relative_to(PKG.parent).with_suffix("")
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
                yield mod, node.lineno
                if node.module is None:
                    for a in node.names:
                        yield f"{mod}.{a.name}", node.lineno
            else:
                yield node.module or "", node.lineno
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
    assert not bad, "core/ must stay pure (DESIGN.md):\n" + "\n".join(bad)


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
