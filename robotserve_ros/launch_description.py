"""One description of what runs: read by `launch/*.launch.py` (ros2 launch) and by
`robotserve up` (plain processes, where there is no ros2 launch). Pure Python, so both
and the tests import it without the launch packages.

Parameters live in a ROS params file (config/*.yaml, `ros__parameters`); the layout (how
many robots, how many per process) is given here. Robots in one process share it: a
fleet of 100 fits in a few processes on 2 cores.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "robotserve_ros"


@dataclass(frozen=True)
class NodeSpec:
    executable: str  # scripts/<executable> for ros2 run; robotserve_ros.nodes.<executable> as a module
    name: str  # process label
    arguments: tuple = field(default=())  # before --ros-args, e.g. ("--robots", "25")
    params_file: str = ""

    def command(self, python: str = sys.executable) -> list[str]:
        cmd = [python, "-m", f"{PACKAGE}.nodes.{self.executable}", *self.arguments]
        if self.params_file:
            cmd += ["--ros-args", "--params-file", self.params_file]
        return cmd


def server(params_file: str) -> list[NodeSpec]:
    return [NodeSpec("inference_server", "inference_server", (), params_file)]


def robots(params_file: str, count: int, per_process: int = 25, sim: bool = True) -> list[NodeSpec]:
    """`count` robot clients (and simulated robots) in namespaces robot_0..robot_{count-1}."""
    if count < 1 or per_process < 1:
        raise ValueError("robots and robots per process must be >= 1")
    out = []
    for first in range(0, count, per_process):
        n = min(per_process, count - first)
        args = ("--robots", str(n), "--first-index", str(first))
        if sim:
            out.append(NodeSpec("sim_robot", f"sim_robots_{first}", args, params_file))
        out.append(NodeSpec("robot_client", f"robot_clients_{first}", args, params_file))
    return out


def fleet(params_file: str, count: int = 4, per_process: int = 25) -> list[NodeSpec]:
    """The inference server and a simulated fleet, as in the main job."""
    return server(params_file) + robots(params_file, count, per_process)


def default_config(name: str = "fleet.yaml") -> str:
    """config/<name> from the source tree, or from share/robotserve_ros when installed."""
    here = Path(__file__).resolve().parent.parent / "config" / name
    if here.exists():
        return str(here)
    try:
        from ament_index_python.packages import get_package_share_directory

        return str(Path(get_package_share_directory(PACKAGE)) / "config" / name)
    except Exception:
        return str(here)


def launch_description(args: dict, specs):
    """A ros2 launch LaunchDescription running `specs(**launch arguments)` as launch_ros Nodes."""
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    def nodes(context):
        values = {k: LaunchConfiguration(k).perform(context) for k in args}
        return [
            Node(package=PACKAGE, executable=s.executable, arguments=list(s.arguments),
                 parameters=[s.params_file] if s.params_file else [], output="screen")
            for s in specs(**values)
        ]

    return LaunchDescription([DeclareLaunchArgument(k, default_value=v) for k, v in args.items()] + [OpaqueFunction(function=nodes)])


def load_launch_file(name: str):
    """Import launch/<name>.launch.py (source tree or installed share dir) as a module."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "launch" / f"{name}.launch.py"
    if not path.exists():
        from ament_index_python.packages import get_package_share_directory

        path = Path(get_package_share_directory(PACKAGE)) / "launch" / f"{name}.launch.py"
    spec = importlib.util.spec_from_file_location(f"robotserve_launch_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
