"""Built-in workloads: seeded, documented generators shaped like seed 000 Table 1 pairs.

A task is a sequence of motion phases. Free motion (approach, transport) tolerates a long
execution horizon; contact phases (grasp, insert, hand-off, push) need a short one. Each
phase has a tolerance tau: an action k steps into a round (k = 0 first) is still fresh
enough while k < tau of the phase it executes in.

- static rounds: the task-optimal fixed H, the largest sweep value safe in the task's
  hardest phase (seed 000 §5.1: baselines use "the largest static H that maintains the
  highest accuracy"), every round the same (the last one what is left);
- dynamic rounds: each round executes the round-optimal horizon (first k that reaches the
  tolerance of the phase it lands in, seed 000 §2.2 Figure 4) as an imperfect confidence
  signal would find it: scaled by a lognormal error (median 0.9, sigma 0.2, so it errs
  short more often than long) and floored at H_min (§3.1).

Generation latencies are engine profiles of real policies measured on this machine's CPU
(2 cores, torch 2.13.0 CPU, lerobot 0.4.4; robotserve_ros/profiles/). The generator is not tuned to any
scheduler: its knobs are the paper's ranges, listed per workload below.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import profiles
from ..core.errors import UnknownName
from .workload import TaskSpec, Workload, load_workload

# Each shape names an engine profile of record (robotserve_ros/profiles/NAME.json): median
# ms per chunk of a LeRobot 0.4.4 policy with random weights on this project's 2-core CPU
# (weights do not change the compute, so the timing is the real policy's):
# - smolvla_tiny: SmolVLA, tiny SmolVLM config, one 64x64 camera, chunk 50, 10 flow steps;
# - diffusion_pusht: DiffusionPolicy 16.1M (resnet18, 96x96), horizon 16, DDIM 10 steps;
# - diffusion_arm: DiffusionPolicy 16.1M, 6-dof arm, horizon 64 (chunk 50), DDIM 10 steps.


@dataclass(frozen=True)
class WorkloadShape:
    name: str
    shaped_like: str  # the seed 000 Table 1 pair it imitates
    profile: str
    control_hz: float
    chunk: int  # actions per generated chunk (N)
    h_min: int  # smallest static horizon of the sweep (§3.1 H_min)
    static_choices: tuple  # the static-H sweep the task-optimal H is picked from
    phases: tuple  # (min, max) number of phases, alternating free/contact, free first
    free_len: tuple  # (min, max) actions in a free-motion phase
    contact_len: tuple  # (min, max) actions in a contact phase
    free_tau: tuple  # (min, max) tolerance of free motion, as fraction of chunk
    contact_tau: tuple  # (min, max) tolerance of contact, in actions
    tasks: int = 200
    # Task types of a suite that mixes lengths (the regime shapes): ((type, (min, max) phases,
    # weight), ...). Empty: one type, `phases` above. A task's id is "<name>-<type>-<i>", its
    # type the id without the trailing number (simulator.task_type_of).
    task_types: tuple = ()
    # "profile": the profile of record as measured; "none": the same batch-1 latency on an
    # engine that does not batch (latency grows linearly with the batch: saturation batch 1,
    # as a large model on a small edge GPU). The latter is assumed, not measured.
    batching: str = "profile"
    regime: str = ""  # non-empty: a regime workload (reports/fleet/regime.md), this says why


SHAPES = {
    s.name: s
    for s in (
        WorkloadShape(
            "libero-smolvla", "LIBERO / SmolVLA", "smolvla_tiny", 30.0, 50, 10, (10, 15, 20, 25, 30, 40, 50),
            phases=(3, 7), free_len=(60, 180), contact_len=(30, 90), free_tau=(0.6, 1.0), contact_tau=(10, 25),
        ),
        WorkloadShape(
            "metaworld-smolvla", "Meta-World / SmolVLA", "smolvla_tiny", 30.0, 50, 10, (10, 15, 20, 25, 30, 40, 50),
            phases=(2, 4), free_len=(40, 120), contact_len=(20, 60), free_tau=(0.5, 1.0), contact_tau=(10, 30),
        ),
        WorkloadShape(
            "bimanual-diffusion", "Bimanual SO-101 / Pi0.5", "diffusion_arm", 30.0, 50, 10, (10, 20, 30, 40, 50),
            phases=(5, 11), free_len=(45, 150), contact_len=(30, 75), free_tau=(0.6, 1.0), contact_tau=(20, 30),
        ),
        WorkloadShape(
            "pusht-diffusion", "Diffusion Policy / Push-T (10 Hz)", "diffusion_pusht", 10.0, 16, 4, (4, 6, 8, 12, 16),
            phases=(3, 7), free_len=(12, 40), contact_len=(15, 50), free_tau=(0.6, 1.0), contact_tau=(5, 10),
        ),
    )
}

# Regime workloads (reports/fleet/regime.md, `robotserve bench regime`): where ordering by
# remaining work pays. Suites that mix short and long task types (LIBERO's spatial/object/
# goal suites beside LIBERO-10's long-horizon tasks; Meta-World's easy..very hard), served by
# an engine that does not batch, so the queue is deeper than any batch can absorb.
REGIME_NOTE = "engine does not batch (saturation batch 1) + task types of very different lengths"
REGIME_SHAPES = {
    s.name: s
    for s in (
        WorkloadShape(
            "libero-mixed-edge", "LIBERO suites mixed / large VLA on a small edge GPU", "diffusion_arm", 30.0, 50, 10,
            (10, 15, 20, 25, 30, 40, 50), phases=(3, 7), free_len=(60, 180), contact_len=(30, 90), free_tau=(0.6, 1.0),
            contact_tau=(10, 25), tasks=240,
            task_types=(("spatial", (2, 3), 3), ("object", (3, 4), 3), ("goal", (3, 5), 3), ("long", (12, 18), 2)),
            batching="none", regime=REGIME_NOTE,
        ),
        WorkloadShape(
            "metaworld-mixed-edge", "Meta-World easy..very hard / large VLA on a small edge GPU", "diffusion_arm", 30.0, 50,
            10, (10, 15, 20, 25, 30, 40, 50), phases=(2, 4), free_len=(40, 120), contact_len=(20, 60), free_tau=(0.5, 1.0),
            contact_tau=(10, 30), tasks=240,
            task_types=(("easy", (1, 2), 4), ("medium", (2, 4), 3), ("hard", (5, 7), 2), ("very-hard", (10, 14), 1)),
            batching="none", regime=REGIME_NOTE,
        ),
        WorkloadShape(
            "pusht-mixed-edge", "Push-T variants, short and long pushes / diffusion policy, no batching", "diffusion_pusht",
            10.0, 16, 4, (4, 6, 8, 12, 16), phases=(3, 7), free_len=(12, 40), contact_len=(15, 50), free_tau=(0.6, 1.0),
            contact_tau=(5, 10), tasks=240,
            task_types=(("nudge", (1, 2), 4), ("push", (3, 5), 3), ("long-push", (9, 13), 2)),
            batching="none", regime=REGIME_NOTE,
        ),
    )
}


def _phases(rng: np.random.Generator, s: WorkloadShape, phases: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-action tolerance tau of one task, and the phase kind (True = contact)."""
    phases = phases or s.phases
    n = int(rng.integers(phases[0], phases[1] + 1))
    taus, kinds = [], []
    for i in range(n):
        contact = i % 2 == 1
        lo, hi = s.contact_len if contact else s.free_len
        length = int(rng.integers(lo, hi + 1))
        if contact:
            tau = int(rng.integers(s.contact_tau[0], s.contact_tau[1] + 1))
        else:
            tau = int(round(rng.uniform(*s.free_tau) * s.chunk))
        taus += [max(1, tau)] * length
        kinds += [contact] * length
    return np.array(taus), np.array(kinds)


def round_optimal_horizon(tau: np.ndarray, pos: int, chunk: int) -> int:
    """Largest H whose actions all stay within their phase's tolerance (>= 1)."""
    k = np.arange(min(chunk, len(tau) - pos))
    stale = k >= tau[pos : pos + len(k)]  # never true at k = 0 since tau >= 1
    return int(np.argmax(stale)) if stale.any() else len(k)


def make_task(rng: np.random.Generator, s: WorkloadShape, tid: str, phases: tuple | None = None) -> TaskSpec:
    tau, _ = _phases(rng, s, phases)
    total = len(tau)
    safe = [h for h in s.static_choices if h <= tau.min()]
    h_static = max(safe) if safe else s.h_min
    static = [h_static] * (total // h_static) + ([total % h_static] if total % h_static else [])
    dynamic, pos = [], 0
    while pos < total:
        h_true = round_optimal_horizon(tau, pos, s.chunk)
        h = int(round(h_true * rng.lognormal(np.log(0.9), 0.2)))
        h = min(max(h, s.h_min), s.chunk, total - pos)
        dynamic.append(h)
        pos += h
    return TaskSpec(tid, s.control_hz, {"static": tuple(static), "dynamic": tuple(dynamic)})


# Workloads recorded on a real policy: `robotserve study horizon --workload-out` writes one
# task per evaluated episode (rounds of the best static H and of the best dynamic policy at
# matched success, reports/horizon/README.md; `robotserve study workload` rebuilds one).
MEASURED = {name: Path(__file__).with_name("measured") / f"{name}.json"
            for name in ("pushgust-diffusion", "pushgust-flow-matching")}


def measured_workload(name: str, seed: int = 0, tasks: int | None = None) -> Workload:
    """Seed 0 without `tasks`: the recorded episodes as they are; else a seeded resample."""
    w = load_workload(MEASURED[name])
    if seed == 0 and tasks is None:
        return w
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    pick = rng.integers(0, len(w.tasks), tasks or len(w.tasks))
    return Workload(name, w.batch_latency_ms,
                    tuple(TaskSpec(f"{w.tasks[i].id}#{k}", w.tasks[i].control_hz, w.tasks[i].rounds) for k, i in enumerate(pick)))


def measured_names() -> list[str]:
    return list(MEASURED)


def builtin_workload(name: str, seed: int = 0, tasks: int | None = None) -> Workload:
    if name in MEASURED:
        return measured_workload(name, seed, tasks)
    s = SHAPES.get(name) or REGIME_SHAPES.get(name)
    if s is None:
        raise UnknownName(f"unknown built-in workload '{name}'; known: {', '.join(all_names())}")
    return shape_workload(s, seed, tasks)


def shape_workload(s: WorkloadShape, seed: int = 0, tasks: int | None = None) -> Workload:
    """The seeded workload of a shape (a built-in one or a sweep's variant)."""
    rng = np.random.default_rng([seed, sum(map(ord, s.name))])
    n = tasks or s.tasks
    if not s.task_types:
        specs = tuple(make_task(rng, s, f"{s.name}-{i:03d}") for i in range(n))
    else:
        w = np.array([t[2] for t in s.task_types], float)
        kinds = rng.choice(len(s.task_types), n, p=w / w.sum())
        specs = tuple(
            make_task(rng, s, f"{s.name}-{s.task_types[k][0]}-{i:03d}", s.task_types[k][1]) for i, k in enumerate(kinds)
        )
    return Workload(s.name, engine_latency_ms(s), specs)


def engine_latency_ms(s: WorkloadShape) -> dict:
    table = profiles.batch_latency_ms(s.profile)
    if s.batching == "none":  # same batch-1 latency, no batching gain: saturation batch 1
        return {b: table[1] * b for b in (1, 2, 4, 8, 16)}
    if s.batching != "profile":
        raise ValueError(f"shape '{s.name}': batching must be 'profile' or 'none', got {s.batching!r}")
    return table


def builtin_names() -> list[str]:
    """Every generated built-in: the Table 1 shapes, then the regime shapes."""
    return list(SHAPES) + list(REGIME_SHAPES)


def regime_names() -> list[str]:
    """Generated workloads of the regime where execution-aware ordering can pay."""
    return list(REGIME_SHAPES)


def all_names() -> list[str]:
    return builtin_names() + list(MEASURED)
