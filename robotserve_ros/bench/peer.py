"""`robotserve bench peer`: LeRobot's own async-inference policy server vs the batched engine.

The peer is LeRobot 0.4.4's `PolicyServer` (lerobot/async_inference/policy_server.py), driven
through its own servicer methods, the code path a robot's gRPC calls run, minus the socket:
`Ready`, `SendPolicyInstructions` (it loads the policy and its processors itself), then per
robot `SendObservations` (pickled `TimedObservation` in TRANSFER_BEGIN/END pieces, its
filters and its size-1 queue) and `GetActions` (its `_predict_action_chunk`: its raw ->
LeRobot conversion, preprocessor, `predict_action_chunk`, per-action postprocessor,
`TimedAction` list, pickle). It serves one robot per forward pass, robot after robot.

Two things are set so it can serve at all, both in its favour or neutral:
- `must_go` on every observation and `inference_latency: 0` (no padding sleep);
- DiffusionPolicy: the stock server calls `predict_action_chunk` without filling the
  observation queues that only `select_action` fills, and fails ("stack expects a non-empty
  TensorList", upstream issues #3445, #3861). Here the policy instance's
  `predict_action_chunk` first fills them as `select_action` would (cameras stacked,
  `populate_queues`), from a queue kept per robot so robots do not share history.

Both sides see the same situation: B robots (B = the batched engine's saturation batch)
each need a chunk at the same moment. LeRobot serves them in turn, with no gap and no
dropped observation (its queue holds one observation: real simultaneous robots would
overwrite each other, which is not counted against it); robot k sees the time until its
own chunk returned. The batched engine (`engine: lerobot`, same directory, same device)
serves them in one forward pass. Robots served per second = chunks per second; at a
policy's control rate f and chunk of n actions one robot needs f/n chunks per second, so
a server sustains robots_per_s * n / f robots.

The report of record (`--out FILE`) holds exactly REPORT_KEYS; FILE.meta.json has the
method, every sample, the machine and its load; FILE.md says it in words.
"""
from __future__ import annotations

import json
import os
import pickle  # nosec - our own objects, to LeRobot's own server in this process
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..core.types import InferenceRequest
from ..machine import machine_info

REPORT_KEYS = ("policy", "device", "lerobot_sequential_robots_per_s", "batched_robots_per_s", "saturation_batch",
               "ratio", "per_robot_latency_ms")
# Control rates of the setups each policy's defaults come from: PushT (diffusion, 10 Hz),
# ALOHA (ACT, 50 Hz), SO-100 (SmolVLA, 30 Hz). --fps overrides.
CONTROL_HZ = {"diffusion": 10.0, "act": 50.0, "smolvla": 30.0}
GAIN_TOL = 0.05


class _Context:
    """The one thing LeRobot's servicer asks of a gRPC context: who is calling."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


class LeRobotPeer:
    """LeRobot's PolicyServer serving robots one at a time through its servicer methods."""

    def __init__(self, policy_dir: str, *, device: str = "cpu", state_dim: int, cameras: list, chunk: int,
                 fps: float, fill_diffusion_queues: bool = True) -> None:
        from ..engines.torch_env import import_lerobot_policies, import_torch

        import_lerobot_policies()
        self.torch = import_torch()
        cwd = os.getcwd()
        os.chdir(tempfile.mkdtemp(prefix="robotserve-lerobot-logs-"))  # its logger writes logs/ into the cwd
        try:
            from lerobot.async_inference import helpers
            from lerobot.async_inference.configs import PolicyServerConfig
            from lerobot.async_inference.policy_server import PolicyServer
            from lerobot.transport import services_pb2
            from lerobot.transport.utils import send_bytes_in_chunks
        finally:
            os.chdir(cwd)
        import logging

        PolicyServer.logger.setLevel(logging.WARNING)  # per-observation INFO lines off: timing, not logging
        self.helpers, self.pb, self._chunks = helpers, services_pb2, send_bytes_in_chunks
        self.joints = [f"joint_{i}.pos" for i in range(state_dim)]
        self.cameras = cameras  # [(name, (C, H, W))]
        feats = {"observation.state": {"dtype": "float32", "shape": (state_dim,), "names": self.joints}}
        for name, (c, h, w) in cameras:
            feats[f"observation.images.{name}"] = {"dtype": "image", "shape": (h, w, c),
                                                   "names": ["height", "width", "channels"]}
        self.server = PolicyServer(PolicyServerConfig(host="127.0.0.1", port=8080, fps=int(round(fps)),
                                                      inference_latency=0.0, obs_queue_timeout=5.0))
        ctx = _Context("bench-peer")
        self.server.Ready(services_pb2.Empty(), ctx)
        ptype = json.loads((Path(policy_dir) / "config.json").read_text())["type"]
        spec = helpers.RemotePolicyConfig(policy_type=ptype, pretrained_name_or_path=str(policy_dir),
                                          lerobot_features=feats, actions_per_chunk=chunk, device=device)
        self.server.SendPolicyInstructions(services_pb2.PolicySetup(data=pickle.dumps(spec)), ctx)
        self.policy, self.chunk = self.server.policy, chunk
        self._step = 0
        self._robot_queues: dict = {}
        self._robot: Optional[str] = None
        if spec.policy_type == "diffusion" and fill_diffusion_queues:  # False: the stock server, which fails
            self._fill_queues_as_select_action_does()

    def _fill_queues_as_select_action_does(self) -> None:
        from lerobot.policies.utils import populate_queues
        from lerobot.utils.constants import ACTION, OBS_IMAGES

        policy, torch = self.policy, self.torch
        orig = policy.predict_action_chunk

        def predict_action_chunk(batch, **kw):
            q = self._robot_queues.get(self._robot)
            if q is None:
                policy.reset()  # a new robot's episode: fresh queues
                q = self._robot_queues[self._robot] = policy._queues
            # What select_action does before it calls predict_action_chunk: drop the action key,
            # stack the cameras into one key, push the observation into the queues.
            b = {k: v for k, v in batch.items() if k != ACTION}
            if policy.config.image_features:
                b[OBS_IMAGES] = torch.stack([b[k] for k in policy.config.image_features], dim=-4)
            policy._queues = populate_queues(q, b)
            return orig(b, **kw)

        policy.predict_action_chunk = predict_action_chunk

    def raw_observation(self, rng: np.random.Generator) -> dict:
        """What a LeRobot robot client sends: joint floats by name, HxWx3 uint8 frames, the task."""
        obs = {j: float(x) for j, x in zip(self.joints, rng.standard_normal(len(self.joints)))}
        for name, (c, h, w) in self.cameras:
            obs[name] = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        obs["task"] = "pick up the cube"
        return obs

    def serve(self, robot: str, raw: dict) -> list:
        """One robot's round trip through the servicer: its TimedActions."""
        self._step += 1
        self._robot = robot
        tobs = self.helpers.TimedObservation(timestamp=time.time(), timestep=self._step, observation=raw, must_go=True)
        ctx = _Context(robot)
        self.server.SendObservations(self._chunks(pickle.dumps(tobs), self.pb.Observation), ctx)
        reply = self.server.GetActions(self.pb.Empty(), ctx)
        if not getattr(reply, "data", b""):
            raise RuntimeError(f"LeRobot's PolicyServer returned no actions for {robot} (see its log above)")
        actions = pickle.loads(reply.data)  # nosec - produced by the server in this process
        if len(actions) != self.chunk:
            raise RuntimeError(f"LeRobot's PolicyServer returned {len(actions)} actions, expected {self.chunk}")
        return actions

    def close(self) -> None:
        self.server.stop()
        self.server.policy = None


def _sync(engine) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and getattr(getattr(engine, "device", None), "type", "") == "cuda":
        torch.cuda.synchronize()


def sweep_batched(engine, *, max_batch: int, warmup: int, repeats: int, seed: int, deadline: float):
    """(ms samples per batch size, why the sweep stopped): batch 1, 2, 4, ... until throughput
    stops growing by GAIN_TOL ("saturated"), max_batch, or the next size would overrun the
    time budget ("time cap": then the saturation batch is only the largest measured)."""
    from ..engines.profiling import DeviceProbe, measure

    samples: dict[int, list[float]] = {}
    b, prev_tput = 1, 0.0
    while True:
        samples.update(measure(engine, [b], warmup=warmup, repeats=repeats, seed=seed, probe=DeviceProbe(engine)))
        med = statistics.median(samples[b])
        tput = b / med
        if b > 1 and tput < prev_tput * (1 + GAIN_TOL):
            return samples, "saturated"
        prev_tput = tput
        if 2 * b > max_batch:
            return samples, "max_batch"
        if time.monotonic() + 2 * med / 1000.0 * (warmup + repeats) > deadline:
            return samples, "time cap"
        b *= 2


def measure_batch_sizes(engine, batch: int, *, warmup: int, seed: int) -> dict:
    """One timed call at batch 1 and at `batch` (after warm-up): the latency table when the
    batch is given rather than swept."""
    from ..engines.profiling import DeviceProbe, measure

    return measure(engine, sorted({1, batch}), warmup=warmup, repeats=1, seed=seed, probe=DeviceProbe(engine))


def _batched_round(engine, batch: list) -> float:
    _sync(engine)
    t0 = time.perf_counter()
    out = engine.infer(batch)
    _sync(engine)
    if len(out) != len(batch):
        raise RuntimeError(f"engine returned {len(out)} chunks for {len(batch)} robots")
    return (time.perf_counter() - t0) * 1000.0


def run_peer(policy_dir: str, out: Path, *, device: str = "cpu", max_batch: int = 16, repeats: int = 3,
             warmup: int = 1, fps: Optional[float] = None, time_cap_s: float = 480.0, seed: int = 0,
             batch: Optional[int] = None) -> dict:
    """`batch` given: no sweep, the rounds use that many robots (where the sweep cannot find
    the saturation batch in time; the report says so). Otherwise the sweep (at most half the time cap) finds the saturation batch B; then rounds of B
    robots alternate between LeRobot's server and the batched engine, so drift in the
    machine's load lands on both alike."""
    from ..engines import make_engine
    from ..engines.lerobot_engine import check_policy_dir
    from ..engines.profiling import build_report

    t_start = time.monotonic()
    deadline = t_start + time_cap_s
    load0 = [round(x, 2) for x in os.getloadavg()]
    check_policy_dir(policy_dir)

    engine = make_engine("lerobot", None, policy_dir=str(policy_dir), device=device)
    peer = None
    try:
        n_params = sum(p.numel() for p in engine.policy.parameters())
        kind, chunk, state_dim = engine.policy_type, engine.chunk_len, engine.state_dim
        cameras = [(k.removeprefix("observation.images."), s) for k, s in zip(engine.image_keys, engine.image_shapes)]
        if batch:
            samples, stopped = measure_batch_sizes(engine, batch, warmup=warmup, seed=seed), "given (--batch)"
        else:
            samples, stopped = sweep_batched(engine, max_batch=max_batch, warmup=warmup, repeats=repeats, seed=seed,
                                             deadline=t_start + time_cap_s / 2)
        prof = build_report(samples, engine_name="lerobot", warmup=warmup,
                            engine_params={"policy_dir": str(policy_dir), "device": device})
        sat = int(batch or prof["engine_profile"]["saturation_batch"])
        fps = float(fps or CONTROL_HZ.get(kind, 30.0))

        peer = LeRobotPeer(str(policy_dir), device=device, state_dim=state_dim, cameras=cameras, chunk=chunk, fps=fps)
        rng = np.random.default_rng(seed)
        robots = [f"robot_{i}" for i in range(sat)]
        raws = {r: peer.raw_observation(rng) for r in robots}
        obs = [engine.example_observation(rng) for _ in robots]
        rounds: list[list[float]] = []  # LeRobot, per round: ms until each robot's chunk was back
        batched: list[float] = []  # the batched engine, per round: ms for all `sat` chunks
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            done = []
            for r in robots:
                peer.serve(r, raws[r])
                done.append((time.perf_counter() - t0) * 1000.0)
            reqs = [InferenceRequest(task_id=f"peer/{r}", round_id=i, observation=o) for r, o in zip(robots, obs)]
            b_ms = _batched_round(engine, reqs)
            if i >= warmup:
                rounds.append(done)
                batched.append(b_ms)
                if time.monotonic() + (done[-1] + b_ms) / 1000.0 > deadline:
                    break  # the time cap: at least one measured round
    finally:
        engine.close()
        if peer is not None:
            peer.close()
    batched_ms = statistics.median(batched)
    seq_total = statistics.median(r[-1] for r in rounds)
    seq_mean_latency = statistics.median(statistics.mean(r) for r in rounds)
    seq_service = statistics.median(d - p for r in rounds for p, d in zip([0.0] + r[:-1], r))

    lerobot_rps = sat / (seq_total / 1000.0)
    batched_rps = sat / (batched_ms / 1000.0)
    meta_policy = _policy_meta(policy_dir)
    policy = (f"{kind}, {n_params / 1e6:.1f}M parameters, chunk {chunk}"
              + (", random weights" if meta_policy.get("random_weights") else "")
              + (f" ({meta_policy['size']} size)" if meta_policy.get("size") else ""))
    rep = {
        "policy": policy,
        "device": _device_name(device),
        "lerobot_sequential_robots_per_s": round(lerobot_rps, 4),
        "batched_robots_per_s": round(batched_rps, 4),
        "saturation_batch": sat,
        "ratio": round(batched_rps / lerobot_rps, 3),
        "per_robot_latency_ms": {"lerobot": round(seq_mean_latency, 2), "batched": round(batched_ms, 2)},
    }
    assert tuple(rep) == REPORT_KEYS
    per_b = {}
    for b, ms in prof["engine_profile"]["batch_latency_ms"].items():  # from the sweep
        n = int(b)
        per_b[b] = {"batched_ms": ms, "lerobot_mean_ms": round(seq_service * (n + 1) / 2, 2),
                    "lerobot_last_robot_ms": round(seq_service * n, 2)}
    meta = {
        "policy_dir": str(policy_dir), "policy_meta": meta_policy, "parameters": n_params, "kind": kind,
        "control_hz": fps, "chunk_actions": chunk, "cameras": cameras, "state_dim": state_dim,
        "robots_sustained": {"lerobot": round(lerobot_rps * chunk / fps, 3),
                             "batched": round(batched_rps * chunk / fps, 3)},
        "lerobot_service_ms_per_robot": round(seq_service, 2),
        "lerobot_round_ms": [[round(x, 2) for x in r] for r in rounds],
        "lerobot_last_robot_ms": round(seq_total, 2),
        "batched_round_ms": [round(x, 2) for x in batched],
        "sweep": {"samples_ms": prof["samples_ms"], "profile_ms": prof["engine_profile"]["batch_latency_ms"],
                  "stopped": stopped},
        "latency_by_batch": per_b,
        "method": {"order": "rounds alternate: LeRobot (robot after robot), then batched", "warmup": warmup, "repeats": repeats, "max_batch": max_batch, "gain_tol": GAIN_TOL,
                   "time_cap_s": time_cap_s, "statistic": "median",
                   "lerobot_path": "PolicyServer.Ready/SendPolicyInstructions/SendObservations/GetActions in process "
                                   "(no socket), must_go, inference_latency 0",
                   "diffusion_queues": "filled per robot before predict_action_chunk, as select_action does"
                                       if kind == "diffusion" else None},
        "machine": machine_info(), "loadavg_start": load0, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "torch": _torch_versions(device), "elapsed_s": round(time.monotonic() - t_start, 1),
        "weights_note": "random weights: the arithmetic, and so the time, depends on shapes, not on values",
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1) + "\n")
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rep, meta))
    return rep


def _policy_meta(policy_dir) -> dict:
    from ..engines.tiny_policies import META_FILE

    f = Path(policy_dir) / META_FILE
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return {}


def _device_name(device: str) -> str:
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    cpu = machine_info()["cpu"] or "unknown CPU"
    return f"cpu ({cpu}, {os.cpu_count()} cores)"


def _torch_versions(device: str) -> dict:
    torch = sys.modules.get("torch")
    info = {"version": getattr(torch, "__version__", None), "threads": torch.get_num_threads() if torch else None}
    if device.startswith("cuda") and torch is not None:
        from ..engines.profiling import gpu_info

        info["gpu"] = gpu_info(torch, torch.device(device))
    return info


def markdown(rep: dict, meta: dict) -> str:
    sat, lat = rep["saturation_batch"], rep["per_robot_latency_ms"]
    lines = [f"# LeRobot's policy server vs the batched engine: {rep['policy']}", "",
             f"Device: {rep['device']}. Load average {meta['loadavg_start']} at start, {meta['loadavg_end']} at end "
             f"(the machine is shared; CPU timings move with it). Torch {meta['torch']['version']}.",
             f"Weights are random ({meta['weights_note']}).", "",
             f"{sat} robot(s) need a chunk at once: "
             + ("a batch given on the command line, not swept" if meta["sweep"]["stopped"].startswith("given")
                else f"the batched engine's saturation batch (sweep stopped: {meta['sweep']['stopped']})") + ". "
             f"LeRobot's PolicyServer serves them robot after robot through its own "
             f"servicer methods; the batched engine in one forward pass. Rounds alternate between the two; median "
             f"of {len(meta['lerobot_round_ms'])} rounds after {meta['method']['warmup']} warm-up.", "",
             "| | LeRobot, one robot per pass | batched |", "|---|---:|---:|",
             f"| robots served per second | {rep['lerobot_sequential_robots_per_s']:.3f} | "
             f"{rep['batched_robots_per_s']:.3f} |",
             f"| robots sustained at {meta['control_hz']:g} Hz, {meta['chunk_actions']} actions per chunk | "
             f"{meta['robots_sustained']['lerobot']:.2f} | {meta['robots_sustained']['batched']:.2f} |",
             f"| latency each robot sees, mean (ms) | {lat['lerobot']:.0f} | {lat['batched']:.0f} |",
             f"| latency of the last robot (ms) | {meta['lerobot_last_robot_ms']:.0f} | {lat['batched']:.0f} |", "",
             f"Ratio (batched / LeRobot robots per second): **x{rep['ratio']:.2f}**.", "",
             "Latency each robot sees when b robots need a chunk at once (batched: the sweep's profile; LeRobot: "
             f"its median per-robot service time, {meta['lerobot_service_ms_per_robot']:.0f} ms, times the robot's "
             "place in line):", "",
             "| b | batched ms | LeRobot mean ms | LeRobot last robot ms |", "|---:|---:|---:|---:|"]
    for b, v in meta["latency_by_batch"].items():
        lines.append(f"| {b} | {v['batched_ms']:.0f} | {v['lerobot_mean_ms']:.0f} | {v['lerobot_last_robot_ms']:.0f} |")
    if meta["kind"] == "diffusion":
        lines += ["", "DiffusionPolicy: LeRobot's stock server fails with it (it calls `predict_action_chunk` "
                  "without the observation queues only `select_action` fills; upstream #3445, #3861). Here the "
                  "queues are filled first, per robot, as `select_action` would, and nothing else is changed."]
    return "\n".join(lines) + "\n"


def cli(a) -> int:
    from ..engines.lerobot_engine import PolicyDirError

    from ..engines.torch_env import import_torch

    import_torch().set_num_threads(a.torch_threads)  # recorded in the meta's torch.threads
    try:
        rep = run_peer(a.policy_dir, Path(a.out), device=a.device, max_batch=a.max_batch, repeats=a.repeats,
                       warmup=a.warmup, fps=a.fps, time_cap_s=a.time_cap, seed=a.seed, batch=a.batch)
    except PolicyDirError as e:
        print(f"robotserve bench peer: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep))
    print(f"report: {a.out} ({Path(a.out).with_suffix('.md')}, {Path(a.out).with_suffix('.meta.json')})")
    return 0


def add_arguments(p) -> None:
    from ..cli_types import device, positive, seed

    p.add_argument("--policy-dir", required=True, help="LeRobot checkpoint directory (make-policy writes one)")
    p.add_argument("--out", required=True, help="report JSON; .meta.json and .md go beside it")
    p.add_argument("--device", type=device, default="cpu")
    p.add_argument("--max-batch", type=int, default=16, help="largest batch the saturation sweep tries")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--fps", type=float, help="control rate in Hz (default: by policy type, "
                   + ", ".join(f"{k} {v:g}" for k, v in CONTROL_HZ.items()) + ")")
    p.add_argument("--time-cap", type=float, default=480.0, help="seconds; the sweep and the rounds stop early to fit")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--torch-threads", type=positive(int), default=1, help="torch intra-op threads of both sides "
                   "(fixed: an unset count races whatever else runs on the machine)")
    p.add_argument("--batch", type=int, help="compare at this many robots instead of the swept saturation batch "
                   "(the report then says the batch was given)")
    p.set_defaults(func=cli)
