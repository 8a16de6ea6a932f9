"""A closed-loop fleet on the virtual clock: N Meta-World robots (MuJoCo, Meta-World's own
success) served by the production ServingCore and Runner, unchanged (through serve.Fleet), on sim/loop.py's
VirtualLoop (issue 34 item 2).

- Each robot runs core/robot_loop.py's RobotLoop at its control rate in virtual time (one
  tick event per control period, each robot at its own phase): trigger point, hold, re-send,
  episode bookkeeping, exactly as the live Meta-World robots (nodes/metaworld_robot.py). Its
  chunks join core/action_queue.py's ActionQueue at the timestep of the observation they were
  generated from (actions already past dropped, the overlap blended).
- Every batch the scheduler dispatches is computed for real by the trained flow policy
  (engines/flow_engine.py, models/metaworld_flow) from the observations the robots have when the
  batch starts: the core's own refresh step (Algorithm 1 lines 20-21 of seed 000) with
  stale_obs_s = 0 fetches each one at dispatch. The batch is charged the virtual time of an
  engine profile (ENGINE_PROFILES), never the wall time it took here, so results do not depend
  on the machine's load; only wall time does.
- Robot i's scored episodes have seeds scored_seed(i, k) in every configuration (paired across
  configurations of a regime); a robot that finished its scored episodes runs unscored ones,
  so the fleet stays at N until every robot is done.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Optional

import numpy as np

from ..core.action_queue import ActionQueue
from ..core.clock import VirtualClock
from ..core.observation import Observation
from ..core.profile import EngineProfile
from ..core.robot_loop import RobotLoop, rtc_leftover, trigger_actions
from ..core.rtc_account import RtcAccount, merge_rtc
from ..core.schedulers import make_scheduler
from ..serve import Tier, fleet_of
from ..serve.stats import load_stats
from ..core.types import ExecInfo, HorizonChoice, InferenceRequest
from .loop import VirtualLoop

# --- engine profiles, fixed before any run (issue 34 item 3) ------------------------------------
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)  # the batch sizes every profile of record is measured at
CPU_PROFILE = "pushgust_flow"  # the flow head's profile of record (the same 0.4M-parameter network; live/demo.py)


def gpu_like_ms(batch: int) -> float:
    """L(b) = 28 ms x (1 + 0.08 (b - 1)): batch 1 from a published pi0.5 latency on an A100; the
    slope is an assumption (issue 34)."""
    return 28.0 * (1.0 + 0.08 * (batch - 1))


def engine_profile(name: str) -> EngineProfile:
    """'cpu': the policy's measured CPU profile of record; 'gpu_like': the GPU-class curve at the
    same batch sizes (its saturation batch is the largest, 32, as the CPU profile's)."""
    if name == "cpu":
        from ..profiles import profile_of_record

        return profile_of_record(CPU_PROFILE)
    if name == "gpu_like":
        return EngineProfile({b: gpu_like_ms(b) for b in PROFILE_BATCHES})
    raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(ENGINE_PROFILES)}")


ENGINE_PROFILES = ("cpu", "gpu_like")

# The dynamic horizons' knobs, from the horizon study of record on this policy
# (reports/horizon/metaworld-flow-matching.md): plan agreement tau = 0.6 (0.971 at mean H 4.29, the
# demo's point) and schedule-normalised t = 0 (0.990 at mean H 1.79); H_min 1 as in the study.
HORIZON_KNOBS = {"agreement": 0.6, "schedule": 0.0}
HORIZON_PARAMS = {"agreement": {"h_min": 1}, "schedule": {"h_min": 1}}
POLICY_DIR = "models/metaworld_flow"

LIVE_FIRST_SEED = 100_000  # nodes/metaworld_robot.py's episode_seed default: the live demo's episodes
SCORED_SEED_BASE = 30_000_000  # far from the demos' (0..249), the horizon study's (1e7+) and the live demo's (1e5+)
UNSCORED_SEED_BASE = 40_000_000


def fleet_trigger(profile: EngineProfile, robots: int, control_hz: float) -> int:
    """The trigger point of a robot that expects the round trip of the batch the whole fleet makes."""
    return trigger_actions(profile.latency_s(min(robots, profile.saturation_batch)), control_hz)


def scored_seed(seed: int, robot: int, k: int, first: int = SCORED_SEED_BASE) -> int:
    """Episode k of robot i, nodes/metaworld_robot.py's rule (first + 101 (1000 seed + i) + k): the
    task (seed mod 5) differs between neighbouring robots at one time; first = 100000 (the live
    robots' episode_seed) gives the live demo's episodes."""
    return first + 101 * (1000 * seed + robot) + k


def unscored_seed(seed: int, robot: int, k: int) -> int:
    return scored_seed(seed, robot, k, UNSCORED_SEED_BASE)


@dataclass(frozen=True)
class FleetConfig:
    robots: int
    profile: str  # ENGINE_PROFILES
    scheduler: str
    horizon: str  # "static" | a HORIZON_KNOBS policy
    param: float  # static: H; else the policy's knob
    episodes: int = 1  # scored episodes per robot
    seed: int = 0
    max_steps: int = 200  # study/metaworld_task.MAX_STEPS
    control_hz: float = 80.0
    first_seed: int = SCORED_SEED_BASE  # scored_seed's first
    # Real-time chunking per robot (docs/rtc_serving.md): each request carries the robot's leftover, the
    # server sets d at dispatch, the engine inpaints (the paper's soft guidance), the robot splices at d.
    rtc: bool = False
    trigger: Optional[int] = None  # actions left at which a robot sends its next round (None: the latency rule)

    def __post_init__(self) -> None:
        if self.robots < 1 or self.episodes < 1 or self.max_steps < 1:
            raise ValueError("robots, episodes and max_steps must be >= 1")
        if self.horizon != "static" and self.horizon not in HORIZON_KNOBS:
            raise ValueError(f"horizon {self.horizon!r}: known static, {', '.join(HORIZON_KNOBS)}")

    @property
    def horizon_label(self) -> str:
        base = f"static H={int(self.param)}" if self.horizon == "static" else self.horizon
        return base + (f", trigger {self.trigger}" if self.trigger is not None else "") + (" + rtc" if self.rtc else "")


@dataclass
class Episode:
    robot: int
    seed: int
    task: str
    success: bool
    time_to_success_s: Optional[float]  # from the episode's first request to its success step's end
    duration_s: float  # first request -> end (success, or max_steps executed)
    steps: int
    idle_s: float
    rounds: int


@dataclass
class FleetResult:
    config: FleetConfig
    episodes: list = field(default_factory=list)
    makespan_s: float = 0.0  # virtual time until the last scored episode ended
    engine_busy_s: float = 0.0  # within the makespan
    batches: int = 0
    dispatched: int = 0
    trigger: int = 0
    unscored: int = 0
    backlogged_s: float = 0.0  # time more requests waited than one full batch (core/runner.py's account)
    wall_s: float = 0.0
    core: dict = field(default_factory=dict)
    rtc: dict = field(default_factory=dict)  # config.rtc: the robots' RtcAccounts together (core/rtc_account.merge_rtc)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = asdict(self.config)
        return d


class EnvPool:
    """Meta-World envs kept per task, reused across robots and configurations: loading a MuJoCo
    model costs ~0.25 s, a reset ~15 ms, so a robot takes a free env of its episode's task."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self.free: dict = {}
        self.made = 0

    def acquire(self, seed: int):
        from ..study.metaworld_task import MetaWorldEnv, TASKS, task_of

        name = TASKS[task_of(seed)]
        envs = self.free.setdefault(name, [])
        if envs:
            env = envs.pop()
        else:
            env = MetaWorldEnv(self.max_steps)
            self.made += 1
        env.max_steps = self.max_steps
        env.reset(seed)
        return env

    def release(self, env) -> None:
        self.free.setdefault(env.name, []).append(env)


class VirtualRobot:
    """A Meta-World robot's hooks for the RobotLoop: its env and its action queue."""

    __slots__ = ("index", "loop", "env", "queue", "seed", "scored_k", "unscored_k", "scored", "t_success", "next_tick",
                 "phase", "asleep", "rtc")

    def __init__(self, index: int, loop: RobotLoop, aggregate: str) -> None:
        self.index, self.loop, self.queue = index, loop, ActionQueue(aggregate)
        self.env = None
        self.scored_k = self.unscored_k = 0
        self.scored, self.t_success, self.next_tick = True, None, 0
        self.phase, self.asleep = 0.0, False
        self.rtc: Optional[RtcAccount] = None

    def execute(self) -> bool:
        a = self.queue.pop()
        if a is None:
            return False  # holding: nothing to execute
        self.env.step(a)
        return True

    def left(self) -> int:
        return len(self.queue)

    def task_over(self) -> bool:
        return self.env.done

    def needs_more(self) -> bool:
        return not self.env.done

    def observation(self, now: float) -> Observation:
        # The instruction is the task: what a server sees of a task's type (the `remaining` scheduler learns by it).
        return Observation(joints=self.env.observe(), instruction=self.env.name, timestep=self.queue.timestep, stamp=now)


class ClosedLoopFleet:
    """One configuration's run (see the module docstring); `run()` returns its FleetResult."""

    def __init__(self, cfg: FleetConfig, engine, pool: Optional[EnvPool] = None, aggregate: str = "weighted_average",
                 profile: Optional[EngineProfile] = None, resend_after_s: Optional[float] = None) -> None:
        self.cfg, self.engine = cfg, engine
        self.pool = pool or EnvPool(cfg.max_steps)
        self.profile = profile or engine_profile(cfg.profile)
        self.clock = VirtualClock()
        tier = Tier("edge", self.profile)
        # The serving port as every front end has it (serve.Fleet); its steps are driven below.
        self.fleet = fleet_of(make_scheduler(cfg.scheduler), [tier], {"edge": engine}, self.clock,
                              refresher=self._refresh, stale_obs_s=0.0, horizon_params=HORIZON_PARAMS)
        self.fleet.batch_listeners.append(self._on_replies)
        self.session = self.fleet.session("sim")
        self.loop = VirtualLoop(self.clock, self._dispatch, self._engine, self._generated, settle_instant=True)
        # The robots expect the round trip of the batch the whole fleet makes (live/demo.py's rule).
        self.trigger = cfg.trigger if cfg.trigger is not None else fleet_trigger(self.profile, cfg.robots, cfg.control_hz)
        self.period = 1.0 / cfg.control_hz
        self.choice = HorizonChoice(cfg.horizon, float(cfg.param) if cfg.horizon == "static"
                                    else HORIZON_KNOBS[cfg.horizon])
        self.by_task: dict = {}
        self.result = FleetResult(cfg, trigger=self.trigger)
        self.scored_left = cfg.robots * cfg.episodes
        self.stopped = False
        self._started: dict = {}  # dispatch id -> engine start (busy time within the makespan)
        # No reply is ever lost here, so a round is only late and never re-sent (None); a robot
        # waiting for its reply with nothing queued sleeps through its ticks (_wake counts them).
        self.resend_after_s = resend_after_s
        rng = np.random.default_rng([cfg.seed, 34])
        self.robots = []
        for i in range(cfg.robots):
            loop = RobotLoop(f"r{i}", cfg.control_hz, self.trigger, resend_after_s=self.resend_after_s or math.inf,
                             request_timeout_s=math.inf)
            r = VirtualRobot(i, loop, aggregate)
            r.rtc = RtcAccount() if cfg.rtc else None
            self.robots.append(r)
            r.phase = float(rng.uniform(0.0, self.period))  # robots tick out of phase, as separate machines do
            self._start_episode(r, 0.0)
            self.loop.at(r.phase, self._tick, r, r.phase)

    # --- robots ------------------------------------------------------------------------------
    def _start_episode(self, r: VirtualRobot, now: float) -> None:
        c = self.cfg
        if r.scored_k < c.episodes:
            r.seed, r.scored = scored_seed(c.seed, r.index, r.scored_k, c.first_seed), True
            r.scored_k += 1
        else:
            r.seed, r.scored = unscored_seed(c.seed, r.index, r.unscored_k), False
            r.unscored_k += 1
        if r.env is not None:
            self.pool.release(r.env)
        r.env = self.pool.acquire(r.seed)
        r.queue.reset()
        r.t_success = None
        # The task id names the episode, not the configuration: the engine's noise of a round
        # (engines/flow_engine.py: seeded by task and round) is the same in every configuration.
        r.loop.name = f"r{r.index}/ep{r.seed}"
        r.loop.task_k = -1
        r.loop.next_task(now)
        self.by_task[r.loop.task_id] = r

    def _tick(self, r: VirtualRobot, t0: float) -> None:
        if self.stopped:
            return
        now = self.clock.now()
        commanded, event = r.loop.tick(now, r)
        if commanded and r.t_success is None and r.env.success():
            r.t_success = now + self.period  # the step that succeeded ends one control period later
        if event == "finished":
            self._finish(r, now)
        elif event == "send":
            self._send(r, now)
        if self.stopped:
            return
        r.next_tick += 1
        if r.loop.outstanding and not r.queue and not r.env.done and self.resend_after_s is None:
            r.asleep = True  # holding until the reply: its ticks change nothing but the idle count
        else:
            self.loop.at(t0 + r.next_tick * self.period, self._tick, r, t0)

    def _wake(self, r: VirtualRobot, now: float) -> None:
        """The reply came: the ticks slept through (before now, on the robot's phase grid) count as
        held, and the next one runs as it would have."""
        r.asleep = False
        skipped = 0
        while r.phase + r.next_tick * self.period < now:
            r.next_tick += 1
            skipped += 1
        r.loop.held_ticks(skipped)
        self.loop.at(r.phase + r.next_tick * self.period, self._tick, r, r.phase)

    def _send(self, r: VirtualRobot, now: float) -> None:
        lp = r.loop
        info = lp.exec_info(r)
        rtc = rtc_leftover(r.queue.queued()) if r.rtc is not None and info is not None else None  # (none at round 0)
        req = InferenceRequest(lp.task_id, lp.round, info, self.choice, observation=r.observation(now), obs_stamp=now,
                               rtc=rtc)
        lp.sent(now)
        self.session.submit(req)  # the reply comes through the batch listener

    def _finish(self, r: VirtualRobot, now: float) -> None:
        lp = r.loop
        tid = lp.task_id
        if lp.task_start is not None:  # (a task that never sent a round is not the server's)
            # the server closes and frees the task at task_done (as the simulator does)
            self.fleet.finish(tid, ExecInfo(lp.exec_start, 0, self.cfg.control_hz))
        del self.by_task[tid]
        if r.scored:
            start = lp.task_start if lp.task_start is not None else now
            ok = r.env.success()
            self.result.episodes.append(Episode(
                r.index, r.seed, r.env.name, ok, (r.t_success - start) if ok else None, now - start,
                r.env.steps, lp.idle, lp.chunks))
            self.scored_left -= 1
            if self.scored_left == 0:
                self._stop(now)
                return
        else:
            self.result.unscored += 1
        self._start_episode(r, now)

    def _stop(self, now: float) -> None:
        self.stopped = True
        res = self.result
        res.makespan_s = now
        st = self.fleet.core_stats()
        busy = st["busy_s"] + sum(now - s for s in self._started.values())
        res.engine_busy_s = busy
        res.backlogged_s = load_stats(self.fleet, 0.0, {})["backlogged_s"]
        res.batches, res.dispatched = st["batches"], st["dispatched"]
        res.core = {k: v for k, v in self.fleet.core.snapshot().items() if not isinstance(v, dict)}
        if self.cfg.rtc:
            res.rtc = merge_rtc([r.rtc.snapshot() for r in self.robots])

    # --- the server: core.Runner's steps, on the virtual clock ----------------------------------
    def _refresh(self, reqs) -> list:
        """The robots' observations at the batch's start (Algorithm 1 line 20, no round trip here)."""
        now = self.clock.now()
        out = []
        for q in reqs:
            r = self.by_task.get(q.task_id)
            out.append(None if r is None else (r.observation(now), now))
        return out

    def _dispatch(self) -> list:
        if not self.stopped:
            return self.fleet.dispatch_now()
        return []

    def _engine(self, d) -> tuple:
        started = self.fleet.begin(d)  # refreshes the batch's observations
        self._started[d.id] = started
        return self.profile.latency_s(len(d.requests)), started

    def _generated(self, d, started: float) -> None:
        self._started.pop(d.id, None)
        self.fleet.finish_batch(d, self.engine.infer([p.request for p in d.requests]), started)

    def _on_replies(self, replies, d, _results) -> None:
        now = self.clock.now()
        first = {p.task_id: p.request.observation.timestep for p in d.requests}
        for reply in replies:
            r = self.by_task.get(reply.task_id)
            if r is None:
                continue  # the episode ended while its round was generated
            if r.rtc is not None:  # spliced at d (RTC §4), or blended when generated unguided (d = -1)
                d = -1 if reply.rtc_delay_steps is None else reply.rtc_delay_steps
                r.rtc.place(r.queue, SimpleNamespace(first_timestep=first[reply.task_id], rtc_delay_steps=d,
                                                     horizon=reply.horizon, chunk_len=reply.chunk_len),
                            np.asarray(reply.actions))
            else:
                r.queue.merge(first[reply.task_id], np.asarray(reply.actions))
            r.loop.answered(now)
            if r.asleep:
                self._wake(r, now)

    def run(self) -> FleetResult:
        t0 = time.monotonic()
        self.loop.run()
        if not self.stopped:
            raise RuntimeError("the closed-loop fleet stopped before every scored episode ended")
        self.result.wall_s = time.monotonic() - t0
        for r in self.robots:
            if r.env is not None:
                self.pool.release(r.env)
                r.env = None
        return self.result


def load_policy(policy_dir: str = POLICY_DIR, seed: int = 0, threads: int = 1):
    """The trained flow policy as the server's engine (study/horizon.py's loader)."""
    from ..study.horizon import load_engine

    return load_engine(policy_dir, seed=seed, threads=threads)


def run_config(cfg: FleetConfig, engine=None, pool: Optional[EnvPool] = None) -> FleetResult:
    return ClosedLoopFleet(cfg, engine if engine is not None else load_policy(seed=cfg.seed), pool).run()
