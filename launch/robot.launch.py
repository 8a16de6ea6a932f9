"""Robot clients for real robots (sim:=false) or simulated ones, in namespaces robot_<i>.

    ros2 launch robotserve_ros robot.launch.py robots:=1 sim:=false params_file:=<yaml>
"""
from robotserve_ros import launch_description as rd

ARGS = rd.launch_args({
    "robots": ("1", "robot clients, in namespaces robot_0..robot_<robots-1>"),
    "per_process": ("25", "robots per process (1: every robot its own process, named and namespaced)"),
    "sim": ("true", "also start a simulated robot per client (false: real robots publish joint_states and camera)"),
})


def specs(params_file=ARGS["params_file"][0], robots="1", per_process="25", sim="true", **common):
    return rd.robots(params_file, int(robots), int(per_process), sim=str(sim).lower() in ("1", "true", "yes"),
                     common=rd.Common.parse(**common))


def generate_launch_description():
    return rd.launch_description(ARGS, specs)
