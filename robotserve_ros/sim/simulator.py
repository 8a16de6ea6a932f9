"""Virtual-clock discrete-event fleet simulator.

It drives the real serving loop (core.ServingCore through core.Runner's steps: ledger,
scheduler, placement over tiers, batching, horizon policy, action manager, requeue of a
failed batch) on sim/loop.py's one virtual-clock loop; only the robots and the engines'
timing (the engine model) are simulated.
A batch on a tier takes its engine profile's latency, plus the link's round trip and
transfer for a cloud tier (seed 000 §3.2.3). Online mode: Poisson task arrivals; fleet
mode: N robots run the workload's tasks back to back (seed 000 §5.3).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.clock import VirtualClock
from ..core.ledger import Span, wait_ratio
from ..core.placement import LinkEstimate, ShortestDelay, payload_bytes
from ..core.profile import EngineProfile
from ..core.schedulers import make_scheduler
from ..core.types import ExecInfo, HorizonChoice, InferenceRequest
from ..engines.simulated import SimulatedEngine
from ..serve import Refused, Tier, fleet_of
from ..core.robot_loop import alone_latency, ReplayRobot, trigger_actions
from .loop import VirtualLoop
from .workload import HORIZON_MODES, TaskSpec, Workload

_VARIANT = re.compile(r"[-#]\d+$")


def task_type_of(spec_id: str) -> str:
    """A trace's task type, as a robot would name its instruction: the spec id without its
    trailing variant number ("libero-mixed-edge-long-007" -> "libero-mixed-edge-long")."""
    while True:
        t = _VARIANT.sub("", spec_id)
        if t == spec_id or not t:
            return spec_id
        spec_id = t


@dataclass(frozen=True)
class SimTier:
    """A place batches run in the simulator. profile None: the workload's engine profile,
    scaled by `speedup` (a cloud GPU 1.75x faster: speedup=1.75). A tier with `rtt_s` is a
    cloud tier behind a link: each batch also pays the round trip and its bytes at
    `bandwidth_bps`, and the placement (shortest_delay) weighs that against the edge."""

    name: str
    profile: Optional[EngineProfile] = None
    speedup: float = 1.0
    slots: int = 1
    max_batch: Optional[int] = None
    rtt_s: Optional[float] = None
    bandwidth_bps: float = 125e6

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tier needs a name")
        if not (self.speedup > 0 and self.slots >= 1 and self.bandwidth_bps > 0):
            raise ValueError(f"tier '{self.name}': speedup > 0, slots >= 1 and bandwidth_bps > 0 are needed")
        if self.rtt_s is not None and not self.rtt_s >= 0:
            raise ValueError(f"tier '{self.name}': rtt_s must be >= 0")


@dataclass(frozen=True)
class TierFault:
    """Every batch a tier starts in [start_s, end_s) fails after `after_s` (a server down:
    the call's deadline passes); its requests are requeued, as the live runner does."""

    tier: str
    start_s: float
    end_s: float
    after_s: float = 0.1


class _Failed(RuntimeError):
    pass


@dataclass
class TaskOutcome:
    task_id: str
    spec_id: str
    robot: int
    span: Span  # arrival -> end of the task's last execution
    rounds: int
    idle_s: float
    wait_ratio: float
    lower_bound_s: float
    round_trips: tuple = ()  # s from each round's request to its chunk, in order

    @property
    def latency(self) -> float:
        return self.span.length


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
    served_by_tier: dict = field(default_factory=dict)
    requeued: int = 0
    tier_failures: dict = field(default_factory=dict)

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


class _Robot(ReplayRobot):
    """One task in progress, seen from the robot: core/robot_loop.py's ReplayRobot of its trace."""

    __slots__ = ("spec", "robot", "kind", "sent", "round_trips")

    def __init__(self, tid: str, spec: TaskSpec, robot: int, rounds, arrival: float, expected_latency_s: float) -> None:
        super().__init__(tid, rounds, spec.control_hz, trigger_actions(expected_latency_s, spec.control_hz), arrival)
        self.spec, self.robot, self.kind = spec, robot, task_type_of(spec.id)
        self.sent, self.round_trips = 0.0, []  # when the round in flight went out; each round's request -> chunk


class _LatestOnlyRobot(_Robot):
    """LeRobot's RobotClient with latest_only aggregation: a chunk replaces the queue as it
    arrives, its actions aligned to its observation's timestep (an action the robot already ran,
    so n - 1 new ones from when it asked), and the robot asks again once `trigger` are left:
    one request per (n - 1 - trigger) control periods, each answered within `trigger` of them."""

    __slots__ = ()

    def answered(self, now: float) -> tuple:
        n = self.rounds[self.round]
        end = self.sent + (n - 1) / self.hz  # when this chunk's actions run out
        last = self.arrival if self.prev_end is None else self.prev_end
        self.idle += max(0.0, now - last)  # ran dry before it came
        self.prev_end, self.exec_start = max(end, now), now  # all stale: dry from now, it asks at once
        self.round += 1
        if self.round < len(self.rounds):
            ask = max(now, end - self.trigger / self.hz)
            return "request", ask, ExecInfo(now, int(round((self.prev_end - ask) * self.hz)), self.hz)
        return "done", self.prev_end, ExecInfo(now, 0, self.hz)


class Simulator:
    def __init__(
        self,
        workload: Workload,
        scheduler: str,
        horizon: str = "static",
        seed: int = 0,
        scheduler_params: Optional[dict] = None,
        tiers: Optional[list] = None,
        faults: tuple = (),
        retry_pause_s: float = 0.1,
        trigger_slack: float = 1.0,
        burstiness: float = 1.0,
        latest_only: bool = False,
    ) -> None:
        """latest_only: robots are LeRobot's RobotClient (_LatestOnlyRobot), not queue-and-append ones."""
        if horizon not in HORIZON_MODES:
            raise ValueError(f"horizon must be one of {HORIZON_MODES}, got {horizon!r}")
        self.workload, self.scheduler_name, self.horizon, self.seed = workload, scheduler, horizon, seed
        self.scheduler_params = dict(scheduler_params or {})
        make_scheduler(scheduler, **self.scheduler_params)  # fail early on a bad name/param
        self.profile = workload.profile
        self.l1 = self.profile.latency_s(1)  # robots trigger on the edge's batch-1 latency
        self.tiers = list(tiers) if tiers else [SimTier("edge")]
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if all(t.rtt_s is not None for t in self.tiers) and len(self.tiers) > 1:
            raise ValueError("shortest_delay placement needs at least one edge tier (a tier without rtt_s)")
        unknown = [f.tier for f in faults if f.tier not in names]
        if unknown:
            raise ValueError(f"fault on unknown tier(s) {unknown}; tiers: {names}")
        self.faults, self.retry_pause_s = tuple(faults), retry_pause_s
        if not (trigger_slack >= 1.0 and burstiness > 0):
            raise ValueError("trigger_slack must be >= 1 and burstiness > 0")
        # Robots ask `trigger_slack` x earlier than just in time (ceil(slack x l1 x hz) actions
        # left); burstiness is the squared coefficient of variation of task inter-arrival
        # times (1: Poisson; > 1: gamma-distributed, burstier). Both are regime sweep knobs.
        self.trigger_slack, self.burstiness = float(trigger_slack), float(burstiness)
        self.robot_kind = _LatestOnlyRobot if latest_only else _Robot

    # --- public modes ------------------------------------------------------------
    def run_online(self, rate: float, n_tasks: int) -> SimResult:
        """Poisson arrivals at `rate` tasks/s of `n_tasks` tasks drawn from the workload."""
        if rate <= 0 or n_tasks < 1:
            raise ValueError("rate must be > 0 and n_tasks >= 1")
        rng = np.random.default_rng(self.seed)
        if self.burstiness == 1.0:
            times = np.cumsum(rng.exponential(1.0 / rate, n_tasks))
        else:
            times = np.cumsum(rng.gamma(1.0 / self.burstiness, self.burstiness / rate, n_tasks))
        picks = rng.integers(0, len(self.workload.tasks), n_tasks)
        run = self._start("online", rate)
        for i, (t, j) in enumerate(zip(times, picks)):
            spec = self.workload.tasks[int(j)]
            run.arrive_at(float(t), f"{spec.id}#{i}", spec, i)
        return run.finish()

    def run_fleet(self, robots: int, starts: Optional[list] = None) -> SimResult:
        """`robots` robots take the workload's tasks (seeded order) back to back until done;
        robot r starts at starts[r] s (default: all at 0)."""
        if robots < 1 or (starts is not None and len(starts) < robots):
            raise ValueError("robots must be >= 1, with a start time for each")
        order = np.random.default_rng(self.seed).permutation(len(self.workload.tasks))
        run = self._start("fleet", robots)
        run.backlog = [self.workload.tasks[int(j)] for j in order][::-1]
        for r in range(min(robots, len(run.backlog))):
            spec = run.backlog.pop()
            run.arrive_at(0.0 if starts is None else float(starts[r]), f"{spec.id}@r{r}", spec, r)
        return run.finish()

    def _start(self, mode: str, load: float) -> "_Run":
        return _Run(self, mode, load)


class _Run:
    def __init__(self, sim: Simulator, mode: str, load: float) -> None:
        self.sim = sim
        self.clock = VirtualClock()
        tiers, engines, self.links = [], {}, {}
        for st in sim.tiers:
            prof = st.profile or EngineProfile({b: ms / st.speedup for b, ms in sim.profile.to_dict().items()})
            tiers.append(Tier(st.name, prof, slots=st.slots, max_batch=st.max_batch))
            engines[st.name] = SimulatedEngine(prof, chunk_size=sim.workload.max_round())
            if st.rtt_s is not None:
                self.links[st.name] = LinkEstimate(st.rtt_s, st.bandwidth_bps)
        placement = ShortestDelay(self.links, [t for t in tiers if t.name not in self.links]) if self.links else None
        scheduler = make_scheduler(sim.scheduler_name, **sim.scheduler_params)
        # The same fleet as the live paths (serve/), its steps driven here on the virtual clock.
        self.fleet = fleet_of(scheduler, tiers, engines, self.clock, placement=placement, retry_pause_s=sim.retry_pause_s)
        self.session = self.fleet.session("sim")
        self.core = self.fleet.core  # for tests that read its scheduler
        self.tiers = {t.name: t for t in tiers}
        self._replies: list = []
        self._given_up: list = []
        self.result = SimResult(sim.workload.name, sim.scheduler_name, sim.horizon, mode, load, sim.seed)
        self.loop = VirtualLoop(self.clock, self._dispatch, self._engine, self._generated)
        self.robots: dict[str, _Robot] = {}
        self.backlog: list = []
        self._alone: dict[str, float] = {}
        self.served_by_tier: Counter = Counter()

    def arrive_at(self, t: float, tid: str, spec: TaskSpec, robot: int) -> None:
        self.loop.at(t, self._arrive, tid, spec, robot)

    def finish(self) -> SimResult:
        self.loop.run()
        r = self.result
        r.makespan_s = max(o.span.end for o in r.outcomes) - min(o.span.start for o in r.outcomes)
        st = self.fleet.core_stats()
        r.batches, r.dispatched = st["batches"], st["dispatched"]
        slots = sum(t.slots for t in self.tiers.values())
        r.engine_busy_s = st["busy_s"] / slots  # busy share of all slots
        r.served_by_tier = dict(self.served_by_tier)
        r.requeued, r.tier_failures = st["requeued"], st["failures_by_tier"]
        return r

    # --- robot side ----------------------------------------------------------------
    def _arrive(self, tid: str, spec: TaskSpec, robot: int) -> None:
        now = self.clock.now()
        # Robots ask trigger_slack x earlier than just in time (Simulator's knob).
        rb = self.robots[tid] = self.sim.robot_kind(tid, spec, robot, spec.rounds[self.sim.horizon], now,
                                       self.sim.l1 * self.sim.trigger_slack)
        self._send(rb, None)

    def _send(self, rb: _Robot, info: Optional[ExecInfo]) -> None:
        # Trace replay: the robot asks for the recorded horizon of this round; the rounds left
        # are known exactly (only `srpt` reads them).
        h = HorizonChoice("static", float(rb.horizon()))
        rb.sent = self.clock.now()
        # The task's type is what a server sees (its instruction); `remaining` learns from it.
        self._submit(InferenceRequest(rb.task_id, rb.round, info, h, remaining_rounds=rb.remaining(), task_type=rb.kind))

    def _submit(self, req: InferenceRequest) -> None:
        """Through the fleet: its reply (or its give-up after failed batches) comes back here."""
        fut = self.session.submit(req)
        if fut.done() and fut.exception() is not None:
            raise fut.exception()  # a trace the core refuses is a bug here, not a robot's error
        fut.add_done_callback(lambda f: self._answered(req, f))

    def _answered(self, req: InferenceRequest, fut) -> None:
        e = fut.exception()
        if e is None:
            self._replies.append(fut.result())
        elif isinstance(e, Refused) and e.code == "engine_failure":
            self._given_up.append(req)  # answered with an error: the robot asks for the same round again

    def _request(self, tid: str, info: ExecInfo) -> None:
        self._send(self.robots[tid], info)

    def _chunk(self, rb: _Robot, horizon: int) -> None:
        assert horizon == rb.horizon(), f"action manager returned H={horizon}, trace says {rb.horizon()}"
        now = self.clock.now()
        rb.round_trips.append(now - rb.sent)
        what, at, info = rb.answered(now)
        self.loop.at(at, self._request if what == "request" else self._task_done, rb.task_id, info)

    def _task_done(self, tid: str, info: ExecInfo) -> None:
        now = self.clock.now()
        rb = self.robots.pop(tid)
        rec = self.fleet.finish(tid, info)
        wr = wait_ratio(rec, now)
        self.result.outcomes.append(
            TaskOutcome(tid, rb.spec.id, rb.robot, Span(rb.arrival, now), len(rb.rounds), rb.idle, wr,
                        self._lower_bound(rb), tuple(rb.round_trips))
        )
        if self.backlog:  # fleet mode: the robot takes the next task
            spec = self.backlog.pop()
            self._arrive(f"{spec.id}@r{rb.robot}#{len(self.result.outcomes)}", spec, rb.robot)

    def _lower_bound(self, rb: _Robot) -> float:
        v = self._alone.get(rb.spec.id)
        if v is None:
            v = self._alone[rb.spec.id] = alone_latency(rb.rounds, rb.spec.control_hz, self.sim.l1)
        return v

    # --- engine side: the fleet's steps (core.Runner's), on the virtual clock ---------------
    def _dispatch(self) -> list:
        return self.fleet.dispatch_now()

    def _engine(self, d) -> tuple:
        """The engine model: the tier's engine profile (+ the link to a cloud tier), or a
        failure after the fault's delay while a fault is on: (seconds, (started, failed))."""
        started = self.fleet.begin(d)
        now = self.clock.now()
        fault = next((f for f in self.sim.faults if f.tier == d.tier and f.start_s <= now < f.end_s), None)
        if fault is not None:
            return fault.after_s, (started, True)
        dur = self.tiers[d.tier].profile.latency_s(len(d.requests))
        link = self.links.get(d.tier)
        if link is not None:
            dur += link.rtt_s + link.transfer_s(sum(payload_bytes(p.request) for p in d.requests))
        return dur, (started, False)

    def _generated(self, d, outcome: tuple) -> None:
        started, failed = outcome
        if failed:
            self.fleet.fail_batch(d, _Failed(f"tier {d.tier} is down"), started)
            link = self.links.get(d.tier)
            if link is not None:
                link.mark_down(self.clock.now())  # as RemoteEngine does on a failed call
            self.loop.at(self.clock.now() + self.sim.retry_pause_s, self.fleet.end_cooldown, d.tier)
            gave_up, self._given_up = self._given_up, []
            for req in gave_up:  # answered with an error: the robot asks for the same round again
                self._submit(req)
            return
        self.fleet.finish_batch(d, self.fleet.run_engine(d), started)
        replies, self._replies = self._replies, []
        for reply in replies:
            self.served_by_tier[reply.tier] += 1
            self._chunk(self.robots[reply.task_id], reply.horizon)
