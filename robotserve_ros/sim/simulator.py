"""Virtual-clock discrete-event fleet simulator.

It drives the real serving loop (core.ServingCore: ledger, scheduler, batching, horizon
policy, action manager) on a VirtualClock; only the robots and the engine's timing are
simulated. Online mode: Poisson task arrivals; fleet mode: N robots run the workload's
tasks back to back (seed 000 §5.3).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.clock import VirtualClock
from ..core.ledger import wait_ratio
from ..core.schedulers import make_scheduler
from ..core.serving import ServingCore, Tier
from ..core.types import ExecInfo, HorizonChoice, InferenceRequest
from ..engines.simulated import SimulatedEngine
from .robot import alone_latency, exec_start, request_after, trigger_actions
from .workload import HORIZON_MODES, TaskSpec, Workload

_ARRIVE, _REQUEST, _DONE_GEN, _DONE_TASK = range(4)


@dataclass
class TaskOutcome:
    task_id: str
    spec_id: str
    robot: int
    arrival: float
    end: float
    rounds: int
    idle_s: float
    wait_ratio: float
    lower_bound_s: float

    @property
    def latency(self) -> float:
        return self.end - self.arrival


@dataclass
class SimResult:
    workload: str
    scheduler: str
    horizon: str
    mode: str
    load: float  # tasks/s (online) or robots (fleet)
    seed: int
    outcomes: list = field(default_factory=list)
    engine_busy_s: float = 0.0
    makespan_s: float = 0.0
    batches: int = 0
    dispatched: int = 0

    def summary(self) -> dict:
        lat = np.array([o.latency for o in self.outcomes])
        lb = np.array([o.lower_bound_s for o in self.outcomes])
        return {
            "workload": self.workload,
            "scheduler": self.scheduler,
            "horizon": self.horizon,
            "mode": self.mode,
            ("rate" if self.mode == "online" else "robots"): self.load,
            "seed": self.seed,
            "tasks": len(self.outcomes),
            "rounds": int(sum(o.rounds for o in self.outcomes)),
            "avg_latency_s": float(lat.mean()),
            "p25_latency_s": float(np.percentile(lat, 25)),
            "p50_latency_s": float(np.percentile(lat, 50)),
            "p95_latency_s": float(np.percentile(lat, 95)),
            "lower_bound_avg_s": float(lb.mean()),
            "slowdown_vs_lower_bound": float(lat.mean() / lb.mean()),
            "mean_wait_ratio": float(np.mean([o.wait_ratio for o in self.outcomes])),
            "mean_idle_s": float(np.mean([o.idle_s for o in self.outcomes])),
            "engine_utilization": self.engine_busy_s / self.makespan_s if self.makespan_s > 0 else 0.0,
            "mean_batch": self.dispatched / self.batches if self.batches else 0.0,
            "makespan_s": self.makespan_s,
        }


class _Robot:
    """One task in progress, seen from the robot."""

    __slots__ = ("tid", "spec", "robot", "rounds", "arrival", "k", "prev_end", "idle")

    def __init__(self, tid: str, spec: TaskSpec, robot: int, rounds, arrival: float) -> None:
        self.tid, self.spec, self.robot, self.rounds, self.arrival = tid, spec, robot, rounds, arrival
        self.k = 0  # round being requested or executed
        self.prev_end: Optional[float] = None
        self.idle = 0.0


class Simulator:
    def __init__(
        self,
        workload: Workload,
        scheduler: str,
        horizon: str = "static",
        seed: int = 0,
        scheduler_params: Optional[dict] = None,
    ) -> None:
        if horizon not in HORIZON_MODES:
            raise ValueError(f"horizon must be one of {HORIZON_MODES}, got {horizon!r}")
        self.workload, self.scheduler_name, self.horizon, self.seed = workload, scheduler, horizon, seed
        self.scheduler_params = dict(scheduler_params or {})
        make_scheduler(scheduler, **self.scheduler_params)  # fail early on a bad name/param
        self.profile = workload.profile
        self.l1 = self.profile.latency_s(1)

    # --- public modes ------------------------------------------------------------
    def run_online(self, rate: float, n_tasks: int) -> SimResult:
        """Poisson arrivals at `rate` tasks/s of `n_tasks` tasks drawn from the workload."""
        if rate <= 0 or n_tasks < 1:
            raise ValueError("rate must be > 0 and n_tasks >= 1")
        rng = np.random.default_rng(self.seed)
        times = np.cumsum(rng.exponential(1.0 / rate, n_tasks))
        picks = rng.integers(0, len(self.workload.tasks), n_tasks)
        run = self._start("online", rate)
        for i, (t, j) in enumerate(zip(times, picks)):
            spec = self.workload.tasks[int(j)]
            run.push(float(t), _ARRIVE, (f"{spec.id}#{i}", spec, i))
        return run.finish()

    def run_fleet(self, robots: int) -> SimResult:
        """`robots` robots take the workload's tasks (seeded order) back to back until done."""
        if robots < 1:
            raise ValueError("robots must be >= 1")
        order = np.random.default_rng(self.seed).permutation(len(self.workload.tasks))
        run = self._start("fleet", robots)
        run.backlog = [self.workload.tasks[int(j)] for j in order][::-1]
        for r in range(min(robots, len(run.backlog))):
            spec = run.backlog.pop()
            run.push(0.0, _ARRIVE, (f"{spec.id}@r{r}", spec, r))
        return run.finish()

    def _start(self, mode: str, load: float) -> "_Run":
        return _Run(self, mode, load)


class _Run:
    def __init__(self, sim: Simulator, mode: str, load: float) -> None:
        self.sim = sim
        self.clock = VirtualClock()
        self.tier = Tier("edge", sim.profile)
        self.core = ServingCore(make_scheduler(sim.scheduler_name, **sim.scheduler_params), [self.tier], self.clock)
        self.engine = SimulatedEngine(sim.profile, chunk_size=sim.workload.max_round())
        self.result = SimResult(sim.workload.name, sim.scheduler_name, sim.horizon, mode, load, sim.seed)
        self.events: list = []
        self._seq = itertools.count()
        self.robots: dict[str, _Robot] = {}
        self.backlog: list = []
        self._alone: dict[str, float] = {}

    def push(self, t: float, kind: int, data) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, data))

    def finish(self) -> SimResult:
        ev = self.events
        while ev:
            t, _, kind, data = heapq.heappop(ev)
            self.clock.advance_to(t)
            if kind == _ARRIVE:
                self._arrive(*data)
            elif kind == _REQUEST:
                self._request(*data)
            elif kind == _DONE_GEN:
                self._generated(data)
            else:
                self._task_done(data)
            if self.tier.free and self.core.pending:
                self._dispatch()
        r = self.result
        r.makespan_s = max(o.end for o in r.outcomes) - min(o.arrival for o in r.outcomes)
        r.batches, r.dispatched = self.core.stats.batches, self.core.stats.dispatched
        return r

    # --- robot side ----------------------------------------------------------------
    def _arrive(self, tid: str, spec: TaskSpec, robot: int) -> None:
        now = self.clock.now()
        rb = self.robots[tid] = _Robot(tid, spec, robot, spec.rounds[self.sim.horizon], now)
        self._send(rb, None)

    def _send(self, rb: _Robot, info: Optional[ExecInfo]) -> None:
        # Trace replay: the robot asks for the recorded horizon of this round.
        h = HorizonChoice("static", float(rb.rounds[rb.k]))
        left = len(rb.rounds) - rb.k  # the trace knows it exactly: only `srpt` reads it
        self.core.submit(InferenceRequest(rb.tid, rb.k, info, h, remaining_rounds=left))

    def _request(self, tid: str, info: ExecInfo) -> None:
        self._send(self.robots[tid], info)

    def _chunk(self, rb: _Robot, horizon: int) -> None:
        now = self.clock.now()
        n, hz = rb.rounds[rb.k], rb.spec.control_hz
        assert horizon == n, f"action manager returned H={horizon}, trace says {n}"
        start = exec_start(now, rb.prev_end)
        rb.idle += start - (rb.arrival if rb.prev_end is None else rb.prev_end)
        end = start + n / hz
        rb.prev_end = end
        rb.k += 1
        if rb.k < len(rb.rounds):
            trig = trigger_actions(self.sim.l1, hz)
            t_req = start + request_after(n, trig, hz)
            self.push(t_req, _REQUEST, (rb.tid, ExecInfo(start, min(n, trig), hz)))
        else:
            self.push(end, _DONE_TASK, (rb.tid, start))

    def _task_done(self, data) -> None:
        tid, start = data
        now = self.clock.now()
        rb = self.robots.pop(tid)
        rec = self.core.finish_task(tid, ExecInfo(start, 0, rb.spec.control_hz))
        wr = wait_ratio(rec, now)
        self.core.drop_task(tid)
        self.result.outcomes.append(
            TaskOutcome(tid, rb.spec.id, rb.robot, rb.arrival, now, len(rb.rounds), rb.idle, wr, self._lower_bound(rb))
        )
        if self.backlog:  # fleet mode: the robot takes the next task
            spec = self.backlog.pop()
            self._arrive(f"{spec.id}@r{rb.robot}#{len(self.result.outcomes)}", spec, rb.robot)

    def _lower_bound(self, rb: _Robot) -> float:
        v = self._alone.get(rb.spec.id)
        if v is None:
            v = self._alone[rb.spec.id] = alone_latency(rb.rounds, rb.spec.control_hz, self.sim.l1)
        return v

    # --- engine side -----------------------------------------------------------------
    def _dispatch(self) -> None:
        for d in self.core.dispatch():
            dur = self.sim.profile.latency_s(len(d.requests))
            self.result.engine_busy_s += dur
            self.push(self.clock.now() + dur, _DONE_GEN, d)

    def _generated(self, d) -> None:
        results = self.engine.infer([p.request for p in d.requests])
        for reply in self.core.complete(d.id, results):
            self._chunk(self.robots[reply.task_id], reply.horizon)
