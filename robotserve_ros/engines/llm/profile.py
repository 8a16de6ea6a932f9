"""`robotserve llm-profile`: measure the LLM engine (prefill latency vs prompt tokens, decode
step latency vs batch size and context length, the cost of rebuilding the batch KV when the
running set changes, the KV handover from a prefill engine to a decode engine, the stop check
per token) and write the one LLM profile JSON every LLM scheduler reads: the segment
scheduler (seed 002 §4.4 batch size), the SLO schedulers (seed 004 §3.1-3.2: prefill
profile, decode LUT, handover) and their simulators (format: core/llm_profile.py).

Each point is timed in CPU time of the engine's thread (torch runs one thread), the median
of `repeats` runs after a warm-up: on this 2-core machine shared by several jobs (load
average 8-10 while it was measured) wall time mostly measures the wait for a core, CPU time
the engine's own cost; the wall-clock samples are kept beside them in the JSON; batch sizes are visited in a
rotated order each repeat so drift from a neighbour's load spreads over all sizes.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import statistics

from ...machine import machine_info

PROFILE_NAME = "smollm2_135m_llm"
REFERENCE_CONTEXT = 128  # the engine_profile block's decode step latencies are at this context


def _fit_line(xs: list, ys: list) -> tuple[float, float]:
    """Least squares y = fixed + slope * x, both clipped at 0 (a handover never costs less)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-12, sum((x - mx) ** 2 for x in xs))
    return max(0.0, slope), max(0.0, my - slope * mx)


def measure(engine, *, prompt_tokens=(16, 32, 64, 128, 256), batches=(1, 2, 4, 8, 16),
            contexts=(64, 128, 256, 512), steps: int = 3, repeats: int = 3) -> dict:
    from .stop import StopChecker

    # the decode worker's engine (seed 004's disaggregation): the same weights, its own KV caches
    twin = type(engine)(engine.model, engine.tokenizer, max_context=engine.max_context, name=engine.name + "-decode")

    torch = engine.torch
    vocab = engine.model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def prompt(n):
        return torch.randint(100, min(vocab, 20000), (n,), generator=g).tolist()

    engine.prefill([("warm", prompt(32))])
    engine.decode(["warm"], 2)
    engine.free("warm")
    pre = {n: [] for n in prompt_tokens}
    hand = {n: [] for n in prompt_tokens}
    wall = {"prefill": {n: [] for n in prompt_tokens}, "decode_step": {}}
    for rep in range(repeats):
        for n in prompt_tokens:
            p = prompt(n)
            t0, c0 = time.perf_counter(), time.thread_time()
            engine.prefill([("p", p)])
            pre[n].append((time.thread_time() - c0) * 1000)
            wall["prefill"][n].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            twin.import_kv("p", engine.export_kv("p"))  # export removes it from the prefill engine
            hand[n].append(time.perf_counter() - t0)
            twin.free("p")
    step = {(b, c): [] for b in batches for c in contexts}
    regather = {(b, c): [] for b in batches for c in contexts}
    for c in contexts:
        ids = [f"r{i}" for i in range(max(batches))]
        for i, rid in enumerate(ids):  # contexts differ a little per row, as in serving
            engine.prefill([(rid, prompt(max(4, c - (i % 4))))])
        for rep in range(repeats):
            order = list(batches[rep % len(batches):]) + list(batches[:rep % len(batches)])
            for b in order:
                rows = ids[:b]
                moved = engine.kv_move_cpu_s
                engine.decode(rows, 1)  # a new running set: the batch KV is gathered first
                regather[(b, c)].append((engine.kv_move_cpu_s - moved) * 1000)
                t0, c0 = time.perf_counter(), time.thread_time()
                engine.decode(rows, steps)
                step[(b, c)].append((time.thread_time() - c0) / steps * 1000)
                wall["decode_step"].setdefault(f"{b}x{c}", []).append((time.perf_counter() - t0) / steps * 1000)
                for rid in rows:  # back to the nominal context: drop what this point decoded
                    engine._scatter()
                    r = engine._reqs[rid]
                    r.kv = [(k[:, :, :-(steps + 1)].clone(), v[:, :, :-(steps + 1)].clone()) for k, v in r.kv]
                    r.length -= steps + 1
        for rid in ids:
            engine.free(rid)
    stop = StopChecker(engine.decode_text, engine.eos_ids, max_tokens=10**6)
    toks = engine.encode("s(cat) g(table) mf(50) tl(90) " * 4)
    t0 = time.perf_counter()
    for k, t in enumerate(toks):
        stop.feed(t)
        if k % 10 == 9:  # segments of ten tokens, as a plan's skills
            stop.take()
    stop_us = (time.perf_counter() - t0) / len(toks) * 1e6
    # the least-disturbed sample of each point: on a shared machine other processes only add
    # time, so the minimum is the engine's own cost; every sample is kept beside it
    best = statistics.median
    kv_slope, kv_fixed = _fit_line([float(n) for n in prompt_tokens], [best(hand[n]) for n in prompt_tokens])
    step_ms = [[round(best(step[(b, c)]), 3) for c in contexts] for b in batches]
    ref = min(contexts, key=lambda c: abs(c - REFERENCE_CONTEXT))
    ref_ms, mono = {}, 0.0
    for b in batches:  # the engine_profile block asks for latency that does not fall with batch
        mono = max(mono, best(step[(b, ref)]))
        ref_ms[str(b)] = round(mono, 3)
    return {
        "llm_profile": {
            "prefill_ms": {"tokens": list(prompt_tokens), "ms": [round(best(pre[n]), 3) for n in prompt_tokens]},
            "decode_step_ms": {"batch": list(batches), "context": list(contexts), "ms": step_ms},
            "regather_ms": {"batch": list(batches), "context": list(contexts),
                            "ms": [[round(best(regather[(b, c)]), 3) for c in contexts] for b in batches]},
            "stop_check_us": round(stop_us, 2),
            "kv_bytes_per_token": engine.kv_bytes_per_token(),
            "kv_handover_s_per_token": kv_slope,
            "kv_handover_fixed_s": kv_fixed,
        },
        "engine_profile": {"batch_latency_ms": ref_ms, "reference_context": ref},
        "samples_ms": {"prefill": {str(n): [round(x, 3) for x in v] for n, v in pre.items()},
                       "kv_handover": {str(n): [round(1000 * x, 3) for x in v] for n, v in hand.items()},
                       "decode_step": {f"{b}x{c}": [round(x, 3) for x in v] for (b, c), v in step.items()}},
        "wall_samples_ms": {"prefill": {str(n): [round(x, 3) for x in v] for n, v in wall["prefill"].items()},
                            "decode_step": {k: [round(x, 3) for x in v] for k, v in wall["decode_step"].items()}},
        "timing": "CPU time of the engine thread (time.thread_time), median of the repeats; the KV handover "
                  "in wall time (a copy between engines)",
    }


def add_arguments(p) -> None:
    p.add_argument("--model", type=Path, default=None, help="model folder (default: the converted SmolLM2)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default: the folder's")
    from ...cli_types import positive, scratch

    p.add_argument("--threads", type=positive(int), default=1, help="torch threads of the engine")
    p.add_argument("--repeats", type=positive(int), default=3, help="measured repetitions of each point")

    p.add_argument("--out", type=Path, default=Path(scratch(f"{PROFILE_NAME}.json")),
                   help=f"profile JSON (the one of record, read by every LLM scheduler: "
                        f"robotserve_ros/profiles/{PROFILE_NAME}.json, written over with --force)")
    p.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    p.set_defaults(func=cli)


def cli(args) -> int:
    from .engine import LLMEngine

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    try:  # a --model folder without a model, or the converted one not made yet: one line, what to do
        eng = LLMEngine.load(args.model, dtype=args.dtype, threads=args.threads)
    except FileNotFoundError as e:
        from ...cli_types import UsageError

        raise UsageError(f"--model {str(args.model)!r}: no model folder there (no config.json); without --model: "
                         "the SmolLM2 `robotserve llm-convert` makes" if args.model else str(e)) from None
    load_s = time.perf_counter() - t0
    rec = {"schema": "robotserve.llm_profile/1", "engine_name": "llm", "model": eng.name,
           "dtype": str(eng.dtype).replace("torch.", ""), "threads": args.threads,
           "load_s": round(load_s, 2), "machine": machine_info(), "loadavg_before": load0}
    kw = dict(prompt_tokens=(16, 64), batches=(1, 2), contexts=(64, 128), steps=2) if args.quick else {}
    rec.update(measure(eng, repeats=max(1, args.repeats), **kw))
    rec["loadavg_after"] = os.getloadavg()
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    lp = rec["llm_profile"]
    print(f"prefill ms {dict(zip(lp['prefill_ms']['tokens'], lp['prefill_ms']['ms']))}")
    print(f"decode step ms @ctx {lp['decode_step_ms']['context']}: "
          + "; ".join(f"b{b}: {row}" for b, row in zip(lp['decode_step_ms']['batch'], lp['decode_step_ms']['ms'])))
    print(f"regather ms {lp['regather_ms']['ms']}  stop check {lp['stop_check_us']} us/token  "
          f"KV handover {1e6 * lp['kv_handover_s_per_token']:.2f} us/token  -> {out}")
    return 0
