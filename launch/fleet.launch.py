"""Inference server + simulated fleet.

    ros2 launch robotserve_ros fleet.launch.py robots:=4 per_process:=25 params_file:=<yaml> \\
        log_level:=info use_sim_time:=false namespace:= policy:=<LeRobot policy dir>

`robotserve up CONFIG NAME:=VALUE...` loads this same file and calls specs(): one description,
two runners. `ros2 launch robotserve_ros fleet.launch.py --show-args` lists the arguments.
"""
from robotserve_ros import launch_description as rd

ARGS = rd.launch_args({
    "robots": ("4", "simulated robots, in namespaces robot_0..robot_<robots-1>"),
    "per_process": ("25", "robots per process (1: every robot its own process, named and namespaced)"),
})


def specs(params_file=ARGS["params_file"][0], robots="4", per_process="25", **common):
    return rd.fleet(params_file, int(robots), int(per_process), rd.Common.parse(**common))


def generate_launch_description():
    return rd.launch_description(ARGS, specs)
