"""`robotserve gpu-server` on the command line: the flags checked before anything heavy starts
(`gpu_server_setup`), then the server (transport/gpu_server.py) run until SIGINT/SIGTERM (`cli`);
`python -m robotserve_ros.transport.gpu_server_cli` runs it without the `robotserve` entry point."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import grpc

from ..config import ConfigError, engine_config, relabel
from ..params import parse_key_values
from . import TOKEN_ENV, add_arguments
from . import gpu_server
from .gpu_server import GpuServer, gpu_guard_limits
from .tensors import Limits

log = logging.getLogger("robotserve.gpu_server")


def gpu_server_setup(a):
    """The command line checked before anything heavy starts: (EngineConfig, token or None).
    ValueError is one line naming the wrong value and what is allowed."""
    host, sep, port = a.address.rpartition(":")
    if not (host and sep and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"--address {a.address!r} is not host:port (port 0..65535; 0: any free one)")
    for flag, path in (("--token-file", a.token_file), ("--tls-cert", a.tls_cert), ("--tls-key", a.tls_key)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path!r} is not a readable file")
    if bool(a.tls_cert) != bool(a.tls_key):
        raise ValueError("--tls-cert and --tls-key go together: TLS needs both the certificate and its key")
    try:
        text = Path(a.token_file).read_text() if a.token_file else os.environ.get(TOKEN_ENV) or None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--token-file {a.token_file!r} cannot be read: {e.strerror or e}") from None
    # one token per line, one line per holder (fair share between them); never fail-open:
    # a file, or a non-empty $ROBOTSERVE_GPU_TOKEN, that holds no token is an error
    token = [t.strip() for t in text.splitlines() if t.strip()] if text is not None else None
    if token is not None and not token:
        where = f"--token-file {a.token_file!r}" if a.token_file else f"${TOKEN_ENV}"
        raise ValueError(f"{where} is empty: it must hold the token (one per line)")
    try:
        params = json.loads(a.engine_params)
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise ValueError(f"--engine-params {a.engine_params!r} is not a JSON object of the engine's keyword "
                         'parameters, e.g. \'{"device": "cuda"}\'')
    params.update(parse_key_values(a.engine_param))
    for flag, v in (("--max-message-mb", a.max_message_mb), ("--workers", a.workers), ("--max-id-bytes", a.max_id_bytes),
                    ("--max-text-bytes", a.max_text_bytes), ("--max-call-requests", a.max_call_requests),
                    ("--max-call-decoded-mb", a.max_call_decoded_mb),
                    ("--receive-timeout", a.receive_timeout), ("--max-calls-per-peer", a.max_calls_per_peer or 1),
                    ("--max-token-requests", a.max_token_requests)):
        if not v > 0:
            raise ValueError(f"{flag} {v} is not > 0")
    lat = a.latency_ms
    if lat is not None and len(lat) != len(a.batch_sizes):
        raise ValueError(f"--latency-ms {lat} does not give one latency for each of the {len(a.batch_sizes)} --batch-sizes")
    try:  # the same EngineConfig the inference server's `engine` section builds
        return engine_config(a.engine, params, dict(zip(a.batch_sizes, lat)) if lat else None), token
    except ConfigError as e:
        raise relabel(e, {"name": "--engine", "engine_params": "--engine-params", "batch_sizes": "--batch-sizes",
                          "latency_ms": "--latency-ms"}) from None


def cli(a) -> int:
    """Serve until SIGINT/SIGTERM. A wrong flag is one line naming it and what is allowed,
    exit 2, before the engine loads or the port is bound."""
    try:
        config, token = gpu_server_setup(a)
        engine = config.build(at="--engine-params")  # a simulated engine gets smolvla_tiny's profile of record
    except (ConfigError, ValueError) as e:
        flag = isinstance(e, ConfigError) and e.name.startswith("--")  # `--engine-params.simulated`: the flag
        flag_name, _, key = e.name.partition(".") if flag else ("", "", "")
        print(f"robotserve gpu-server: {flag_name} {key + ': ' if key else ''}{e.what}" if flag
              else f"robotserve gpu-server: {e}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu-server %(levelname)s %(message)s")
    try:
        srv = GpuServer(engine, a.address, token=token, tls_cert=a.tls_cert, tls_key=a.tls_key,
                        max_message_bytes=int(a.max_message_mb * (1 << 20)), workers=a.workers,
                        limits=Limits(max_id_bytes=a.max_id_bytes, max_text_bytes=a.max_text_bytes,
                                      max_call_requests=a.max_call_requests,
                                      max_call_decoded_bytes=int(a.max_call_decoded_mb * (1 << 20))),
                        guard=gpu_guard_limits(a.workers, receive_timeout_s=a.receive_timeout,
                                               max_calls_per_peer=a.max_calls_per_peer),
                        max_token_requests=a.max_token_requests)
    except (OSError, ValueError, RuntimeError, grpc.RpcError) as e:  # cannot bind, a certificate grpc refuses
        engine.close()
        print(f"robotserve gpu-server: cannot serve on {a.address}: {e}", file=sys.stderr, flush=True)
        return 2
    log.info("serving %s on %s (%s, %s)", a.engine, srv.address, "TLS" if a.tls_cert else "plaintext",
             f"{len(token)} token(s)" if token else "no token")
    if not token:
        log.warning("no token: anyone who can reach %s may use the engine (--token-file)", srv.address)
    if not a.tls_cert:
        log.warning("no TLS: the token and observations cross the network in the clear (--tls-cert, --tls-key)")
    if a.ready_file:
        Path(a.ready_file).write_text(srv.address + "\n")
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    srv.stop(1.0)
    engine.close()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="robotserve gpu-server", description=gpu_server.__doc__)
    add_arguments(p)
    return cli(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
