"""Workload files: malformed input raises core.errors.WorkloadError naming the offending field."""
from __future__ import annotations

import copy
import json

import pytest

from robotserve_ros.core import WorkloadError
from robotserve_ros.sim.workload import load_workload, parse_workload

GOOD = {
    "name": "demo",
    "engine": {"batch_latency_ms": {"1": 100, "2": 150, "4": 245}},
    "tasks": [
        {"id": "a", "control_hz": 30, "rounds": {"static": [25, 25], "dynamic": [30, 20, 10, 5]}},
        {"id": "b", "control_hz": 10, "rounds": {"static": [10], "dynamic": [12]}},
        {"id": "c", "control_hz": 50, "rounds": {"static": [5, 5, 5], "dynamic": [8, 2]}},
    ],
}


def mutated(fn):
    obj = copy.deepcopy(GOOD)
    fn(obj)
    return obj


def test_good_workload_parses_and_round_trips(tmp_path):
    wl = parse_workload(GOOD)
    assert wl.name == "demo"
    assert [t.id for t in wl.tasks] == ["a", "b", "c"]
    assert wl.tasks[0].rounds["dynamic"] == (30, 20, 10, 5)
    assert wl.tasks[2].total_actions("static") == 15
    assert wl.max_round() == 30
    assert wl.profile.latency_ms(2) == 150.0
    path = tmp_path / "wl.json"
    wl.save(path)
    assert load_workload(path) == wl


CASES = [
    ("missing name", lambda o: o.pop("name"), "name"),
    ("empty name", lambda o: o.update(name="  "), "name"),
    ("missing engine", lambda o: o.pop("engine"), "engine"),
    ("batch 1 missing", lambda o: o["engine"]["batch_latency_ms"].pop("1"), "engine.batch_latency_ms"),
    ("negative latency", lambda o: o["engine"]["batch_latency_ms"].update({"2": -150}), "engine.batch_latency_ms.2"),
    ("latency not a number", lambda o: o["engine"]["batch_latency_ms"].update({"1": "fast"}), "engine.batch_latency_ms.1"),
    ("batch key not integer", lambda o: o["engine"]["batch_latency_ms"].update({"x": 5}), "engine.batch_latency_ms.x"),
    ("latency falls", lambda o: o["engine"]["batch_latency_ms"].update({"4": 120}), "engine.batch_latency_ms"),
    ("zero control rate", lambda o: o["tasks"][2].update(control_hz=0), "tasks[2].control_hz"),
    ("bool control rate", lambda o: o["tasks"][1].update(control_hz=True), "tasks[1].control_hz"),
    ("zero actions", lambda o: o["tasks"][0]["rounds"]["dynamic"].__setitem__(3, 0), "tasks[0].rounds.dynamic[3]"),
    ("fractional actions", lambda o: o["tasks"][0]["rounds"]["dynamic"].__setitem__(3, 2.5), "tasks[0].rounds.dynamic[3]"),
    ("empty round list", lambda o: o["tasks"][1]["rounds"].update(static=[]), "tasks[1].rounds.static"),
    ("missing dynamic", lambda o: o["tasks"][1]["rounds"].pop("dynamic"), "tasks[1].rounds.dynamic"),
    ("unknown field", lambda o: o["tasks"][1].update(contol_hz=10), "tasks[1].contol_hz"),
    ("misspelt field", lambda o: o["tasks"][1].update(contol_hz=o["tasks"][1].pop("control_hz")), "tasks[1].control_hz"),
    ("unknown top field", lambda o: o.update(robots=3), "robots"),
    ("duplicate ids", lambda o: o["tasks"][2].update(id="a"), "tasks[2].id"),
    ("no tasks", lambda o: o.update(tasks=[]), "tasks"),
    ("task not object", lambda o: o["tasks"].__setitem__(1, "b"), "tasks[1]"),
]


@pytest.mark.parametrize("label,mutate,field", CASES, ids=[c[0] for c in CASES])
def test_malformed_workload_names_the_field(label, mutate, field):
    with pytest.raises(WorkloadError) as exc:
        parse_workload(mutated(mutate))
    err = exc.value
    assert err.field == field
    assert f"'{field}'" in str(err)
    assert isinstance(err, ValueError)


def test_top_level_not_an_object():
    with pytest.raises(WorkloadError) as exc:
        parse_workload([GOOD])
    assert exc.value.field == "(top level)"


def test_load_workload_not_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"name": "demo", "engine": ')
    with pytest.raises(WorkloadError) as exc:
        load_workload(path)
    assert exc.value.field == "(file)"
    assert "not valid JSON" in str(exc.value)
    assert str(path) in str(exc.value)


def test_load_workload_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(WorkloadError) as exc:
        load_workload(path)
    assert exc.value.field == "(file)"
    assert "does not exist" in str(exc.value)


def test_load_workload_reports_inner_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(mutated(lambda o: o["tasks"][2].update(control_hz=0))))
    with pytest.raises(WorkloadError) as exc:
        load_workload(path)
    assert exc.value.field == "tasks[2].control_hz"
