"""Small live runs of the two live benchmarks (`robotserve bench transport`, `robotserve
bench fleet-live`): real processes on a ROS domain no other process uses. They check the
result JSON's keys and that its values are sane (every round answered, none lost or
duplicated); they never assert speed, which depends on the machine and its load."""
from __future__ import annotations

import json
import math

from rosutil import requires_rclpy, ros_env

pytestmark = requires_rclpy


def _apply_env(monkeypatch) -> None:
    """ROS_LOG_DIR, discovery range, PYTHONPATH... for the benchmark's processes. The
    benchmarks pick their own ROS domain, one that no process on the machine uses now."""
    env = ros_env()
    for key in ("ROS_STATIC_PEERS", "ROS_LOCALHOST_ONLY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_transport_small(tmp_path, monkeypatch):
    from robotserve_ros.bench.transport import run_transport

    _apply_env(monkeypatch)
    out = tmp_path / "transport.json"
    res = run_transport(out, rounds=30, image=96, warmup=5, log_dir=tmp_path / "logs", verbose=False)
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    for key in ("raw_median_ms", "served_median_ms", "added_median_ms", "added_p99_ms", "machine", "rounds", "payload"):
        assert key in res, key
    assert res["rounds"] == 30 and res["payload"]["image_bytes"] == 96 * 96 * 3
    assert res["payload"]["request_bytes_serialized"] > 96 * 96 * 3
    assert res["machine"]["cores"] >= 1 and res["machine"]["cpu"] is not None
    for side in ("raw", "served"):
        assert res[side]["n"] == 30, res[side]
        assert res[side]["errors"] == {} and res[side]["bad_replies"] == 0, res[side]
    assert 0 < res["raw_median_ms"] < 1000 and 0 < res["served_median_ms"] < 1000
    assert math.isfinite(res["added_median_ms"]) and math.isfinite(res["added_p99_ms"])
    assert res["paired"]["n"] == 30 and res["foreign_nodes_on_domain"] == []
    assert all(code == 0 for code in res["process_exit_codes"].values()), res["process_exit_codes"]
    assert "profile" not in res


def test_transport_profile_has_every_served_stage(tmp_path, monkeypatch):
    """--profile: the real server writes its stage trace on SIGINT, and every round of the
    served path comes back split into its stages, client send to client receive."""
    from robotserve_ros.bench.transport import SERVED_STAGES, run_transport

    _apply_env(monkeypatch)
    res = run_transport(tmp_path / "t.json", rounds=12, image=32, warmup=3, profile=True,
                        log_dir=tmp_path / "logs", verbose=False)
    prof = res["profile"]
    assert prof["stage_trace_missing"] is None, prof
    spans = [f"{a}->{b}" for a, b in zip(SERVED_STAGES, SERVED_STAGES[1:])] + ["received->answered"]
    assert SERVED_STAGES[1:-1] == ("received", "submit", "dispatch", "engine_start", "engine_end", "reply", "answered")
    assert sorted(prof["served_stages"]) == sorted(spans), prof["served_stages"]
    for name, span in prof["served_stages"].items():
        assert span["n"] == 12 and span["median_ms"] >= 0, (name, span)
    # One clock on both sides: each round's time in the server is part of its round trip.
    assert 0 < prof["served_stages"]["received->answered"]["median_ms"] <= res["served"]["median_ms"]
    for side in ("raw_stages", "raw_mt_stages"):
        assert set(prof[side]) == {"send->received", "received->recv"} and prof[side]["send->received"]["n"] == 12
    assert res["raw_mt"]["n"] == 12 and res["raw_mt"]["errors"] == {}
    assert all(code == 0 for code in res["process_exit_codes"].values()), res["process_exit_codes"]


def test_fleet_engine_profile_read_like_the_node():
    from robotserve_ros.bench.fleet_live import engine_profile_ms
    from robotserve_ros.profiles import batch_latency_ms

    explicit = {"engine": {"batch_sizes": [1, 4], "latency_ms": [10.0, 20.0], "profile": "act_small"}}
    assert engine_profile_ms(explicit) == {1: 10.0, 4: 20.0}
    named = {"engine": {"batch_sizes": [], "latency_ms": [], "profile": "act_small"}}
    assert engine_profile_ms(named) == batch_latency_ms("act_small") != batch_latency_ms("diffusion_arm")


def test_fleet_live_small(tmp_path, monkeypatch):
    from robotserve_ros.bench.fleet_live import run_fleet_live

    _apply_env(monkeypatch)
    out = tmp_path / "fleet_live.json"
    res = run_fleet_live(out, robots=4, duration=8.0, per_process=2, log_dir=tmp_path / "logs", trace_server=True,
                         verbose=False)
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    for key in ("chunks_served", "lost_chunks", "duplicate_chunks", "lateness_p50_ms", "lateness_p99_ms", "requests",
                "errors", "idle_fraction", "server", "cpu", "in_flight_at_stop", "control_ticks", "machine"):
        assert key in res, key
    # Two sim_robot and two robot_client processes (2 robots each), as launch_description.fleet() lays them out.
    assert res["processes"] == {"inference_server": 1, "sim_robot": 2, "robot_client": 2}
    assert res["robot_accounts"] == 4 and res["robots_seen_by_server"] == 4
    assert res["lost_chunks"] == 0 and res["duplicate_chunks"] == 0 and res["mismatched_chunks"] == 0, res
    assert res["chunks_served"] > 0 and res["requests"] >= res["chunks_served"]
    # Every request is answered (chunk or error) or still in flight at the stop.
    assert res["answered_requests_check"] == 0, res
    assert res["in_flight_at_stop"] <= 4
    assert 0 <= res["lateness_p50_ms"] <= res["lateness_p99_ms"]
    assert 0 <= res["idle_fraction"] <= 1
    assert res["control_ticks"]["ticks"]["commanded"] > 0
    assert 0 < res["cpu"]["machine_busy_fraction_mean"] <= 1
    assert isinstance(res["server"].get("served"), int) and res["server"]["served"] >= res["chunks_served"]
    assert res["processes_failed_during_run"] == [] and res["foreign_nodes_on_domain"] == []
    assert res["rmw_replies_dropped_by_process"] == {}, res["rmw_replies_dropped_by_process"]
    assert all(code == 0 for code in res["process_exit_codes"].values()), res["process_exit_codes"]
    trace = res["server_trace"]  # trace_server: the server's own stage trace
    assert trace["stage_trace_missing"] is None, trace
    assert trace["rounds_reaching_server"] >= trace["ok_replies_answered"] >= res["chunks_served"], trace
    assert 0 <= trace["in_server_ms"]["p50"] <= trace["in_server_ms"]["max"]


def test_fleet_live_light_reports_the_servers_numbers(tmp_path, monkeypatch):
    """--light: robots from live/light_fleet.py (several in one process), the server's own
    numbers (backlog utilisation, dispatch time, in-server latency) in the report."""
    from robotserve_ros.bench.fleet_live import run_fleet_live

    _apply_env(monkeypatch)
    res = run_fleet_live(tmp_path / "light.json", robots=6, duration=8.0, per_process=3, log_dir=tmp_path / "logs",
                         verbose=False, light=True)
    assert res["light"] and res["processes"] == {"inference_server": 1, "light_fleet": 2}
    assert res["robot_accounts"] == 6 and res["robots_seen_by_server"] == 6
    assert res["lost_chunks"] == 0 and res["duplicate_chunks"] == 0 and res["mismatched_chunks"] == 0, res
    assert res["chunks_served"] > 0 and res["answered_requests_check"] == 0, res
    for key in ("engine_utilization_when_backlogged", "resent_requests", "replies_replayed", "server_headline"):
        assert key in res, key
    head = res["server_headline"]
    assert head["dispatch_ms_p99"] is not None and 0 <= head["dispatch_ms_p50"] <= head["dispatch_ms_p99"]
    assert 0 < head["in_server_ms_p50"] <= head["in_server_ms_p99"]
    u = res["engine_utilization_when_backlogged"]
    assert u is None or 0 <= u <= 1.0001
    assert res["server_rss_kb"] and all(kb > 0 and threads >= 1 for _, kb, threads in res["server_rss_kb"])
    assert res["cpu"]["process_cores_used_by_role"]["light_clients"] > 0
    assert all(code == 0 for code in res["process_exit_codes"].values()), res["process_exit_codes"]
    # The server profile (issue 26): its cost per round and per robot-second, the executor's share
    assert res["server_cpu_s_per_round"] > 0 and res["server_cpu_s_per_robot_s"] > 0, res
    assert 0 < res["executor_time_share"] <= 1.0, res["executor_time_share"]
    assert res["tasks_reaped_alive"] == 0 and res["infer_queue_depth"] == 1000
    assert res["refresh"]["from_topic"] == 0  # no --refresh-topic: refreshes only by srv/FetchObservation


def test_fault_drop_is_seeded_and_drops_its_fraction():
    """live/fault.py: the same seed drops the same messages of a robot; about p of them."""
    import pytest

    from robotserve_ros.live.fault import FaultDrop

    a, b, other = FaultDrop(0.1, seed=3), FaultDrop(0.1, seed=3), FaultDrop(0.1, seed=4)
    drops = [a.drops("request", "robot_7", n) for n in range(4000)]
    assert drops == [b.drops("request", "robot_7", n) for n in range(4000)]
    assert drops != [other.drops("request", "robot_7", n) for n in range(4000)]
    assert drops != [a.drops("reply", "robot_7", n) for n in range(4000)]  # a request and its reply: apart
    assert 0.08 < sum(drops) / len(drops) < 0.12
    assert not any(FaultDrop(0.0).drops("request", "robot_7", n) for n in range(1000))
    with pytest.raises(ValueError):
        FaultDrop(1.0)


def test_a_lost_round_is_accounted_from_its_drop_to_its_chunk(tmp_path):
    """A robot's account (nodes/client_account.py) and the report (bench/fleet_live_fault.py):
    a round whose request was dropped, re-sent and served; one whose reply was dropped twice."""
    import time

    from robotserve_ros.bench.fleet_live_fault import fault_summary
    from robotserve_ros.nodes.client_account import ClientAccount
    from robotserve_ros.srv import Infer

    acct, ok = ClientAccount("robot_0", 30.0), Infer.Response()
    acct.on_send(("t", 0))
    acct.on_drop(("t", 0), "request", 0.5, 2.0)
    acct.on_send(("t", 0))  # the re-send
    ok.chunk.task_id, ok.chunk.round_id = "t", 0
    acct.on_answer(("t", 0), ok)
    acct.on_chunk_used(("t", 0), 1.0, 3)
    acct.on_send(("t", 1))
    acct.on_drop(("t", 1), "reply", 0.5, 2.0)
    acct.on_send(("t", 1))
    acct.on_drop(("t", 1), "reply", 0.5, 2.0)  # the re-send's reply lost too: still open
    acct.dump(str(tmp_path / "robot_0.json"), {})
    a = json.loads((tmp_path / "robot_0.json").read_text())
    assert a["dropped"] == {"request": 1, "reply": 2} and a["resent_rounds"] == [0, 1]
    (t0, r0, kind0, drop0, wait0, _, resend0, served0, n0), lost1 = a["lost_rounds"]
    assert (t0, r0, kind0, wait0, n0) == ("t", 0, "request", 0.5, 1) and drop0 <= resend0 <= served0 <= time.monotonic()
    assert lost1[:3] == ["t", 1, "reply"] and lost1[6] is not None and lost1[7] is None and lost1[8] == 2
    f = fault_summary([a], 0.1, 3, a["requests"], a["resent"])
    assert (f["fault_drop"], f["fault_seed"], f["lost_rounds"]) == (0.1, 3, 2)
    assert f["fault"]["lost_rounds_resent"] == 2 and f["fault"]["lost_rounds_served"] == 1
    assert not f["fault"]["every_lost_round_served"] and f["fault"]["lost_rounds_unserved_sample"] == [["t", 1]]
    assert f["fault"]["served_within_budget"] == 1  # served at once: within 0.5 s + 100 ms
    assert f["fault"]["resends_vs_lost_rounds"]["met"]  # 2 re-sends, 2 lost rounds


def test_fleet_live_light_recovers_every_dropped_round(tmp_path, monkeypatch):
    """--fault-drop: the light robots drop a fifth of their requests and of the replies they
    wait for; every lost round is asked for again and served, none lost or duplicated."""
    from robotserve_ros.bench.fleet_live import run_fleet_live

    _apply_env(monkeypatch)
    res = run_fleet_live(tmp_path / "fault.json", robots=6, duration=8.0, per_process=3, log_dir=tmp_path / "logs",
                         verbose=False, light=True, fault_drop=0.2, fault_seed=1)
    f = res["fault"]
    assert res["fault_drop"] == 0.2 and res["lost_rounds"] > 0 and f["dropped_requests"] > 0 and f["dropped_replies"] > 0, f
    assert f["lost_rounds_served"] == res["lost_rounds"] and f["every_lost_round_served"], f
    assert res["lost_chunks"] == 0 and res["duplicate_chunks"] == 0 and res["mismatched_chunks"] == 0, res
    assert res["answered_requests_check"] == 0, res
    assert f["lost_rounds_resent"] + f["lost_rounds_served_without_resend"] >= res["lost_rounds"], f
    assert res["resent_requests"] >= f["lost_rounds_resent"]
    assert f["served_within_budget"] + f["served_over_budget"] == f["lost_rounds_served"]
    assert json.loads((tmp_path / "fault.json").read_text())["lost_rounds"] == res["lost_rounds"]


def test_fleet_live_light_refreshes_from_the_topic(tmp_path, monkeypatch):
    """--refresh-topic: the light robots publish their newest observations, the server reads
    them at dispatch (every queued observation is stale here: stale_obs_s 10 ms) and makes no
    refresh client."""
    import yaml

    from robotserve_ros.bench.fleet_live import REFRESH_TOPIC, run_fleet_live
    from robotserve_ros.launch_description import default_config

    _apply_env(monkeypatch)
    cfg = yaml.safe_load(open(default_config()))
    cfg["inference_server"]["ros__parameters"]["stale_obs_s"] = 0.01
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(cfg))
    res = run_fleet_live(tmp_path / "topic.json", robots=6, duration=8.0, per_process=3, log_dir=tmp_path / "logs",
                         verbose=False, light=True, refresh_topic=REFRESH_TOPIC, config=str(tmp_path / "fleet.yaml"))
    assert res["lost_chunks"] == 0 and res["duplicate_chunks"] == 0, res
    assert res["refresh"]["clients"] == 0 and res["refresh"]["from_topic"] > 0, res["refresh"]


def test_soak_short_frees_every_task(tmp_path, monkeypatch):
    """A 30 s soak: RSS sampled, nothing lost or duplicated, and once the robots stop the
    server's reaper leaves no task, waiter or cached reply behind."""
    from robotserve_ros.bench.soak import run_soak

    _apply_env(monkeypatch)
    res = run_soak(tmp_path / "soak.json", minutes=0.5, robots=6, verbose=False)
    assert json.loads((tmp_path / "soak.json").read_text()) == json.loads(json.dumps(res))
    assert res["lost_chunks"] == 0 and res["duplicate_chunks"] == 0 and res["chunks_served"] > 0, res
    assert res["ledger_freed"], res["server_after_stop"]
    assert res["rss_baseline_kb"] > 0 and isinstance(res["rss_growth_fraction"], float)
    assert res["minutes"] == 0.5 and res["robots"] == 6 and res["rss_slope_samples"] >= 4
    slope, ci = res["rss_slope_mb_per_min_after_warmup"], res["rss_slope_ci95"]
    assert isinstance(slope, float) and (ci is None or ci[0] <= slope <= ci[1]), (slope, ci)
    assert len(res["server_rss_kb_every"]) >= 3


def test_chaos_server_killed_and_restarted(tmp_path, monkeypatch):
    """The server SIGKILLed mid-fleet and started again: every robot gets chunks again, the
    tasks the new server does not know continue under new ids, nothing lost or duplicated."""
    from robotserve_ros.bench.chaos import run_scenario

    _apply_env(monkeypatch)
    r = run_scenario("server_kill", tmp_path, robots=4, before_s=4.0, after_s=12.0)
    assert r["robot_accounts"] == 4
    assert r["lost_chunks"] == 0 and r["duplicate_chunks"] == 0 and r["mismatched_chunks"] == 0, r
    assert r["robots_with_chunks_after_fault"] == 4, r
    assert r["errors"].get("unknown_task", 0) == r["tasks_continued"], r  # every unknown_task continued once
    assert r["answered_requests_check"] == 0, r


def test_chaos_robot_process_killed_its_tasks_are_reaped(tmp_path, monkeypatch):
    from robotserve_ros.bench.chaos import run_scenario

    _apply_env(monkeypatch)
    r = run_scenario("client_kill", tmp_path, robots=4, before_s=3.0, after_s=5.0)
    assert r["robots_killed"] == 2 and r["robot_accounts"] == 2  # the killed process wrote no account
    assert r["reaper_settled"], r  # the server reached the state below (waited for, not sampled)
    assert int(r["server_at_end"]["reaped_tasks"]) >= 2, r
    assert int(r["server_at_end"]["tasks"]) <= 2, r  # only the live robots' tasks are left
    assert r["lost_chunks"] == 0 and r["duplicate_chunks"] == 0, r
