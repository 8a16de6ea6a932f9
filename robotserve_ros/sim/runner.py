"""Run simulator configurations, in parallel processes, and pool their results."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Optional

from tqdm import tqdm

from .simulator import SimResult, Simulator
from .workload import Workload
from .workloads import builtin_workload


@dataclass(frozen=True)
class RunSpec:
    workload: str  # built-in name
    scheduler: str
    horizon: str
    mode: str  # "online" | "fleet"
    load: float  # rate (online) or robots (fleet)
    seed: int
    tasks: int = 0  # online: tasks per run
    scheduler_params: tuple = field(default=())  # sorted (key, value) pairs


@lru_cache(maxsize=None)
def _workload(name: str) -> Workload:
    return builtin_workload(name)


def run_one(spec: RunSpec) -> SimResult:
    sim = Simulator(_workload(spec.workload), spec.scheduler, spec.horizon, spec.seed, dict(spec.scheduler_params))
    if spec.mode == "online":
        return sim.run_online(spec.load, spec.tasks)
    return sim.run_fleet(int(spec.load))


def run_many(specs: Iterable, workers: Optional[int] = None, desc: str = "runs", fn=run_one) -> dict:
    """spec -> fn(spec) (a SimResult) for all specs, with a progress bar; fn must pickle."""
    specs = list(specs)
    workers = workers or os.cpu_count() or 1
    out = {}
    bar = tqdm(total=len(specs), desc=desc, unit="run", dynamic_ncols=True)
    if workers == 1:
        for s in specs:
            out[s] = fn(s)
            bar.update()
    else:
        with ProcessPoolExecutor(workers) as pool:
            futs = {pool.submit(fn, s): s for s in specs}
            for f in as_completed(futs):
                out[futs[f]] = f.result()
                bar.update()
    bar.close()
    return out


def pooled(results: Iterable[SimResult]) -> SimResult:
    """One result over several seeds: all tasks together, engine time summed."""
    results = list(results)
    first = results[0]
    merged = SimResult(first.workload, first.scheduler, first.horizon, first.mode, first.load, -1)
    for r in results:
        merged.outcomes.extend(r.outcomes)
        merged.engine_busy_s += r.engine_busy_s
        merged.makespan_s += r.makespan_s
        merged.batches += r.batches
        merged.dispatched += r.dispatched
    return merged
