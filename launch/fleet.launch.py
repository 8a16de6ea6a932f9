"""Inference server + simulated fleet.

    ros2 launch robotserve_ros fleet.launch.py robots:=4 per_process:=25 params_file:=<yaml>

`robotserve up CONFIG` loads this same file and calls specs(): one description, two runners.
"""
from robotserve_ros import launch_description as rd

ARGS = {"params_file": rd.default_config(), "robots": "4", "per_process": "25"}


def specs(params_file=ARGS["params_file"], robots=ARGS["robots"], per_process=ARGS["per_process"]):
    return rd.fleet(params_file, int(robots), int(per_process))


def generate_launch_description():
    return rd.launch_description(ARGS, specs)
