"""`robotserve bench robots-per-engine` (issue 40): the "fed" rule, capacity and the report's
shape on synthetic rows, and the bench itself at a tiny size, every server it names, its report
of record checked against the schema and against its own rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from robotserve_ros.bench import rpe_rules as rules
from robotserve_ros.cli import main

BUDGET = rules.leftover_s(10, 5, 50.0)  # 100 ms


def robot(idle_s=0.0, task_s=10.0, rts=(0.03,) * 20):
    return {"idle_s": idle_s, "task_s": task_s, "rt_s": list(rts)}


def row(n, rep, fed, valid=True, busy=0.1, server="robotserve"):
    return {"server": server, "protocol": "openpi", "curve": "gpu_like", "robots": n, "repeat": rep, "fed": fed,
            "rt_p50_ms": 30.0, "rt_p95_ms": 40.0, "idle_fraction": 0.0, "mean_batch": 1.0, "valid": valid,
            "client_core_busy": busy, "refusals": 0}


def test_fed_is_idle_within_five_points_of_batch_one_and_p95_within_the_leftover():
    assert BUDGET == pytest.approx(0.1)
    assert rules.robot_fed(0.07, 0.099, idle_share_b1=0.02, budget_s=BUDGET)
    assert not rules.robot_fed(0.0701, 0.05, idle_share_b1=0.02, budget_s=BUDGET)  # idle 5.01 points over
    assert not rules.robot_fed(0.0, 0.101, idle_share_b1=0.0, budget_s=BUDGET)  # p95 past the leftover


def test_a_row_is_fed_only_when_every_robot_is():
    calls = [(2, rules.gpu_like_ms(2))] * 10
    ok = rules.make_row("robotserve", "openpi", "gpu_like", 2, 0, [robot(), robot()], 0.0, BUDGET, calls, 0.2)
    assert tuple(ok) == rules.ROW_KEYS and ok["fed"] and ok["valid"] and ok["mean_batch"] == 2.0
    # One robot's 96th-percentile-and-up rounds are slow: its p95 is over 100 ms, the row is unfed.
    slow = robot(rts=[0.03] * 18 + [0.2, 0.2])
    assert not rules.make_row("robotserve", "openpi", "gpu_like", 2, 0, [robot(), slow], 0.0, BUDGET, calls, 0.2)["fed"]
    # A robot that did not report (3 robots asked, 2 came back) makes the row unfed.
    assert not rules.make_row("robotserve", "openpi", "gpu_like", 3, 0, [robot(), robot()], 0.0, BUDGET, calls, 0.2)["fed"]
    # Idle relative to the batch-1 run: 6 % idle is fed over a 2 % batch-1 share, not over 0 %.
    idle = [robot(idle_s=0.6), robot(idle_s=0.6)]
    assert rules.make_row("robotserve", "openpi", "gpu_like", 2, 0, idle, 0.02, BUDGET, calls, 0.2)["fed"]
    assert not rules.make_row("robotserve", "openpi", "gpu_like", 2, 0, idle, 0.0, BUDGET, calls, 0.2)["fed"]


def test_a_row_whose_server_refused_anything_is_unfed_and_counted():
    calls = [(2, rules.gpu_like_ms(2))] * 10
    kw = dict(per_robot=[robot(), robot()], idle_b1=0.0, budget_s=BUDGET, calls=calls, client_busy=0.2)
    assert rules.make_row("robotserve", "openpi", "gpu_like", 2, 0, refusals=0, **kw)["fed"]
    refused = rules.make_row("robotserve", "openpi", "gpu_like", 2, 0, refusals=3, **kw)
    assert not refused["fed"] and refused["refusals"] == 3
    assert rules.capacity_of([{**row(1, 0, True), "refusals": 0}, {**row(2, 0, False), "refusals": 1}])[
        "rows_with_refusals"] == 1


def test_openpi_robots_present_the_api_key_and_a_robot_without_it_is_refused(tmp_path):
    pytest.importorskip("openpi_client")
    import numpy as np
    from websockets.exceptions import InvalidStatus

    from robotserve_ros.bench.rpe_clients import openpi_caller
    from robotserve_ros.bench.rpe_servers import ServerProcess

    key = tmp_path / "api.key"
    key.write_text("sesame\n")
    srv = ServerProcess("robotserve", "openpi", str(tmp_path / "lock"), "gpu_like", 10, 50.0, None, str(key))
    try:
        rng = np.random.default_rng(0)
        assert openpi_caller(srv.port, rng, "sesame")(0)["actions"].shape[0] == 10
        with pytest.raises(InvalidStatus, match="401"):
            openpi_caller(srv.port, rng)
        assert srv.refused() == {"openpi:bad_api_key": 1}
    finally:
        srv.close()


def test_robotclient_round_trips_and_idle_are_read_off_the_client_it_runs(monkeypatch):
    """LeRobot's RobotClient measures no round trip: the bench reads when each timestep's
    observation first went out and when the chunk starting at that timestep arrived, and counts
    the fake robot's executed actions; the client's own methods still run."""
    from types import SimpleNamespace

    from robotserve_ros.bench import rpe_robotclient

    clock = [100.0]
    monkeypatch.setattr(rpe_robotclient.time, "time", lambda: clock[0])
    ran = []
    robot = SimpleNamespace(send_action=lambda a: ran.append(("act", a)) or a)
    queued = []
    client = SimpleNamespace(robot=robot, send_observation=lambda o: ran.append(("obs", o.get_timestep())) or True,
                             _aggregate_action_queues=lambda acts, fn=None: ran.append(("chunk", len(acts))),
                             actions_available=lambda: bool(queued))
    w = rpe_robotclient.Watched(client)
    step = lambda t: SimpleNamespace(get_timestep=lambda: t)  # noqa: E731 - a TimedObservation/TimedAction stand-in
    client.send_observation(step(5))
    clock[0] = 100.01
    client.send_observation(step(5))  # sent again for the same timestep: the first send counts
    clock[0] = 100.04
    client._aggregate_action_queues([step(5), step(6)])
    for k in range(45):  # control ticks every 20 ms from 100.05; the first 5 find nothing queued
        clock[0] = 100.05 + 0.02 * k
        queued[:] = [1] if k >= 5 else []
        if client.actions_available():
            client.robot.send_action({"j0.pos": 0.0})
    assert ran[:3] == [("obs", 5), ("obs", 5), ("chunk", 2)] and len(ran) == 43  # the client's own calls ran
    res = w.result(100.0, 101.0, 50.0)
    assert res["rt_s"] == [pytest.approx(0.04)] and res["task_s"] == 1.0
    assert res["idle_s"] == pytest.approx(0.1)  # 5 ticks held, 20 ms each (not the time before the first tick)
    assert res["short_s"] == pytest.approx(0.2)  # 40 actions in 1 s at 50 Hz: 10 periods without one
    assert "error" in w.result(101.0, 102.0, 50.0)  # no chunk in that window: the robot's row is unfed


def test_the_arm_moves_at_its_stated_speed_along_one_path_never_still_to_lerobots_filter():
    """Every server's actions follow one arm path in time: at most the stated peak joint speed,
    the same path whatever the chunk's start, and a joint state that moves more than LeRobot's
    similarity tolerance (L2 1.0) in every 20 ms tick, so no observation is skipped as "too similar"."""
    import numpy as np

    hz = 50.0
    path = rules.arm_chunk(3.7, 2000, hz, 6)  # 40 s: whole swings
    step = np.diff(path, axis=0)
    assert np.abs(step).max() <= rules.ARM_PEAK_SPEED_DEG_S / hz + 1e-3
    assert np.abs(step).max() >= 0.95 * rules.ARM_PEAK_SPEED_DEG_S / hz  # it does reach its speed
    assert np.abs(path).max() == pytest.approx(rules.ARM_SWING_DEG, rel=1e-3)
    assert np.linalg.norm(step, axis=1).min() > 1.0
    np.testing.assert_allclose(rules.arm_chunk(3.7 + 7 / hz, 10, hz, 6), path[7:17], atol=1e-3)


def test_every_server_sends_the_arm_path(tmp_path):
    """robotserve's device engine and LeRobot's own server (through its postprocessor's
    unnormalising) hand out the same arm path, read at the time the chunk is made."""
    import time as _time

    import numpy as np
    torch = pytest.importorskip("torch")
    from robotserve_ros.bench.rpe_servers import Device, DeviceEngine, normalised_arm
    from robotserve_ros.core.observation import Observation
    from robotserve_ros.core.types import InferenceRequest

    eng = DeviceEngine(Device(str(tmp_path / "lock"), "gpu_like", hz=50.0), 10)
    t0 = _time.monotonic()
    (res,) = eng.infer([InferenceRequest("robot0", 3, observation=Observation(joints=np.zeros(6, np.float32)))])
    t1 = _time.monotonic()
    assert t1 - t0 >= 0.028  # the device's batch-1 time was slept
    assert res.actions.shape == (10, 6)
    # the path at some moment of the call: within the arm's speed x the call's time of where it was at t0
    off = np.abs(res.actions - rules.arm_chunk(t0, 10, 50.0, 6)).max()
    assert off <= rules.ARM_PEAK_SPEED_DEG_S * (t1 - t0) + 1e-3
    mean, std = torch.linspace(-0.5, 0.5, 6), torch.linspace(0.5, 2.0, 6)
    post = lambda x: x * std + mean  # noqa: E731 - an unnormaliser (the tiny ACT's stats)
    out = normalised_arm(post, torch, 10, 50.0)(12.5)
    assert out.shape == (1, 10, 6)
    np.testing.assert_allclose(post(out[0]).numpy(), rules.arm_chunk(12.5, 10, 50.0, 6), atol=1e-4)


def test_engine_time_more_than_twice_off_its_curve_marks_the_row_invalid():
    on = [(4, rules.gpu_like_ms(4))] * 40
    assert rules.engine_valid(on, rules.gpu_like_ms)
    assert not rules.engine_valid([(4, 2.5 * rules.gpu_like_ms(4))] * 40, rules.gpu_like_ms)
    assert not rules.engine_valid([(1, 0.4 * rules.gpu_like_ms(1))] * 40, rules.gpu_like_ms)
    assert rules.engine_valid(on + [(4, 10 * rules.gpu_like_ms(4))], rules.gpu_like_ms)  # one late wake-up of 41
    assert not rules.engine_valid([], rules.gpu_like_ms)


def test_capacity_is_the_largest_fleet_with_every_smaller_one_fed():
    rows = [row(1, 0, True), row(2, 0, True), row(3, 0, False), row(4, 0, True),  # 4 fed after 3 unfed: not counted
            row(1, 1, True), row(2, 1, True), row(3, 1, True), row(4, 1, False),
            row(1, 2, True), row(2, 2, False, valid=False)]
    cap = rules.capacity_of(rows)
    assert cap["per_repeat"] == [2, 3, 1] and cap["measured"] == 2 and cap["range"] == [1, 3]
    assert cap["first_unfed"] == 3 and cap["client_bound"] is False and cap["reported"] == "2"
    assert cap["valid_rows_only"] is False  # repeat 2's first unfed row was invalid
    bound = rules.capacity_of([row(1, 0, True), row(2, 0, True, busy=0.9)])
    assert bound["client_bound"] and bound["reported"] == ">= 2" and bound["first_unfed"] is None
    ratio = rules.paired_ratio(cap, {"per_repeat": [1, 1, 1]})
    assert ratio["ratios"] == [2.0, 3.0, 1.0] and ratio["median"] == 2.0 and ratio["range"] == [1.0, 3.0]


def test_fleet_sizes_step_by_one_to_16_then_by_at_most_25_percent():
    s = rules.fleet_sizes(64)
    assert s[:16] == list(range(1, 17)) and s[-1] == 64
    assert all(b > a and b <= 1.25 * a for a, b in zip(s[16:], s[17:]))
    assert rules.fleet_sizes(3) == [1, 2, 3]


def test_the_simulator_predicts_more_robots_for_batching_than_for_one_at_a_time():
    kw = dict(curve="gpu_like", horizon=10, trigger=5, control_hz=50.0, rounds=20, phases_seed=0, budget_s=BUDGET)
    sizes = rules.fleet_sizes(40)
    batched, serial = rules.predicted_capacity(sizes, **kw), rules.predicted_capacity(sizes, serial=True, **kw)
    # Serial: one robot needs 28 ms of a 200 ms period, so at most 7 fit; batching fits many more.
    assert 1 <= serial["predicted"] <= 7 < batched["predicted"]
    assert serial["first_unfed"] == sizes[sizes.index(serial["predicted"]) + 1]
    # The simulator's round trips (virtual clock): one robot alone waits exactly L(1).
    assert batched["per_size"][1]["max_rt_p95_ms"] == pytest.approx(rules.gpu_like_ms(1))
    unfed = serial["per_size"][serial["first_unfed"]]
    assert unfed["max_rt_p95_ms"] > 100.0 or unfed["max_idle_share"] > serial["per_size"][1]["max_idle_share"] + 0.05


def test_a_robotclient_asks_once_per_h_minus_1_minus_trigger_ticks_and_the_prediction_follows():
    """LeRobot's RobotClient (latest_only): a chunk replaces its queue, aligned to its observation's
    timestep (an action already run), and it asks again with `trigger` left: one request per
    H - 1 - trigger = 4 ticks (80 ms at 50 Hz), each answered within trigger ticks (100 ms)."""
    from robotserve_ros.sim.simulator import Simulator
    from robotserve_ros.sim.workload import TaskSpec, Workload

    l1 = rules.gpu_like_ms(1) / 1e3
    prof = {b: rules.gpu_like_ms(b) for b in (1, 2, 4)}
    wl = Workload("rc", prof, (TaskSpec("rc-0", 50.0, {"static": (10,) * 20, "dynamic": (10,) * 20}),))
    slack = (5 - 0.5) / (l1 * 50.0)  # asks with 5 actions left, as predicted_capacity sets it
    (alone,) = Simulator(wl, "remaining", trigger_slack=slack, latest_only=True).run_fleet(1).outcomes
    # asks at 0, 0.08, ..., 19 x 0.08 s; the last chunk's 9 actions end 0.18 s after its ask
    assert alone.latency == pytest.approx(19 * 0.08 + 0.18)
    assert alone.round_trips == pytest.approx([l1] * 20) and alone.idle_s == pytest.approx(l1)  # dry only at first
    (queue,) = Simulator(wl, "remaining", trigger_slack=slack).run_fleet(1).outcomes
    assert queue.latency == pytest.approx(l1 + 20 * 10 / 50.0)  # the bench's own robot: all H actions per round
    assert rules.round_trip_budget_s(10, 3, 50.0, latest_only=True) == pytest.approx(0.06)
    assert rules.round_trip_budget_s(10, 3, 50.0) == pytest.approx(0.14)  # leftover_s
    kw = dict(curve="gpu_like", horizon=10, trigger=5, control_hz=50.0, rounds=20, phases_seed=0, budget_s=BUDGET)
    sizes = rules.fleet_sizes(40)
    own, rc = rules.predicted_capacity(sizes, **kw), rules.predicted_capacity(sizes, latest_only=True, **kw)
    rc_serial = rules.predicted_capacity(sizes, latest_only=True, serial=True, **kw)
    # 12.5 requests per robot per second instead of 5: fewer robots fit, batched or one at a time
    assert 1 <= rc_serial["predicted"] < rc["predicted"] < own["predicted"]


def test_check_report_names_what_is_off():
    good = {"engine": {}, "rows": [row(1, 0, True)], "capacity": {"lerobot_lerobot_gpu_like": {
        "measured": 1, "predicted": 2, "first_unfed": 2, "client_bound": False}},
        "added_latency_ms": {"openpi_serial_openpi_gpu_like": {"p50": 1.0, "p95": 2.0}}}
    rules.check_report(good)
    with pytest.raises(ValueError, match="not <server>_<protocol>_<curve>"):
        rules.check_report({**good, "added_latency_ms": {"vllm_openpi_gpu_like": {"p50": 1, "p95": 2}}})
    with pytest.raises(ValueError, match="lacks"):
        rules.check_report({**good, "capacity": {"robotserve_ros_gpu_like": {"measured": 1}}})


def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys):
    out = str(tmp_path / "r.json")
    assert main(["bench", "robots-per-engine", "--out", out, "--trigger", "10"]) == 2
    assert "--trigger 10 must be below --horizon 10" in capsys.readouterr().err
    assert main(["bench", "robots-per-engine", "--out", out, "--server-core", "0", "--client-core", "0"]) == 2
    err = capsys.readouterr().err
    assert "must differ" in err and len(err.strip().splitlines()) == 1


def run_bench(args: list) -> None:
    """The bench as a user runs it, in a process of its own: it forks its robots, and a fork of this
    test process (threads and an rclpy context left by earlier tests) hung in the full suite."""
    p = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "bench", "robots-per-engine", *args],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1 (server and clients apart)")
def test_bench_at_a_tiny_size_writes_the_report_of_record(tmp_path):
    pytest.importorskip("openpi_client")
    pytest.importorskip("lerobot")
    out = tmp_path / "rpe.json"
    run_bench(["--out", str(out), "--max-robots", "2", "--repeats", "2", "--seconds", "1", "--latency-rounds", "5"])
    rep = json.loads(out.read_text())
    rules.check_report(rep)
    keys = {f"{k}_gpu_like" for k in ("robotserve_ros", "robotserve_openpi", "openpi_serial_openpi", "lerobot_lerobot",
                                      "robotserve_lerobot")}
    assert set(rep["capacity"]) == keys and set(rep["added_latency_ms"]) == keys
    assert rep["engine"]["round_trip_budget_ms"] == 100.0 and rep["engine"]["batch_ms"]["1"] == 28.0
    for k, cap in rep["capacity"].items():
        mine = [r for r in rep["rows"] if f"{r['server']}_{r['protocol']}_gpu_like" == k]
        assert {r["repeat"] for r in mine} == {0, 1}  # every repeat ran, every attempted run a row
        assert cap == {**cap, **{x: rules.capacity_of(mine)[x] for x in ("measured", "first_unfed", "client_bound")}}
        assert cap["predicted"] in (1, 2)
        for r in mine:  # a row's fed agrees with its own figures
            if r["fed"]:
                assert r["rt_p95_ms"] is not None and r["rt_p50_ms"] <= r["rt_p95_ms"]
        assert all(r["mean_batch"] == 1.0 for r in mine if r["robots"] == 1 and r["mean_batch"] is not None)
        assert all(r["refusals"] == 0 for r in mine)  # every cap at its default, the openpi robots with the key
    meta = json.loads((tmp_path / "rpe.json.meta.json").read_text())
    assert meta["command"].startswith("robotserve bench robots-per-engine") and meta["predicted"]
    assert len(meta["runs"]) == len(rep["rows"]) and meta["server_rss_mb"]["lerobot_lerobot"]
    ros = [d for d in meta["runs"] if d["key"] == "robotserve_ros"]  # its robots re-send: how often, per run
    assert ros and all(isinstance(d["resends"], int) and d["resends"] >= 0 for d in ros)


def test_a_measured_curve_is_linear_between_its_points_and_holds_rows_to_it():
    pts = {1: 10.0, 2: 12.0, 4: 16.0}
    ms = rules.curve_fn("smolvla_cpu", pts)
    assert [ms(1), ms(3), ms(4)] == [10.0, 14.0, 16.0] and ms(8) == pytest.approx(24.0)  # last segment extended
    assert rules.curve_fn("gpu_like") is rules.gpu_like_ms
    with pytest.raises(ValueError, match="measured by the bench"):
        rules.curve_fn("smolvla_cpu")
    per = dict(per_robot=[robot(), robot()], idle_b1=0.0, budget_s=BUDGET, client_busy=0.2)
    on = rules.make_row("robotserve", "openpi", "smolvla_cpu", 2, 0, calls=[(2, 12.5)] * 20, curve_ms=ms, **per)
    off = rules.make_row("robotserve", "openpi", "smolvla_cpu", 2, 0, calls=[(2, 30.0)] * 20, curve_ms=ms, **per)
    assert on["valid"] and not off["valid"] and off["curve"] == "smolvla_cpu"  # 30 ms is 2.5x its 12 ms: invalid, kept
    # The simulator predicts on the measured curve: a slower curve fits fewer robots at one at a time.
    kw = dict(curve="smolvla_cpu", horizon=10, trigger=5, control_hz=50.0, rounds=20, phases_seed=0, serial=True,
              budget_s=BUDGET)
    fast = rules.predicted_capacity(rules.fleet_sizes(30), points=pts, **kw)
    slow = rules.predicted_capacity(rules.fleet_sizes(30), points={b: 4 * v for b, v in pts.items()}, **kw)
    assert fast["per_size"][1]["max_rt_p95_ms"] == pytest.approx(10.0) and slow["predicted"] < fast["predicted"]


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1 (server and clients apart)")
def test_bench_on_the_real_tiny_smolvla_device_measures_its_curve_and_keys_rows_by_it(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("lerobot")
    pytest.importorskip("openpi_client")
    out = tmp_path / "rpe.json"
    servers = ("robotserve_openpi", "openpi_serial_openpi", "lerobot_lerobot")
    run_bench(["--out", str(out), "--curve", "smolvla_cpu", "--servers", ",".join(servers), "--max-robots", "2",
               "--repeats", "1", "--seconds", "1", "--latency-rounds", "5"])
    rep = json.loads(out.read_text())
    rules.check_report(rep)
    keys = {f"{k}_smolvla_cpu" for k in servers}
    assert set(rep["capacity"]) == keys and set(rep["added_latency_ms"]) == keys
    eng = rep["engine"]
    assert eng["curve"] == "smolvla_cpu" and eng["torch_threads"] == 1 and set(eng["measured_batch_ms"]) == {"1", "2"}
    assert "measured in this bench" in eng["source"] or "profile of record" in eng["source"]
    ms = rules.curve_fn("smolvla_cpu", {int(b): v for b, v in eng["curve_batch_ms"].items()})
    assert eng["batch_ms"]["1"] == round(ms(1), 2) > 0 and ms(2) >= ms(1)
    assert all(r["curve"] == "smolvla_cpu" for r in rep["rows"]) and {r["server"] for r in rep["rows"]} == {
        "robotserve", "openpi_serial", "lerobot"}
    for k, cap in rep["capacity"].items():  # validity judged against the measured curve, every row kept
        mine = [r for r in rep["rows"] if f"{r['server']}_{r['protocol']}_smolvla_cpu" == k]
        assert [r["robots"] for r in mine] == [1, 2] or not mine[-1]["fed"] or not mine[-1]["valid"]
        assert cap["measured"] == rules.capacity_of(mine)["measured"] and cap["predicted"] in (0, 1, 2)
    meta = json.loads((tmp_path / "rpe.json.meta.json").read_text())
    assert "--curve smolvla_cpu" in meta["command"] and not any("smolvla_cpu" in x for x in meta["not_built"])
    assert all(d["device_calls"] > 0 for d in meta["runs"])  # the servers called the device
