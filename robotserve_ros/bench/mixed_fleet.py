"""`robotserve bench mixed-fleet`: one fleet, three client protocols (issue 23 item 4). One
inference server node (the engine of config/fleet.yaml: the simulated stand-in engine, a
fixed-time profile, no model) with its `openpi` and `lerobot` services, serving at once:
N ROS 2 robots (sim_robot + robot_client), N unchanged LeRobot RobotClients (driving the
fake `rsfake` LeRobot robot plugin) and N unchanged openpi clients (WebsocketClientPolicy in
an ActionChunkBroker, as `bench openpi` runs them: --horizon actions at --control-hz).

Everything listens on 127.0.0.1 (DDS on the loopback profile, the services' ports bound to
127.0.0.1). Per protocol over the window: rounds served, round latency P50/P95, idle
fraction, errors. The server, from its /diagnostics at the window's two ends: batches, mean
batch, engine utilisation, and the share of batches that mixed protocols.

How each is measured (the clients are unchanged, so each protocol is read where it can be):
  ros     the robot clients' own accounts (stats_file): chunks in the window, their reply
          latency; idle = control ticks holding position / ticks in a task (client's life)
  openpi  the client loops: infer() calls that went to the server, their time; idle = time
          blocked in infer() / task time
  lerobot the fake robot's record of executed actions: idle = 1 - executed / (fps x window);
          rounds = the server's served rounds minus the other two (LeRobot's client logs
          no per-round latency unless run verbose: its latency is not reported)
  mixed   the openpi service counts batches holding an openpi robot by the protocols in them;
          a batch of only ROS and LeRobot robots is not counted, so the share is a lower bound
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from ..cli_types import positive
from ..launch_description import default_config, robots as robot_specs, server as server_specs
from ..live.mixed import executed, start_robot_client
from ..live.processes import ProcessGroup, pct, pick_free_domain, ros_env
from ..machine import machine_info
from .fleet_live import _Listener, engine_profile_ms, settle
from .fleet_live_report import _num
from .openpi import FLEET_KEY, run_fleet

LEROBOT_FPS = 30


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="the report JSON")
    p.add_argument("--ros", type=positive(int), default=4, help="ROS 2 robots (sim_robot + robot_client)")
    p.add_argument("--lerobot", type=positive(int), default=2, help="unchanged LeRobot RobotClients")
    p.add_argument("--openpi", type=positive(int), default=4, help="unchanged openpi clients")
    p.add_argument("--duration", type=positive(), default=20.0, help="measured seconds")
    p.add_argument("--horizon", type=positive(int), default=10, help="openpi robots: actions executed per chunk")
    p.add_argument("--control-hz", type=positive(), default=50.0, help="openpi robots' control rate")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(tmp: Path, openpi_port: int, lerobot_port: int, policies: Path) -> tuple[str, dict]:
    cfg = yaml.safe_load(Path(default_config()).read_text())
    srv = cfg["inference_server"]["ros__parameters"]
    srv.update({"services": ["openpi", "lerobot"], "task_timeout_s": 10.0, "diagnostics_hz": 5.0})
    key = tmp / "openpi.key"  # every robot on loopback is one address: the fleet presents a key,
    key.write_text(FLEET_KEY + "\n")  # budgeted per key, not per address (docs/security.md)
    srv["openpi"] = {**srv.get("openpi", {}), "port": openpi_port, "host": "127.0.0.1", "api_key_file": str(key)}
    srv["lerobot"] = {**srv.get("lerobot", {}), "port": lerobot_port, "host": "127.0.0.1",
                      "policy_dirs": [str(policies)]}
    cfg["/**/robot_client"]["ros__parameters"].update({"tasks": 100000,
                                                       "stats_file": str(tmp / "stats" / "{robot}.json")})
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path), cfg


def _num_diag(d: dict, k: str) -> float:
    v = _num(d.get(k, 0))
    return float(v) if isinstance(v, (int, float)) else 0.0


def _stop(procs: list) -> None:
    """SIGINT (LeRobot's client disconnects its robot), SIGKILL if it will not stop."""
    for p, _ in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p, _ in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_mixed_fleet(out: Path, ros: int = 4, lerobot: int = 2, openpi: int = 4, duration: float = 20.0,
                    horizon: int = 10, control_hz: float = 50.0, startup_timeout: float = 120.0,
                    verbose: bool = True) -> dict:
    say = (lambda s: print(f"[mixed-fleet] {s}", flush=True)) if verbose else (lambda s: None)
    out = Path(out)
    machine = machine_info()
    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_mixed_fleet_"))
    policies = tmp / "policies"
    (policies / "act").mkdir(parents=True)  # the stand-in engine serves any policy name under policy_dirs
    op, lp = _free_port(), _free_port()
    params, cfg = _params(tmp, op, lp, policies)
    engine = cfg["inference_server"]["ros__parameters"].get("engine", {}).get("name", "?")
    env = ros_env(pick_free_domain(), str(tmp / "ros_log"))
    listener = _Listener(env)
    specs = robot_specs(params, ros, per_process=ros)
    base = ProcessGroup(server_specs(params) + [s for s in specs if s.executable == "sim_robot"], env, tmp / "logs")
    clients = ProcessGroup([s for s in specs if s.executable == "robot_client"], env, tmp / "logs")
    lerobots: list = []
    fleet: dict = {}
    window = {}
    try:
        say(f"server ({engine} engine) + {ros} ROS, {lerobot} LeRobot, {openpi} openpi robots; logs in {tmp}")
        base.start()
        clients.start()
        deadline = time.monotonic() + startup_timeout

        def wait(cond, what: str) -> None:
            while not cond():
                listener.spin(0.2)
                if base.failed() + clients.failed():
                    raise RuntimeError(f"processes exited: {base.failed() + clients.failed()} (logs in {tmp / 'logs'})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} not within {startup_timeout:g} s (logs in {tmp})")

        wait(lambda: "services/openpi/connected" in listener.last, "the server's openpi service up")
        lerobots = [start_robot_client(tmp, i, lp, "act", policies / "act", env=env, fps=LEROBOT_FPS)
                    for i in range(lerobot)]
        wait(lambda: len(listener.robots_seen) >= ros and
             int(_num_diag(listener.last, "services/lerobot/clients")) >= lerobot, "every ROS and LeRobot robot seen")
        obs = {"observation/state": np.zeros(6, np.float32), "prompt": "pick up the cube"}
        t_call = time.time()
        th = threading.Thread(target=lambda: fleet.update(r=run_fleet(op, openpi, horizon, control_hz, duration, obs)),
                              daemon=True)
        th.start()
        start = t_call + 2.0 + 0.25 * openpi  # run_fleet's: every openpi robot connected and warm first
        for edge, at in (("start", start), ("end", start + duration)):
            while time.time() < at:
                listener.spin(min(0.1, max(0.01, at - time.time())))
            listener.spin(0.25)  # the diagnostics at this edge (5 Hz)
            # the time this process received those diagnostics: the server's counters at about then
            window[edge] = (listener.series[-1][0], dict(listener.last),
                            [len(executed(r)) for _, r in lerobots])
        th.join(60)
        _stop(lerobots)
        # the ROS robot clients start no new round and see their open ones through, then stop
        # (a SIGINT while one handles SIGUSR1 would cut it short of writing its account)
        settle(listener, clients, 10.0, say, grace_s=2.0)
    finally:
        _stop(lerobots)
        codes = clients.stop(timeout=20.0)
        codes.update(base.stop(timeout=20.0))
        listener.close()

    if "end" not in window or "r" not in fleet:
        raise RuntimeError(f"the run did not finish its window (logs in {tmp})")
    (m0, d0, e0), (m1, d1, e1) = window["start"], window["end"]
    span = m1 - m0

    def delta(k: str) -> float:
        return _num_diag(d1, k) - _num_diag(d0, k)

    def refused(service: str) -> int:
        return int(sum(delta(k) for k in d1 if k.startswith(f"services/{service}/refused/")))

    # ROS: the clients' accounts, chunks answered in the window
    accounts = [json.loads(f.read_text()) for f in sorted((tmp / "stats").glob("*.json"))]
    ros_ms = [ms for a in accounts for _task, _rnd, t, ms, _late in a["chunk_log"] if m0 <= t <= m1]
    ticks = {k: sum(a["ticks"].get(k, 0) for a in accounts) for k in ("commanded", "holding")}
    ros_err = sum(sum(a["errors"].values()) for a in accounts)
    # openpi: the client loops
    per = fleet["r"]
    op_ms = [x for r in per for x in r["rounds_ms"]]
    op_err = (openpi - len(per)) + refused("openpi")  # a robot whose infer() raised returns no account
    # LeRobot: the fake robots' executed actions
    le_done = [b - a for a, b in zip(e0, e1)]
    le_err = refused("lerobot") + sum(p.returncode not in (0, None, -2, 130) for p, _ in lerobots)
    served, batches = delta("served"), delta("batches")
    mixes = {k.rsplit("/", 1)[1]: int(delta(k)) for k in d1 if k.startswith("services/openpi/batches/")}
    mixed = sum(v for k, v in mixes.items() if "+" in k)
    three = mixes.get("lerobot+openpi+ros", 0)
    res = {
        "benchmark": "mixed-fleet",
        "command": f"robotserve bench mixed-fleet --out {out} --ros {ros} --lerobot {lerobot} --openpi {openpi} "
                   f"--duration {duration:g} --horizon {horizon} --control-hz {control_hz:g}",
        "engine": f"{engine} (config/fleet.yaml's engine: a simulated stand-in with a fixed-time profile, no model)",
        "engine_profile_ms": engine_profile_ms(cfg["inference_server"]["ros__parameters"]),  # batch -> ms
        "window_s": round(span, 2),
        "run_dir": str(tmp),  # the processes' logs and the robots' accounts
        "protocols": {
            "ros": {"robots": ros, "rounds_served": len(ros_ms), "p50_ms": round(pct(ros_ms, 50), 2),
                    "p95_ms": round(pct(ros_ms, 95), 2),
                    "idle_fraction": round(ticks["holding"] / max(1, ticks["holding"] + ticks["commanded"]), 4),
                    "errors": ros_err},
            "lerobot": {"robots": lerobot, "rounds_served": int(served - len(ros_ms) - len(op_ms)),
                        "p50_ms": None, "p95_ms": None,
                        "idle_fraction": round(float(np.mean([max(0.0, 1 - n / (LEROBOT_FPS * span))
                                                              for n in le_done])), 4),
                        "actions_executed": le_done, "errors": le_err},
            "openpi": {"robots": openpi, "rounds_served": len(op_ms), "p50_ms": round(pct(op_ms, 50), 2),
                       "p95_ms": round(pct(op_ms, 95), 2),
                       "idle_fraction": round(float(np.mean([r["idle_s"] / r["task_s"] for r in per]))
                                              if per else 1.0, 4),
                       "errors": op_err},
        },
        "server": {"batches": int(batches), "rounds_served": int(served),
                   "mean_batch": round(served / batches, 2) if batches else None,
                   "mixed_batches_fraction": round(mixed / batches, 4) if batches else None,
                   "three_protocol_batches_fraction": round(three / batches, 4) if batches else None,
                   "batches_with_openpi_by_protocols": mixes,
                   "engine_utilization": round(delta("engine_busy_s") / span, 4)},
        "exit_codes": codes,
        "machine": {**machine, "loadavg_at_start": [round(x, 2) for x in load0],
                    "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "method": __doc__.split("How each is measured")[1].strip(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def cli(a) -> int:
    # Ctrl-C or SIGTERM: run_mixed_fleet's `finally` stops every process it started (a shell
    # starts a background job with SIGINT ignored: set it back to raising here)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        res = run_mixed_fleet(Path(a.out), a.ros, a.lerobot, a.openpi, a.duration, a.horizon, a.control_hz)
    except KeyboardInterrupt:
        print("robotserve bench mixed-fleet: interrupted; every process it started is stopped, no report written")
        return 130
    for name, p in res["protocols"].items():
        print(f"{name:8s} {p['robots']} robots: {p['rounds_served']} rounds, P50/P95 {p['p50_ms']}/{p['p95_ms']} ms, "
              f"idle {p['idle_fraction']:.1%}, errors {p['errors']}")
    s = res["server"]
    print(f"server: {s['batches']} batches, mean batch {s['mean_batch']}, mixed {s['mixed_batches_fraction']}, "
          f"all three {s['three_protocol_batches_fraction']}, engine utilisation {s['engine_utilization']}")
    print(f"wrote {a.out}")
    return 0
