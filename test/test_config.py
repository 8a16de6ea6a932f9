"""robotserve_ros/config.py: config dataclasses read from a nested tree (no ROS needed).
The nodes, the LeRobot endpoint and the GPU server build the same EngineConfig."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from robotserve_ros.config import (Config, ConfigError, EngineConfig, SchedulerConfig, engine_config, flatten,
                                   from_tree, param, relabel, unflatten)
from robotserve_ros.nodes.server_config import InferenceServerConfig


@dataclass(frozen=True)
class Inner(Config):
    rate: float = param(1.0, "a rate, > 0")

    def check(self) -> None:
        if not self.rate > 0:
            raise ConfigError("rate", f"{self.rate!r} is not > 0")


@dataclass(frozen=True)
class Outer(Config):
    name: str = param("x", "a name")
    inner: Inner = param(Inner(), "a section")
    sizes: tuple[int, ...] = param((1, 2), "sizes")


def test_a_tree_fills_sections_and_the_defaults_stand_for_what_is_missing():
    cfg = from_tree(Outer, {"inner": {"rate": 2}, "sizes": [4]})
    assert cfg == Outer(name="x", inner=Inner(rate=2.0), sizes=(4,)) and isinstance(cfg.inner.rate, float)
    assert from_tree(Outer, {}) == Outer()


@pytest.mark.parametrize("tree,line", [
    ({"inner": {"rate": 0}}, "parameter 'inner.rate': 0.0 is not > 0"),
    ({"inner": {"rat": 1}}, "parameter 'inner.rat': is not a parameter here; allowed: rate"),
    ({"inner": 3}, "parameter 'inner': 3 is not a section"),
    ({"sizes": "1,2"}, "parameter 'sizes': '1,2' is not a list of integers"),
    ({"nam": "y"}, "parameter 'nam': is not a parameter here; allowed: name, inner, sizes"),
])
def test_a_wrong_key_or_value_is_one_line_with_its_dotted_name(tree, line):
    with pytest.raises(ConfigError) as e:
        from_tree(Outer, tree)
    assert str(e.value) == line


def test_flatten_and_unflatten_are_the_ros_parameter_names_of_a_tree():
    flat = flatten(Outer())
    assert {k: v for k, (v, _) in flat.items()} == {"name": "x", "inner.rate": 1.0, "sizes": (1, 2)}
    assert flat["inner.rate"][1] == "a rate, > 0"
    assert unflatten({"a.b.c": 1, "a.d": 2, "e": 3}) == {"a": {"b": {"c": 1}, "d": 2}, "e": 3}
    with pytest.raises(ConfigError, match="^parameter 'a.b': is inside 'a', which is a value, not a section$"):
        unflatten({"a": 1, "a.b": 2})


def test_a_plugin_section_keeps_each_plugins_knobs_under_its_name_and_uses_the_chosen_ones():
    sc = from_tree(SchedulerConfig, {"name": "fifo", "kairos": {"buckets": 3}, "fifo": {}})
    assert sc.chosen == {} and sc.params["kairos"] == {"buckets": 3}
    assert type(sc.build()).__name__ != type(from_tree(SchedulerConfig, {"name": "kairos"}).build()).__name__
    assert flatten(from_tree(SchedulerConfig, {"kairos": {"buckets": 3}}))["kairos.buckets"][0] == 3
    with pytest.raises(ConfigError, match=r"^parameter 'kairos.nosuch': given 1, but scheduler 'kairos' has no such "
                                          r"knob; its knobs: buckets, aging"):
        from_tree(SchedulerConfig, {"name": "kairos", "kairos": {"nosuch": 1}})  # refused before anything is built
    with pytest.raises(ConfigError, match="^parameter 'nosuch': 1 is not a parameter here nor one of "):
        from_tree(SchedulerConfig, {"nosuch": 1})


@pytest.mark.parametrize("knobs,line", [
    ({"chunk_size": 30.5}, "parameter 'engine.simulated.chunk_size': 30.5 is not an integer"),
    ({"chunk_size": "abc"}, "parameter 'engine.simulated.chunk_size': 'abc' is not an integer"),
    ({"chunk_size": 0}, "parameter 'engine.simulated.chunk_size': 0 is not >= 1"),
    ({"chunk_sise": 30}, "parameter 'engine.simulated.chunk_sise': given 30, but engine 'simulated' has no such knob; "
                         "its knobs: chunk_size, action_dim, steps, updates, realtime, seed"),
])
def test_a_plugin_knob_is_typed_and_ranged_where_the_plugin_declares_it(knobs, line):
    """The engine's own declaration (engines/simulated.py SimulatedKnobs) is the one list: the
    config refuses a bad knob with its dotted key, value and what is allowed, before building."""
    with pytest.raises(ConfigError) as e:
        from_tree(InferenceServerConfig, {"engine": {"name": "simulated", "simulated": knobs}})
    assert str(e.value) == line


@pytest.mark.parametrize("tree,line", [
    ({"services": ["planner"], "planner": {"max_batch": "x"}}, "parameter 'planner.max_batch': 'x' is not an integer"),
    ({"services": ["vlm"], "vlm": {"shap": "tiny"}}, "parameter 'vlm.shap': given 'tiny', but service 'vlm' has no "
                                                     "such knob; its knobs: service, shape,"),
    ({"horizon": {"static": {"h": 2.5}}}, "parameter 'horizon.static.h': 2.5 is not an integer"),
    # the wrappers: their own knobs and the wrapped engine's, in one section or under engine_params
    ({"engine": {"name": "sampled", "sampled": {"k": 0}}}, "parameter 'engine.sampled.k': 0 is not >= 1"),
    ({"engine": {"name": "sampled", "sampled": {"inner": "sampled"}}},
     "parameter 'engine.sampled.inner': 'sampled' is not one of simulated, remote, lerobot, flow, oxygen"),
    ({"engine": {"name": "sampled", "sampled": {"inner": "simulated", "chunk_sise": 3}}},
     "parameter 'engine.sampled.chunk_sise': given 3, but neither engine 'sampled' (inner, k, saturation_batch) "
     "nor the engine 'simulated' it wraps (action_dim, chunk_size,"),
    ({"engine": {"name": "sampled", "sampled": {"inner": "simulated", "chunk_size": 30.5}}},
     "parameter 'engine.sampled.chunk_size': 30.5 is not an integer"),
    ({"engine": {"name": "ray", "ray": {"replicas": "two"}}}, "parameter 'engine.ray.replicas': 'two' is not an integer"),
    ({"engine": {"name": "ray", "ray": {"replica": 2}}}, "parameter 'engine.ray.replica': given 2, but engine 'ray' has "
                                                         "no such knob; its knobs: engine, engine_params,"),
    ({"engine": {"name": "ray", "ray": {"engine": "simulated", "engine_params": {"chunk_sise": 3}}}},
     "parameter 'engine.ray.engine_params.chunk_sise': given 3, but engine 'simulated' has no such knob"),
    ({"ray_tiers": ["pool"], "pool": {"engine": "ray"}}, "parameter 'pool.engine': 'ray' is not one of"),
    ({"ray_tiers": ["pool"], "pool": {"engine": "simulated", "engine_params": {"chunk_size": "x"}}},
     "parameter 'pool.engine_params.chunk_size': 'x' is not an integer"),
    ({"placement": {"name": "fill_in_order", "fill_in_order": {"edge_first": True}}},
     "parameter 'placement.fill_in_order.edge_first': given True, but placement 'fill_in_order' has no such knob; "
     "it takes none"),
    ({"services": ["vla_language"], "vla_language": {"tokens_per_frame": "x"}},
     "parameter 'vla_language.tokens_per_frame': 'x' is not an integer"),
    ({"services": ["vla_language"], "vla_language": {"policy_dir": "models/x", "dtyp": "float32"}},
     "parameter 'vla_language.dtyp': given 'float32', but neither service 'vla_language' (generate_service,"),
    ({"services": ["vla_language"], "vla_language": {"policy_dir": "models/x", "dtype": 16}},
     "parameter 'vla_language.dtype': 16 is not a string"),
])
def test_a_service_or_horizon_section_is_typed_by_its_plugin_before_anything_starts(tree, line):
    with pytest.raises(ConfigError) as e:
        from_tree(InferenceServerConfig, tree)
    assert str(e.value).startswith(line), str(e.value)


def test_every_plugin_knob_is_declared_or_read_from_its_factory():
    """Each registered plug-in has one list of knobs (declared, or its factory's keyword
    parameters); the ones whose knobs cannot be known are named here, on purpose."""
    from robotserve_ros.core.horizon import HORIZON_POLICIES
    from robotserve_ros.core.placement import PLACEMENTS
    from robotserve_ros.core.schedulers import SCHEDULERS
    from robotserve_ros.engines import ENGINES

    unknown = {f"{r.role} {n}" for r in (ENGINES, SCHEDULERS, HORIZON_POLICIES, PLACEMENTS) for n in r.names()
               if r.knobs(n) is None}
    assert not unknown, unknown  # the wrappers (sampled, ray) check theirs and the wrapped engine's
    from robotserve_ros.nodes.services import SERVICES

    # openpi and lerobot check theirs in their own config dataclass
    assert {n for n in SERVICES.names() if SERVICES.knobs(n) is None} <= {"openpi", "lerobot"}
    sched = from_tree(SchedulerConfig, {"name": "remaining", "remaining": {"unknown_rounds": 10}})
    assert sched.chosen == {"unknown_rounds": 10.0} and isinstance(sched.chosen["unknown_rounds"], float)


def test_the_command_lines_flat_engine_flags_build_the_engine_section_of_the_nodes():
    flat = engine_config("simulated", {"chunk_size": 8}, {2: 6.0, 1: 5.0})
    tree = from_tree(EngineConfig, {"name": "simulated", "simulated": {"chunk_size": 8},
                                    "batch_sizes": [1, 2], "latency_ms": [5.0, 6.0]})
    assert flat == tree
    assert flat.engine_profile().to_dict() == {"1": 5.0, "2": 6.0}
    assert flat.build().chunk_size == 8
    assert engine_config("lerobot", {}).engine_profile() is None  # the engine's own (nominal or profile_file)
    with pytest.raises(ConfigError) as e:
        engine_config("nosuch", {})
    assert str(relabel(e.value, {"name": "--engine"})).startswith("parameter '--engine': 'nosuch' is not one of ")
