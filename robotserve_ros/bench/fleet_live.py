"""`robotserve bench fleet-live`: one inference server and N simulated robots at their
control rate on this machine, as real ROS 2 processes, for a fixed time; then an account of
every round.

The fleet is laid out exactly as launch_description.fleet(): the server, and per
`per_process` robots one sim_robot and one robot_client process (--robots K
--first-index i). Parameters come from config/fleet.yaml (its engine profile included),
plus the clients' `stats_file`: each robot client keeps its own account (ClientAccount in
nodes/client_account.py: requests and answers keyed by (task_id, round_id), chunk lateness,
control-tick timing) and writes it on shutdown.

Timeline: start everything; wait until the server has seen a task of every robot (the
start-up, reported as startup_s; at most startup_timeout, 60 s: startup_complete says
whether every robot made it); run `duration` seconds (the window); settle (SIGUSR1: the
robots start no new round and see their open ones through, re-sending with backoff, until
the server holds no request or settle_timeout_s passed); stop the robot clients (SIGINT:
each writes its account), take the server's last diagnostics, then stop the server and the
simulated robots. Meanwhile this process samples /proc/stat and
each process's CPU time once a second and listens to /diagnostics.

Accounting (over the clients' whole life):
  requests            Infer calls sent
  resent_requests     of them, the same (task, round) sent again (resent_share: their share;
                      the server's count of re-sends it attached: server_headline.resent_requests)
  resent_rounds       the (task, round)s sent more than once: a task's round 0, or a later one
  chunks_served       chunks received (status ok)
  lost_chunks         rounds with no answer after the settle whose first send was more than
                      lost_after_s (default 10 s) before the stop: every open round had the
                      settle to be answered, so these were lost (or given up by the robot)
  in_flight_at_stop   rounds with no answer at the stop, first sent less than lost_after_s ago
  duplicate_chunks    chunks for a (task, round) that had already been answered with a chunk
  lateness            per chunk used: how long the robot had been holding position (queue
                      dry) when it arrived; 0 if it arrived before the queue ran dry
  idle_fraction       control ticks spent holding position / ticks in a task
With --light --fault-drop P: fault_drop, lost_rounds (rounds whose request or reply the robots
dropped) and fault (how each was recovered; bench/fleet_live_fault.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np

from ..launch_description import default_config, robots as robot_specs, server as server_specs
from ..live.processes import (ModuleSpec, ProcessGroup, foreign_nodes, pct, pick_free_domain, read_stage_trace,
                              ros_env)
from ..nodes.server_config import executor_kind
from ..machine import busy_fraction, cpu_times, machine_info, proc_cpu_s, tree_cpu_s
# (_Listener, settle, engine_profile_ms, compare_executors, server_profile: imported from here too)
from .fleet_live_procs import (_Listener, _flame, _params_file, engine_profile_ms, infer_depth,  # noqa: F401
                               proc_status, settle, thread_cpu_s)
from .fleet_live_fault import fault_lines, fault_summary
from .metrics_check import MetricsCheck, verdict
from .fleet_live_report import (HEADLINE, _num, _server_summary, aggregate, backlog_window,  # noqa: F401
                                compare_executors, server_profile, summary_lines)


def run_fleet_live(out: Path, robots: int = 100, duration: float = 60.0, per_process: int = 25,
                   config: Optional[str] = None, lost_after_s: float = 10.0, startup_timeout: float = 60.0,
                   domain_id: Optional[int] = None, log_dir: Optional[Path] = None, trace_server: bool = False,
                   verbose: bool = True, light: bool = False, drain_s: float = 2.2,
                   settle_timeout_s: float = 30.0, image_transport: str = "", executor: str = "",
                   flame: Optional[str] = None, refresh_topic: str = "", metrics_check: bool = False,
                   fault_drop: float = 0.0, fault_seed: int = 0) -> dict:
    """light: the robots are light_fleet's (live/light_fleet.py: per_process of them in one
    process, no simulated robots, pre-encoded observations) and the server is what is measured.
    drain_s: how long the server is watched after the clients stopped (its ledger and reply
    cache are freed by the reaper after task_timeout_s).
    settle_timeout_s: after the window the robots start no new round (SIGUSR1) and their open
    rounds are seen through -- re-sent until answered -- until the server holds no request
    (or this long): a round still unanswered after that was lost, not in flight.
    image_transport: raw/jpeg/png for every robot ('' = the config's).
    metrics_check: scrape the server's Prometheus endpoint in the window and check it against
    /diagnostics once quiet (bench/metrics_check.py): `metrics_check` in the result.
    fault_drop (light only): that fraction of requests and of replies lost on the robots' side,
    seeded by fault_seed (live/fault.py); `fault_drop`, `lost_rounds` and `fault` in the result
    (bench/fleet_live_fault.py)."""
    if robots < 1 or per_process < 1 or duration <= 0:
        raise ValueError("robots >= 1, per_process >= 1 and duration > 0 are needed")
    if fault_drop and not (light and 0 < fault_drop < 1):
        raise ValueError(f"fault_drop needs light robots and a fraction in (0, 1), got {fault_drop!r}")
    out = Path(out)
    machine = machine_info()
    base = config or default_config()
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_fleet_live_"))
    log_dir = Path(log_dir) if log_dir else tmp / "logs"
    stats_dir = tmp / "stats"
    trace_file = tmp / "server_stage_trace.json"
    params, cfg = _params_file(base, str(stats_dir / "{robot}.json"), tmp / "params.yaml",
                               str(trace_file) if trace_server else "", image_transport, executor, refresh_topic,
                               light)
    srv_cfg = cfg.get("inference_server", {}).get("ros__parameters", {})
    engine = engine_profile_ms(srv_cfg)
    rc_cfg = cfg.get("/**/robot_client", {}).get("ros__parameters", {})
    hz = float(rc_cfg.get("control_hz", 30.0))
    domain = domain_id if domain_id is not None else pick_free_domain()
    env = ros_env(domain, str(tmp / "ros_log"))
    # Every occurrence of rclpy's RuntimeWarnings in the logs (by default Python prints one
    # per call site): "failed to send response (timeout)" is a reply the rmw dropped.
    env["PYTHONWARNINGS"] = "always::RuntimeWarning"
    say = (lambda s: print(f"[fleet-live] {s}", flush=True)) if verbose else (lambda s: None)

    listener = _Listener(env)
    srv = server_specs(params)
    if light:
        base_group = ProcessGroup(srv, env, log_dir)
        client_group = ProcessGroup([ModuleSpec(f"light_fleet_{i}", "robotserve_ros.live.light_fleet",
                                                ["--robots", str(min(per_process, robots - i)), "--first-index", str(i),
                                                 "--params", params, "--stats-dir", str(stats_dir)]
                                                + (["--refresh-topic", refresh_topic] if refresh_topic else [])
                                                + (["--fault-drop", repr(fault_drop), "--fault-seed", str(fault_seed)]
                                                   if fault_drop else []))
                                     for i in range(0, robots, per_process)], env, log_dir)
    else:
        base_group = ProcessGroup(srv + [s for s in robot_specs(params, robots, per_process) if s.executable == "sim_robot"],
                                  env, log_dir)
        client_group = ProcessGroup([s for s in robot_specs(params, robots, per_process) if s.executable == "robot_client"],
                                    env, log_dir)
    codes: dict = {}
    samples: list = []  # (t, cpu_times, {name: cpu_s}) once a second
    rss: list = []  # (s since the window began, the server's resident set in kB, its threads) once a second
    # The server's main thread runs the executor's spin (wait set, dispatch to its pool): its
    # CPU over the window against the whole process's is the executor's time share.
    spin_cpu: list = []  # (t, main thread cpu s) once a second
    reaped_alive = None  # the server's reaped tasks before any robot stopped (light robots live until then)
    t_launch = time.monotonic()
    failed: list = []
    t_ready = t_stop = settle_s = None
    foreign: set = set()
    mcheck = MetricsCheck() if metrics_check else None

    def ours(n: str) -> bool:
        if light and n.split("/")[-1].startswith("light_fleet_robot_") and n.count("/") == 1:
            return True
        return n.split("/")[-1] in ("inference_server", "sim_robot", "robot_client", "fleet_live_bench_listener") and \
            (n.count("/") == 1 or n.split("/")[1].removeprefix("robot_").isdigit() and int(n.split("/")[1][6:]) < robots)

    def sample(rss_only: bool = False):
        if not rss_only:  # the CPU window ends at the stop
            # (each process with its children: the server's engine core process, engine_process: separate)
            procs = {s.name: tree_cpu_s(p.pid) for g in (base_group, client_group) for s, p in g.procs}
            procs["bench_listener"] = proc_cpu_s(os.getpid())
            samples.append((time.monotonic(), cpu_times(), procs, os.getloadavg()[0]))
        srv_pid = next((p.pid for s, p in base_group.procs if s.name == "inference_server"), None)
        if not rss_only and srv_pid:
            spin_cpu.append(thread_cpu_s(srv_pid, srv_pid))
        kb = proc_status(srv_pid) if srv_pid else None
        if kb is not None:
            rss.append((round(time.monotonic() - t_ready, 1) if t_ready else 0.0, kb, proc_status(srv_pid, "Threads")))

    try:
        say(f"domain {domain}: server + {robots} robots ({per_process} per process), {hz:g} Hz control, "
            f"engine profile {engine} ms")
        base_group.start()
        client_group.start()
        deadline = t_launch + startup_timeout
        while len(listener.robots_seen) < robots and time.monotonic() < deadline:
            listener.spin(0.2)
            failed = base_group.failed() + client_group.failed()
            if failed:
                raise RuntimeError(f"processes exited: {failed} (logs in {log_dir})")
        t_ready = time.monotonic()
        startup_complete = len(listener.robots_seen) >= robots
        say(f"{len(listener.robots_seen)}/{robots} robots seen by the server after {t_ready - t_launch:.1f} s; "
            f"running {duration:g} s")
        sample()
        spy = _flame(flame, base_group, duration, say) if flame else None
        foreign.update(foreign_nodes(listener.node, ours))
        end = t_ready + duration
        next_sample = t_ready + 1.0
        while (now := time.monotonic()) < end:
            listener.spin(min(0.1, end - now))
            if mcheck is not None:
                mcheck.during(listener.last)
            if time.monotonic() >= next_sample:
                sample()
                next_sample += 1.0
        failed = base_group.failed() + client_group.failed()
        t_stop = time.monotonic()
        if spy is not None:  # py-spy lags its --duration on a busy server: SIGINT makes it write what it has
            try:
                spy.wait(timeout=5)
            except subprocess.TimeoutExpired:
                spy.send_signal(signal.SIGINT)
                try:
                    spy.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    spy.kill()
        foreign.update(foreign_nodes(listener.node, ours))
        settle_s = settle(listener, client_group, settle_timeout_s, say)
        reaped_alive = _num(listener.last.get("reaped_tasks")) if listener.last else None
        say("stopping the robot clients")
        codes.update(client_group.stop(timeout=20.0))
        drain_end = time.monotonic() + max(2.2, drain_s)  # the server's diagnostics after the last client request
        while time.monotonic() < drain_end:
            listener.spin(min(1.0, drain_end - time.monotonic()))
            sample(rss_only=True)
        mcheck = mcheck.final(listener) if mcheck is not None else None
    finally:
        codes.update(base_group.stop())
        client_group.stop()
        last, series, seen, tasks_at_end = listener.last, listener.series, listener.robots_seen, listener.tasks_at_end
        listener.close()

    accounts = []
    for f in sorted(stats_dir.glob("*.json")):
        accounts.append(json.loads(f.read_text()))
    agg = aggregate(accounts, t_ready, t_stop, lost_after_s, hz)

    # Replies the rmw dropped ("failed to send response (timeout): client will not receive
    # response": the server's reply writer had not matched the client's reply reader within
    # its max_blocking_time), and other warnings, counted in each process's log.
    dropped, warnings = Counter(), Counter()
    for f in sorted(log_dir.glob("*.log")):
        for line in f.read_text(errors="replace").splitlines():
            if "failed to send response" in line:
                dropped[f.stem] += 1
            elif "Warning" in line or "[WARN]" in line or "[ERROR]" in line:
                warnings[f.stem] += 1
    # Where each unanswered request went: the server's ledger at the end (and, with
    # --trace-server, which rounds reached the server's callback and which it answered).
    unanswered = [(task, rnd, age) for a in accounts for task, rnd, age in a["unanswered"]]
    robots_end = set(tasks_at_end)  # robots with a task in the server's ledger at the end
    trace = None
    lost_keys = [(t, r) for t, r, age in unanswered if age > lost_after_s]
    where = {"robot_in_server_ledger_at_end": sum(t.split("/")[0] in robots_end for t, _ in lost_keys),
             "robot_not_in_server_ledger_at_end": sum(t.split("/")[0] not in robots_end for t, _ in lost_keys)}
    if trace_server:
        marks, missing = read_stage_trace(trace_file, codes.get("inference_server"))
        got = [marks.get(f"{t}#{r}", {}) for t, r in lost_keys]
        where.update(reached_server_callback=sum("received" in m for m in got),
                     never_reached_server_callback=sum("received" not in m for m in got),
                     reply_answered_by_server=sum("answered" in m for m in got))

        def span(a, b):
            xs = [(m[b] - m[a]) / 1e6 for m in marks.values() if a in m and b in m]
            return {"p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs) if xs else None, "n": len(xs)}

        trace = {"rounds_reaching_server": sum("received" in m for m in marks.values()),
                 "ok_replies_answered": sum("answered" in m for m in marks.values()),
                 "in_server_ms": span("received", "answered"),
                 "queued_ms": span("submit", "dispatch"),
                 "engine_ms": span("engine_start", "engine_end"),
                 "stage_trace_missing": missing,
                 "note": "the server's stage trace (its stage_trace_file parameter), CLOCK_MONOTONIC"}

    # CPU: whole machine, and each process, over the window (first to last sample).
    cpu = {}
    if len(samples) >= 2:
        (ta, _, pa, _), (tb, _, pb, _) = samples[0], samples[-1]
        per_s = [busy_fraction(samples[i][1], samples[i + 1][1]) for i in range(len(samples) - 1)]
        cores = os.cpu_count() or 1
        procs = {k: round((pb[k] - pa[k]) / (tb - ta), 3) for k in pa if pa.get(k) is not None and pb.get(k) is not None}
        cpu = {
            "machine_busy_fraction_mean": round(float(np.mean(per_s)), 3),
            "machine_busy_fraction_p90_1s": round(pct(per_s, 90), 3),
            "machine_busy_fraction_max_1s": round(float(np.max(per_s)), 3),
            "seconds_over_95pct_busy": int(sum(x > 0.95 for x in per_s)),
            "samples": len(per_s),
            "cores": cores,
            "process_cores_used": procs,
            "process_cores_used_by_role": {
                "inference_server": round(sum(v for k, v in procs.items() if k == "inference_server"), 3),
                "sim_robots": round(sum(v for k, v in procs.items() if k.startswith("sim_robots")), 3),
                "robot_clients": round(sum(v for k, v in procs.items() if k.startswith("robot_clients")), 3),
                "light_clients": round(sum(v for k, v in procs.items() if k.startswith("light_fleet")), 3),
                "bench_listener": procs.get("bench_listener"),
            },
            # Machine busy time not accounted for by this benchmark's processes: the kernel's
            # own work for them (softirqs, ...) plus anything else running on the machine.
            "other_cores_used": round(float(np.mean(per_s)) * cores - sum(procs.values()), 3),
            "loadavg_1m_samples": [round(s[3], 2) for s in samples[:: max(1, len(samples) // 12)]],
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        }
    backlog = backlog_window(series, t_ready, t_stop)
    ql = [_num(d.get("queue_length")) for t, d in series if t_ready <= t < t_stop and "queue_length" in d]
    served_at = [(t, _num(d.get("served"))) for t, d in series if t_ready <= t <= t_stop and "served" in d]
    window = t_stop - t_ready
    server = _server_summary(last) if last else {}
    srv_rate = ((served_at[-1][1] - served_at[0][1]) / (served_at[-1][0] - served_at[0][0])
                if len(served_at) >= 2 and served_at[-1][0] > served_at[0][0] else float("nan"))
    chunks_in_window = agg["lateness"]["in_window"]["n"]
    profile = server_profile(cpu, samples, spin_cpu, srv_rate, window, robots, server, reaped_alive)
    bmax = max(engine) if engine else None
    res = {
        "benchmark": "fleet-live",
        "machine": machine,
        "robots": robots,
        "per_process": per_process,
        "light": light,
        "image_transport": rc_cfg.get("image_transport", "raw"),
        "processes": ({"inference_server": 1, "light_fleet": -(-robots // per_process)} if light else
                      {"inference_server": 1, "sim_robot": -(-robots // per_process), "robot_client": -(-robots // per_process)}),
        "duration_s": duration,
        "startup_s": round(t_ready - t_launch, 2),
        "startup_complete": startup_complete,
        "robots_seen_by_server": len(seen),
        "window_s": round(window, 2),
        "config": str(base),
        "control_hz": hz,
        "scheduler": (srv_cfg.get("scheduler") or {}).get("name", "kairos"),
        "engine_profile_ms": engine,
        "engine_capacity_chunks_per_s": round(bmax / engine[bmax] * 1000, 1) if engine else None,
        **agg,
        **(fault_summary(accounts, fault_drop, fault_seed, agg["requests"], agg["resent_requests"]) if fault_drop else {}),
        "chunks_per_s_in_window": round(chunks_in_window / window, 2) if window > 0 else None,
        "server_served_per_s_in_window": round(srv_rate, 2),
        "engine_utilization_when_backlogged": backlog["engine_utilization_when_backlogged"],
        "replies_replayed": server.get("replies_replayed"),
        "server_headline": {**backlog, **{k: server.get(k) for k in HEADLINE}},
        "executor": executor_kind(executor or srv_cfg.get("executor", "auto"), srv_cfg.get("services")),
        "infer_queue_depth": infer_depth(srv_cfg),
        **profile,
        "server": server,
        "server_minus_client_chunks": (server.get("served") - agg["chunks_served"]) if isinstance(server.get("served"), int) else None,
        "server_queue_length_in_window": {"mean": float(np.mean(ql)) if ql else None, "max": max(ql) if ql else None,
                                          "samples": len(ql)},
        "cpu": cpu,
        "server_rss_kb": [list(x) for x in rss],
        "server_after_stop": {k: _num(last.get(k)) for k in ("tasks", "queue_length", "in_flight", "waiters", "reply_cache",
                                                             "finished_tasks", "reaped_tasks")} if last else {},
        "rmw_replies_dropped_by_process": dict(dropped),
        "other_warnings_by_process": dict(warnings),
        "lost_requests_where": where,
        "lost_requests_sample": [list(k) for k in lost_keys[:20]],
        "server_trace": trace,
        "metrics_check": mcheck if isinstance(mcheck, dict) else None,
        "ros_domain_id": domain,
        "foreign_nodes_on_domain": sorted(foreign),
        "processes_failed_during_run": failed,
        "process_exit_codes": codes,
        "lost_after_s": lost_after_s,
        "settle_s": round(settle_s, 2) if settle_s is not None else None,
        "definitions": {
            "lost_chunks": f"rounds unanswered after the settle, first sent more than {lost_after_s:g} s before the stop",
            "in_flight_at_stop": f"requests unanswered at the stop that had waited at most {lost_after_s:g} s",
            "duplicate_chunks": "chunks for a (task_id, round_id) already answered with a chunk",
            "lateness": "per chunk used: time the robot had been holding position (queue dry) when it arrived; 0 if before",
            "idle_fraction": "control ticks holding position / control ticks in a task (all robots)",
            "window": "from every robot seen by the server (or the start-up limit) to the stop; counts are over the clients' whole life",
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


REFRESH_TOPIC = "/robotserve/observations"  # --refresh-topic: the server's refresh_topic, the light robots'


def cli(a) -> int:
    """`robotserve bench fleet-live` (registered in cli.py). With --runs N the fleet runs N
    times in a row: FILE is the last run, FILE's `_runs` sibling the per-run counts."""
    per_process = a.per_process or (150 if a.light else 25)
    if a.fault_drop and (not a.light or getattr(a, "executors", None)):
        from ..cli_types import UsageError

        raise UsageError("--fault-drop needs --light (the light robots drop messages) and no --executors")
    if getattr(a, "executors", None):
        return _cli_executors(a, per_process)
    runs, bad_runs = [], 0
    for k in range(a.runs):
        if a.runs > 1:
            print(f"[fleet-live] run {k + 1}/{a.runs}", flush=True)
        res = run_fleet_live(Path(a.out), robots=a.robots, duration=a.duration, per_process=per_process,
                             config=a.config, lost_after_s=a.lost_after, trace_server=a.trace_server, light=a.light,
                             image_transport=a.image_transport, flame=a.flame,
                             refresh_topic=REFRESH_TOPIC if a.refresh_topic else "", metrics_check=a.metrics_check,
                             fault_drop=a.fault_drop, fault_seed=a.fault_seed)
        print("\n".join(summary_lines(res) + fault_lines(res)))
        bad = res["lost_chunks"] or res["duplicate_chunks"] or res["mismatched_chunks"] or res["processes_failed_during_run"]
        if a.metrics_check:  # the scraped figures against the Runner's own
            bad = not verdict(res["metrics_check"]) or bad
        bad_runs += bool(bad)
        runs.append({k: res.get(k) for k in (
            "lost_chunks", "duplicate_chunks", "mismatched_chunks", "chunks_served", "requests", "resent_requests",
            "resent_share", "replies_replayed", "lateness_p50_ms", "lateness_p99_ms", "engine_utilization_when_backlogged",
            "in_flight_at_stop", "settle_s", "errors", "processes_failed_during_run", "lost_requests_where",
            "lost_requests_sample", "fault_drop", "lost_rounds")}
            | {"loadavg_at_start": res["machine"].get("loadavg_at_start"),
               "machine_busy_fraction_mean": res["cpu"].get("machine_busy_fraction_mean")})
    print(f"wrote {a.out}")
    if a.runs > 1:
        out = Path(a.out)
        summary = out.with_name(f"{out.stem}_runs{out.suffix}")
        summary.write_text(json.dumps({
            "benchmark": f"fleet-live x{a.runs}",
            "command": f"robotserve bench fleet-live --robots {a.robots} --duration {a.duration:g} --runs {a.runs}"
                       + (" --light" if a.light else "") + (f" --image-transport {a.image_transport}" if a.image_transport else ""),
            "lost_chunks_per_run": [r["lost_chunks"] for r in runs],
            "duplicate_chunks_per_run": [r["duplicate_chunks"] for r in runs],
            "runs": runs}, indent=1) + "\n")
        print(f"wrote {summary}: lost per run {[r['lost_chunks'] for r in runs]}, "
              f"duplicated per run {[r['duplicate_chunks'] for r in runs]}")
    if bad_runs:
        print("robotserve bench fleet-live: lost, duplicated or mismatched chunks, or a process failed (see the JSON)")
    return 1 if bad_runs else 0


def _cli_executors(a, per_process: int) -> int:
    """--executors: the same fleet once per server executor; FILE_<name>.json each, and
    FILE_executors.json side by side."""
    out, results = Path(a.out), {}
    for name in a.executors:
        print(f"[fleet-live] executor {name}", flush=True)
        results[name] = run_fleet_live(out.with_name(f"{out.stem}_{name}{out.suffix}"), robots=a.robots,
                                       duration=a.duration, per_process=per_process, config=a.config,
                                       lost_after_s=a.lost_after, trace_server=a.trace_server, light=a.light,
                                       executor=name, refresh_topic=REFRESH_TOPIC if a.refresh_topic else "",
                                       image_transport=a.image_transport)
        print("\n".join(summary_lines(results[name])))
    summary = out.with_name(f"{out.stem}_executors{out.suffix}")
    summary.write_text(json.dumps({
        "benchmark": "fleet-live executors",
        "command": f"robotserve bench fleet-live --robots {a.robots} --duration {a.duration:g} "
                   f"--executors {','.join(a.executors)}" + (" --light" if a.light else ""),
        "executors": compare_executors(results)}, indent=1) + "\n")
    print(f"wrote {summary}")
    return 0
