"""`robotserve bench chaos`: faults injected into a live fleet (the inference server and light
robots, live/light_fleet.py, as real processes on a free ROS domain); each scenario counts
what the robots got: lost and duplicated rounds, chunks after the fault, tasks continued.

Scenarios (each on a fresh fleet):
  server_kill     the inference server is SIGKILLed and started again. Robots hold position
                  (idle ticks), re-send their round; the new server does not know their tasks
                  and answers unknown_task for a round > 0: the robot continues its motion
                  under a new task id from round 0 (tasks_continued). Round-0 re-sends are
                  simply new tasks to it.
  client_kill     one robot process is SIGKILLed: the server reaps its tasks after
                  task_timeout_s (reaped_tasks), the other robots go on.
  server_freeze   the server process is stopped (SIGSTOP) for `pause_s` and continued: the
                  ROS graph loses it for that long, as in a partition (see below); robots
                  re-send meanwhile, and the server, back, answers each round once (re-sends
                  attach to the queued round or replay its reply): no duplicate chunk.
  partition       (root, iproute2) the server runs on host a, the robots on host b: two network
                  namespaces joined by a veth pair, Fast DDS over UDPv4 only (no shared
                  memory, which would bypass the link), discovery by multicast on the veth.
                  The link is taken down for `pause_s` and brought back: the graph is cut
                  both ways while both sides run. Robots hold position and re-send; the
                  server answers each round once: no duplicate chunk, nothing lost. No
                  listener here (it would need a third host): counts come from the robots'
                  accounts after a settle (SIGUSR1, as fleet-live).
A remote GPU tier killed and restored is `robotserve bench hybrid`'s kill step
(reports/live/hybrid*).
"""
from __future__ import annotations

import glob
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml

from ..launch_description import default_config, server as server_specs
from ..live.processes import ModuleSpec, ProcessGroup, pick_free_domain, ros_env
from ..machine import machine_info
from .fleet_live import _Listener
from .fleet_live_report import aggregate

SCENARIOS = ("server_kill", "client_kill", "server_freeze", "partition")


def _kill(p) -> None:
    p.kill()
    p.wait()
    for f in glob.glob(f"/dev/shm/fastdds_*{p.pid}*"):
        Path(f).unlink(missing_ok=True)


def _counts(robots: int, accounts: list, agg: dict) -> dict:
    """What every scenario reports from the robots' accounts (aggregate() of fleet-live)."""
    return {
        "robots": robots,
        "robot_accounts": len(accounts),
        **{k: agg[k] for k in ("lost_chunks", "duplicate_chunks", "mismatched_chunks", "chunks_served",
                               "resent_requests", "answers_to_resent_requests", "errors", "idle_fraction")},
        "tasks_continued": sum(a.get("tasks_continued", 0) for a in accounts),
        "finished_tasks": sum(a.get("finished_tasks", 0) for a in accounts),
    }


class _InNetns:
    """A ProcessGroup spec run inside one host of a NetnsLink (`ip netns exec` execs it: the
    pid is the process's own, so signals reach it)."""

    def __init__(self, spec, link, side: str) -> None:
        self.spec, self.link, self.side, self.name = spec, link, side, spec.name

    def command(self, python: str) -> list:
        return self.link.command(self.side, self.spec.command(python))


def _udp_only(env: dict) -> dict:
    """Fast DDS over UDPv4 only: inside a namespace that is lo + the veth, so nothing leaves
    the two hosts, and no shared memory bypasses the link the partition cuts."""
    env = dict(env)
    env.pop("FASTDDS_DEFAULT_PROFILES_FILE", None)
    env["FASTDDS_BUILTIN_TRANSPORTS"] = "UDPv4"
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "SUBNET"
    return env


def run_partition(tmp: Path, robots: int = 10, before_s: float = 8.0, after_s: float = 20.0, pause_s: float = 5.0,
                  config: Optional[str] = None, startup_s: float = 20.0, settle_s: float = 15.0,
                  say=lambda s: None) -> dict:
    """The `partition` scenario (see the module docstring); needs root and iproute2."""
    from ..net.netns import NetnsLink, netns_available

    why = netns_available()
    if why:
        return {"scenario": "partition", "skipped": why}
    base = config or default_config()
    cfg = yaml.safe_load(Path(base).read_text())
    hz = float(cfg.get("/**/robot_client", {}).get("ros__parameters", {}).get("control_hz", 30.0))
    work = tmp / "partition"
    stats = work / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    env = _udp_only(ros_env(pick_free_domain(), str(work / "ros_log")))
    with NetnsLink(rate_mbit=1000) as link:
        for side, ifc in (("a", link.if_a), ("b", link.if_b)):  # multicast discovery goes over the veth
            link.run(side, ["ip", "route", "add", "224.0.0.0/4", "dev", ifc], check=True, capture_output=True)
        server = ProcessGroup([_InNetns(s, link, "a") for s in server_specs(str(base))], env, work / "logs0")
        fleet = ModuleSpec("light_fleet_0", "robotserve_ros.live.light_fleet",
                           ["--robots", str(robots), "--params", str(base), "--stats-dir", str(stats)])
        clients = ProcessGroup([_InNetns(fleet, link, "b")], env, work / "logs")
        fault: dict = {"scenario": "partition", "link": f"{link.addr_a} <-> {link.addr_b} (veth, UDPv4)"}
        try:
            server.start()
            clients.start()
            time.sleep(startup_s + before_s)  # discovery over the link, then steady serving
            t0 = time.monotonic()
            link.run("a", ["ip", "link", "set", link.if_a, "down"], check=True, capture_output=True)
            say(f"link down for {pause_s:g} s")
            time.sleep(pause_s)
            link.run("a", ["ip", "link", "set", link.if_a, "up"], check=True, capture_output=True)
            link.run("a", ["ip", "route", "replace", "224.0.0.0/4", "dev", link.if_a], check=False, capture_output=True)
            t1 = time.monotonic()
            fault["fault_s"] = round(t1 - t0, 2)
            time.sleep(after_s)
            t_stop = time.monotonic()
            clients.signal(signal.SIGUSR1)  # settle: no new rounds, open ones seen through
            time.sleep(settle_s)
            codes = clients.stop(timeout=20.0)
            failed = server.failed()
        finally:
            server.stop()
            clients.stop()
    accounts = [json.loads(f.read_text()) for f in sorted(stats.glob("*.json"))]
    agg = aggregate(accounts, t1, t_stop, 10.0, hz)
    got_after = {a["robot"]: sum(1 for _, _, t, _, _ in a["chunk_log"] if t > t1) for a in accounts}
    got_before = {a["robot"]: sum(1 for _, _, t, _, _ in a["chunk_log"] if t < t0) for a in accounts}
    during = sum(1 for a in accounts for _, _, t, _, _ in a["chunk_log"] if t0 + 0.5 < t < t1)  # the cut is real: ~0
    return {
        **fault,
        **_counts(robots, accounts, agg),
        "in_flight_at_stop": agg["in_flight_at_stop"],
        "robots_with_chunks_before_fault": sum(1 for r in got_before if got_before[r] > 0),
        "chunks_during_partition": during,
        "robots_with_chunks_after_fault": sum(1 for r in got_after if got_after[r] > 0),
        "server_failed": failed,
        "client_exit_codes": codes,
    }


def run_scenario(name: str, tmp: Path, robots: int = 10, before_s: float = 8.0, after_s: float = 20.0,
                 pause_s: float = 5.0, config: Optional[str] = None, say=lambda s: None) -> dict:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if name == "partition":
        return run_partition(tmp, robots=robots, before_s=before_s, after_s=after_s, pause_s=pause_s, config=config,
                             say=say)
    base = config or default_config()
    cfg = yaml.safe_load(Path(base).read_text())
    hz = float(cfg.get("/**/robot_client", {}).get("ros__parameters", {}).get("control_hz", 30.0))
    task_timeout = float(cfg.get("inference_server", {}).get("ros__parameters", {}).get("task_timeout_s", 10.0))
    work = tmp / name
    stats = work / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    domain = pick_free_domain()
    env = ros_env(domain, str(work / "ros_log"))
    half = max(1, robots // 2)
    fleets = [ModuleSpec(f"light_fleet_{i}", "robotserve_ros.live.light_fleet",
                         ["--robots", str(min(half, robots - i)), "--first-index", str(i), "--params", str(base),
                          "--stats-dir", str(stats)]) for i in range(0, robots, half)]
    listener = _Listener(env)
    servers = [ProcessGroup(server_specs(str(base)), env, work / "logs0")]
    clients = ProcessGroup(fleets, env, work / "logs")
    fault: dict = {"scenario": name}
    diag_before = diag_after = {}
    try:
        servers[0].start()
        clients.start()
        deadline = time.monotonic() + 60
        while len(listener.robots_seen) < robots and time.monotonic() < deadline:
            listener.spin(0.2)
        listener.spin(before_s)
        diag_before = dict(listener.last)
        t0 = time.monotonic()
        if name == "server_kill":
            _kill(servers[0].procs[0][1])
            say("server SIGKILLed; starting it again")
            servers.append(ProcessGroup(server_specs(str(base)), env, work / "logs1").start())
        elif name == "client_kill":
            _, p = clients.procs[-1]
            _kill(p)
            fault["robots_killed"] = min(half, robots - (len(fleets) - 1) * half)
            say(f"robot process {clients.specs[-1].name} SIGKILLed")
        else:
            p = servers[0].procs[0][1]
            os.kill(p.pid, signal.SIGSTOP)
            time.sleep(pause_s)
            os.kill(p.pid, signal.SIGCONT)
            say(f"server stopped for {pause_s:g} s and continued")
        t1 = time.monotonic()
        fault["fault_s"] = round(t1 - t0, 2)
        listener.spin(max(after_s, task_timeout + 5.0 if name == "client_kill" else after_s))
        if name == "client_kill":  # the reaper's state, not one instant of it: it runs on its own period
            killed, alive_n = fault["robots_killed"], robots - fault["robots_killed"]
            fault["reaper_settled"] = listener.spin(
                task_timeout + 15.0, until=lambda d: int(d.get("reaped_tasks", 0)) >= killed
                and int(d.get("tasks", 0)) <= alive_n)
        diag_after = dict(listener.last)
        t_stop = time.monotonic()
        codes = clients.stop(timeout=20.0)
    finally:
        for g in servers:
            g.stop()
        clients.stop()
        listener.close()
    accounts = [json.loads(f.read_text()) for f in sorted(stats.glob("*.json"))]
    agg = aggregate(accounts, t1, t_stop, 10.0, hz)
    got_after = {a["robot"]: sum(1 for _, _, t, _, _ in a["chunk_log"] if t > t1) for a in accounts}
    alive = [a["robot"] for a in accounts]
    return {
        **fault,
        **_counts(robots, accounts, agg),
        "answered_requests_check": agg["answered_requests_check"],
        "robots_with_chunks_after_fault": sum(1 for r in alive if got_after[r] > 0),
        "robot_accounts_alive": len(alive),
        "server_before_fault": {k: diag_before.get(k) for k in ("served", "tasks", "finished_tasks", "reaped_tasks")},
        "server_at_end": {k: diag_after.get(k) for k in ("served", "tasks", "finished_tasks", "reaped_tasks",
                                                        "resent_requests", "replies_replayed", "given_up")},
        "client_exit_codes": codes,
    }


def run_chaos(out: Path, scenarios=SCENARIOS, robots: int = 10, config: Optional[str] = None, verbose: bool = True) -> dict:
    say = (lambda s: print(f"[chaos] {s}", flush=True)) if verbose else (lambda s: None)
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_chaos_"))
    res = {"benchmark": "chaos", "machine": machine_info(), "robots": robots, "scenarios": {},
           "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    for name in scenarios:
        say(f"{name}: {robots} robots")
        res["scenarios"][name] = r = run_scenario(name, tmp, robots=robots, config=config, say=say)
        if "skipped" in r:
            say(f"{name}: skipped ({r['skipped']})")
            continue
        say(f"{name}: lost {r['lost_chunks']}, duplicates {r['duplicate_chunks']}, chunks after the fault on "
            f"{r['robots_with_chunks_after_fault']}/{r['robots']} robots, tasks continued {r['tasks_continued']}, "
            f"finished {r['finished_tasks']}, server at end {r.get('server_at_end')}")
    res["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


def cli(a) -> int:
    """`robotserve bench chaos` (registered in cli.py)."""
    res = run_chaos(Path(a.out), scenarios=a.scenarios, robots=a.robots, config=a.config)
    print(f"wrote {a.out}")
    bad = [n for n, r in res["scenarios"].items()
           if "skipped" not in r and (r["lost_chunks"] or r["duplicate_chunks"] or r["mismatched_chunks"])]
    return 1 if bad else 0
