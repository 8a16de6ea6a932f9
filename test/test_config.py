"""robotserve_ros/config.py: config dataclasses read from a nested tree (no ROS needed).
The nodes, the LeRobot endpoint and the GPU server build the same EngineConfig."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from robotserve_ros.config import (Config, ConfigError, EngineConfig, SchedulerConfig, engine_config, flatten,
                                   from_tree, param, relabel, unflatten)


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
    with pytest.raises(ConfigError, match=r"^parameter 'scheduler.kairos': no kairos scheduler with \{'nosuch': 1\}"):
        from_tree(SchedulerConfig, {"name": "kairos", "kairos": {"nosuch": 1}}).build()
    with pytest.raises(ConfigError, match="^parameter 'nosuch': 1 is not a parameter here nor one of "):
        from_tree(SchedulerConfig, {"nosuch": 1})


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
