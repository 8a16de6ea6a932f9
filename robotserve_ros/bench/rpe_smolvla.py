"""The `smolvla_cpu` device of `robotserve bench robots-per-engine` (issue 40 item 2b): the real
tiny SmolVLA (the smolvla_tiny profile of record's shapes: one 64x64 camera, state 6, chunk 50,
10 flow steps, random weights) at ONE torch thread. Every server process loads its own copy and
runs a batch of b through it under the device lock (rpe_servers.Device), so the calls of all
servers are serialised on one device, as with the simulated curve: several servers never get
several devices. The model computes on synthetic observations of its own shapes, as `robotserve
profile` feeds it; the robots' observations (by protocol: a 32x32 camera, or state only) do not
reach it, and the chunks they get back are the simulated engine's. What is real is the device's
time: the model's forward, pre- and post-processing, on the server core, beside the servers.

Its curve is measured here before the rows, in a process of its own on the server core, by the
profiler of record's method (engines/profiling.py: warm-up, rotated order, medians). The profile
of record (robotserve_ros/profiles/smolvla_tiny.json) is used only if it was taken at one torch
thread too; else it is recorded beside the measured curve, not used.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

PROFILE_OF_RECORD = "smolvla_tiny"
POLICY = dict(image_hw=(64, 64), steps=10, chunk_size=50, n_action_steps=50)  # the profile of record's
THREADS = 1


class SmolVLAWork:
    """The tiny SmolVLA as device work: `work(b)` runs one batch of b synthetic observations."""

    def __init__(self, policy_dir: str) -> None:
        from ..engines.torch_env import import_lerobot_policies, import_torch

        import_lerobot_policies()
        import_torch().set_num_threads(THREADS)  # one thread: no OpenMP race with the servers beside it (issue 40)
        from ..engines.lerobot_engine import LeRobotEngine

        self.engine = LeRobotEngine(policy_dir=policy_dir)
        self._rng, self._obs, self._round = np.random.default_rng(0), [], 0

    def __call__(self, b: int) -> None:
        from ..core.types import InferenceRequest

        while len(self._obs) < b:
            self._obs.append(self.engine.example_observation(self._rng))
        self._round += 1
        self.engine.infer([InferenceRequest(task_id=f"device/row_{i}", round_id=self._round, observation=self._obs[i])
                           for i in range(b)])


def make_policy(path) -> str:
    from ..engines.tiny_policies import make_policy_dir

    return str(make_policy_dir("smolvla", Path(path), **POLICY))


def measure_batches(max_robots: int) -> list:
    """1, 2, 4, ... up to the first power of two covering the largest fleet (at most 64)."""
    out = [1]
    while out[-1] < min(max_robots, 64):
        out.append(out[-1] * 2)
    return out


def _measure(path: str, core, batches: list, warmup: int, repeats: int) -> dict:
    if core is not None:
        os.sched_setaffinity(0, {core})
    policy_dir = make_policy(path)
    work = SmolVLAWork(policy_dir)
    from ..engines import profiling

    samples = profiling.measure(work.engine, batches, warmup=warmup, repeats=repeats)
    rep = profiling.build_report(samples, engine_name="lerobot", engine_params={}, warmup=warmup)
    return {"policy_dir": policy_dir, "batch_ms": {int(b): ms for b, ms in rep["engine_profile"]["batch_latency_ms"].items()},
            "samples_ms": rep["samples_ms"], "method": rep["method"], "torch_threads": work.engine.torch.get_num_threads()}


def measure_curve(path, core, max_robots: int, warmup: int = 2, repeats: int = 7) -> dict:
    """Build the policy at `path` and measure its batch curve in a spawned process on `core`."""
    import multiprocessing as mp

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(_measure, str(path), core, measure_batches(max_robots), warmup, repeats).result(timeout=900)


def engine_block(measured: dict) -> dict:
    """The report's `engine` entries for this device: the curve used (curve_batch_ms: measured
    here, or the profile of record where it matches) and the other beside it."""
    from ..profiles import record

    rec = record(PROFILE_OF_RECORD)
    rec_threads = rec.get("torch", {}).get("threads")
    matches = rec_threads == THREADS
    rec_ms = {int(b): float(v) for b, v in rec["engine_profile"]["batch_latency_ms"].items()}
    used = rec_ms if matches else measured["batch_ms"]
    src = (f"the profile of record {PROFILE_OF_RECORD} (taken at {THREADS} torch thread, as this device)" if matches else
           f"measured in this bench before the rows ({measured['method']['repeats']} repeats after "
           f"{measured['method']['warmup_rounds']} warm-up rounds, medians, on the server core at {THREADS} torch "
           f"thread); the profile of record {PROFILE_OF_RECORD} was taken at {rec_threads} threads, so not used")
    return {"curve_batch_ms": {str(b): round(v, 3) for b, v in used.items()}, "formula": "the measured ms per batch size, linear between them, extended along the "
                                       "last segment past the largest",
            "source": src, "measured_batch_ms": {str(b): round(v, 2) for b, v in measured["batch_ms"].items()},
            "measured_samples_ms": measured["samples_ms"], "torch_threads": measured["torch_threads"],
            "profile_of_record_batch_ms": {str(b): v for b, v in rec_ms.items()},
            "device": "the real tiny SmolVLA (smolvla_tiny's shapes: 64x64 camera, state 6, chunk 50, 10 flow steps, "
                      "random weights) at one torch thread, a copy in every server process, every call under one "
                      "file lock; it runs on synthetic observations of its shapes (the robots' do not reach it) and "
                      "shares the server core with the servers' own threads"}
