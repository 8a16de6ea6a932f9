"""package.xml declares what the package imports and runs (issue 27, item 7): a clean ROS 2
install that follows rosdep gets everything; colcon itself is built in CI (.ci/colcon_check.sh)."""
from __future__ import annotations

import ast
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What an import needs, by rosdep key (where the module's name is not the key).
ROSDEP = {"yaml": "python3-yaml", "numpy": "python3-numpy", "grpc": "python3-grpcio", "google": "python3-protobuf"}
ROS_MODULES = ("rclpy", "launch", "launch_ros", "ament_index_python")


def declared() -> dict:
    root = ET.parse(ROOT / "package.xml").getroot()
    return {kind: {e.text for e in root.iter(kind)} for kind in ("depend", "build_depend", "exec_depend")}


def top_imports() -> set:
    out = set()
    for f in list((ROOT / "robotserve_ros").rglob("*.py")) + list((ROOT / "launch").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                out.add(node.module.split(".")[0])
    return out


def test_runtime_and_build_dependencies_are_declared():
    d = declared()
    run = d["depend"] | d["exec_depend"]
    assert {"launch", "launch_ros", "ament_index_python", "rclpy", "python3-grpcio", "python3-protobuf"} <= run
    assert "python3-grpc-tools" in d["build_depend"] | d["depend"]  # CMake runs grpc_tools.protoc


def test_every_ros_package_the_code_imports_is_declared():
    run = declared()["depend"] | declared()["exec_depend"]
    imports = top_imports()
    ros = {m for m in imports if m.endswith(("_msgs", "_srvs")) or m in ROS_MODULES}
    assert {"rclpy", "launch_ros", "diagnostic_msgs"} <= ros  # the scan sees the imports
    assert ros <= run, f"imported but not in package.xml: {sorted(ros - run)}"
    third = {ROSDEP[m] for m in imports if m in ROSDEP}
    assert third <= run, f"not declared: {sorted(third - run)}"


def test_cmake_skips_grpc_stubs_without_grpc_tools_and_installs_no_shell_scripts():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    probe, run = cmake.index('-c "import grpc_tools.protoc"'), cmake.index("-m grpc_tools.protoc")
    assert probe < run and "message(WARNING" in cmake[probe:run]
    assert 'list(FILTER _executables EXCLUDE REGEX "\\\\.sh$")' in cmake
    assert (ROOT / "scripts" / "gpu_reports.sh").exists()  # what the filter keeps out of lib/robotserve_ros
