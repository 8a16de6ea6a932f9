"""`robotserve up CONFIG [NAME:=VALUE ...]`: the nodes of a launch file as plain processes
(there is no `ros2 launch` here), watched: a one-line fleet status every few seconds from
the server's /diagnostics, and when a node dies, its name, exit code and the reason from
its log."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from ..cli_types import UsageError, positive
from ..launch_description import load_launch_file


def add_arguments(u) -> None:
    u.add_argument("config", help="ROS params file, e.g. config/fleet.yaml")
    u.add_argument("launch_args", nargs="*", metavar="NAME:=VALUE",
                   help="launch arguments, as for ros2 launch (namespace, log_level, use_sim_time, policy, ...)")
    u.add_argument("--launch", default="fleet", choices=("fleet", "server", "robot"), help="launch/<name>.launch.py to read")
    u.add_argument("--robots", type=positive(int), help="same as robots:=N")
    u.add_argument("--per-process", type=positive(int), help="same as per_process:=N")
    u.add_argument("--domain-id", type=positive(int, zero_ok=True), help="ROS domain (default: $ROS_DOMAIN_ID or 0)")
    u.add_argument("--duration", type=positive(), help="stop after this many seconds")
    u.add_argument("--status-every", type=positive(), default=3.0, help="seconds between fleet status lines")
    u.add_argument("--log-dir", default="log/up", help="one log file per process")
    u.add_argument("--dry-run", action="store_true", help="print the commands instead")


def launch_values(mod, a) -> dict:
    """The launch arguments given (NAME:=VALUE, --robots, --per-process), checked against the
    launch file's declared ones."""
    values = {"params_file": str(Path(a.config).resolve())}
    for item in a.launch_args:
        name, sep, value = item.partition(":=")
        if not sep or name not in mod.ARGS:
            raise UsageError(f"launch argument {item!r}: expected NAME:=VALUE with NAME one of "
                             f"{', '.join(k for k in mod.ARGS if k != 'params_file')}")
        values[name] = value
    for name, v in (("robots", a.robots), ("per_process", a.per_process)):
        if v is not None:
            if name not in mod.ARGS:
                raise UsageError(f"--{name.replace('_', '-')}: launch/{a.launch}.launch.py has no {name} argument")
            values[name] = str(v)
    return values


def report_death(group, name: str, code: int) -> None:
    from .fleet_status import death_reason

    log = group.log_dir / f"{name}.log"
    reason, last = death_reason(log)
    print(f"robotserve up: {name} exited with code {code}: {reason or 'its log is empty'}", file=sys.stderr)
    for line in last:
        print(f"  | {line}", file=sys.stderr)
    print(f"  (whole log: {log})", file=sys.stderr)


def cli(a) -> int:
    from .processes import ProcessGroup, ros_env

    from .params_file import check_params_file

    check_params_file(a.config, "config")  # a bad file or knob is one line now, not a node's death in its log
    mod = load_launch_file(a.launch)
    try:
        specs = mod.specs(**launch_values(mod, a))
    except ValueError as e:  # a launch argument's value the description refuses (log_level:=loud)
        raise UsageError(str(e)) from None
    if a.dry_run:
        for s in specs:
            print(" ".join(s.command()))
        return 0
    env = ros_env(a.domain_id)
    group = ProcessGroup(specs, env, Path(a.log_dir)).start()
    from .fleet_status import plural

    print(f"started {plural(len(specs), 'process', 'processes')} from launch/{a.launch}.launch.py (logs: {a.log_dir}); Ctrl-C stops them",
          flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the group like Ctrl-C
    t0 = time.monotonic()
    end = t0 + a.duration if a.duration else float("inf")
    code, watch, why = 0, None, "its --duration ran out"
    try:
        from .fleet_status import DiagnosticsWatch, last_errors, status_line

        watch = DiagnosticsWatch(env)
        next_line, previous = t0 + a.status_every, None
        while time.monotonic() < end:
            bad = group.failed()
            if bad:
                report_death(group, *bad[0])
                code, why = 1, f"{bad[0][0]} exited"
                break
            watch.spin(0.2)
            now = time.monotonic()
            if now >= next_line:
                next_line = now + a.status_every
                if watch.latest is None:
                    line = f"waiting for the inference server's /diagnostics (ROS domain {watch.domain})"
                elif now - watch.heard_at > 3 * a.status_every:
                    line = f"no /diagnostics from the inference server for {now - watch.heard_at:.0f} s"
                else:
                    line = status_line(watch.latest, previous)
                    line += "".join(f"\n          last refusal, {e}" for e in last_errors(watch.latest, previous))
                    previous = watch.latest
                print(f"[{now - t0:5.1f} s] {line}", flush=True)
    except KeyboardInterrupt:
        why = "Ctrl-C (or SIGTERM)"
    finally:
        if watch is not None:
            watch.close()
        group.stop()
    print(f"robotserve up: stopped {plural(len(specs), 'process', 'processes')} after {time.monotonic() - t0:.0f} s ({why}); "
          f"logs: {a.log_dir}", flush=True)
    return code
