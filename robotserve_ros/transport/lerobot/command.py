"""`robotserve lerobot-server`: its options and the command. Imports nothing heavy until
run, so building the CLI's parser stays cheap."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from ...params import parse_key_values
from .. import serve_until_interrupted
from ..policy_source import hub_patterns
from .config import CompatConfig


def add_arguments(p) -> None:
    from ...cli_types import host

    d = CompatConfig()
    p.add_argument("--host", type=host, default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--fps", type=float, default=d.fps, help="the clients' control rate (LeRobot's server --fps)")
    p.add_argument("--scheduler", default=d.scheduler)
    p.add_argument("--scheduler-param", action="append", metavar="KEY=VALUE")
    p.add_argument("--engine", default=d.engine, help="lerobot (the checkpoint each client names) or simulated")
    p.add_argument("--engine-param", action="append", metavar="KEY=VALUE", help="e.g. device=cuda, profile_file=F")
    p.add_argument("--latency-ms", help="engine profile as BATCH:MS,...; default: the engine's own")
    p.add_argument("--max-batch", type=int)
    p.add_argument("--policy-dir", action="append", help="load policies only from under this directory (repeatable)")
    p.add_argument("--allow-hub", help="hub ids clients may name, e.g. lerobot/*,myorg/* (safetensors only, "
                   "through the hub cache; HF_HUB_OFFLINE honoured)")
    p.add_argument("--client-timeout", type=float, default=d.client_timeout_s, help="seconds of silence before a client's task is dropped")
    p.add_argument("--stale-obs", type=float, help="serve a round queued longer than this (s) from the client's newest observation")
    p.add_argument("--replan-held", action="store_true", help="predict an observation that arrived while its "
                   "chunk was generating once the chunk is out, as LeRobot's server does (default: the chunk answers it)")
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--receive-timeout", type=float, default=d.receive_timeout_s,
                   help="seconds a call's request may take to arrive (a stalled call is cancelled)")
    p.add_argument("--max-calls-per-peer", type=int, default=d.max_calls_per_peer, help="calls in flight from one connection")
    p.add_argument("--max-sessions", type=int, default=d.max_sessions, help="sessions at once (least recently used evicted)")
    p.add_argument("--max-policies", type=int, default=d.max_policy_groups,
                   help="policies loaded at once (an idle one is unloaded to make room)")
    p.add_argument("--stats-every", type=float, default=0.0, help="print the server's stats as JSON every N seconds")
    p.add_argument("--rtc", action="store_true", help="real-time chunking: each round's leftover rebuilt from the "
                   "session's last chunk (an engine that inpaints, e.g. SmolVLA; docs/rtc_serving.md)")


def _latency_ms(text: str) -> dict:
    try:
        return {int(b): float(ms) for b, _, ms in (x.partition(":") for x in text.split(","))}
    except ValueError:
        raise ValueError(f"--latency-ms must be BATCH:MS,... (e.g. 1:30,4:45), got {text!r}") from None


def config_from_args(a) -> CompatConfig:
    """The command line as a CompatConfig; ValueError names what is wrong."""
    for d in a.policy_dir or ():  # a typo would otherwise serve, then refuse every policy
        if not Path(d).expanduser().is_dir():
            raise ValueError(f"--policy-dir {d!r} is not a directory (policies load only from under existing ones)")
    return CompatConfig(
        host=a.host, port=a.port, fps=a.fps, scheduler=a.scheduler,
        scheduler_params=parse_key_values(a.scheduler_param), engine=a.engine,
        engine_params=parse_key_values(a.engine_param), profile_ms=_latency_ms(a.latency_ms) if a.latency_ms else None,
        max_batch=a.max_batch, policy_dirs=tuple(a.policy_dir or ()), allow_hub=hub_patterns(a.allow_hub),
        client_timeout_s=a.client_timeout,
        stale_obs_s=a.stale_obs, replan_held=a.replan_held, threads=a.threads, receive_timeout_s=a.receive_timeout,
        max_calls_per_peer=a.max_calls_per_peer, max_sessions=a.max_sessions, max_policy_groups=a.max_policies,
        rtc=a.rtc,
    )


def cli(a) -> int:
    """Serve LeRobot robot_clients until Ctrl-C or SIGTERM."""
    try:
        cfg = config_from_args(a)  # checked before the slow LeRobot import
    except ValueError as e:
        print(f"robotserve lerobot-server: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from .protocol import LeRobotCompatServer

    try:
        srv = LeRobotCompatServer(cfg)
    except (OSError, RuntimeError) as e:  # RuntimeError: grpc cannot bind
        print(f"robotserve lerobot-server: {e}", file=sys.stderr)
        return 2
    print(f"serving LeRobot async inference on {cfg.host}:{srv.port} (scheduler {cfg.scheduler}, engine {cfg.engine}); "
          f"Ctrl-C stops", flush=True)
    serve_until_interrupted(srv.servicer.stats, a.stats_every)
    srv.stop()
    return 0
