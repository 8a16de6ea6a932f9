"""The one `robotserve` command."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_types import Parser as _Parser, UsageError, between, check_out, comma_list, positive, scratch, seed
from .live.params_file import params_file
from .params import parse_key_values

DEMO_MOST_ROBOTS = 1000  # a live demo on one machine: 40 robot processes and their MuJoCo envs at most


def _load_workload(arg: str):
    from .sim.workload import load_workload
    from .sim.workloads import builtin_names, builtin_workload, measured_names

    if Path(arg).exists() or arg.endswith(".json"):
        return load_workload(arg)
    if arg in builtin_names() or arg in measured_names():  # the regime shapes included
        return builtin_workload(arg)
    raise UsageError(f"--workload {arg!r} is neither a file nor a built-in ({', '.join(builtin_names() + measured_names())})")


def _params(items) -> dict:
    try:
        return parse_key_values(items)
    except ValueError as e:
        raise UsageError(str(e)) from None


def cmd_sim(a) -> int:
    from .core.errors import ConfigError
    from .sim.simulator import Simulator

    if a.tasks is not None and a.rate is None:  # fleet mode runs the workload's tasks: say so, not ignore it
        raise UsageError(f"--tasks {a.tasks}: only with --rate (online mode); with --robots every task of the "
                         "workload runs")
    wl = _load_workload(a.workload)
    try:
        sim = Simulator(wl, a.scheduler, a.horizon, a.seed, _params(a.scheduler_param))
    except ConfigError:  # the registry's line names the knob and the ones allowed
        raise
    except (TypeError, ValueError) as e:  # a knob's value the scheduler refuses (buckets=0)
        raise UsageError(f"--scheduler-param for '{a.scheduler}': {e}") from None
    res = sim.run_online(a.rate, a.tasks or 400) if a.rate is not None else sim.run_fleet(a.robots)
    summary = res.summary()
    text = json.dumps(summary, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


def cmd_bench_fleet(a) -> int:
    from .bench.fleet import run_bench
    from .bench.fleet_report import regime_targets, targets

    seeds = tuple(a.seeds)
    tasks = a.tasks
    if a.quick:
        seeds, tasks = seeds[:1], min(tasks, 150)
    data = run_bench(Path(a.out), seeds=seeds, tasks=tasks, workloads=a.workloads, workers=a.workers)
    print(f"report: {Path(a.out) / 'report.md'}  (data: fleet_bench.json, plots: *.png)")
    for n, t, v, thr, ok in targets(data) + regime_targets(data):
        print(f"  {'met ' if ok else 'MISS'} {n:20s} {t:45s} {v:+6.1f}%")
    return 0


def cmd_bench_scheduler(a) -> int:
    from .bench.scheduler import format_table, run_bench

    res = run_bench(Path(a.out), tuple(a.sizes), a.repeats)
    print(format_table(res))
    print(f"kairos decision at 1000 pending under 1 ms: {res['kairos_1000_under_1ms']}  ({a.out})")
    return 0


def cmd_bench_regime(a) -> int:
    from .bench.regime import run_regime

    seeds, tasks = (a.seeds[:1], min(a.tasks, 120)) if a.quick else (a.seeds, a.tasks)
    run_regime(Path(a.out), seeds=tuple(seeds), tasks=tasks, workers=a.workers)
    print(f"report: {Path(a.out) / 'regime.md'}  (data: regime.json, heat map: regime_heatmap.png)")
    return 0


def cmd_workload(a) -> int:
    from .sim.workload import load_workload
    from .sim.workloads import builtin_names, builtin_workload

    if a.action == "list":
        from .sim.workloads import REGIME_SHAPES, measured_names

        for n in builtin_names() + measured_names():
            print(f"{n}  (regime: {REGIME_SHAPES[n].regime})" if n in REGIME_SHAPES else n)
    elif a.action == "gen":
        if not a.name or not a.out:
            raise UsageError("workload gen needs NAME and --out FILE")
        builtin_workload(a.name, a.seed).save(a.out)
        print(f"wrote {a.out}")
    else:
        if not a.name:
            raise UsageError("workload check needs FILE")
        w = load_workload(a.name)
        print(f"ok: '{w.name}', {len(w.tasks)} tasks, saturation batch {w.profile.saturation_batch}")
    return 0


def demo_scratch_dir() -> Path:
    """Where `robotserve demo` writes unless --out says otherwise: a scratch folder that exists
    wherever the command runs (a checkout or an installed package) and never dirties a git tree;
    the run of record is made on purpose with --out reports/live --force."""
    return Path(scratch("demo"))


def cmd_demo(a) -> int:
    from .live.demo import incomplete_runs, run_demo
    from .sim.workloads import builtin_workload

    if a.config:
        from .live.params_file import check_params_file

        need = [k for k in ("inference_server", "/**/robot_client") if k not in check_params_file(a.config, "--config")]
        if need:  # the demo sets each run's scheduler and workload in these two
            raise UsageError(f"--config {a.config!r}: no {need[0]!r} section (the demo runs config/fleet.yaml's nodes)")
    if a.workload is None and (a.config or a.ablation):
        raise UsageError(f"{'--config' if a.config else '--ablation'} is for --workload runs only "
                         "(the Meta-World demo builds its own parameters)")
    if a.workload is not None:
        builtin_workload(a.workload)  # an unknown name is refused here, listing the known ones, before any process starts
    a.out = a.out or str(demo_scratch_dir())
    try:
        res = run_demo(Path(a.out), robots=a.robots, tasks=a.tasks, workload=a.workload, seed=a.seed, config=a.config,
                       ablation=a.ablation)
    except RuntimeError as e:  # a fleet process died (which, and where its log is), or Meta-World is missing
        print(f"robotserve {e}", file=sys.stderr)
        return 1
    missing = incomplete_runs(res)
    print(f"report: {Path(a.out) / 'live_demo.md'}")
    if missing:
        print(f"robotserve demo: runs {missing} did not finish every task (see {a.out}/logs)", file=sys.stderr)
        return 1
    return 0


def cmd_bench_transport(a) -> int:
    from .bench.transport import cli

    return cli(a)


def cmd_bench_fleet_live(a) -> int:
    from .bench.fleet_live import cli

    return cli(a)


def cmd_bench_soak(a) -> int:
    from .bench.soak import cli

    return cli(a)


def cmd_bench_chaos(a) -> int:
    from .bench.chaos import cli

    return cli(a)


def cmd_gpu_server(a) -> int:
    from .transport.gpu_server_cli import cli

    return cli(a)


def build_parser() -> argparse.ArgumentParser:
    # Commands whose options their own modules define (none imports torch or rclpy at load).
    from . import sros, transport
    from .core.schedulers import SCHEDULERS
    from .bench import hybrid as bench_hybrid, nova as bench_nova, oxygen as bench_oxygen, peer as bench_peer
    from .bench import llm_backends as bench_llm_backends, ray as bench_ray, slo as bench_slo, study_fleet
    from .bench import mixed_fleet as bench_mixed_fleet, openpi as bench_openpi, timely as timely_bench
    from .bench import image_transport as bench_image_transport
    from .bench import rtc_live as bench_rtc_live
    from .bench import robots_per_engine as bench_rpe
    from .engines import profiling, tiny_policies
    from .engines.llm import convert as llm_convert, profile as llm_profile
    from .live import fleet_status, up as live_up
    from .transport.lerobot import command as lerobot_command, dataset as lerobot_dataset
    from .transport.openpi import command as openpi_command

    p = _Parser(prog="robotserve", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("sim", help="simulate one scheduler/horizon on a workload (virtual clock)")
    s.add_argument("--workload", required=True, help="workload JSON file or built-in name")
    s.add_argument("--scheduler", default="kairos", choices=SCHEDULERS.names(), metavar="NAME",
                   help=f"one of {', '.join(SCHEDULERS.names())}")
    s.add_argument("--scheduler-param", action="append", metavar="KEY=VALUE", help="e.g. buckets=5")
    s.add_argument("--horizon", choices=("static", "dynamic"), default="static", help="execution horizon policy")
    load = s.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=positive(), help="online mode: Poisson task arrivals per second")
    load.add_argument("--robots", type=positive(int), help="fleet mode: robots running the tasks back to back")
    s.add_argument("--tasks", type=positive(int), help="online mode (--rate): tasks to draw (default: 400; with "
                   "--robots every task of the workload runs)")
    s.add_argument("--seed", type=seed, default=0)
    s.add_argument("--out", help="write the result JSON here")
    s.set_defaults(func=cmd_sim)

    b = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    f = b.add_parser("fleet", help="schedulers x horizons on every built-in workload; Markdown + PNG report")
    f.add_argument("--out", default=scratch("fleet"), help="report folder (the report of record: reports/fleet)")
    f.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2])
    f.add_argument("--tasks", type=positive(int), default=400)
    f.add_argument("--workloads", nargs="+")
    f.add_argument("--workers", type=positive(int))
    f.add_argument("--quick", action="store_true", help="one seed, 150 tasks: a smoke run")
    f.set_defaults(func=cmd_bench_fleet)
    rg = b.add_parser("regime", help="where execution-aware ordering pays: sweep + heat map (reports/fleet/regime.md)")
    rg.add_argument("--out", default=scratch("fleet"), help="report folder (the report of record: reports/fleet)")
    rg.add_argument("--seeds", type=seed, nargs="+", default=[0, 1])
    rg.add_argument("--tasks", type=positive(int), default=300)
    rg.add_argument("--workers", type=positive(int))
    rg.add_argument("--quick", action="store_true", help="one seed, 120 tasks: a smoke run")
    rg.set_defaults(func=cmd_bench_regime)
    sc = b.add_parser("scheduler", help="scheduling decision time at 10/100/1000 pending requests")
    sc.add_argument("--out", default=scratch("scheduler_bench.json"),
                    help="result JSON (the record: reports/scheduler_bench.json)")
    sc.add_argument("--sizes", type=positive(int), nargs="+", default=[10, 100, 1000], help="pending requests to time a decision at")
    sc.add_argument("--repeats", type=positive(int), default=300)
    sc.set_defaults(func=cmd_bench_scheduler)
    # Live benchmarks on real ROS 2 processes (robotserve_ros/bench/transport.py, fleet_live.py).
    tr = b.add_parser("transport", help="latency the inference server adds over a bare rclpy service round trip")
    tr.add_argument("--out", required=True, help="result JSON")
    tr.add_argument("--rounds", type=positive(int), default=200, help="measured round trips per service (after warm-up)")
    tr.add_argument("--warmup", type=positive(int, zero_ok=True), default=30)
    tr.add_argument("--image", type=positive(int), default=224, help="side of the square rgb8 image sent each round")
    tr.add_argument("--profile", action="store_true", help="also time each stage of the served path")
    tr.set_defaults(func=cmd_bench_transport)
    fl = b.add_parser("fleet-live", help="server + simulated robots live on this machine: lost/duplicate chunks, lateness, load")
    fl.add_argument("--out", required=True, help="result JSON")
    fl.add_argument("--robots", type=positive(int), default=100)
    fl.add_argument("--duration", type=positive(), default=60.0, help="seconds, after every robot has started")
    fl.add_argument("--per-process", type=positive(int), help="robots per process (default 25; 150 with --light)")
    fl.add_argument("--config", type=params_file, help="ROS params file (default config/fleet.yaml)")
    fl.add_argument("--runs", type=positive(int), default=1, help="run the fleet this many times in a row "
                    "(FILE: the last run; FILE_runs: the per-run counts)")
    fl.add_argument("--lost-after", type=float, default=10.0, help="an answer missing longer than this at the stop is lost")
    fl.add_argument("--trace-server", action="store_true", help="run the server with per-round marks (where lost rounds went)")
    fl.add_argument("--light", action="store_true", help="light load generator (live/light_fleet.py): many robots per "
                    "process, no rendering; the server's numbers are the headline")
    fl.add_argument("--image-transport", choices=("raw", "jpeg", "png"), help="how every robot sends its cameras "
                    "(robot_client image_transport; default: the config's, else raw; docs/transport.md)")
    fl.add_argument("--executors", type=comma_list(("multithreaded", "single")), help="comma-separated server executors (multithreaded, single) "
                    "run one after another on the same fleet: FILE_executors.json compares them side by side")
    fl.add_argument("--flame", help="py-spy flame graph (svg) of the server over the window")
    fl.add_argument("--refresh-topic", action="store_true", help="with --light: robots publish their newest "
                    "observations on /robotserve/observations, the server reads them at dispatch (no refresh service)")
    fl.add_argument("--metrics-check", action="store_true", help="scrape the server's Prometheus endpoint during the "
                    "run; exit 1 unless its figures are the server's own (/diagnostics; docs/metrics.md)")
    fl.add_argument("--fault-drop", type=between(0.0, 0.5), default=0.0, help="with --light: drop this fraction of "
                    "requests (never sent) and of replies (discarded), as if lost on the wire; the report gains "
                    "fault_drop, lost_rounds and fault (how each lost round was recovered)")
    fl.add_argument("--fault-seed", type=seed, default=0, help="seed of --fault-drop: the same seed drops the same "
                    "messages of each robot")
    fl.set_defaults(func=cmd_bench_fleet_live)

    so = b.add_parser("soak", help="the server under a steady light fleet for minutes: RSS growth, lost chunks, ledger freed")
    so.add_argument("--minutes", type=positive(), default=20.0, help="how long the fleet runs")
    so.add_argument("--robots", type=positive(int), default=50)
    so.add_argument("--config", type=params_file, help="ROS params file (default config/fleet.yaml)")
    so.add_argument("--out", default=scratch("soak.json"), help="result JSON (the record: reports/live/soak.json)")
    so.add_argument("--memory-trace", action="store_true",
                    help="the server traces Python allocations (tracemalloc; slower) and the report names what grew")
    so.add_argument("--warmup-minutes", type=positive(zero_ok=True), help="minutes left out of the RSS slope "
                    "(default 5, or a quarter of a shorter run)")
    so.set_defaults(func=cmd_bench_soak)

    ch = b.add_parser("chaos", help="faults in a live light fleet: server killed/restarted, robot process killed, server frozen")
    ch.add_argument("--scenarios", nargs="+", default=["server_kill", "client_kill", "server_freeze", "partition"],
                    help="faults to inject, one run each", choices=["server_kill", "client_kill", "server_freeze", "partition"])
    ch.add_argument("--robots", type=positive(int), default=10)
    ch.add_argument("--config", type=params_file, help="ROS params file (default config/fleet.yaml)")
    ch.add_argument("--out", default=scratch("chaos.json"), help="result JSON (the record: reports/live/chaos.json)")
    ch.set_defaults(func=cmd_bench_chaos)

    sec = sub.add_parser("security", help="access control: the SROS 2 policy and keystore script of the fleet")
    sec = sec.add_subparsers(dest="security", required=True)

    # Commands whose options their own modules define: module.add_arguments + module.cli.
    for parent, name, help_, module in (
        (b, "peer", "LeRobot's own policy server (one robot per pass) vs the batched engine, same policy", bench_peer),
        (b, "hybrid", "edge-only vs cloud-only vs hybrid placement over a shaped link (netns, root)", bench_hybrid),
        (b, "slo", "SLO-aware disaggregated LLM serving (seed 004): urgency_slack vs fcfs_cb + ablations", bench_slo),
        (b, "oxygen", "SmolVLA actions + language: isolated vs KV sharing vs OxyGen batching (seed 001)", bench_oxygen),
        (b, "nova", "Nova VLM serving (seed 003): stage pipeline + adaptive partition vs baselines", bench_nova),
        (b, "openpi", "unchanged openpi clients: capacity of a one-at-a-time reference vs robotserve's batching",
         bench_openpi),
        (b, "robots-per-engine", "robots one engine keeps fed: robotserve vs openpi's serial server and LeRobot's own, "
                                 "one simulated device, clients on their own core (issue 40)", bench_rpe),
        (b, "mixed-fleet", "one server, ROS 2 + unchanged LeRobot + unchanged openpi robots in the same batches",
         bench_mixed_fleet),
        (b, "image-transport", "camera frames raw vs JPEG/PNG: bytes per round, decode time, the action difference "
                               "on the tiny SmolVLA (issue 26)", bench_image_transport),
        (b, "rtc-live", "RTC served remotely: the delay d the server predicts vs what the robots saw, "
                        "a live fleet with and without rtc", bench_rtc_live),
        (b, "timely", "TimelyLLM trace replay: time utility, response and waiting time per scheduler", timely_bench),
        (b, "ray", "the fleet scheduler over 1/2/4 replicas: gRPC tiers vs a Ray Serve pool, and chaos (issue 24)",
         bench_ray),
        (b, "llm-backends", "the LLM services on the own engine vs vLLM: tok/s, TTFT/TPOT, utility, SLO attainment",
         bench_llm_backends),
        (sub, "lerobot-server", "serve unmodified LeRobot robot_clients (async inference) by the fleet scheduler",
         lerobot_command),
        (sub, "openpi-server", "serve unmodified openpi clients (websocket, msgpack) by the fleet scheduler",
         openpi_command),
        (sub, "profile", "engine latency vs batch size: the engine profile JSON + Markdown report", profiling),
        (sub, "llm-convert", "convert the packaged SmolLM2 GGUF once into a model folder (build step)", llm_convert),
        (sub, "llm-profile", "LLM engine: prefill vs prompt, decode step vs batch/context, KV handover "
                             "-> the profile JSON every LLM scheduler reads", llm_profile),
        (sub, "make-policy", "write a random-weight LeRobot policy directory (default or real size)", tiny_policies),
        (sub, "up", "start the nodes of a launch file as processes (no ros2 launch needed), with a live fleet status",
         live_up),
        (sub, "record-dataset", "a recorded session (rosbag2) as a LeRobot dataset: camera, joints, commands, "
                                "instruction", lerobot_dataset),
        (sub, "status", "read the inference server's /diagnostics once and print it", fleet_status),
        (sec, "keystore", "write the SROS 2 policy (an enclave per node) and the script making the keystore", sros),
    ):
        module_parser = parent.add_parser(name, help=help_)
        module.add_arguments(module_parser)
        module_parser.set_defaults(func=module.cli)

    g = sub.add_parser("gpu-server", help="host an engine behind the gRPC GPU service (a cloud tier)")
    transport.add_arguments(g)
    g.set_defaults(func=cmd_gpu_server)

    d = sub.add_parser("demo", help="live fleet on this machine: Meta-World robots on the trained flow policy under the "
                                    "closed-loop study's baseline, FIFO + dynamic horizon and best execution-aware rows "
                                    "(--workload NAME: a generated workload)")
    d.add_argument("--robots", type=positive(int, most=DEMO_MOST_ROBOTS), default=10)
    d.add_argument("--tasks", type=positive(int), help="episodes per robot (Meta-World: 8) or tasks per robot (--workload: 2)")
    d.add_argument("--workload", help="replay a built-in generated workload instead (robotserve workload list), "
                   "FIFO vs Kairos vs remaining, e.g. metaworld-mixed-edge")
    d.add_argument("--seed", type=seed, default=0)
    d.add_argument("--config", help="with --workload: ROS params file (default config/fleet.yaml)")
    d.add_argument("--out", help="report folder (default: a scratch folder, $TMPDIR/robotserve-demo; "
                   "the run of record: --out reports/live --force)")
    d.add_argument("--ablation", action="store_true", help="with --workload: also run FIFO with the dynamic horizon")
    d.set_defaults(func=cmd_demo)


    from .study.commands import add_parser as add_study  # PushGust task and horizon study (robotserve_ros/study/)

    study = add_study(sub)
    from .cli_doctor import add_parser as add_doctor  # is this venv the one `make` builds (make doctor)

    add_doctor(sub)
    # a benchmark, so it lives in bench/ and is wired here (only the CLI imports bench/)
    study_fleet.add_arguments(study.add_parser("fleet", help="Kairos vs FIFO (and the Table 2 split) on the measured "
                                                              "workloads at peak load and with 100 robots"))
    from .bench import fleet_closed
    fleet_closed.add_arguments(study.add_parser(
        "fleet-closed", help="closed-loop virtual fleet of Meta-World robots on the trained policy: every factor "
                             "apart, paired seeds, the primary test (docs/closed_loop.md)"))

    w = sub.add_parser("workload", help="list, generate or check workload files")
    w.add_argument("action", choices=("list", "gen", "check"))
    w.add_argument("name", nargs="?", help="built-in name (gen) or file (check)")
    w.add_argument("--out")
    w.add_argument("--seed", type=seed, default=0)
    w.set_defaults(func=cmd_workload)
    _add_force(p)
    return p


def _subparsers(p: argparse.ArgumentParser):
    """`p` and every parser under it."""
    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():
                yield from _subparsers(sp)


def _add_force(p: argparse.ArgumentParser) -> None:
    """Every command with --out takes --force: a non-empty --out is written over only then."""
    for sp in _subparsers(p):
        opts = sp._option_string_actions
        if "--out" in opts and "--force" not in opts:
            sp.add_argument("--force", action="store_true", help="write over a non-empty --out")


def _named_out(argv) -> bool:
    """Whether --out was given on the command line (a default scratch path is ours to reuse)."""
    return any(x == "--out" or x.startswith("--out=") for x in argv)


def _given_paths(args) -> set:
    """Every string value on the command line, as given and resolved: the paths the user named."""
    out = set()
    for v in vars(args).values():
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(x, (str, Path)) and x:
                out |= {str(x), str(Path(x).resolve())}
    return out


def main(argv=None) -> int:
    from .core.errors import ConfigError, WorkloadError

    argv = sys.argv[1:] if argv is None else [str(x) for x in argv]
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "out", None) and _named_out(argv):
            check_out(args.out, getattr(args, "force", False))
        return args.func(args)
    except (WorkloadError, ConfigError, UsageError) as e:
        print(f"robotserve: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
        # A file the user named that is not there (--config, --demos, --out's folder) is a wrong
        # value, said in one line; any other missing file is a fault of ours: keep its traceback.
        if e.filename is None or str(e.filename) not in _given_paths(args):
            raise
        print(f"robotserve: {str(e.filename)!r}: {e.strerror.lower()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
