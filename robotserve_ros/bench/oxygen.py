"""`robotserve bench oxygen --out DIR`: actions and language from one SmolVLA (seed 001 §4).

Every frame one robot sends a new observation; it needs an action chunk (its horizon H =
the policy's n_action_steps) and starts one language request of N tokens. Modes, all on
the same policy, measured side by side in one run:

- sequential: isolated execution, the main baseline (§4.1): the action path prefills the
  observation and denoises; the language path prefills observation + prompt again and
  decodes its N tokens to completion inside the frame (batch 1);
- parallel: the same two isolated paths in two worker processes sharing the machine, the
  frame ends when both are done (§4.1 "Parallel");
- kv_sharing: one prefill feeds both; language still decoded to completion in the frame
  (§4.3 "Ours w/o Batching");
- oxygen: one prefill; every active request advances k tokens per frame in one batch
  (cross-frame continuous batching, §3.3).

Metrics (§4.1): action frequency = H * frames / time (Hz), language throughput = tokens /
time, average decode batch, peak memory (peak RSS of the process(es) serving the mode
alone, by the end of the configuration). Timing runs the modes in interleaved blocks, so a
busy machine slows all of them alike. Poisson arrivals (§4.4): per frame a Poisson(lambda)
number of robots send an observation with a language request.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from ..cli_types import scratch
from ..core.errors import ConfigError
from .oxygen_modes import (_frame_rates, _load, _obs, _peak_rss_mb, _sync, frame_actions, frame_language_isolated,
                           run_inline, run_poisson)
from .oxygen_report import MODES, summarize, write_report

ROW_KEYS = ("mode", "decode_tokens", "denoise_steps", "action_hz", "tokens_per_s", "avg_decode_batch",
            "peak_memory_mb")


# --------------------------------------------------------------------------------------
# Processes. Timing: one process holds the engine for the in-process modes and drives the
# two parallel-mode workers; per configuration the modes run in interleaved blocks (the
# order rotating), repeated, and the median block counts, so machine noise hits every mode
# alike. Memory: each in-process mode again in a fresh process of its own (peak RSS is per
# process); the parallel workers' own peaks come from the timing pass.
# --------------------------------------------------------------------------------------
def _worker_main(conn, cfg: dict, role: str) -> None:
    """A parallel-mode worker: the action path or the language path, one frame per message."""
    eng = _load(cfg["policy_dir"], cfg["device"], cfg["k"], cfg["threads"])
    frame_actions(eng, 10**6, _obs(eng, np.random.default_rng(99)))
    eng.forget("robot0")
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        kind, f, n, steps, seed = msg
        if kind == "steps":
            eng.set_denoise_steps(steps)
            conn.send(0)
            continue
        if kind == "peak":
            conn.send(_peak_rss_mb())
            continue
        obs = _obs(eng, np.random.default_rng([seed, f]))
        if role == "actions":
            frame_actions(eng, f, obs)
            _sync(eng)
            conn.send(0)
        else:
            conn.send(frame_language_isolated(eng, obs, n))


class _Parallel:
    """Two worker processes (actions, language); a frame ends when both have answered."""

    def __init__(self, cfg: dict) -> None:
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for role in ("actions", "language"):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(b, cfg, role), daemon=True)
            p.start()
            self.pipes.append(a)
            self.procs.append(p)
        for c in self.pipes:
            if c.recv() != "ready":
                raise RuntimeError("a parallel worker did not start")

    def ask(self, msg) -> list:
        for c in self.pipes:
            c.send(msg)
        return [c.recv() for c in self.pipes]

    def block(self, chunk_len: int, n: int, frames: int, warmup: int, seed: int, f0: int) -> dict:
        times, toks = [], []
        for f in range(warmup + frames):
            t0 = time.perf_counter()
            tokens = sum(self.ask(("frame", f0 + f, n, 0, seed)))
            if f >= warmup:
                times.append(time.perf_counter() - t0)
                toks.append(tokens)
        return _frame_rates(chunk_len, times, toks, 1.0, None)

    def close(self) -> None:
        for c in self.pipes:
            c.send(None)
        for p in self.procs:
            p.join(timeout=30)


def _median_row(blocks: list) -> dict:
    """A mode's figures from all its measured frames: H over the median frame time, tokens
    per frame (mean) over the median frame time. The median keeps a burst of other jobs on
    this shared machine from deciding the ratio; every mode is reduced alike."""
    times = [t for b in blocks for t in b["frame_s"]]
    toks = [t for b in blocks for t in b["frame_tokens"]]
    med = float(np.median(times))
    out = {"action_hz": blocks[0]["chunk_len"] / med, "tokens_per_s": float(np.mean(toks)) / med,
           "frame_ms": 1000 * med, "frame_ms_mean": 1000 * float(np.mean(times)),
           "avg_decode_batch": float(np.mean([b["avg_decode_batch"] for b in blocks]))}
    kv = [b["kv_peak_mb"] for b in blocks if b.get("kv_peak_mb") is not None]
    out["kv_peak_mb"] = max(kv) if kv else None
    out["spread"] = [round(b["action_hz"], 2) for b in blocks]
    return out


def _timing_main(conn, cfg: dict) -> None:
    eng = _load(cfg["policy_dir"], cfg["device"], cfg["k"], cfg["threads"])
    frame_actions(eng, 10**6, _obs(eng, np.random.default_rng(99)))  # first-call costs out of the measure
    eng.forget("robot0")
    modes = cfg["modes"]
    par = _Parallel(cfg) if "parallel" in modes else None
    k, fr, wu, seed = cfg["k"], cfg["frames"], cfg["warmup"], cfg["seed"]
    f0 = 0
    try:
        for steps in cfg["steps"]:
            eng.set_denoise_steps(steps)
            if par:
                par.ask(("steps", 0, 0, steps, 0))
            for n in cfg["tokens"]:
                blocks = {m: [] for m in modes}
                for rep in range(cfg["reps"]):
                    for m in modes[rep % len(modes):] + modes[: rep % len(modes)]:
                        if m == "parallel":
                            blocks[m].append(par.block(eng.chunk_len, n, fr, wu, seed + rep, f0))
                        else:
                            w = wu + (math.ceil(n / k) if m == "oxygen" else 0)
                            blocks[m].append(run_inline(eng, m, n, steps, fr, w, seed + rep))
                        f0 += fr + wu
                for m in modes:
                    r = _median_row(blocks[m])
                    r.update(mode=m, decode_tokens=n, denoise_steps=steps,
                             peak_memory_mb=sum(par.ask(("peak", 0, 0, 0, 0))) if m == "parallel" else None)
                    conn.send(("row", r))
        if "sequential" in modes and "oxygen" in modes:
            nt = cfg["poisson_tokens"]
            for lam in cfg["poisson"]:
                blocks = {"sequential": [], "oxygen": []}
                for rep in range(cfg["reps"]):
                    for m in (("sequential", "oxygen") if rep % 2 == 0 else ("oxygen", "sequential")):
                        blocks[m].append(run_poisson(eng, lam, nt, cfg["steps"][-1], fr * 2, wu + math.ceil(nt / k),
                                                     seed + rep, sequential=m == "sequential"))
                for m, bl in blocks.items():
                    r = dict(bl[0])
                    for key in ("actions_per_s_total", "action_hz_per_request", "tokens_per_s"):
                        r[key] = float(np.median([b[key] for b in bl]))
                    r["avg_decode_batch"] = float(np.mean([b["avg_decode_batch"] for b in bl]))
                    conn.send(("poisson", r))
        conn.send(("meta", {"chunk_len": eng.chunk_len,
                            "parameters": sum(p.numel() for p in eng.policy.parameters()),
                            "context_limit": eng.context_limit, "max_prefix_tokens": eng._max_prefix}))
    finally:
        if par:
            par.close()
    conn.send(("done", None))


def _memory_main(conn, cfg: dict) -> None:
    """One in-process mode alone in a fresh process: its peak RSS after each configuration."""
    eng = _load(cfg["policy_dir"], cfg["device"], cfg["k"], cfg["threads"])
    frame_actions(eng, 10**6, _obs(eng, np.random.default_rng(99)))
    eng.forget("robot0")
    m = cfg["mode"]
    for steps in cfg["steps"]:
        for n in cfg["tokens"]:
            w = cfg["warmup"] + (math.ceil(n / cfg["k"]) if m == "oxygen" else 0)
            r = run_inline(eng, m, n, steps, 3, w, cfg["seed"])
            conn.send(("mem", {"mode": m, "decode_tokens": n, "denoise_steps": steps,
                               "peak_memory_mb": _peak_rss_mb(), "kv_peak_mb": r["kv_peak_mb"]}))
    conn.send(("done", None))


def _run(target, cfg: dict, on_msg) -> None:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=target, args=(b, cfg), daemon=False)
    p.start()
    while True:
        if not a.poll(3600):
            p.kill()
            raise RuntimeError("bench oxygen: no result for an hour")
        kind, val = a.recv()
        if kind == "done":
            break
        on_msg(kind, val)
    p.join(timeout=60)
    if p.exitcode not in (0, None):
        raise RuntimeError(f"bench oxygen: a measuring process exited with {p.exitcode}")


# --------------------------------------------------------------------------------------
# CLI and report
# --------------------------------------------------------------------------------------
def _positive_ints(v: str) -> list:
    try:
        out = [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(x < 1 for x in out):
        raise argparse.ArgumentTypeError(f"must be whole numbers >= 1 separated by commas, got {v!r}")
    return out


def _rates(v: str) -> list:
    try:
        out = [float(x) for x in v.split(",") if x.strip()]
    except ValueError:
        out = None
    if out is None or any(not (x > 0 and math.isfinite(x)) for x in out):
        raise argparse.ArgumentTypeError(f"must be numbers > 0 separated by commas, got {v!r}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli_types import seed

    p.add_argument("--out", required=True, help="directory for oxygen.json")
    p.add_argument("--report-dir", default=scratch("oxygen"), help="Markdown + PNG report folder (the record: reports/oxygen)")
    p.add_argument("--policy", help="a SmolVLA policy directory (default: build one with random weights)")
    p.add_argument("--size", choices=("default", "real"), default="default",
                   help="the SmolVLA built when --policy is not given: tiny, or SmolVLA's real (450M) shape")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--modes", type=lambda v: [m.strip() for m in v.split(",") if m.strip()], default=list(MODES),
                   help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--decode-tokens", type=_positive_ints, default=[1, 5, 10, 20, 50],
                   help="language tokens per request (N)")
    p.add_argument("--denoise-steps", type=_positive_ints, default=[5, 10], help="flow-matching steps (S)")
    p.add_argument("--tokens-per-frame", type=_positive_ints, default=[5], help="k: tokens per request per frame")
    p.add_argument("--frames", type=_positive_ints, default=[6], help="measured frames per block")
    p.add_argument("--reps", type=_positive_ints, default=[3], help="interleaved blocks per mode and configuration")
    p.add_argument("--warmup", type=_positive_ints, default=[3], help="frames before measuring (oxygen adds N/k)")
    p.add_argument("--poisson", type=_rates, default=[0.5, 1.0, 2.0],
                   help="Poisson arrival rates (observations per frame), oxygen vs sequential")
    p.add_argument("--poisson-tokens", type=_positive_ints, default=[20], help="mean language tokens per request (Poisson), one run each")
    p.add_argument("--threads", type=_positive_ints, default=[1], help="torch threads per process")
    p.add_argument("--seed", type=seed, default=0)


def cli(a) -> int:
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes:
        raise ConfigError(f"--modes: {', '.join(bad) or 'none given'} not known; choose from {', '.join(MODES)}")
    if a.device not in ("cpu", "cuda") and not a.device.startswith("cuda:"):
        raise ConfigError(f"--device: {a.device!r}; choose cpu or cuda")
    out, rep = Path(a.out), Path(a.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep.mkdir(parents=True, exist_ok=True)
    tmp = None
    if a.policy:
        from ..engines.lerobot_engine import check_policy_dir

        check_policy_dir(a.policy)
        policy = a.policy
    else:
        from ..engines.tiny_policies import make_sized_policy_dir

        tmp = tempfile.TemporaryDirectory(prefix="oxygen_bench_")
        policy = str(make_sized_policy_dir("smolvla", Path(tmp.name) / "vla", a.size))
    cfg_json = json.loads((Path(policy) / "config.json").read_text())
    k = a.tokens_per_frame[0]
    base = {"policy_dir": policy, "device": a.device, "k": k, "threads": a.threads[0], "steps": a.denoise_steps,
            "tokens": a.decode_tokens, "frames": a.frames[0], "warmup": a.warmup[0], "seed": a.seed,
            "poisson": a.poisson, "poisson_tokens": a.poisson_tokens[0],
            "chunk_len": int(cfg_json.get("n_action_steps", 1)), "reps": a.reps[0]}
    load0 = os.getloadavg()
    t0 = time.time()
    rows, poisson, meta = [], [], {}

    def on_msg(kind, val):
        if kind == "row":
            rows.append(val)
            print(f"  {val['mode']:<11} N={val['decode_tokens']:>3} S={val['denoise_steps']:>2}: "
                  f"{val['action_hz']:7.1f} Hz actions, {val['tokens_per_s']:7.1f} tok/s, "
                  f"batch {val['avg_decode_batch']:.2f}, median frame {val['frame_ms']:.1f} ms (block rates: {val['spread']} Hz)",
                  flush=True)
        elif kind == "poisson":
            poisson.append(val)
            print(f"  poisson {val['mode']} lambda={val['lambda']}: {val['actions_per_s_total']:.1f} actions/s, "
                  f"{val['tokens_per_s']:.1f} tok/s, batch {val['avg_decode_batch']:.2f}", flush=True)
        elif kind == "meta":
            meta.update(val)
        elif kind == "mem":
            for r in rows:
                if (r["mode"], r["decode_tokens"], r["denoise_steps"]) == (val["mode"], val["decode_tokens"],
                                                                          val["denoise_steps"]):
                    r["peak_memory_mb"], r["kv_peak_mb"] = val["peak_memory_mb"], val["kv_peak_mb"]

    print(f"timing: modes {', '.join(a.modes)} interleaved, {base['reps']} blocks each, median", flush=True)
    _run(_timing_main, {**base, "modes": list(a.modes)}, on_msg)
    for mode in a.modes:
        if mode != "parallel":
            print(f"memory: {mode} alone in a fresh process", flush=True)
            _run(_memory_main, {**base, "mode": mode}, on_msg)
    load1 = os.getloadavg()
    device = _device_name(a.device)
    doc = {
        "device": device,
        "rows": [{k2: (round(r[k2], 3) if isinstance(r[k2], float) else r[k2]) for k2 in ROW_KEYS} for r in rows],
        "tokens_per_frame": k,
        "action_horizon": base["chunk_len"],
        "policy": {"kind": "smolvla", "size": a.size if not a.policy else "given", "random_weights": True,
                   **meta, "vlm_layers": cfg_json.get("num_vlm_layers")},
        "frames_per_block": base["frames"], "blocks_per_config": base["reps"],
        "threads_per_process": base["threads"],
        "action_hz_per_block": {f"{r['mode']}/N{r['decode_tokens']}/S{r['denoise_steps']}": r["spread"] for r in rows},
        "frame_ms_median": {f"{r['mode']}/N{r['decode_tokens']}/S{r['denoise_steps']}": round(r["frame_ms"], 2)
                            for r in rows},
        "frame_ms_mean": {f"{r['mode']}/N{r['decode_tokens']}/S{r['denoise_steps']}": round(r["frame_ms_mean"], 2)
                          for r in rows},
        "kv_cache_peak_mb": {f"{r['mode']}/N{r['decode_tokens']}/S{r['denoise_steps']}": round(r["kv_peak_mb"], 3)
                             for r in rows if r.get("kv_peak_mb") is not None},
        "poisson": [{k2: (round(v, 3) if isinstance(v, float) else v) for k2, v in p.items()} for p in poisson],
        "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in load1],
        "wall_s": round(time.time() - t0, 1),
    }
    doc["summary"] = summarize(doc)
    (out / "oxygen.json").write_text(json.dumps(doc, indent=1) + "\n")
    write_report(doc, rep)
    for line in doc["summary"]["lines"]:
        print(line)
    print(f"wrote {out / 'oxygen.json'} and {rep}/oxygen.md, {rep}/oxygen.png")
    if tmp is not None:
        tmp.cleanup()
    return 0


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        try:
            import torch

            return f"cuda: {torch.cuda.get_device_name(0)}"
        except Exception:  # noqa: BLE001 - only a label
            return device
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"cpu: {cpu}, {os.cpu_count()} cores (no GPU)"
