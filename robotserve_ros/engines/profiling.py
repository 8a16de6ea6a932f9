"""`robotserve profile`: measure an engine's latency against batch size (seed 000 §3.2.2).

Builds any registered engine by name, feeds it batches of synthetic observations shaped for
its inputs (`engine.example_observation(rng)`), and times `infer` at each batch size:
warm-up first, then several repeats with the order of batch sizes rotated every repeat so
slow drift (thermal, a neighbour's load) spreads over all sizes instead of biasing one.
The result JSON holds the engine profile the scheduler and placement read (median ms per
batch size, every sample, the saturation batch from core.EngineProfile, the machine) and,
verbatim, the simulator workload's `engine` block; a short Markdown report sits beside it.

On `device: cuda` every timing is bracketed by a device synchronisation (kernels are
asynchronous: without it the clock reads launch time), the peak device memory of each batch
size is recorded, and the report names the GPU, its driver and the torch/CUDA versions.
`--variants fp32,bf16,compile,graphs` times the same policy as eager fp32 (the profile of
record) and as each variant, side by side: speed-up per batch size and the largest absolute
difference of the actions from eager fp32 on the same requests (same noise per row).

Nothing here imports torch at module level.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.errors import ConfigError
from ..core.profile import EngineProfile
from ..core.types import InferenceRequest
from ..machine import machine_info

SCHEMA = "robotserve.engine_profile/1"


class DeviceProbe:
    """What a timing needs from the engine's device: synchronise it (CUDA runs asynchronously)
    and track peak memory per batch size. On the CPU both are no-ops."""

    def __init__(self, engine) -> None:
        torch = sys.modules.get("torch")
        dev = getattr(engine, "device", None)
        self.cuda = torch is not None and getattr(dev, "type", str(dev)) == "cuda"
        self.torch = torch
        self.peak_bytes: dict[int, int] = {}

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def start(self, b: int) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def stop(self, b: int) -> None:
        if self.cuda:
            self.peak_bytes[b] = max(self.peak_bytes.get(b, 0), int(self.torch.cuda.max_memory_allocated()))


def measure(engine, batch_sizes: Sequence[int], *, warmup: int = 3, repeats: int = 10, seed: int = 0,
            clock=time.perf_counter, probe: Optional[DeviceProbe] = None) -> dict[int, list[float]]:
    """ms per `infer` call at each batch size: `repeats` samples each, after `warmup` calls.
    With a probe, the device is synchronised before and after each timed call."""
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
        if probe:
            probe.start(b)
            probe.sync()
        t0 = clock()
        out = engine.infer(batch)
        if probe:
            probe.sync()
        dt = (clock() - t0) * 1000.0
        if probe:
            probe.stop(b)
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
    gpu = (t or {}).get("gpu")
    if gpu:
        lines.append(f"- GPU: {gpu['name']} ({gpu['memory_gib']} GiB), driver {gpu['driver']}, CUDA {gpu['cuda']}, "
                     f"cuDNN {gpu['cudnn']}; every timing between two device synchronisations.")
    if rep.get("peak_memory_mib"):
        lines.append("- Peak device memory (MiB) per batch: " +
                     ", ".join(f"{b}: {v}" for b, v in rep["peak_memory_mib"].items()) + ".")
    if rep.get("variants"):
        lines += ["", "## Variants (same policy, same requests; max |action - fp32 eager action|)", "",
                  "| variant | " + " | ".join(f"b{b} ms (x vs fp32)" for b in rep["median_ms"]) + " | max abs diff |",
                  "|---|" + "---:|" * (len(rep["median_ms"]) + 1)]
        for name, v in rep["variants"].items():
            if "median_ms" not in v:
                lines.append(f"| {name} | " + " | ".join("-" for _ in rep["median_ms"]) +
                             f" | {v.get('skipped') or v.get('error')} |")
                continue
            cells = [f"{v['median_ms'][b]:.1f} (x{v['speedup_vs_fp32'][b]:.2f})" for b in v["median_ms"]]
            d = v["max_abs_action_diff_vs_fp32"]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {'-' if d is None else f'{d:.3g}'} |")
    return "\n".join(lines) + "\n"


def _torch_info(engine) -> Optional[dict]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dev = getattr(engine, "device", "cpu")
    info = {"version": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "device": str(dev)}
    if getattr(dev, "type", None) == "cuda":
        info["gpu"] = gpu_info(torch, dev)
    return info


def gpu_info(torch, dev=None) -> dict:
    """The GPU a measurement ran on: name, memory, driver, CUDA/cuDNN versions, TF32 settings."""
    idx = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    return {"name": torch.cuda.get_device_name(idx), "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "driver": _nvidia_driver(),
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32}


def _nvidia_driver() -> Optional[str]:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _policy_info(engine) -> Optional[str]:
    policy = getattr(engine, "policy", None)
    if policy is None:
        return None
    n = sum(p.numel() for p in policy.parameters())
    return (f"{engine.policy_type}, {n / 1e6:.2f}M parameters, chunk {engine.chunk_len}, "
            f"cameras {[s for s in engine.image_shapes]}, state dim {engine.state_dim}")


# The variants `--variants` compares, as engine parameters laid over the given ones. fp32 eager
# is the baseline every other is compared with, and the profile of record.
VARIANTS = {"fp32": {}, "bf16": {"dtype": "bf16"}, "compile": {"compile": True},
            "graphs": {"cuda_graphs": True}, "bf16+compile": {"dtype": "bf16", "compile": True},
            "bf16+graphs": {"dtype": "bf16", "cuda_graphs": True}}
COMPARE_ROBOTS = 4


def _measure_engine(engine_name: str, engine_params: dict, batch_sizes, *, warmup, repeats, seed, profile_ms):
    """(samples, extra info incl. peak MiB per batch on CUDA, comparison-batch actions) for one build."""
    from . import make_engine

    try:
        engine = make_engine(engine_name, EngineProfile(profile_ms) if profile_ms else None, **engine_params)
    except ConfigError:
        raise
    except (TypeError, ValueError, OSError) as e:  # a knob it does not take, a missing policy dir or model
        raise ConfigError(f"engine '{engine_name}' with {json.dumps(engine_params)}: {e}") from e
    try:
        probe = DeviceProbe(engine)
        samples = measure(engine, batch_sizes, warmup=warmup, repeats=repeats, seed=seed, probe=probe)
        extra = {k: v for k, v in (("torch", _torch_info(engine)), ("policy", _policy_info(engine))) if v}
        if probe.peak_bytes:
            extra["peak_memory_mib"] = {str(b): round(v / 2**20, 1) for b, v in sorted(probe.peak_bytes.items())}
        actions = _compare_actions(engine, seed)
    finally:
        engine.close()
        _free_device()
    return samples, extra, actions


def _compare_actions(engine, seed: int) -> Optional[np.ndarray]:
    """The actions of one fixed batch of fresh robots (same tasks, rounds and so noise in every
    variant), to measure how far a variant's arithmetic moves them."""
    if not hasattr(engine, "example_observation"):
        return None
    rng = np.random.default_rng(seed + 7919)
    reqs = [InferenceRequest(task_id=f"compare/robot_{i}", round_id=0, observation=engine.example_observation(rng))
            for i in range(COMPARE_ROBOTS)]
    return np.stack([r.actions for r in engine.infer(reqs)])


def _free_device() -> None:
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_profile(engine_name: str, engine_params: dict, batch_sizes: Sequence[int], out: Path, *, warmup: int = 3,
                repeats: int = 10, seed: int = 0, profile_ms: Optional[dict] = None, title: Optional[str] = None,
                variants: Sequence[str] = ()) -> dict:
    samples, extra, base_actions = _measure_engine(engine_name, engine_params, batch_sizes, warmup=warmup,
                                                   repeats=repeats, seed=seed, profile_ms=profile_ms)
    rep = build_report(samples, engine_name=engine_name, engine_params=engine_params, warmup=warmup, extra=extra)
    if [v for v in variants if v != "fp32"]:
        rep["variants"] = run_variants(engine_name, engine_params, batch_sizes, rep, base_actions, variants,
                                       warmup=warmup, repeats=repeats, seed=seed, profile_ms=profile_ms)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rep, title or out.stem))
    return rep


def run_variants(engine_name, engine_params, batch_sizes, base: dict, base_actions, variants, **kw) -> dict:
    """Each variant measured like the baseline, side by side. A variant that cannot run here
    (CUDA graphs without CUDA) or fails is recorded with the reason, not fatal: the others
    still say what they say."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants {unknown}: choose from {', '.join(VARIANTS)}")
    base_ms = base["median_ms"]
    res = {"fp32": {"engine_params": engine_params, "median_ms": base_ms, "speedup_vs_fp32": {b: 1.0 for b in base_ms},
                    "max_abs_action_diff_vs_fp32": 0.0, "peak_memory_mib": base.get("peak_memory_mib")}}
    device = str(engine_params.get("device", "cpu"))
    for name in variants:
        if name == "fp32":
            continue
        params = {**engine_params, **VARIANTS[name]}
        if params.get("cuda_graphs") and not device.startswith("cuda"):
            res[name] = {"engine_params": params, "skipped": "CUDA graphs need device cuda"}
            continue
        t0 = time.perf_counter()
        try:
            samples, extra, actions = _measure_engine(engine_name, params, batch_sizes, **kw)
        except Exception as e:  # noqa: BLE001 - recorded in the report, with its type
            res[name] = {"engine_params": params, "error": f"{type(e).__name__}: {str(e)[:500]}"}
            continue
        med = {str(b): round(statistics.median(v), 3) for b, v in sorted(samples.items())}
        diff = None
        if actions is not None and base_actions is not None:
            diff = float(np.max(np.abs(actions.astype(np.float64) - base_actions.astype(np.float64))))
        res[name] = {"engine_params": params, "median_ms": med,
                     "speedup_vs_fp32": {b: round(base_ms[b] / med[b], 3) for b in med},
                     "max_abs_action_diff_vs_fp32": diff, "peak_memory_mib": extra.get("peak_memory_mib"),
                     "build_and_measure_s": round(time.perf_counter() - t0, 1)}
    return res


def _json_arg(flag: str, text: str, example: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(f"{flag} {text!r} is not JSON; give an object, e.g. {example}") from None


def cli(a) -> int:
    params = _json_arg("--engine-params", a.engine_params, '{"policy_dir": "DIR"}')
    if not isinstance(params, dict):
        raise ConfigError(f"--engine-params {a.engine_params!r} is not a JSON object, e.g. {{\"policy_dir\": \"DIR\"}}")
    profile_ms = _json_arg("--engine-profile-ms", a.engine_profile_ms, '{"1": 20}') if a.engine_profile_ms else None
    try:
        sizes = [int(x) for x in a.batch_sizes.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--batch-sizes {a.batch_sizes!r}: comma-separated whole numbers, e.g. 1,2,4,8") from None
    variants = [v.strip() for v in (a.variants or "").split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ConfigError(f"--variants {','.join(bad)}: choose from {', '.join(VARIANTS)}")
    rep = run_profile(a.engine, params, sizes, Path(a.out), warmup=a.warmup, repeats=a.repeats, seed=a.seed,
                      profile_ms=profile_ms, title=a.title, variants=variants)
    s = rep["summary"]
    print(json.dumps(rep["engine_profile"]))
    print(f"saturation batch {s['saturation_batch']}: throughput x{s['throughput_gain']}, per-robot latency "
          f"x{s['per_robot_latency_cost']}  ({a.out}, {Path(a.out).with_suffix('.md')})")
    return 0


def add_arguments(p) -> None:
    """The `robotserve profile` subcommand's arguments (cli.py calls this)."""
    from ..cli_types import seed

    p.add_argument("--engine", required=True, help="registered engine name, e.g. lerobot or simulated")
    p.add_argument("--engine-params", default="{}", help='JSON object of engine parameters, e.g. {"policy_dir": "..."}')
    p.add_argument("--engine-profile-ms", help='profile handed to the engine at construction, e.g. {"1": 20} '
                   "(the simulated engine sleeps it when realtime)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16", help="comma-separated batch sizes; must include 1")
    p.add_argument("--warmup", type=int, default=3, help="warm-up rounds over all batch sizes")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per batch size")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--out", required=True, help="result JSON; the Markdown report goes beside it (.md)")
    p.add_argument("--title", help="report title (default: the file name)")
    p.add_argument("--variants", help=f"also time these beside eager fp32, e.g. fp32,bf16,compile,graphs "
                   f"(choices: {', '.join(VARIANTS)}; graphs need device cuda)")
    p.set_defaults(func=cli)
