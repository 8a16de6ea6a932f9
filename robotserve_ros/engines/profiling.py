"""`robotserve profile`: measure an engine's latency against batch size (seed 000 §3.2.2).

Builds any registered engine by name, feeds it batches of synthetic observations shaped for
its inputs (`engine.example_observation(rng)`), and times `infer` at each batch size:
warm-up first, then several repeats with the order of batch sizes rotated every repeat so
slow drift (thermal, a neighbour's load) spreads over all sizes instead of biasing one.
The result JSON holds the engine profile the scheduler and placement read (median ms per
batch size, every sample, the saturation batch from core.EngineProfile, the machine) and,
verbatim, the simulator workload's `engine` block; a short Markdown report sits beside it.

Nothing here imports torch at module level: `load_profile_file` serves torch-free callers.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.profile import EngineProfile
from ..core.types import InferenceRequest
from ..machine import machine_info

SCHEMA = "robotserve.engine_profile/1"


def load_profile_file(path) -> EngineProfile:
    """The EngineProfile in a `robotserve profile` JSON (or a workload file's engine block),
    or a profile of record by name (robotserve_ros/profiles/NAME.json)."""
    from .. import profiles

    if str(path) in profiles.names():
        return profiles.profile_of_record(str(path))
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"profile file {str(p)!r}: cannot read it as JSON ({e})") from None
    block = obj.get("engine_profile") or obj.get("engine") if isinstance(obj, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("batch_latency_ms"), dict):
        raise ValueError(f"profile file {str(p)!r}: no engine_profile.batch_latency_ms (write it with `robotserve profile`)")
    try:
        return EngineProfile(block["batch_latency_ms"], gain_tol=float(block.get("gain_tol", 0.05)))
    except ValueError as e:
        raise ValueError(f"profile file {str(p)!r}: {e}") from None


def measure(engine, batch_sizes: Sequence[int], *, warmup: int = 3, repeats: int = 10, seed: int = 0,
            clock=time.perf_counter) -> dict[int, list[float]]:
    """ms per `infer` call at each batch size: `repeats` samples each, after `warmup` calls."""
    if not hasattr(engine, "example_observation"):
        raise ValueError(f"engine {getattr(engine, 'name', engine)!r} has no example_observation(rng): cannot "
                         f"make synthetic inputs for it")
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
    rng = np.random.default_rng(seed)
    # One robot per row, each with its own task: a real fleet's batch, not one robot repeated.
    obs = [engine.example_observation(rng) for _ in range(sizes[-1])]
    samples: dict[int, list[float]] = {b: [] for b in sizes}
    rnd = 0

    def run(b: int) -> float:
        nonlocal rnd
        rnd += 1
        batch = [InferenceRequest(task_id=f"profile/robot_{i}", round_id=rnd, observation=obs[i]) for i in range(b)]
        t0 = clock()
        out = engine.infer(batch)
        dt = (clock() - t0) * 1000.0
        if len(out) != b:
            raise RuntimeError(f"engine returned {len(out)} results for a batch of {b}")
        return dt

    for _ in range(warmup):
        for b in sizes:
            run(b)
    for r in range(repeats):
        k = r % len(sizes)
        for b in sizes[k:] + sizes[:k]:  # rotated order: drift lands on every size alike
            samples[b].append(run(b))
    return samples


def build_report(samples: dict[int, list[float]], *, engine_name: str, engine_params: dict, warmup: int,
                 extra: Optional[dict] = None) -> dict:
    medians = {b: statistics.median(v) for b, v in sorted(samples.items())}
    # EngineProfile needs latency that never falls with batch size; noise can make a larger
    # batch's median a hair lower. Such a point is raised to its predecessor and listed.
    profile_ms, raised, prev = {}, [], 0.0
    for b, ms in medians.items():
        if ms < prev:
            raised.append(b)
        prev = max(prev, ms)
        profile_ms[b] = prev
    prof = EngineProfile(profile_ms)
    sat = prof.saturation_batch
    table = {str(b): round(ms, 3) for b, ms in profile_ms.items()}
    return {
        "schema": SCHEMA,
        "engine_name": engine_name,
        "engine_params": engine_params,
        "machine": machine_info(),
        **(extra or {}),
        "method": {"warmup_rounds": warmup, "repeats": len(next(iter(samples.values()))),
                   "order": "all batch sizes each repeat, order rotated by one per repeat", "statistic": "median",
                   "raised_to_previous": raised},
        "samples_ms": {str(b): [round(x, 3) for x in v] for b, v in sorted(samples.items())},
        "median_ms": {str(b): round(ms, 3) for b, ms in medians.items()},
        "engine_profile": {"batch_latency_ms": table, "saturation_batch": sat, "gain_tol": prof.gain_tol},
        # The simulator workload file's `engine` block, ready to paste (sim/workload.py).
        "engine": {"batch_latency_ms": table},
        "summary": {
            "latency_b1_ms": round(profile_ms[min(profile_ms)], 3),
            "saturation_batch": sat,
            "latency_at_saturation_ms": round(profile_ms[sat], 3),
            "throughput_b1_chunks_per_s": round(prof.throughput(1), 3),
            "throughput_at_saturation_chunks_per_s": round(prof.throughput(sat), 3),
            "throughput_gain": round(prof.throughput(sat) / prof.throughput(1), 3),
            "per_robot_latency_cost": round(profile_ms[sat] / profile_ms[1], 3),
        },
    }


def markdown(rep: dict, title: str) -> str:
    s, m = rep["summary"], rep["machine"]
    lines = [f"# Engine profile: {title}", "",
             f"Engine `{rep['engine_name']}` with `{json.dumps(rep['engine_params'])}`."]
    if "policy" in rep:
        lines.append(f"Policy: {rep['policy']}.")
    t = rep.get("torch")
    lines += ["", f"Machine: {m['cpu'] or 'unknown CPU'}, {m['cores']} cores, load average at start "
              f"{m['loadavg_at_start']}" + (f"; torch {t['version']} with {t['threads']} intra-op threads "
                                           f"(default, not pinned), device {t['device']}" if t else "") + ".",
              f"Method: {rep['method']['warmup_rounds']} warm-up rounds, {rep['method']['repeats']} repeats, "
              f"{rep['method']['order']}; median per batch size.", "",
              "| batch | median ms | min ms | max ms | chunks/s | ms per robot |", "|---:|---:|---:|---:|---:|---:|"]
    for b, v in rep["samples_ms"].items():
        med = rep["engine_profile"]["batch_latency_ms"][b]
        lines.append(f"| {b} | {med:.1f} | {min(v):.1f} | {max(v):.1f} | {int(b) / med * 1000:.1f} | {med / int(b):.1f} |")
    lines += ["", f"- Saturation batch (core EngineProfile, gain tolerance {rep['engine_profile']['gain_tol']:.0%}): "
              f"**{s['saturation_batch']}**.",
              f"- Throughput at the saturation batch vs batch 1: {s['throughput_at_saturation_chunks_per_s']:.1f} vs "
              f"{s['throughput_b1_chunks_per_s']:.1f} chunks/s (**x{s['throughput_gain']:.2f}**).",
              f"- Per-robot latency cost of batching to saturation: {s['latency_at_saturation_ms']:.1f} ms vs "
              f"{s['latency_b1_ms']:.1f} ms (**x{s['per_robot_latency_cost']:.2f}**)."]
    if rep["method"]["raised_to_previous"]:
        lines.append(f"- Medians raised to the previous batch's (noise made them lower): "
                     f"{rep['method']['raised_to_previous']}.")
    return "\n".join(lines) + "\n"


def _torch_info(engine) -> Optional[dict]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dev = getattr(engine, "device", "cpu")
    return {"version": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "device": str(dev)}


def _policy_info(engine) -> Optional[str]:
    policy = getattr(engine, "policy", None)
    if policy is None:
        return None
    n = sum(p.numel() for p in policy.parameters())
    return (f"{engine.policy_type}, {n / 1e6:.2f}M parameters, chunk {engine.chunk_len}, "
            f"cameras {[s for s in engine.image_shapes]}, state dim {engine.state_dim}")


def run_profile(engine_name: str, engine_params: dict, batch_sizes: Sequence[int], out: Path, *, warmup: int = 3,
                repeats: int = 10, seed: int = 0, profile_ms: Optional[dict] = None, title: Optional[str] = None) -> dict:
    from . import make_engine

    engine = make_engine(engine_name, EngineProfile(profile_ms) if profile_ms else None, **engine_params)
    try:
        samples = measure(engine, batch_sizes, warmup=warmup, repeats=repeats, seed=seed)
        extra = {k: v for k, v in (("torch", _torch_info(engine)), ("policy", _policy_info(engine))) if v}
    finally:
        engine.close()
    rep = build_report(samples, engine_name=engine_name, engine_params=engine_params, warmup=warmup, extra=extra)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rep, title or out.stem))
    return rep


def cli(a) -> int:
    try:
        params = json.loads(a.engine_params)
        profile_ms = json.loads(a.engine_profile_ms) if a.engine_profile_ms else None
        sizes = [int(x) for x in a.batch_sizes.split(",") if x.strip()]
    except (json.JSONDecodeError, ValueError) as e:
        raise SystemExit(f"robotserve profile: bad argument: {e}")
    if not isinstance(params, dict):
        raise SystemExit("robotserve profile: --engine-params must be a JSON object")
    rep = run_profile(a.engine, params, sizes, Path(a.out), warmup=a.warmup, repeats=a.repeats, seed=a.seed,
                      profile_ms=profile_ms, title=a.title)
    s = rep["summary"]
    print(json.dumps(rep["engine_profile"]))
    print(f"saturation batch {s['saturation_batch']}: throughput x{s['throughput_gain']}, per-robot latency "
          f"x{s['per_robot_latency_cost']}  ({a.out}, {Path(a.out).with_suffix('.md')})")
    return 0


def add_arguments(p) -> None:
    """The `robotserve profile` subcommand's arguments (cli.py calls this)."""
    p.add_argument("--engine", required=True, help="registered engine name, e.g. lerobot or simulated")
    p.add_argument("--engine-params", default="{}", help='JSON object of engine parameters, e.g. {"policy_dir": "..."}')
    p.add_argument("--engine-profile-ms", help='profile handed to the engine at construction, e.g. {"1": 20} '
                   "(the simulated engine sleeps it when realtime)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16", help="comma-separated batch sizes; must include 1")
    p.add_argument("--warmup", type=int, default=3, help="warm-up rounds over all batch sizes")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="result JSON; the Markdown report goes beside it (.md)")
    p.add_argument("--title", help="report title (default: the file name)")
    p.set_defaults(func=cli)
