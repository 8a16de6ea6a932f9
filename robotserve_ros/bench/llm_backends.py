"""`robotserve bench llm-backends --out DIR`: the LLM services' two backends side by side
(issue 25): the own engine (engines/llm) and vLLM (engines/llm/vllm_backend.py), live, in
one run, at equal engine threads (`--threads`, 1 by default: the own planner engine's one
torch thread vs vLLM's engine bound to one core; the own generate service is two workers
of one thread each, its design, stated in the JSON).

1. decode tok/s at batch 8 (8 chat prompts, 32 greedy tokens each, bf16);
2. the TimelyLLM trace replay (bench/timely.py's live loop) at an arrival scale (trace
   times x `--arrival-scale`), per scheduler: time utility (Eq. 1), response, waiting; on
   vLLM the resumed segments' prefill that the prefix cache saved;
3. the SLO workload (bench/slo.py's live mix and SLOs) per scheduler: attainment, TTFT/TPOT;
4. item 5, where the order pays: the virtual-clock replay of the whole trace (timely/sim.py,
   the measured profile scaled to each engine speed) over engine speed x arrival scale.

DIR/llm_backends.json: {"threads", "backends": {"own": {...}, "vllm": {...}}, "regime",
"targets", "meta"}; each backend has decode_tokens_per_s, ttft_p50_ms, tpot_p50_ms (+ P95),
"schedulers" (timely, fcfs, ...: utility_urgent_mean, ...) and "slo" (kairos_slo = the
generate service's urgency_slack, fcfs_cb: e2e_attainment, ...), the load average beside
each row. The issue's key names are kept: kairos_slo is the scheduler now called urgency_slack.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from ..cli_types import positive
from ..core.errors import ConfigError

TRACE = "/work/shared/data/timelyllm/data_sample_1.json"
SLO_KEYS = {"kairos_slo": "urgency_slack", "fcfs_cb": "fcfs_cb"}   # issue 25's key -> scheduler
REGIME_SPEEDS = (1.0, 2.0, 4.2, 8.0, 16.0)     # x this CPU's measured profile; 4.2 = 90 ms/segment (§7.1)
REGIME_SCALES = (1.0, 2.0, 4.0, 8.0, 16.0)     # x the trace's inter-arrival times
REGIME_SCHEDULERS = ("timely", "seg_edf", "seg_fcfs", "fcfs")


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="directory for llm_backends.json")
    p.add_argument("--trace", default=TRACE, help="TimelyLLM trace JSON (its _config.json beside it)")
    p.add_argument("--threads", type=positive(int), default=1, help="engine threads of both backends")
    p.add_argument("--arrival-scale", type=positive(), default=4.0, help="live replay: trace times x this")
    p.add_argument("--live-window", type=positive(), default=10.0, help="live replay: requests of the first N s (scaled)")
    p.add_argument("--schedulers", nargs="+", default=["timely", "fcfs", "seg_fcfs"], metavar="NAME",
                   help="segment schedulers to compare")
    p.add_argument("--slo-requests", type=positive(int), default=16, help="SLO workload: requests per run")
    p.add_argument("--slo-load", type=positive(), default=1.0, help="SLO workload: rate as a multiple of fcfs_cb's knee")
    p.add_argument("--vllm-python", default="", help="the vLLM venv's python ('' = .venv-vllm/bin/python)")
    p.add_argument("--vllm-model", default="", help="vLLM-ready model folder ('' = .venv-vllm/models/smollm2-135m)")
    p.add_argument("--skip-live", action="store_true", help="only the regime sweep (no engine)")


def _pct(xs, q):
    xs = [x for x in xs if x is not None]
    return round(float(np.percentile(xs, q)) * 1000, 2) if xs else None


def decode_batch8(backend: str, engine, steps: int = 32) -> dict:
    prompts = [engine.chat_prompt(t) for t in ("Name a fruit.", "What is 2+2?", "Say hello.", "List three colours.",
                                               "Describe a cat.", "What is a robot?", "Count to five.", "Name a city.")]
    if backend == "own":
        ids = [f"b{i}" for i in range(8)]
        for rid, p in zip(ids, prompts):
            engine.prefill([(rid, p)])
        t0 = time.monotonic()
        engine.decode(ids, steps - 1)
        dt = time.monotonic() - t0
        for rid in ids:
            engine.free(rid)
        return {"decode_tokens_per_s": round(8 * (steps - 1) / dt, 1), "batch": 8, "tokens": steps}
    first, last, n, done = [], [], [0], threading.Event()
    lock = threading.Lock()

    def on_tokens(toks, box):
        t = time.monotonic()
        with lock:
            if not box:
                first.append(t)
            box.append(t)
            n[0] += len(toks)

    def on_done(m, box):
        with lock:
            last.append(box[-1] if box else time.monotonic())
            if len(last) == 8:
                done.set()

    for i, p in enumerate(prompts):
        box: list = []
        engine.host.generate(f"b8-{i}-{time.monotonic()}", p, steps, min_tokens=steps, ignore_eos=True,
                             on_tokens=lambda t, b=box: on_tokens(t, b), on_done=lambda m, b=box: on_done(m, b))
    done.wait(300)
    dt = max(last) - max(first)
    return {"decode_tokens_per_s": round((n[0] - 8) / dt, 1) if dt > 0 else None, "batch": 8, "tokens": steps,
            "note": "tokens after each request's first, from the last first token to the last token"}


def run_timely(backend, engine, specs, skill_time, profile, args, est, mx, eos, log) -> dict:
    from .timely import run_live

    runs = [(name, name, None) for name in args.schedulers]
    if backend == "vllm":
        from functools import partial

        from ..engines.llm.vllm_backend import VLLMTimely

        runs = [(name, sched, VLLMTimely) for name, sched, _ in runs]
        if "timely" in args.schedulers:  # §4.4's admission, predicted from the own engine's profile
            runs.append(("timely_core_admission", "timely", partial(VLLMTimely, admission="core")))
    out = {}
    for key, name, live_cls in runs:
        _cold(engine)
        la = os.getloadavg()[0]
        ns = argparse_ns(live_window=args.live_window, prefix_cache=True, max_batch=16)
        res = run_live(specs, [name], profile, skill_time, ns, est, mx, eos, engine=engine, live_cls=live_cls)[name]
        res.pop("per_task_type", None)
        res["loadavg_1m_before"] = round(la, 2)
        out[key] = res
        log(f"  {backend} timely-replay {key}: urgent {res['utility_urgent_mean']} normal {res['utility_normal_mean']} "
            f"response {res['response_time_mean_s']} s, waiting {res['waiting_time_total_s']} s, load {la:.1f}")
    return out


def _cold(engine) -> None:
    """Each run starts without the KV of the run before (the same prompts): vLLM's prefix
    cache reset; the own engine keeps only its server-side system prefixes, as in service."""
    host = getattr(engine, "host", None)
    if host is not None and not host.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache")


def argparse_ns(**kw):
    import argparse

    return argparse.Namespace(**kw)


def run_slo(backend, engines, args, log) -> tuple[dict, dict]:
    from ..core.slo import LLMProfile
    from ..core.slo.workers import DisaggregatedWorkers
    from ..slo.workload import poisson_requests
    from .slo import LIVE_MIX, PROFILE_OF_RECORD, knee_rate, run_live_once, slos_for

    profile = LLMProfile.load(PROFILE_OF_RECORD)
    ttft, tpot = slos_for(profile, LIVE_MIX)
    rate = args.slo_load * knee_rate(profile, LIVE_MIX, ttft, tpot, 16, 0)
    reqs = poisson_requests(LIVE_MIX, rate, args.slo_requests, 0)
    pe, de = engines
    vocab = 49152
    out = {}
    for key, sched in [("warmup", "fcfs_cb")] + list(SLO_KEYS.items()):  # the first run pays one-off costs
        cores = []

        def workers(core, sched=sched):
            cores.append(core)
            if backend == "vllm":
                from ..engines.llm.vllm_backend import VLLMWorkers

                return VLLMWorkers(core, pe, sched, stop_at_eos=False)
            return DisaggregatedWorkers(core, pe, de, stop_at_eos=False)

        _cold(pe)
        la = os.getloadavg()[0]
        m, _ = run_live_once(pe, de, profile, sched, reqs[:3] if key == "warmup" else reqs, ttft, tpot, 16, vocab, 0,
                             workers=workers)
        if key == "warmup":
            continue
        rs = list(cores[0].requests.values())
        row = {k: m.get(k) for k in ("e2e_attainment", "ttft_attainment", "tpot_attainment", "decode_tokens_per_s",
                                     "decode_tokens_per_s_system", "finished", "failed", "timed_out", "wall_s")}
        row.update({"scheduler": sched, "ttft_p50_ms": _pct([r.ttft_s for r in rs], 50),
                    "ttft_p95_ms": _pct([r.ttft_s for r in rs], 95), "tpot_p50_ms": _pct([r.tpot_s for r in rs], 50),
                    "tpot_p95_ms": _pct([r.tpot_s for r in rs], 95), "loadavg_1m_before": round(la, 2)})
        out[key] = row
        log(f"  {backend} slo {key} ({sched}): e2e {row['e2e_attainment']:.2f} ttft p50 {row['ttft_p50_ms']} ms "
            f"tpot p50 {row['tpot_p50_ms']} ms, load {la:.1f}")
    meta = {"ttft_slo_s": ttft, "tpot_slo_s": tpot, "rate_req_s": rate, "requests": len(reqs)}
    return out, meta


def regime(specs, skill_time, prof_rec, est, mx) -> dict:
    """Item 5: TimelyLLM's order vs segmented FCFS / EDF (and whole-plan FCFS) on the whole
    trace, virtual clock, the measured profile made `speed` times faster, arrivals spread."""
    from ..timely.metrics import summarize
    from ..timely.sim import simulate
    from .timely import scaled

    cells = []
    for speed in REGIME_SPEEDS:
        profile = scaled(prof_rec["llm_profile"], speed)
        for scale in REGIME_SCALES:
            sp = [dataclasses.replace(s, trigger=s.trigger * scale) for s in specs]
            row = {"speed": speed, "arrival_scale": scale}
            for name in REGIME_SCHEDULERS:
                res, _ = simulate(sp, name, profile, skill_time, seg_tokens_est=est, seg_tokens_max=mx)
                m = summarize(res, None)
                row[name] = {k: m[k] for k in ("utility_urgent_mean", "utility_normal_mean", "utility_mean",
                                               "waiting_time_total_s", "response_time_mean_s")}
            t, best = row["timely"]["utility_mean"], max(row[n]["utility_mean"] for n in ("seg_edf", "seg_fcfs"))
            row["timely_minus_best_segmented_utility"] = round(t - best, 4)
            row["timely_minus_fcfs_urgent"] = round(row["timely"]["utility_urgent_mean"] - row["fcfs"]["utility_urgent_mean"], 4)
            row["verdict"] = ("order pays" if t - best > 0.02 * max(abs(best), 0.1)
                              else "equal" if abs(t - best) <= 0.02 * max(abs(best), 0.1) else "order loses")
            cells.append(row)
    return {"speeds": REGIME_SPEEDS, "arrival_scales": REGIME_SCALES, "schedulers": REGIME_SCHEDULERS,
            "cells": cells, "note": "virtual clock, the measured SmolLM2 profile scaled (speed 4.2 = 90 ms a mean "
            "segment at batch 1, the paper's Llama3-8B on an RTX 4090, §7.1); utility = Eq. 1 unclamped"}


def cli(args) -> int:
    from ..profiles import load_llm_profile
    from .timely import prepare

    bad = [n for n in args.schedulers if n not in ("timely", "fcfs", "fcfs_stream", "seg_fcfs", "seg_edf")]
    if bad:
        raise ConfigError(f"--schedulers: {bad[0]!r} is not one of timely, fcfs, fcfs_stream, seg_fcfs, seg_edf")
    if not Path(args.trace).is_file():
        raise ConfigError(f"--trace: no file {args.trace}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(s):
        print(s, flush=True)

    t_start, load0 = time.monotonic(), os.getloadavg()
    profile, prof_rec = load_llm_profile("smollm2_135m_llm")
    specs, _, skill_time, eos = prepare(args.trace)
    segs = [n for s in specs for n in s.seg_tokens]
    est, mx = statistics.fmean(segs), max(segs)
    log("regime sweep (virtual clock) ...")
    reg = regime(specs, skill_time, prof_rec, est, mx)
    result = {"threads": args.threads, "backends": {}, "regime": reg}
    if not args.skip_live:
        scaled_specs = [dataclasses.replace(s, trigger=s.trigger * args.arrival_scale) for s in specs]
        from ..engines.llm import LLMEngine
        from ..engines.llm.engine import live_engines
        from ..engines.llm.vllm_backend import VLLMEngine

        for backend in ("own", "vllm"):
            t0 = time.monotonic()
            if backend == "own":
                eng = LLMEngine.load(threads=args.threads)
                pe, de = live_engines(None, None)
                slo_engines = (pe, de)
            else:
                eng = VLLMEngine(model=args.vllm_model, python=args.vllm_python, threads=args.threads, max_num_seqs=16)
                slo_engines = (eng, eng)
            load_s = time.monotonic() - t0
            log(f"{backend}: loaded in {load_s:.1f} s")
            try:
                la = os.getloadavg()[0]
                b = {"load_s": round(load_s, 1), **decode_batch8(backend, eng), "loadavg_1m_before_decode": round(la, 2)}
                log(f"  {backend} decode tok/s at batch 8: {b['decode_tokens_per_s']} (load {la:.1f})")
                b["schedulers"] = run_timely(backend, eng, scaled_specs, skill_time, profile, args, est, mx, eos, log)
                b["slo"], slo_meta = run_slo(backend, slo_engines, args, log)
                k = b["slo"]["kairos_slo"]
                b.update({x: k[x] for x in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms")})
                b["engine_threads"] = (f"{args.threads} (planner); generate: 2 disaggregated workers x 1 torch thread"
                                       if backend == "own" else f"{args.threads} (VLLM_CPU_OMP_THREADS_BIND), both services")
            finally:
                if backend == "vllm":
                    eng.close()
            result["backends"][backend] = b
        result["slo_setting"] = slo_meta
        result["targets"] = targets(result)
    result["meta"] = {"trace": args.trace, "arrival_scale": args.arrival_scale, "live_window_s": args.live_window,
                      "slo_keys": SLO_KEYS, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                      "wall_s": round(time.monotonic() - t_start, 1), "dtype": "bfloat16 (both)",
                      "ttft_tpot_from": "the SLO workload's kairos_slo (urgency_slack) run"}
    (out_dir / "llm_backends.json").write_text(json.dumps(result, indent=1) + "\n")
    log(json.dumps(result.get("targets", {}), indent=1))
    log(f"-> {out_dir / 'llm_backends.json'}")
    return 0


def targets(r: dict) -> dict:
    own, vl = r["backends"]["own"], r["backends"]["vllm"]
    ratio = (vl["decode_tokens_per_s"] / own["decode_tokens_per_s"]
             if vl.get("decode_tokens_per_s") and own.get("decode_tokens_per_s") else None)

    def gain(b):
        s = b["schedulers"]
        if "timely" not in s or "fcfs" not in s or s["timely"]["utility_urgent_mean"] is None \
                or s["fcfs"]["utility_urgent_mean"] is None:
            return None
        return s["timely"]["utility_urgent_mean"] - s["fcfs"]["utility_urgent_mean"]

    g_own, g_vllm = gain(own), gain(vl)
    kept = g_vllm / g_own if g_own and g_own > 0 and g_vllm is not None else None
    return {"decode_ratio_vllm_over_own": None if ratio is None else round(ratio, 2),
            "decode_ratio_met": ratio is not None and ratio >= 1.5,
            "urgent_gain_own": None if g_own is None else round(g_own, 4),
            "urgent_gain_vllm": None if g_vllm is None else round(g_vllm, 4),
            "urgent_gain_kept": None if kept is None else round(kept, 3),
            "urgent_gain_kept_met": kept is not None and kept >= 0.8}
