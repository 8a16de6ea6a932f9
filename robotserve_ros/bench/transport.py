"""`robotserve bench transport`: the latency the inference server adds to one round over a
bare rclpy service round trip with the same payload, measured side by side in one run.

Two services of the same type (srv/Infer) run as their own processes on a private ROS
domain, and this process calls both, alternately (raw, served, served, raw, ...), so that
the two series share the machine's noise:

  raw     a bare rclpy service (SingleThreadedExecutor) that answers at once with a valid
          reply of the served reply's size: status ok and a horizon x action_dim chunk;
  served  the real inference_server node with a zero-cost engine (the simulated engine,
          0.001 ms at batch 1, realtime, no denoising updates), so only the serving path
          is measured: executor thread -> validation -> core.submit -> engine worker
          thread (dispatch, engine, horizon policy, trim) -> executor thread -> reply.

Every call is a new round of one task per service (round ids increase, execution info
after round 0, a static horizon so the reply is a fixed-size chunk). added = served - raw,
per pair; the JSON reports the medians, the paired differences' median and p99, the
machine and the payload.

With --profile the served server is started with its `stage_trace_file` parameter: it
marks each round at every stage of its serving loop (CLOCK_MONOTONIC ns, comparable with
this process's send/receive times on one machine) and writes the marks when it stops. A
third service (the bare one on a MultiThreadedExecutor of the server's thread count) is
measured too, and the JSON gets the median of every stage of the served path.

Helper process of this module (started by the benchmark itself):
    python -m robotserve_ros.bench.transport raw-server [--service S] [--horizon H]
        [--action-dim D] [--threads N]
"""
from __future__ import annotations

import argparse
import array
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from ..core.runner import STAGES
from ..live.processes import DomainContext, ModuleSpec, foreign_nodes, pct, pick_free_domain, read_stage_trace
from ..machine import busy_fraction, cpu_times, machine_info

RAW_SERVICE = "/robotserve_bench/raw_infer"
RAW_MT_SERVICE = "/robotserve_bench/raw_infer_mt"
SERVED_SERVICE = "/robotserve_bench/served_infer"
HORIZON, ACTION_DIM, JOINTS = 50, 6, 6
SERVER_THREADS = 128  # inference_server's default `threads`


# --------------------------------------------------------------------------------------
# The bare service
# --------------------------------------------------------------------------------------
def raw_server_main(argv) -> int:
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.node import Node

    from ..nodes.common import run_nodes
    from ..srv import Infer

    ap = argparse.ArgumentParser(prog="bench.transport raw-server")
    ap.add_argument("--service", default=RAW_SERVICE)
    ap.add_argument("--horizon", type=int, default=HORIZON)
    ap.add_argument("--action-dim", type=int, default=ACTION_DIM)
    ap.add_argument("--threads", type=int, default=0, help="0: SingleThreadedExecutor, else a MultiThreadedExecutor")
    ns, rest = ap.parse_known_args(argv[1:])

    class RawInferServer(Node):
        """Answers srv/Infer at once with a valid, served-sized reply; nothing else."""

        def __init__(self) -> None:
            super().__init__("bench_raw_server" + ("_mt" if ns.threads else ""))
            self.actions = array.array("f", bytes(4 * ns.horizon * ns.action_dim))
            self.reason = f"static H={ns.horizon}"
            group = ReentrantCallbackGroup() if ns.threads else None
            self.create_service(Infer, ns.service, self._on_infer, callback_group=group)

        def _on_infer(self, request, response):
            t = time.monotonic_ns()  # the callback's start, for the stage breakdown
            response.status.code, response.status.reason = 0, "ok"
            c = response.chunk
            c.header.stamp.sec, c.header.stamp.nanosec = divmod(t, 1_000_000_000)
            c.task_id, c.round_id = request.task_id, request.round_id
            c.first_timestep = request.observation.timestep
            c.horizon, c.action_dim, c.chunk_len = ns.horizon, ns.action_dim, ns.horizon
            c.actions = self.actions
            c.horizon_reason = self.reason
            return response

    return run_nodes(lambda: [RawInferServer()], [argv[0]] + rest, threads=ns.threads or None)


# --------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------
def _server_params(out: Path, image: int, stage_trace_file: str = "") -> str:
    """Default server parameters, but a zero-cost engine and the bench's observation spec."""
    cfg = {"inference_server": {"ros__parameters": {
        "stage_trace_file": stage_trace_file,
        "service": SERVED_SERVICE,
        "engine": {"name": "simulated", "batch_sizes": [1], "latency_ms": [0.001],
                   "simulated": {"chunk_size": HORIZON, "action_dim": ACTION_DIM, "steps": 10,
                                 "updates": False, "realtime": True}},
        "horizon": {"static": {"h": HORIZON}},
        "obs_width": image, "obs_height": image, "obs_joints": JOINTS, "obs_encodings": ["rgb8"],
        "progress_topic": "/robotserve_bench/progress",
    }}}
    out.write_text(yaml.safe_dump(cfg))
    return str(out)


def _request(image: int, task: str):
    from sensor_msgs.msg import Image

    from ..srv import Infer

    r = Infer.Request()
    r.task_id = task
    im = Image()
    im.height = im.width = image
    im.encoding, im.step = "rgb8", 3 * image
    im.header.frame_id = "camera"
    im.data = np.random.default_rng(0).integers(0, 256, (image, image, 3), dtype=np.uint8).tobytes()
    r.observation.images = [im]
    r.observation.joint_state.name = [f"joint_{i}" for i in range(JOINTS)]
    r.observation.joint_state.position = [0.1 * i for i in range(JOINTS)]
    r.observation.instruction = "pick up the cube and place it in the box"
    r.horizon.name, r.horizon.has_param, r.horizon.param = "static", True, float(HORIZON)
    r.exec_info.control_hz = 30.0
    return r


class _Endpoint:
    def __init__(self, name: str, node, service: str, image: int) -> None:
        from ..srv import Infer

        self.name = name
        self.cli = node.create_client(Infer, service)
        self.req = _request(image, f"bench_{name}")
        self.round = 0
        self.samples: list = []  # (round, t_send_ns, t_recv_ns, server stamp ns or 0)
        self.errors: dict = {}
        self.warmup_errors: dict = {}
        self.bad_replies = 0

    def call(self, ex, clock_now_ns, timeout: float) -> Optional[float]:
        r = self.req
        r.round_id = self.round
        r.observation.timestep = self.round * HORIZON
        t = clock_now_ns()
        r.observation.header.stamp.sec, r.observation.header.stamp.nanosec = divmod(t, 1_000_000_000)
        r.observation.images[0].header.stamp = r.observation.header.stamp
        r.observation.joint_state.header.stamp = r.observation.header.stamp
        r.has_exec_info = self.round > 0
        r.exec_info.exec_start.sec, r.exec_info.exec_start.nanosec = divmod(t, 1_000_000_000)
        r.exec_info.actions_left = 10
        t0 = time.monotonic_ns()
        fut = self.cli.call_async(r)
        ex.spin_until_future_complete(fut, timeout_sec=timeout)
        t1 = time.monotonic_ns()
        self.round += 1
        res = fut.result() if fut.done() else None
        if res is None:
            self.errors["no_response"] = self.errors.get("no_response", 0) + 1
            self.cli.remove_pending_request(fut)
            return None
        if res.status.code != 0:
            self.errors[res.status.reason] = self.errors.get(res.status.reason, 0) + 1
            return None
        c = res.chunk
        if (c.task_id, c.round_id, c.horizon, c.action_dim, len(c.actions)) != (r.task_id, r.round_id, HORIZON, ACTION_DIM, HORIZON * ACTION_DIM):
            self.bad_replies += 1
        stamp = c.header.stamp.sec * 1_000_000_000 + c.header.stamp.nanosec
        self.samples.append((r.round_id, t0, t1, stamp))
        return (t1 - t0) / 1e6


def _stats(xs) -> dict:
    return {"median_ms": pct(xs, 50), "p90_ms": pct(xs, 90), "p99_ms": pct(xs, 99), "min_ms": float(np.min(xs)) if len(xs) else float("nan"),
            "max_ms": float(np.max(xs)) if len(xs) else float("nan"), "mean_ms": float(np.mean(xs)) if len(xs) else float("nan")}


# The served path's stages in order: the client's send, the node's own marks around the
# serving loop's stages (core/runner.py), the client's receive.
SERVED_STAGES = ("send", "received", *STAGES, "answered", "recv")


def _span(xs) -> dict:
    return {"median_ms": round(pct(xs, 50), 4), "p99_ms": round(pct(xs, 99), 4), "n": len(xs)}


def _stage_breakdown(samples, marks: dict, task: str, first_round: int) -> dict:
    """Median ms of each stage of the served path, from the client's send/receive times and
    the server's stage trace (all CLOCK_MONOTONIC), plus the server's whole share."""
    pairs = list(zip(SERVED_STAGES, SERVED_STAGES[1:])) + [("received", "answered")]
    spans: dict = {f"{a}->{b}": [] for a, b in pairs}
    for rnd, t0, t1, _ in samples:
        m = marks.get(f"{task}#{rnd}") if rnd >= first_round else None
        if not m:
            continue
        m = dict(m, send=t0, recv=t1)
        for a, b in pairs:
            if a in m and b in m:
                spans[f"{a}->{b}"].append((m[b] - m[a]) / 1e6)
    return {k: _span(v) for k, v in spans.items() if v}


def _raw_breakdown(samples, first_round: int) -> dict:
    """The bare service's callback start (its reply's stamp) splits its round trip in two."""
    req, rep = [], []
    for rnd, t0, t1, stamp in samples:
        if rnd >= first_round and t0 <= stamp <= t1:
            req.append((stamp - t0) / 1e6)
            rep.append((t1 - stamp) / 1e6)
    return {"send->received": _span(req), "received->recv": _span(rep)}


def run_transport(out: Path, rounds: int = 200, image: int = 224, warmup: int = 30, profile: bool = False,
                  domain_id: Optional[int] = None, log_dir: Optional[Path] = None, timeout: float = 10.0,
                  verbose: bool = True) -> dict:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.serialization import serialize_message

    from ..live.processes import ProcessGroup, ros_env
    from ..launch_description import NodeSpec

    if rounds < 1 or warmup < 0 or image < 8:
        raise ValueError("rounds >= 1, warmup >= 0 and image >= 8 are needed")
    out = Path(out)
    machine = machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_bench_transport_"))
    log_dir = Path(log_dir) if log_dir else tmp / "logs"
    domain = domain_id if domain_id is not None else pick_free_domain()
    env = ros_env(domain, str(tmp / "ros_log"))
    trace_file = tmp / "stage_trace.json"
    params = _server_params(tmp / "server.yaml", image, str(trace_file) if profile else "")
    this = "robotserve_ros.bench.transport"
    specs = [ModuleSpec("raw_server", this, ["raw-server", "--service", RAW_SERVICE]),
             NodeSpec("inference_server", "inference_server", (), params)]
    if profile:
        specs.append(ModuleSpec("raw_server_mt", this, ["raw-server", "--service", RAW_MT_SERVICE, "--threads", str(SERVER_THREADS)]))

    domain_ctx = DomainContext(env)
    ctx = domain_ctx.ctx
    group = ProcessGroup(specs, env, log_dir).start()
    codes: dict = {}
    try:
        node = rclpy.create_node("bench_transport_client", context=ctx)
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        eps = [_Endpoint("raw", node, RAW_SERVICE, image), _Endpoint("served", node, SERVED_SERVICE, image)]
        if profile:
            eps.append(_Endpoint("raw_mt", node, RAW_MT_SERVICE, image))
        deadline = time.monotonic() + 30.0
        while not all(e.cli.service_is_ready() for e in eps):
            if time.monotonic() > deadline or group.failed():
                raise RuntimeError(f"services did not come up (failed: {group.failed()}; logs in {log_dir})")
            ex.spin_once(timeout_sec=0.1)
        clock_now = lambda: node.get_clock().now().nanoseconds  # noqa: E731
        if verbose:
            print(f"[transport] domain {domain}: {warmup} warm-up + {rounds} rounds per service, "
                  f"{image}x{image}x3 rgb8 + {JOINTS} joints", flush=True)
        lat = {e.name: [] for e in eps}
        paired: list = []
        cpu0, t_start = cpu_times(), time.monotonic()
        for i in range(warmup + rounds):
            # Alternate the order so neither service always goes first after the other.
            order = eps if i % 2 == 0 else eps[::-1]
            got = {}
            for e in order:
                got[e.name] = e.call(ex, clock_now, timeout)
            if i < warmup:
                if i == warmup - 1:
                    # A warm-up call may lose its reply to DDS discovery (wait_for_service matches the
                    # request path only): kept apart, so `errors` counts measured rounds only.
                    for e in eps:
                        e.warmup_errors, e.errors = e.errors, {}
                continue
            for name, v in got.items():
                if v is not None:
                    lat[name].append(v)
            if got["raw"] is not None and got["served"] is not None:
                paired.append(got["served"] - got["raw"])
        busy = busy_fraction(cpu0, cpu_times())
        wall = time.monotonic() - t_start
        req_bytes = len(serialize_message(eps[0].req))
        from ..srv import Infer

        rep = Infer.Response()
        rep.chunk.actions = array.array("f", bytes(4 * HORIZON * ACTION_DIM))
        rep.chunk.horizon_reason = f"static H={HORIZON}"
        rep.chunk.task_id = eps[0].req.task_id
        rep_bytes = len(serialize_message(rep))
        foreign = foreign_nodes(node, lambda n: n.split("/")[-1] in ("bench_transport_client", "bench_raw_server", "bench_raw_server_mt", "inference_server"))
        node.destroy_node()
    finally:
        codes = group.stop()
        domain_ctx.close()

    raw, served = _stats(lat["raw"]), _stats(lat["served"])
    res = {
        "benchmark": "transport",
        "what": "latency the inference server adds to one round over a bare rclpy service round trip, same payload, interleaved",
        "machine": machine,
        "rounds": rounds,
        "warmup_rounds": warmup,
        "payload": {"image": f"{image}x{image}x3 rgb8", "image_bytes": image * image * 3, "joints": JOINTS,
                    "request_bytes_serialized": req_bytes, "reply_chunk": f"{HORIZON}x{ACTION_DIM} float32",
                    "reply_bytes_serialized_approx": rep_bytes},
        "raw_median_ms": raw["median_ms"],
        "served_median_ms": served["median_ms"],
        "added_median_ms": served["median_ms"] - raw["median_ms"],
        "added_paired_median_ms": pct(paired, 50),
        "added_p99_ms": pct(paired, 99),
        "added_p99_of_p99s_ms": served["p99_ms"] - raw["p99_ms"],
        "target_added_median_ms": 1.0,
        "target_met": bool(served["median_ms"] - raw["median_ms"] <= 1.0),
        "raw": dict(raw, n=len(lat["raw"]), errors=eps[0].errors, warmup_errors=eps[0].warmup_errors,
                    bad_replies=eps[0].bad_replies),
        "served": dict(served, n=len(lat["served"]), errors=eps[1].errors, warmup_errors=eps[1].warmup_errors,
                       bad_replies=eps[1].bad_replies),
        "paired": dict(_stats(paired), n=len(paired)),
        "server": {"engine": "simulated, 0.001 ms at batch 1, realtime, updates off", "scheduler": "kairos (default)",
                   "horizon": f"static H={HORIZON}", "executor_threads": SERVER_THREADS,
                   "raw_server_executor": "SingleThreadedExecutor"},
        "load": {"cpu_busy_fraction_during_run": round(busy, 3), "wall_s": round(wall, 2),
                 "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "process_exit_codes": codes,
        "ros_domain_id": domain,
        "foreign_nodes_on_domain": foreign,
        "definitions": {
            "added_median_ms": "served_median_ms - raw_median_ms (medians over the measured rounds)",
            "added_paired_median_ms": "median over rounds of (served - raw) of the same interleaved pair",
            "added_p99_ms": "99th percentile over rounds of (served - raw) of the same interleaved pair",
            "errors": "failed calls in the measured rounds; warmup_errors: in the warm-up calls (DDS discovery)",
        },
    }
    if profile:
        res["raw_mt"] = dict(_stats(lat["raw_mt"]), n=len(lat["raw_mt"]), errors=eps[2].errors,
                             note=f"the bare service on a MultiThreadedExecutor({SERVER_THREADS}) with a reentrant group")
        marks, missing = read_stage_trace(trace_file, codes.get("inference_server"))
        res["profile"] = {
            "served_stages": _stage_breakdown(eps[1].samples, marks, eps[1].req.task_id, warmup),
            "raw_stages": _raw_breakdown(eps[0].samples, warmup),
            "raw_mt_stages": _raw_breakdown(eps[2].samples, warmup),
            "stage_trace_missing": missing,
            "note": "CLOCK_MONOTONIC marks: send/recv in the client, the rest the served server's stage trace "
                    "(its stage_trace_file parameter); medians of each span over the measured rounds",
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


def summary_lines(res: dict) -> list[str]:
    lines = [
        f"raw    median {res['raw_median_ms']:.3f} ms  p99 {res['raw']['p99_ms']:.3f} ms  (n={res['raw']['n']})",
        f"served median {res['served_median_ms']:.3f} ms  p99 {res['served']['p99_ms']:.3f} ms  (n={res['served']['n']})",
    ]
    if "raw_mt" in res:
        lines.append(f"raw_mt median {res['raw_mt']['median_ms']:.3f} ms  p99 {res['raw_mt']['p99_ms']:.3f} ms")
    lines.append(f"added  median {res['added_median_ms']:.3f} ms (paired {res['added_paired_median_ms']:.3f}), "
                 f"p99 {res['added_p99_ms']:.3f} ms; target <= 1 ms: {'met' if res['target_met'] else 'MISSED'}")
    if "profile" in res:
        for k, v in res["profile"]["served_stages"].items():
            lines.append(f"  served {k:28s} {v['median_ms']:8.3f} ms (p99 {v['p99_ms']:.3f})")
        if res["profile"]["stage_trace_missing"]:
            lines.append(f"  no stage breakdown: {res['profile']['stage_trace_missing']}")
    return lines


def cli(a) -> int:
    """`robotserve bench transport` (registered in cli.py)."""
    res = run_transport(Path(a.out), rounds=a.rounds, image=a.image, warmup=a.warmup, profile=a.profile)
    print("\n".join(summary_lines(res)))
    print(f"wrote {a.out}")
    errors = {**res["raw"]["errors"], **res["served"]["errors"]}
    if errors or res["raw"]["bad_replies"] or res["served"]["bad_replies"]:
        print(f"robotserve bench transport: failed or malformed replies: {errors}")
        return 1
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv if argv is None else argv)
    what = argv[1] if len(argv) > 1 else ""
    if what == "raw-server":
        return raw_server_main([argv[0]] + argv[2:])
    print("usage: python -m robotserve_ros.bench.transport raw-server ... "
          "(the benchmark itself: robotserve bench transport)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    from ..nodes.common import exit_process

    exit_process(main())
