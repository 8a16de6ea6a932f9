"""The inference server alone: ros2 launch robotserve_ros server.launch.py params_file:=<yaml>"""
from robotserve_ros import launch_description as rd

ARGS = {"params_file": rd.default_config()}


def specs(params_file=ARGS["params_file"]):
    return rd.server(params_file)


def generate_launch_description():
    return rd.launch_description(ARGS, specs)
