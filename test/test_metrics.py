"""serve/metrics.py: the Prometheus figures of a Fleet are its own counts (pure Python, a fake
engine, the live runner; the endpoint on 127.0.0.1)."""
from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from robotserve_ros.core.clock import WallClock
from robotserve_ros.core.errors import RequestError
from robotserve_ros.core.profile import EngineProfile
from robotserve_ros.core.schedulers import make_scheduler
from robotserve_ros.core.types import ChunkResult, ExecInfo, HorizonChoice, InferenceRequest
from robotserve_ros.serve import fleet_over

pytest.importorskip("prometheus_client")
from robotserve_ros.serve.metrics import CORE_COUNTERS, MetricsServer, parse  # noqa: E402


class Echo:
    """A fake engine answering every row at once."""

    profile = EngineProfile({1: 0.001, 8: 0.002})
    name = "echo"

    def infer(self, batch):
        return [ChunkResult(np.zeros((8, 2), np.float32)) for _ in batch]


def req(task: str, rnd: int = 0, stamp=None) -> InferenceRequest:
    info = ExecInfo(0.0, 4, 30.0) if rnd else None
    return InferenceRequest(task, rnd, horizon=HorizonChoice("static", 4.0), exec_info=info, obs_stamp=stamp)


@pytest.fixture
def served():
    """A started fleet with its metrics endpoint on a free loopback port."""
    fleet = fleet_over(Echo(), make_scheduler("fifo"), WallClock()).start()
    m = MetricsServer(fleet, port=0)
    yield fleet, m
    m.close()
    fleet.close()


def run_rounds(fleet) -> None:
    now = fleet.clock.now()
    for robot in ("/r1", "/r2"):
        s = fleet.session("ros", robot)
        for rnd in range(3):
            s.submit(req(f"{robot[1:]}-t", rnd, stamp=now)).result(10)
    bad = fleet.session("ros", "/r2").submit(req("r2-t", 1))  # an old round: refused
    assert isinstance(bad.exception(10), RequestError)
    assert fleet.session("ros", "/r1").submit(req("r1-t", 2)).result(10)  # asked again: replayed


def test_the_scrape_is_the_fleets_own_counts(served):
    fleet, m = served
    run_rounds(fleet)
    body = urllib.request.urlopen(m.url, timeout=5).read().decode()  # what Prometheus gets
    got = parse(body)
    s = fleet.core.stats
    for name, _, attr in CORE_COUNTERS:
        assert got[(name + "_total", ())] == getattr(s, attr), name
    assert got[("robotserve_rounds_served_total", ())] == 6
    assert got[("robotserve_replies_replayed_total", ())] == 1
    for code, n in s.errors.items():
        assert got[("robotserve_refusals_total", (("reason", code),))] == n
    assert got[("robotserve_robot_refusals_total", (("reason", "round_out_of_order"), ("robot", "r2")))] == 1
    assert got[("robotserve_protocol_requests_total", (("outcome", "served"), ("protocol", "ros"), ("reason", "")))] \
        == fleet.protocol_stats()["ros"]["served"]
    busy = fleet.core_stats()["busy_s_by_tier"]["edge"]
    assert got[("robotserve_engine_busy_seconds_total", (("tier", "edge"),))] == pytest.approx(busy)
    assert got[("robotserve_tasks", ())] == 2 and got[("robotserve_queue_length", ())] == 0


def test_histograms_count_every_served_round_and_batch(served):
    fleet, m = served
    run_rounds(fleet)
    got = parse(m.text())
    served_n = fleet.core.stats.completed
    assert got[("robotserve_round_latency_seconds_count", ())] == served_n
    assert got[("robotserve_queue_wait_seconds_count", ())] == served_n
    assert got[("robotserve_observation_age_seconds_count", ())] == served_n  # every round was stamped
    assert got[("robotserve_batch_size_count", ())] == fleet.core.stats.batches
    assert got[("robotserve_batch_size_sum", ())] == fleet.core.stats.dispatched
    per_robot = {lab: v for (n, lab), v in got.items() if n == "robotserve_robot_rounds_served_total"}
    assert per_robot == {(("robot", "r1"),): 3, (("robot", "r2"),): 3}
    assert got[("robotserve_robot_round_latency_seconds_count", (("robot", "r1"),))] == 3
    lat_sum = got[("robotserve_round_latency_seconds_sum", ())]
    wait_sum = got[("robotserve_queue_wait_seconds_sum", ())]
    assert 0 <= wait_sum <= lat_sum
    # Per-robot idle: both robots have a live task with a wait ratio in [0, 1].
    ratios = {lab: v for (n, lab), v in got.items() if n == "robotserve_robot_wait_ratio"}
    assert set(ratios) == {(("robot", "r1"),), (("robot", "r2"),)} and all(0 <= v <= 1 for v in ratios.values())


def test_per_robot_series_can_be_off_and_the_port_is_loopback():
    fleet = fleet_over(Echo(), make_scheduler("fifo"), WallClock()).start()
    m = MetricsServer(fleet, port=0, per_robot=False)
    try:
        assert m.url.startswith("http://127.0.0.1:") and m.port > 0
        fleet.session("ros", "/r1").submit(req("t")).result(10)
        names = {n for n, _ in parse(m.text())}
        assert "robotserve_rounds_served_total" in names
        assert not any(n.startswith("robotserve_robot_round") for n in names)
    finally:
        m.close()
        fleet.close()
    assert m.feed not in fleet.batch_listeners  # closed: no longer fed


def test_a_taken_port_is_one_error_naming_it(served):
    fleet, m = served
    with pytest.raises(ValueError) as e:
        MetricsServer(fleet, port=m.port)
    assert e.value.args[0] == "metrics.port" and str(m.port) in e.value.args[1]


class FakeListener:
    """/diagnostics as the bench's listener holds it: `last`, and a series a spin extends."""

    def __init__(self, diag: dict) -> None:
        self.last, self.series = diag, []

    def spin(self, seconds, until=None) -> bool:
        self.series.append((0.0, self.last))
        return True


def test_the_metrics_check_passes_on_the_runners_figures_and_fails_on_others(served):
    from robotserve_ros.bench.metrics_check import MetricsCheck

    fleet, m = served
    run_rounds(fleet)
    s = fleet.core.stats
    diag = {"metrics_port": str(m.port), "served": str(s.completed), "batches": str(s.batches),
            "resent_requests": str(s.resent_requests), "replies_replayed": str(s.replies_replayed),
            "given_up": str(s.given_up), **{f"errors/{k}": str(v) for k, v in s.errors.items()}}
    good = MetricsCheck(every_s=0.0)
    good.during(diag)
    rep = good.final(FakeListener(diag))
    assert rep["ok"], rep["failures"]
    assert rep["scraped"]["served"] == 6 and rep["scraped"]["errors/round_out_of_order"] == 1
    bad = MetricsCheck(every_s=0.0)
    bad.during(diag)
    rep = bad.final(FakeListener({**diag, "served": "5"}), tries=2)
    assert not rep["ok"] and "served" in rep["failures"][0], rep
    off = MetricsCheck().final(FakeListener({"metrics_port": "-1"}))
    assert not off["ok"] and "metrics_port" in off["failures"][0]


def test_the_grafana_dashboard_asks_only_for_metrics_the_server_serves(served):
    """docs/grafana/robotserve.json: every robotserve_* name in its queries is served (a renamed
    metric would leave a panel empty without an error anywhere)."""
    import json
    import re
    from pathlib import Path

    from robotserve_ros.serve.metrics import PROGRESS_REFUSED, TASKS_ENDED

    fleet, m = served
    run_rounds(fleet)
    served_names = {n for n, _ in parse(m.text())} | {TASKS_ENDED + "_total", PROGRESS_REFUSED + "_total"}
    dash = json.loads((Path(__file__).parents[1] / "docs" / "grafana" / "robotserve.json").read_text())
    asked = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"robotserve_\w+", t["expr"])}
    assert len(asked) >= 15 and not asked - served_names, sorted(asked - served_names)


class Gate(Echo):
    """Batches wait until `open` is set; the first `fail` of them raise."""

    def __init__(self, fail: int = 0) -> None:
        import threading

        self.open, self.fail = threading.Event(), fail

    def infer(self, batch):
        assert self.open.wait(10)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("engine down")
        return super().infer(batch)


def test_re_sent_and_lost_rounds_per_robot_add_up_to_the_servers():
    from rosutil import wait_for

    eng = Gate(fail=1)
    fleet = fleet_over(eng, make_scheduler("fifo"), WallClock(), max_attempts=1).start()
    m = MetricsServer(fleet, port=0)
    try:
        r1, r2 = fleet.session("ros", "/r1"), fleet.session("ros", "r2")
        lost = r2.submit(req("hold"))  # its batch fails once: given up (max_attempts 1)
        assert wait_for(lambda: fleet.generating("hold"), 10.0)
        first = r1.submit(req("a"))
        again = r1.submit(req("a"))  # asked again while queued: attached, not run twice
        assert isinstance(first.exception(10), RequestError)  # the older call: duplicate_request
        eng.open.set()
        assert isinstance(lost.exception(10), RequestError) and again.result(10)
        got, s = parse(m.text()), fleet.core.stats
        assert s.resent_requests == 1 and s.given_up == 1
        assert got[("robotserve_robot_resent_requests_total", (("robot", "r1"),))] == s.resent_requests
        assert got[("robotserve_robot_rounds_given_up_total", (("robot", "r2"),))] == s.given_up
        assert got[("robotserve_engine_failures_total", (("tier", "edge"),))] == 1
        per_robot = sum(v for (n, _), v in got.items() if n == "robotserve_robot_resent_requests_total")
        assert per_robot == got[("robotserve_resent_requests_total", ())]
    finally:
        m.close()
        fleet.close()
