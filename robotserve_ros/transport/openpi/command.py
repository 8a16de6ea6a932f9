"""`robotserve openpi-server`: its options and the command. Imports nothing heavy until run,
so building the CLI's parser stays cheap."""
from __future__ import annotations

import logging
import os
import sys

from ...cli_types import host, positive
from ...params import parse_key_values
from .. import serve_until_interrupted
from .config import EndpointConfig, OpenPiConfig


def add_arguments(p) -> None:
    d, e = OpenPiConfig, EndpointConfig()
    p.add_argument("--policy", required=True, help="a local policy directory, or a hub id allowed by --allow-hub")
    p.add_argument("--host", type=host, default=e.host, help="address to listen on (loopback unless you mean it)")
    p.add_argument("--port", type=int, default=e.port)
    p.add_argument("--api-key-file", default="", help="file of keys clients send as 'Authorization: Api-Key KEY', one per line and holder")
    p.add_argument("--policy-dir", action="append", help="local policies only from under this directory (repeatable)")
    p.add_argument("--allow-hub", help="hub ids that may be served, e.g. lerobot/*,myorg/* (safetensors only, "
                   "through the hub cache; HF_HUB_OFFLINE honoured)")
    p.add_argument("--revision", help="hub revision (branch, tag or commit); default main, pinned at start")
    p.add_argument("--scheduler", default=d.scheduler)
    p.add_argument("--scheduler-param", action="append", metavar="KEY=VALUE")
    p.add_argument("--engine", default=d.engine, help="lerobot (the policy) or simulated (a stand-in, no model)")
    p.add_argument("--engine-param", action="append", metavar="KEY=VALUE", help="e.g. device=cuda, profile_file=F")
    p.add_argument("--max-batch", type=positive(int))
    p.add_argument("--control-hz", type=positive(), default=e.control_hz, help="the robots' control rate")
    p.add_argument("--horizon", type=positive(int, zero_ok=True), default=e.horizon,
                   help="actions per reply (0: the whole chunk)")
    p.add_argument("--key-map", action="append", metavar="OPENPI_KEY=FEATURE",
                   help="e.g. observation/image=observation.images.cam0 (default: openpi's conventions)")
    p.add_argument("--max-connections", type=positive(int), default=e.max_connections, help="open websockets at most")
    p.add_argument("--max-connections-per-peer", type=positive(int), default=e.max_connections_per_peer,
                   help="open websockets at most from one address without an API key")
    p.add_argument("--max-connections-per-key", type=positive(int), default=e.max_connections_per_key,
                   help="open websockets at most per API key holder (a line of --api-key-file)")
    p.add_argument("--max-pending-bytes", type=positive(int), default=e.max_pending_bytes,
                   help="bytes of frames received and not yet answered, all robots together")
    p.add_argument("--max-pending-bytes-per-peer", type=positive(int), default=e.max_pending_bytes_per_peer,
                   help="the same from one address without an API key")
    p.add_argument("--max-pending-bytes-per-key", type=positive(int), default=e.max_pending_bytes_per_key,
                   help="the same per API key holder")
    p.add_argument("--max-rate-hz", type=positive(), default=e.max_rate_hz, help="infer calls per second per robot")
    p.add_argument("--max-message-bytes", type=positive(int), default=e.max_message_bytes,
                   help="largest message a client may send")
    p.add_argument("--stats-every", type=positive(zero_ok=True), default=0.0, help="print stats as JSON every N s")
    p.add_argument("--rtc", action="store_true", help="real-time chunking: each round's leftover rebuilt from the "
                   "robot's last chunk and the time since (an engine that inpaints; docs/rtc_serving.md)")


def config_from_args(a) -> OpenPiConfig:
    """The command line as an OpenPiConfig; ValueError names what is wrong."""
    from ..policy_source import hub_patterns

    for d in a.policy_dir or ():  # a typo would otherwise refuse every policy with the one answer
        if not os.path.isdir(os.path.expanduser(d)):
            raise ValueError(f"--policy-dir {d!r} is not a directory")
    keys = {}
    for item in a.key_map or ():
        k, sep, v = item.partition("=")
        if not sep or not k or not v:
            raise ValueError(f"--key-map {item!r} is not OPENPI_KEY=FEATURE")
        keys[k] = v
    ep = EndpointConfig(host=a.host, port=a.port, api_key_file=a.api_key_file, control_hz=a.control_hz,
                        horizon=a.horizon, key_map=keys, max_connections=a.max_connections,
                        max_connections_per_peer=a.max_connections_per_peer, max_pending_bytes=a.max_pending_bytes,
                        max_pending_bytes_per_peer=a.max_pending_bytes_per_peer,
                        max_connections_per_key=a.max_connections_per_key,
                        max_pending_bytes_per_key=a.max_pending_bytes_per_key,
                        max_rate_hz=a.max_rate_hz, max_message_bytes=a.max_message_bytes, rtc=a.rtc)
    ep.api_keys()  # an empty or unreadable key file stops the server here, before the model loads
    return OpenPiConfig(policy=a.policy, endpoint=ep, policy_dirs=tuple(a.policy_dir or ()),
                        allow_hub=hub_patterns(a.allow_hub), revision=a.revision, scheduler=a.scheduler,
                        scheduler_params=parse_key_values(a.scheduler_param), engine=a.engine,
                        engine_params=parse_key_values(a.engine_param), max_batch=a.max_batch)


def cli(a) -> int:
    """Serve openpi clients until Ctrl-C or SIGTERM."""
    from ..policy_source import PolicySourceError

    try:
        cfg = config_from_args(a)
    except ValueError as e:
        print(f"robotserve openpi-server: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from .server import OpenPiServer

    try:
        srv = OpenPiServer(cfg)
    except PolicySourceError as e:
        print(f"robotserve openpi-server: {e.message}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TypeError, KeyError) as e:  # a policy that does not load, a port taken
        print(f"robotserve openpi-server: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    print(f"serving openpi clients on ws://{cfg.endpoint.host}:{srv.port} ({srv.source.describe()}, scheduler "
          f"{cfg.scheduler}); Ctrl-C stops", flush=True)
    serve_until_interrupted(srv.stats, a.stats_every)
    srv.stop()
    return 0
