"""Node parameters: one frozen config dataclass per node (robotserve_ros/config.py), nested
sections as nested ROS parameters. A wrong key or value is a one-line ParamError naming the
parameter (its dotted name) and what is allowed; the dataclasses need no running ROS, the
last tests start real nodes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("rclpy")  # the node modules import rclpy (no node is started here)

from robotserve_ros.nodes.bag_player import BagPlayerConfig  # noqa: E402
from robotserve_ros.nodes.bag_recorder import BagRecorderConfig  # noqa: E402
from robotserve_ros.config import from_tree  # noqa: E402
from robotserve_ros.nodes.common import ParamError, declare_config, node_options  # noqa: E402
from robotserve_ros.nodes.inference_server import InferenceServerConfig  # noqa: E402
from robotserve_ros.nodes.robot_client import RobotClientConfig  # noqa: E402
from robotserve_ros.nodes.sim_robot import SimRobotConfig  # noqa: E402
from robotserve_ros.profiles import batch_latency_ms, names as profile_names  # noqa: E402
from rosutil import requires_rclpy, ros_env, start_node  # noqa: E402

CONFIGS = [InferenceServerConfig, RobotClientConfig, SimRobotConfig, BagPlayerConfig, BagRecorderConfig]
REQUIRED = {BagPlayerConfig: {"bag": "/data/b"}, BagRecorderConfig: {"output": "/data/out"}}


def make(cls, **kw):
    return cls(**{**REQUIRED.get(cls, {}), **kw})


def error_of(cls, **kw) -> str:
    with pytest.raises(ParamError) as e:
        make(cls, **kw)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# --- one bad value per node: the one line names the parameter and what is allowed -----
@pytest.mark.parametrize("cls,kw,expected", [
    (InferenceServerConfig, {"scheduler": {"name": "nosuch"}},
     "parameter 'scheduler.name': 'nosuch' is not one of autellix, edf, fifo, kairos, remaining, srpt"),
    (InferenceServerConfig, {"threads": 2}, "parameter 'threads': 2 is not >= 4"),
    (InferenceServerConfig, {"scheduler": "kairos"}, "parameter 'scheduler': 'kairos' is not a section"),
    (InferenceServerConfig, {"horizon": {"nosuch": {}}}, "parameter 'horizon': 'nosuch' is not one of "),
    (InferenceServerConfig, {"remote_tiers": ["gpu"]}, "parameter 'remote_tiers': 'gpu' has no section 'gpu'"),
    (InferenceServerConfig, {"remote_tiers": ["gpu"], "sections": {"gpu": {"address": "nohost"}}},
     "parameter 'gpu.address': 'nohost' is not host:port"),
    (InferenceServerConfig, {"engine": {"name": "simulated", "latency_ms": [1.0]}},
     "parameter 'engine.latency_ms': [1.0] does not give one latency for each of the 0 batch_sizes"),
    (InferenceServerConfig, {"metrics": {"port": 70000}},
     "parameter 'metrics.port': 70000 is not -1 (off), 0 (a free port) or 1..65535"),
    (RobotClientConfig, {"command_type": "velocity"},
     "parameter 'command_type': 'velocity' is not one of trajectory, trajectory_chunk, position"),
    (RobotClientConfig, {"control_hz": 0}, "parameter 'control_hz': 0.0 is not > 0"),
    (SimRobotConfig, {"robot_type": "tank"}, "parameter 'robot_type': 'tank' is not one of so101, drone"),
    (SimRobotConfig, {"image_width": 3}, "parameter 'image_width': 3 is not in [8, 4096]"),
    (SimRobotConfig, {"publish_clock": "maybe"}, "parameter 'publish_clock': 'maybe' is not true or false"),
    (BagPlayerConfig, {"rate": 0.0}, "parameter 'rate': 0.0 is not > 0"),
    (BagPlayerConfig, {"bag": ""}, "parameter 'bag': '' is required"),
    (BagPlayerConfig, {"namespace_prefix": "robot-0"}, "parameter 'namespace_prefix': 'robot-0' is not a namespace"),
    (BagRecorderConfig, {"storage": "csv"}, "parameter 'storage': 'csv' is not one of mcap, sqlite3"),
    (BagRecorderConfig, {"topics": []}, "parameter 'topics': [] is empty"),
])
def test_a_bad_value_is_one_line_naming_the_parameter(cls, kw, expected):
    assert error_of(cls, **kw).startswith(expected)


def test_executor_auto_is_single_unless_side_services_and_a_single_process_refuses_them():
    """issue 38: the single executor costs a third of the multithreaded one's CPU per round,
    but side services' calls wait in an executor thread, so they keep the multithreaded one."""
    from rclpy.executors import SingleThreadedExecutor

    from robotserve_ros.config import ConfigError
    from robotserve_ros.nodes.server_config import executor_kind

    class Spun(SingleThreadedExecutor):  # only its kind matters here: no rclpy context
        def __init__(self) -> None:
            pass

        def __del__(self) -> None:
            pass

    assert InferenceServerConfig().executor == "auto"
    assert executor_kind("auto", ()) == "single" and executor_kind("auto", ("planner",)) == "multithreaded"
    assert executor_kind("multithreaded", ()) == "multithreaded" and executor_kind("single", ()) == "single"
    assert error_of(InferenceServerConfig, executor="events").startswith("parameter 'executor': 'events' is not one of")
    with_services = InferenceServerConfig(services=("planner",))
    with_services.check_executor(None)  # not spun yet (autostart): the choice follows the config
    with pytest.raises(ConfigError, match="need executor: multithreaded"):
        with_services.check_executor(Spun())
    InferenceServerConfig().check_executor(Spun())


@pytest.mark.parametrize("cls", CONFIGS)
def test_defaults_are_valid_frozen_and_every_parameter_is_described(cls):
    cfg = make(cls)
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no description"
    name = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, name, getattr(cfg, name))


def test_types_ints_serve_floats_lists_become_tuples_and_wrong_types_are_named():
    cfg = RobotClientConfig(control_hz=20, image_topics=["a", "b"])
    assert cfg.control_hz == 20.0 and isinstance(cfg.control_hz, float)
    assert cfg.image_topics == ("a", "b")
    assert error_of(RobotClientConfig, tasks=1.5) == "parameter 'tasks': 1.5 is not an integer"
    assert error_of(RobotClientConfig, tasks=True) == "parameter 'tasks': True is not an integer"
    assert error_of(RobotClientConfig, image_topics="cam") == "parameter 'image_topics': 'cam' is not a list of strings"
    assert error_of(SimRobotConfig, joint_state_hz=float("nan")) == "parameter 'joint_state_hz': nan is not a finite number"
    assert make(BagPlayerConfig).topics is None  # unset: every Image and JointState topic of the bag
    assert make(BagPlayerConfig, topics=["/a"]).topics == ("/a",)


def test_clock_rate_alone_is_settable_at_run_time_and_rechecked():
    runtime = [f.name for f in dataclasses.fields(SimRobotConfig) if f.metadata.get("runtime")]
    assert runtime == ["clock_rate"]
    cfg = SimRobotConfig()
    assert dataclasses.replace(cfg, clock_rate=0).clock_rate == 0.0
    with pytest.raises(ParamError, match="parameter 'clock_rate': 2000.0 is not in"):
        dataclasses.replace(cfg, clock_rate=2000.0)


# --- the engine profile: named, or given explicitly ------------------------------------
def engine(**kw):
    return {"engine": {"name": "simulated", **kw}}


def test_engine_profile_of_record_by_name_and_a_bad_name_lists_the_names():
    cfg = InferenceServerConfig()
    assert cfg.engine.profile == "smolvla_tiny" and cfg.engine.batch_sizes == cfg.engine.latency_ms == ()
    assert cfg.engine.engine_profile().to_dict() == {str(b): ms for b, ms in batch_latency_ms("smolvla_tiny").items()}
    arm = InferenceServerConfig(**engine(profile="diffusion_arm")).engine.engine_profile()
    assert arm.to_dict() == {str(b): ms for b, ms in batch_latency_ms("diffusion_arm").items()}
    msg = error_of(InferenceServerConfig, **engine(profile="nosuch"))
    assert msg == f"parameter 'engine.profile': 'nosuch' is not one of {', '.join(profile_names())}"


def test_explicit_batch_latencies_override_the_named_profile_and_are_checked():
    cfg = InferenceServerConfig(**engine(batch_sizes=[1, 2, 4], latency_ms=[40, 45, 50]))
    assert cfg.engine.engine_profile().to_dict() == {"1": 40.0, "2": 45.0, "4": 50.0}
    assert error_of(InferenceServerConfig, **engine(batch_sizes=[1, 2], latency_ms=[40.0])) == (
        "parameter 'engine.latency_ms': [40.0] does not give one latency for each of the 2 batch_sizes")
    assert error_of(InferenceServerConfig, **engine(batch_sizes=[2, 4], latency_ms=[40.0, 45.0])).startswith(
        "parameter 'engine.batch_sizes': [2, 4] is not a list of increasing batch sizes starting at 1")
    assert error_of(InferenceServerConfig, **engine(batch_sizes=[1, 2], latency_ms=[40.0, -1.0])).startswith(
        "parameter 'engine.latency_ms': [40.0, -1.0] is not a profile")


# --- the nested tree: nav2's shape, unknown keys refused ---------------------------------
def test_a_tree_builds_the_sections_and_keeps_each_plugins_knobs_under_its_name():
    cfg = from_tree(InferenceServerConfig, {
        "scheduler": {"name": "kairos", "kairos": {"buckets": 10}, "fifo": {}},
        "engine": {"name": "lerobot", "lerobot": {"policy_dir": "/p", "device": "cuda"}},
        "remote_tiers": ["gpu"], "gpu": {"address": "10.0.0.2:50051", "slots": 2},
        "services": ["planner"], "planner": {"max_batch": 8}})
    assert cfg.scheduler.chosen == {"buckets": 10} and cfg.engine.chosen == {"policy_dir": "/p", "device": "cuda"}
    assert cfg.engine.engine_profile() is None  # a real engine's own profile (or profile_file)
    assert cfg.tiers()["gpu"].slots == 2 and cfg.tiers()["gpu"].engine_params()["address"] == "10.0.0.2:50051"
    assert cfg.service_params("planner") == {"max_batch": 8} and cfg.service_params("generate") == {}


@pytest.mark.parametrize("tree,expected", [
    ({"engine_params": "{}"}, "parameter 'engine_params': is not a parameter here; allowed: service, "),
    ({"engine": {"name": "simulated", "nosuch": {}}}, "parameter 'engine.nosuch': {} is not a parameter here nor one of "),
    ({"planner": {"max_batch": 8}}, "parameter 'planner': is not a parameter here"),
    ({"remote_tiers": ["gpu"], "gpu": {"address": "h:1", "token": "x"}},
     "parameter 'gpu.token': is not a parameter here; allowed: address, token_file, "),
])
def test_an_unknown_key_is_named_with_what_is_allowed(tree, expected):
    with pytest.raises(ParamError) as e:
        from_tree(InferenceServerConfig, tree)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


# --- the config files are read by the same dataclasses ---------------------------------
SECTIONS = {"inference_server": InferenceServerConfig, "/**/robot_client": RobotClientConfig,
            "/**/sim_robot": SimRobotConfig}


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parent.parent / "config").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_config_files_name_only_declared_parameters_with_valid_values(path):
    import yaml

    doc = yaml.safe_load(path.read_text())
    assert doc, path
    for section, body in doc.items():
        cls = SECTIONS[section]
        values = dict(body["ros__parameters"])
        values.pop("use_sim_time", None)  # rclpy's own
        assert not [v for v in _leaves(values) if isinstance(v, str) and v.lstrip().startswith(("{", "["))], \
            f"{path.name} {section}: a JSON string where a nested parameter belongs"
        from_tree(cls, values)  # raises ParamError on an unknown key or a bad value
    assert doc["inference_server"]["ros__parameters"]["engine"]["profile"] in profile_names()


def _leaves(tree: dict):
    for v in tree.values():
        yield from _leaves(v) if isinstance(v, dict) else [v]


# --- declare_config on a real node, and nodes that exit 2 with the one line ------------
@requires_rclpy
def test_declare_config_declares_each_field_and_builds_the_config():
    import rclpy
    from rclpy.node import Node

    ctx = rclpy.Context()
    rclpy.init(args=["t", "--ros-args", "-p", "control_hz:=20", "-p", "image_topics:=[cam0, cam1]"], context=ctx,
               domain_id=int(ros_env()["ROS_DOMAIN_ID"]))
    try:
        node = Node("cfg_test", context=ctx, start_parameter_services=False)
        cfg = declare_config(node, RobotClientConfig)
        assert cfg == RobotClientConfig(control_hz=20.0, image_topics=("cam0", "cam1"))
        desc = node.describe_parameter("control_hz")
        assert desc.read_only and "> 0" in desc.description
        assert node.get_parameter("task_actions").value == 300
        bad = Node("cfg_test_bad", context=ctx, start_parameter_services=False,
                   parameter_overrides=[rclpy.parameter.Parameter("engine.profile", value="nosuch")])
        with pytest.raises(ParamError, match="^parameter 'engine.profile': 'nosuch' is not one of "):
            declare_config(bad, InferenceServerConfig)
        bad.destroy_node()
        P = rclpy.parameter.Parameter
        nested = Node("cfg_test_nested", context=ctx, **node_options({"start_parameter_services": False, "use_global_arguments": False,
                      "parameter_overrides": [P("engine.simulated.chunk_size", value=30), P("scheduler.name", value="fifo")]}))
        cfg = declare_config(nested, InferenceServerConfig)
        assert cfg.scheduler.name == "fifo" and cfg.engine.chosen["chunk_size"] == 30
        assert cfg.engine.chosen["action_dim"] == 6  # the defaults of the rest of its section stand
        assert nested.get_parameter("horizon.static.h").value == 25
        nested.destroy_node()
        unknown = Node("cfg_test_unknown", context=ctx, **node_options({
            "start_parameter_services": False, "use_global_arguments": False,
            "parameter_overrides": [P("engine_params", value="{}")]}))
        with pytest.raises(ParamError, match="^parameter 'engine_params': is not a parameter here; allowed: "):
            declare_config(unknown, InferenceServerConfig)
        unknown.destroy_node()
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


@requires_rclpy
def test_nodes_given_a_bad_parameter_exit_2_with_that_one_line():
    cases = {
        "robotserve_ros.nodes.inference_server": ("engine.name:=nosuch", "parameter 'engine.name': 'nosuch' is not one of "),
        "robotserve_ros.nodes.robot_client": ("aggregate:=median", "parameter 'aggregate': 'median' is not one of "),
    }
    procs = {m: start_node([m, "--ros-args", "-p", p]) for m, (p, _) in cases.items()}  # side by side: they only start
    for module, proc in procs.items():
        try:
            code = proc.wait(timeout=30)
        finally:
            proc.stop()
        lines = [ln for ln in proc.stderr().splitlines() if ln.strip()]
        assert code == 2, proc.output()
        assert len(lines) == 1 and lines[0].startswith("robotserve_ros: " + cases[module][1]), proc.output()
