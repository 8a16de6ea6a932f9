"""`robotserve bench oxygen`'s modes, each timed in the process that runs it (seed 001 §4.1): one
frame of actions and language as isolated execution, KV sharing or OxyGen batching (§3.3),
inline or under Poisson arrivals (§4.4); the CLI in oxygen.py runs them in worker processes."""
from __future__ import annotations

import time

import numpy as np


PROMPT = "what do you see"  # ignored by the measure: the length is what counts


def _peak_rss_mb(pid: str = "self") -> float:
    """VmHWM: the process's peak resident set, MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _load(policy_dir: str, device: str, k: int, threads: int):
    from ..engines.oxygen import OxyGenEngine
    from ..engines.torch_env import import_torch

    torch = import_torch()
    torch.set_num_threads(threads)
    return OxyGenEngine(policy_dir=policy_dir, device=device, tokens_per_frame=k, max_active=256, seed=0)


def _obs(eng, rng):
    return eng.example_observation(rng)


def _request(task, rnd, obs):
    from ..core.types import InferenceRequest

    return InferenceRequest(task_id=task, round_id=rnd, observation=obs)


def _sync(eng) -> None:
    if eng.device.type == "cuda":
        eng.torch.cuda.synchronize()


# --------------------------------------------------------------------------------------
# One frame of each mode (in the process that holds the engine)
# --------------------------------------------------------------------------------------
def frame_actions(eng, rnd, obs) -> None:
    eng.infer([_request("robot0", rnd, obs)])


def frame_language_isolated(eng, obs, n) -> int:
    return len(eng.isolated_language(obs, PROMPT, n))


def run_inline(eng, mode: str, n: int, steps: int, frames: int, warmup: int, seed: int) -> dict:
    """sequential / kv_sharing / oxygen in this process: per frame a new observation. Each
    measured frame's time and tokens are kept (the summary takes the median frame)."""
    eng.set_denoise_steps(steps)
    eng.kv.close()
    eng.kv.counts.update(frames=0, batch_sum=0)
    rng = np.random.default_rng(seed)
    kv_peak = 0
    times, toks = [], []
    for f in range(warmup + frames):
        if f == warmup:
            eng.kv.counts.update(frames=0, batch_sum=0)
        obs = _obs(eng, rng)
        _sync(eng)
        t0, tokens = time.perf_counter(), 0
        if mode == "sequential":
            frame_actions(eng, f, obs)
            tokens += frame_language_isolated(eng, obs, n)
        else:
            eng.request_language("robot0", f, PROMPT, n)
            frame_actions(eng, f, obs)
            if mode == "kv_sharing":  # to completion inside the frame
                while len(eng.kv):
                    tokens += sum(len(t) for _, t in eng.decode_frame())
            else:  # one round of k tokens for every active request
                tokens += sum(len(t) for _, t in eng.decode_frame())
        _sync(eng)
        if f >= warmup:
            times.append(time.perf_counter() - t0)
            toks.append(tokens)
        kv_peak = max(kv_peak, eng.kv.kv_bytes())
    eng.kv.close()
    return _frame_rates(eng.chunk_len, times, toks, eng.kv.avg_decode_batch(), kv_peak / 2**20)


def _frame_rates(chunk_len: int, times: list, toks: list, batch: float, kv_peak_mb) -> dict:
    dt = sum(times)
    return {"action_hz": chunk_len * len(times) / dt, "tokens_per_s": sum(toks) / dt, "avg_decode_batch": batch,
            "frame_ms": 1000 * dt / len(times), "kv_peak_mb": kv_peak_mb, "frame_s": list(times),
            "frame_tokens": list(toks), "chunk_len": chunk_len}


def run_poisson(eng, lam: float, n: int, steps: int, frames: int, warmup: int, seed: int, sequential: bool) -> dict:
    """§4.4: per frame Poisson(lam) robots send an observation with a language request."""
    eng.set_denoise_steps(steps)
    eng.kv.close()
    rng = np.random.default_rng([seed, int(lam * 1000)])
    tokens = chunks = 0
    t0 = None
    for f in range(warmup + frames):
        if f == warmup:
            t0, tokens, chunks = time.perf_counter(), 0, 0
            eng.kv.counts.update(frames=0, batch_sum=0)
        m = int(rng.poisson(lam))
        obs = [_obs(eng, rng) for _ in range(m)]
        if sequential:
            for i, o in enumerate(obs):
                eng.infer([_request(f"robot{i}", f, o)])
                tokens += frame_language_isolated(eng, o, n)
        else:
            for i in range(m):
                eng.request_language(f"robot{i}", f, PROMPT, n)
            if m:
                eng.infer([_request(f"robot{i}", f, o) for i, o in enumerate(obs)])
            tokens += sum(len(t) for _, t in eng.decode_frame())
        chunks += m
    _sync(eng)
    dt = time.perf_counter() - t0
    eng.kv.close()
    # Action frequency per request: H over the mean frame time of frames that had requests.
    return {"lambda": lam, "mode": "sequential" if sequential else "oxygen", "decode_tokens": n,
            "denoise_steps": steps, "actions_per_s_total": eng.chunk_len * chunks / dt,
            "action_hz_per_request": eng.chunk_len * frames / dt, "tokens_per_s": tokens / dt,
            "avg_decode_batch": 1.0 if sequential else eng.kv.avg_decode_batch()}
