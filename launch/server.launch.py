"""The inference server alone: ros2 launch robotserve_ros server.launch.py params_file:=<yaml> policy:=<dir>"""
from robotserve_ros import launch_description as rd

ARGS = rd.launch_args({})


def specs(params_file=ARGS["params_file"][0], **common):
    return rd.server(params_file, rd.Common.parse(**common))


def generate_launch_description():
    return rd.launch_description(ARGS, specs)
