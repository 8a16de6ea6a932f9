"""Robot clients for real robots (sim:=false) or simulated ones, in namespaces robot_<i>.

    ros2 launch robotserve_ros robot.launch.py robots:=1 sim:=false params_file:=<yaml>
"""
from robotserve_ros import launch_description as rd

ARGS = {"params_file": rd.default_config(), "robots": "1", "per_process": "25", "sim": "true"}


def specs(params_file=ARGS["params_file"], robots=ARGS["robots"], per_process=ARGS["per_process"], sim=ARGS["sim"]):
    return rd.robots(params_file, int(robots), int(per_process), sim=str(sim).lower() in ("1", "true", "yes"))


def generate_launch_description():
    return rd.launch_description(ARGS, specs)
