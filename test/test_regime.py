"""The regime sweep (`robotserve bench regime`), the simulator knobs it turns, and the task type
the simulator's requests carry (what `remaining` learns from)."""
from __future__ import annotations

import json

import pytest

from robotserve_ros.bench import regime
from robotserve_ros.sim.simulator import Simulator, task_type_of
from robotserve_ros.sim.workloads import builtin_workload


def test_task_type_is_the_spec_id_without_its_variant_number():
    assert task_type_of("libero-mixed-edge-long-007") == "libero-mixed-edge-long"
    assert task_type_of("ep-3#12") == "ep"
    assert task_type_of("pick") == "pick"
    assert task_type_of("42") == "42"  # nothing left to strip: the id itself


def test_simulated_requests_carry_the_type_and_the_scheduler_learns_it():
    w = builtin_workload("metaworld-mixed-edge", tasks=30)
    sim = Simulator(w, "remaining", "static", 0)
    run = sim._start("online", 1.0)
    seen = []
    sched = run.core.scheduler
    learn = sched.task_finished
    run.core.scheduler.task_finished = lambda rec, kind: (seen.append(kind), learn(rec, kind))
    for i, spec in enumerate(w.tasks[:6]):
        run.arrive_at(float(i), f"{spec.id}#{i}", spec, i)
    res = run.finish()
    assert sorted(seen) == sorted(task_type_of(s.id) for s in w.tasks[:6])
    assert len(res.outcomes) == 6 and sched._by_kind  # it learned per type


def test_trigger_slack_and_burstiness_knobs():
    w = builtin_workload("pusht-mixed-edge", tasks=40)
    for bad in (dict(trigger_slack=0.5), dict(burstiness=0.0)):
        with pytest.raises(ValueError):
            Simulator(w, "fifo", **bad)
    base = Simulator(w, "fifo", "static", 0).run_online(0.5, 30).summary()
    assert Simulator(w, "fifo", "static", 0, trigger_slack=1.0, burstiness=1.0).run_online(0.5, 30).summary() == base
    # Burstier arrivals: same tasks, same mean rate, different arrival times.
    bursty = Simulator(w, "fifo", "static", 0, burstiness=4.0).run_online(0.5, 30)
    assert bursty.summary()["tasks"] == 30 and bursty.summary()["avg_latency_s"] != base["avg_latency_s"]
    # Earlier requests leave more slack: never slower alone, and each task still completes.
    slack = Simulator(w, "fifo", "static", 0, trigger_slack=4.0).run_online(0.05, 5).summary()
    alone = Simulator(w, "fifo", "static", 0).run_online(0.05, 5).summary()
    assert slack["avg_latency_s"] <= alone["avg_latency_s"] + 1e-9


def test_regime_sweep_writes_json_markdown_and_heatmap(tmp_path, monkeypatch):
    pts = {"heatmap": [regime.Point(spread=s, max_batch=b, load=1.0) for s in ("low", "high") for b in (1, 16)],
           "trigger slack": [regime.Point(slack=2.0, load=1.0)]}
    monkeypatch.setattr(regime, "points", lambda: pts)
    data = regime.run_regime(tmp_path, seeds=(0,), tasks=15, workers=1)
    saved = json.loads((tmp_path / "regime.json").read_text())
    assert set(saved["sweeps"]) == {"heatmap", "trigger slack"} and len(saved["sweeps"]["heatmap"]) == 4
    row = data["sweeps"]["heatmap"][0]
    assert set(row["gain_vs_fifo_pct"]) == set(regime.SCHEDULERS) and row["gain_vs_fifo_pct"]["fifo"] == 0.0
    assert row["runs"]["remaining"]["tasks"] == 15
    md = (tmp_path / "regime.md").read_text()
    assert "## heatmap" in md and "## trigger slack" in md and "SRPT oracle" in md
    assert (tmp_path / "regime_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The max-batch axis caps the tier: batches never exceed it.
    assert data["sweeps"]["heatmap"][0]["fifo_mean_batch"] == 1.0
