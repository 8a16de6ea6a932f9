"""One description of what runs: read by `launch/*.launch.py` (ros2 launch) and by
`robotserve up` (plain processes, where there is no ros2 launch). Pure Python, so both
and the tests import it without the launch packages.

Parameters live in a ROS params file (config/*.yaml, `ros__parameters`); the layout (how
many robots, how many per process) is given here. Robots in one process share it: a
fleet of 100 fits in a few processes on 2 cores.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "robotserve_ros"


#: Launch arguments every launch file takes: name -> (default, description). The launch
#: files add their own (robots, per_process, sim); `robotserve up` takes them as NAME:=VALUE.
COMMON_ARGS = {
    "params_file": ("", "ROS params file (config/*.yaml, ros__parameters) every node reads"),
    "namespace": ("", "namespace of the fleet's robots: robot i in /<namespace>/robot_<i> (needs per_process:=1: "
                      "a remap applies to every node of a process); the server stays /inference_server"),
    "log_level": ("info", "ROS log level of every node: debug, info, warn, error or fatal"),
    "use_sim_time": ("false", "nodes follow /clock (true, e.g. a simulator or a bag played with --clock) or the wall clock"),
    "policy": ("", "a LeRobot policy directory the server serves (engine lerobot); '' keeps the params file's engine"),
}
LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")


@dataclass(frozen=True)
class NodeSpec:
    executable: str  # scripts/<executable> for ros2 run; robotserve_ros.nodes.<executable> as a module
    name: str  # process label
    arguments: tuple = field(default=())  # before --ros-args, e.g. ("--robots", "25")
    params_file: str = ""
    node_name: str = ""  # the node's name (-r __node:=); '' keeps the names the process gives its nodes
    namespace: str = ""  # the node's namespace (-r __ns:=); '' keeps the process's own
    ros_args: tuple = field(default=())  # after the params file, e.g. ("--log-level", "debug", "-p", "use_sim_time:=true")

    def command(self, python: str = sys.executable) -> list[str]:
        cmd = [python, "-m", f"{PACKAGE}.nodes.{self.executable}", *self.arguments]
        ros = [*(("-r", f"__node:={self.node_name}") if self.node_name else ()),
               *(("-r", f"__ns:={self.namespace}") if self.namespace else ()),
               *(("--params-file", self.params_file) if self.params_file else ()), *self.ros_args]
        return cmd + ["--ros-args", *ros] if ros else cmd


@dataclass(frozen=True)
class Common:
    """The common launch arguments, checked: what every spec of a launch carries."""
    namespace: str = ""
    log_level: str = "info"
    use_sim_time: bool = False
    policy: str = ""

    @classmethod
    def parse(cls, namespace: str = "", log_level: str = "info", use_sim_time="false", policy: str = "") -> "Common":
        if str(log_level).lower() not in LOG_LEVELS:
            raise ValueError(f"log_level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        sim = str(use_sim_time).lower()
        if sim not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"use_sim_time {use_sim_time!r} is not true or false")
        ns = str(namespace).strip("/")
        if ns and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*", ns):
            raise ValueError(f"namespace {namespace!r} is not a ROS namespace (letters, digits, _ and /)")
        return cls(f"/{ns}" if ns else "", str(log_level).lower(), sim in ("true", "1", "yes"), str(policy))

    def ros_args(self) -> tuple:
        return ("--log-level", self.log_level, "-p", f"use_sim_time:={str(self.use_sim_time).lower()}")

    def server_args(self) -> tuple:
        # The policy overrides the params file's engine (command-line -p comes after --params-file).
        if not self.policy:
            return self.ros_args()
        return self.ros_args() + ("-p", "engine.name:=lerobot", "-p", f"engine.lerobot.policy_dir:={self.policy}")


def server(params_file: str, common: Common = Common()) -> list[NodeSpec]:
    # Not namespaced: one server serves the fleet on absolute names (/robotserve/infer, /diagnostics),
    # and params files key it as `inference_server`, which matches the root namespace only.
    return [NodeSpec("inference_server", "inference_server", (), params_file, node_name="inference_server",
                     ros_args=common.server_args())]


def robots(params_file: str, count: int, per_process: int = 25, sim: bool = True, common: Common = Common()) -> list[NodeSpec]:
    """`count` robot clients (and simulated robots) in namespaces robot_0..robot_{count-1}.
    A process of one robot gets its node's name and full namespace; a process of several
    keeps the names it gives them (robot_client in robot_<i>): a remap would rename all."""
    if count < 1 or per_process < 1:
        raise ValueError("robots and robots per process must be >= 1")
    if common.namespace and per_process > 1 and count > 1:
        raise ValueError(f"namespace {common.namespace!r} needs per_process:=1 (one robot per process)")
    out = []
    for first in range(0, count, per_process):
        n = min(per_process, count - first)
        args = ("--robots", str(n), "--first-index", str(first))
        ns = f"{common.namespace}/robot_{first}" if n == 1 else ""
        for exe, label in (("sim_robot", "sim_robots"), ("robot_client", "robot_clients"))[0 if sim else 1:]:
            out.append(NodeSpec(exe, f"{label}_{first}", args, params_file, node_name=exe if n == 1 else "",
                                namespace=ns, ros_args=common.ros_args()))
    return out


def fleet(params_file: str, count: int = 4, per_process: int = 25, common: Common = Common()) -> list[NodeSpec]:
    """The inference server and a simulated fleet, as in the main job."""
    return server(params_file, common) + robots(params_file, count, per_process, common=common)


def launch_args(own: dict) -> dict:
    """The launch arguments of a launch file: COMMON_ARGS (params_file defaulting to
    config/fleet.yaml) and its own {name: (default, description)}."""
    return {**COMMON_ARGS, "params_file": (default_config(), COMMON_ARGS["params_file"][1]), **own}


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
    """A ros2 launch LaunchDescription running `specs(**launch arguments)` as launch_ros Nodes.
    `args` is launch_args(): every argument declared with its default and description."""
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    def nodes(context):
        values = {k: LaunchConfiguration(k).perform(context) for k in args}
        return [
            Node(package=PACKAGE, executable=s.executable, name=s.node_name or None, namespace=s.namespace or None,
                 arguments=list(s.arguments), parameters=[s.params_file] if s.params_file else [],
                 ros_arguments=list(s.ros_args), output="screen")
            for s in specs(**values)
        ]

    declared = [DeclareLaunchArgument(k, default_value=v, description=d) for k, (v, d) in args.items()]
    return LaunchDescription(declared + [OpaqueFunction(function=nodes)])


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
