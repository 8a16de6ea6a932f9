"""A ROS params file named on the command line (`robotserve up FILE`, `demo --config FILE`),
checked before any process starts: YAML that parses, one section per node with its
`ros__parameters`, and the sections of this package's nodes through their config dataclasses
(config.py), so a misspelt knob is one line here, not a node dying in a log file later."""
from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from ..cli_types import UsageError

# node name -> (module, its config dataclass); imported when the file has that node's section
NODE_CONFIGS = {
    "inference_server": ("..nodes.server_config", "InferenceServerConfig"),
    "robot_client": ("..nodes.robot_client_config", "RobotClientConfig"),
    "sim_robot": ("..nodes.sim_robot", "SimRobotConfig"),
}


def check_params_file(path: str, flag: str) -> dict:
    """The file's sections; UsageError (one line naming `flag`, the file and what is wrong) else."""
    from ..config import from_tree
    from ..core.errors import ConfigError
    from ..nodes.common import _ROS_OWN  # what a node leaves to ROS (use_sim_time, ...), as config_from does

    where = f"{flag} {str(path)!r}".strip()
    if not Path(path).is_file():
        raise UsageError(f"{where}: no such file (a ROS params file, e.g. config/fleet.yaml)")
    try:
        tree = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{where}: not YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(tree, dict):
        raise UsageError(f"{where}: not a ROS params file (a mapping of node name -> ros__parameters)")
    for node, section in tree.items():
        if not (isinstance(section, dict) and isinstance(section.get("ros__parameters"), dict)):
            raise UsageError(f"{where}: section {node!r} has no ros__parameters mapping (a ROS params file is "
                             "NODE: {ros__parameters: {...}}, e.g. config/fleet.yaml)")
        name = str(node).rsplit("/", 1)[-1]
        if name in NODE_CONFIGS:
            module, cls = NODE_CONFIGS[name]
            given = {k: v for k, v in section["ros__parameters"].items()
                     if k not in _ROS_OWN and k != "qos_overrides" and v is not None}
            try:
                from_tree(getattr(importlib.import_module(module, __package__), cls), given)
            except ConfigError as e:
                raise UsageError(f"{where}: {node}: {e}") from None
    return tree


def params_file(path: str) -> str:
    """argparse type of a --config params file: checked as it is parsed (argparse names the flag)."""
    import argparse

    try:
        check_params_file(path, "")
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


__all__ = ["NODE_CONFIGS", "check_params_file", "params_file"]
