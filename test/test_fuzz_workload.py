"""Fuzzing the workload loader: any JSON value is either a Workload or a WorkloadError that
names a field; nothing else escapes, nothing hangs (hypothesis, bounded examples)."""
from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robotserve_ros.core.errors import WorkloadError
from robotserve_ros.sim.workload import Workload, load_workload, parse_workload

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=20)

counts = st.one_of(st.integers(-3, 60), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none())
near_valid = st.fixed_dictionaries({
    "name": st.one_of(st.just("w"), json_scalars),
    "engine": st.one_of(
        st.fixed_dictionaries({"batch_latency_ms": st.dictionaries(
            st.one_of(st.sampled_from(["1", "2", "4", "8", "0", "-1", "x", "1.5"]), st.text(max_size=3)),
            st.one_of(st.floats(0.001, 1e4), json_scalars), min_size=0, max_size=5)}),
        json_values),
    "tasks": st.lists(st.one_of(
        st.fixed_dictionaries({
            "id": st.one_of(st.sampled_from(["a", "b", "a"]), json_scalars),
            "control_hz": st.one_of(st.floats(0.1, 500), json_scalars),
            "rounds": st.one_of(st.fixed_dictionaries({
                "static": st.lists(counts, max_size=5), "dynamic": st.lists(counts, max_size=5)}), json_values)}),
        json_values), max_size=4),
})


def _check(obj) -> None:
    try:
        w = parse_workload(obj)
    except WorkloadError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(w, Workload) and w.tasks and w.name
    for t in w.tasks:  # what is accepted is servable: positive finite numbers only
        assert math.isfinite(t.control_hz) and t.control_hz > 0
        for m in ("static", "dynamic"):
            assert t.rounds[m] and all(isinstance(n, int) and n >= 1 for n in t.rounds[m])
    assert w.profile.latency_ms(1) > 0
    assert parse_workload(json.loads(json.dumps(w.to_json()))) == w  # round-trips


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_is_a_workload_or_a_named_error(obj):
    _check(obj)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_valid)
def test_near_valid_workloads_are_accepted_or_refused_by_field(obj):
    _check(obj)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=200))
def test_a_file_of_random_bytes_is_a_named_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("w") / "w.json"
    path.write_bytes(data)
    try:
        load_workload(path)
    except WorkloadError as e:
        assert str(e)
