"""`robotserve study rtc-profile`: engine time of RTC's guided denoising vs unguided, per batch
size, for a flow checkpoint; written into its engine profile file as an `rtc` block (issue 28
item 2 target: the paper's guidance <= 2x unguided).

Every row of a guided batch carries a leftover (H - d actions of an earlier chunk) and d; the
three forms (unguided, paper, lerobot) are timed side by side, interleaved call by call with a
rotated order, on one engine, so load drift lands on each alike."""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

FORMS = ("unguided", "paper", "lerobot")
BATCHES = (1, 2, 4, 8, 16, 32)


def measure_rtc(policy_dir, batch_sizes=BATCHES, delay: int = 4, repeats: int = 15, warmup: int = 2,
                threads: int = 1, clock=time.perf_counter) -> dict:
    from ..core.rtc import RtcGuide
    from ..core.types import InferenceRequest
    from ..engines import make_engine
    from ..engines.torch_env import import_torch

    import_torch().set_num_threads(threads)
    eng = make_engine("flow", None, policy_dir=str(policy_dir), device="cpu", seed=0)
    rng = np.random.default_rng(0)
    n = max(batch_sizes)
    obs = [eng.example_observation(rng) for _ in range(n)]
    prev = eng.infer([InferenceRequest(f"rtc-profile/{i}", 0, observation=obs[i]) for i in range(n)])
    d = min(int(delay), eng.chunk_len // 2)
    guides = [RtcGuide(p.actions[d:], d) for p in prev]  # s = d: the leftover is H - d actions
    samples = {f: {b: [] for b in batch_sizes} for f in FORMS}
    rnd = 0

    def run(form: str, b: int) -> float:
        nonlocal rnd
        rnd += 1
        eng.rtc_form = form if form != "unguided" else eng.rtc_form
        reqs = [InferenceRequest(f"rtc-profile/{i}", rnd, observation=obs[i],
                                 rtc=None if form == "unguided" else guides[i]) for i in range(b)]
        t0 = clock()
        eng.infer(reqs)
        return (clock() - t0) * 1000.0

    for _ in range(warmup):
        for b in batch_sizes:
            for f in FORMS:
                run(f, b)
    for r in range(repeats):
        for b in batch_sizes:
            k = r % len(FORMS)
            for f in FORMS[k:] + FORMS[:k]:
                samples[f][b].append(run(f, b))
    med = {f: {str(b): round(statistics.median(v), 3) for b, v in s.items()} for f, s in samples.items()}
    ratio = {f: {str(b): round(med[f][str(b)] / med["unguided"][str(b)], 3) for b in batch_sizes}
             for f in ("paper", "lerobot")}
    eng.close()
    return {"batch_latency_ms": med, "ratio_vs_unguided": ratio, "delay_steps": d, "leftover": eng.chunk_len - d,
            "num_steps": int(eng.num_steps), "repeats": repeats, "torch_threads": threads,
            "paper_within_2x": all(v <= 2.0 for v in ratio["paper"].values()),
            "loadavg": list(os.getloadavg()), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_rtc_block(profile_file, block: dict) -> Path:
    """Add (replace) the `rtc` block of an engine profile JSON, keeping everything else."""
    p = Path(profile_file)
    data = json.loads(p.read_text()) if p.is_file() else {}
    data["rtc"] = block
    p.write_text(json.dumps(data, indent=1) + "\n")
    return p


# pi0's inference split on an RTX 4090 (Black et al. 2024, arXiv 2410.24164, App. D): image encoders
# 14 ms + observation (VLM prefix) forward 32 ms, then 10 action-expert steps 27 ms. RTC's VJP runs
# through the action expert only (the prefix's KV cache is an input, not differentiated).
PI0_PREFIX_MS, PI0_EXPERT_MS = 46.0, 27.0
FORMS_OF_RECORD = ("unguided", "rtc_soft", "rtc_lerobot", "rtc_trained")


def measure_forms(policy_dir, trained_dir=None, batch: int = 8, delay: int = 4, repeats: int = 25,
                  warmup: int = 3, clock=time.perf_counter) -> dict:
    """Engine time per form at one batch size and one torch thread, the forms interleaved call by
    call with a rotated order (load drift lands on each alike): unguided, the paper's guidance
    (rtc_soft), LeRobot's defaults (rtc_lerobot) and a training-time RTC head (rtc_trained: prefix
    conditioning, no guidance). Every guided row has d = `delay` and a leftover of H - d actions."""
    from ..core.rtc import RtcGuide
    from ..core.types import InferenceRequest
    from ..engines import make_engine
    from ..engines.torch_env import import_torch

    import_torch().set_num_threads(1)
    engines = {"unguided": make_engine("flow", None, policy_dir=str(policy_dir), seed=0),
               "rtc_lerobot": make_engine("flow", None, policy_dir=str(policy_dir), seed=0, rtc_form="lerobot")}
    engines["rtc_soft"] = engines["unguided"]
    if trained_dir:
        engines["rtc_trained"] = make_engine("flow", None, policy_dir=str(trained_dir), seed=0)
    forms = [f for f in FORMS_OF_RECORD if f in engines]
    eng = engines["unguided"]
    rng = np.random.default_rng(0)
    obs = [eng.example_observation(rng) for _ in range(batch)]
    prev = eng.infer([InferenceRequest(f"forms/{i}", 0, observation=obs[i]) for i in range(batch)])
    d = min(int(delay), eng.chunk_len // 2)
    guides = [RtcGuide(p.actions[d:], d) for p in prev]
    samples: dict = {f: [] for f in forms}
    for r in range(warmup + repeats):
        k = r % len(forms)
        for f in forms[k:] + forms[:k]:
            reqs = [InferenceRequest(f"forms/{i}", r + 1, observation=obs[i],
                                     rtc=None if f == "unguided" else guides[i]) for i in range(batch)]
            t0 = clock()
            engines[f].infer(reqs)
            if r >= warmup:
                samples[f].append((clock() - t0) * 1000.0)
    med = {f: statistics.median(v) for f, v in samples.items()}
    ratio = {f: round(med[f] / med["unguided"], 3) for f in forms if f != "unguided"}
    n = int(eng.num_steps)
    vla = {f: round((PI0_PREFIX_MS + PI0_EXPERT_MS * r) / (PI0_PREFIX_MS + PI0_EXPERT_MS), 3) for f, r in ratio.items()}
    return {"forms": {f: {"batch": batch, "engine_ms_p50": round(med[f], 3)} for f in forms},
            "ratio_vs_unguided": ratio,
            "projected_vla_ratio": {"assumes": f"pi0 on an RTX 4090 (arXiv 2410.24164 App. D): prefix "
                                               f"{PI0_PREFIX_MS:g} ms not differentiated, {n} action-expert steps "
                                               f"{PI0_EXPERT_MS:g} ms costing the ratio measured here", **vla},
            "policy_dir": str(policy_dir), "trained_dir": str(trained_dir) if trained_dir else None,
            "delay_steps": d, "leftover": eng.chunk_len - d, "num_steps": n, "repeats": repeats, "torch_threads": 1,
            "loadavg": list(os.getloadavg()), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
