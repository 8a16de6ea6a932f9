"""The rules of `robotserve bench robots-per-engine` (issue 40), apart from any server or socket:
the engine curve, the fleet sizes, what "fed" means, capacity, the predicted capacity from the
simulator, and the report's shape. Pure: numpy and the simulator only, so tests check the
rules on synthetic rows.
"""
from __future__ import annotations

import statistics
from typing import Optional, Sequence

import numpy as np

from ..sim.closed_loop import gpu_like_ms

# The arm's motion in every server's actions (robotserve's endpoints and LeRobot's own server
# alike): a swing of +-30 degrees per joint at a peak of 60 deg/s (about 2 s per swing), joints a
# radian apart in phase. LeRobot's servers skip an observation whose joint state lies within L2
# 1.0 of the last one they predicted on unless the client's queue ran dry (must_go); SO-101
# joints are in degrees and an arm doing a task moves several degrees per 100 ms, so an arm
# that barely moves (the sine of 0.5 the simulator draws, or zeros) would make every early
# observation "too similar" and each robot run dry once per chunk: LeRobot's semantics on a
# robot that does not exist. At this speed the state moves >= 2 (L2) per 20 ms tick.
ARM_SWING_DEG = 30.0
ARM_PEAK_SPEED_DEG_S = 60.0


def arm_chunk(t_s: float, n: int, hz: float, dim: int) -> np.ndarray:
    """n actions (degrees) of the arm's motion from time t_s (s, any one clock of the machine),
    one per control period: the same path for every server, whatever its rounds."""
    t = t_s + np.arange(n, dtype=np.float64)[:, None] / hz
    w = ARM_PEAK_SPEED_DEG_S / ARM_SWING_DEG  # rad/s: peak speed = swing x w
    return (ARM_SWING_DEG * np.sin(w * t + np.arange(dim))).astype(np.float32)

SERVERS = ("robotserve", "openpi_serial", "lerobot")
PROTOCOLS = ("ros", "openpi", "lerobot")
# A curve by name: a fixed one, or None where the bench measures it on its own device before the
# rows (smolvla_cpu: the real tiny SmolVLA at one torch thread, bench/rpe_smolvla.py).
CURVES = {"gpu_like": gpu_like_ms, "smolvla_cpu": None}
IDLE_SLACK = 0.05  # "fed": idle share <= the batch-1 idle share + 5 points
CLIENT_BOUND_BUSY = 0.80  # a client core busier than this limits what the run can show
ENGINE_TOL = 2.0  # engine time more than 2x off its curve: the row is invalid
ROW_KEYS = ("server", "protocol", "curve", "robots", "repeat", "fed", "rt_p50_ms", "rt_p95_ms", "idle_fraction",
            "mean_batch", "valid", "client_core_busy", "refusals")  # the keys, then the server's refusals
REPORT_KEYS = ("engine", "rows", "capacity", "added_latency_ms")


def key(server: str, protocol: str, curve: str) -> str:
    return f"{server}_{protocol}_{curve}"


def fleet_sizes(max_robots: int) -> list:
    """1, 2, ... 16, then steps of at most 25 % (issue 40 item 4)."""
    out = list(range(1, min(16, max_robots) + 1))
    while out[-1] < max_robots:
        out.append(min(max_robots, max(out[-1] + 1, int(out[-1] * 1.25))))
    return out


def leftover_s(horizon: int, trigger: int, control_hz: float) -> float:
    """What the leftover covers once the robot asks at the trigger point: (H - trigger) x dt
    is when it asks; it then has `trigger` actions. The issue's budget: (H - trigger) x dt."""
    return (horizon - trigger) / control_hz


def curve_fn(name: str, points: Optional[dict] = None):
    """The curve `name` as ms per batch size: the fixed one, or, for a measured curve, linear
    between the measured batch sizes (points: {batch: ms}) and extended along its last segment
    past the largest (never below the largest measured point)."""
    if CURVES[name] is not None:
        return CURVES[name]
    if not points:
        raise ValueError(f"curve {name!r} is measured by the bench: give its points")
    bs = np.array(sorted(int(b) for b in points), dtype=float)
    ms = np.array([float(points[int(b)]) for b in bs])
    slope = (ms[-1] - ms[-2]) / (bs[-1] - bs[-2]) if len(bs) > 1 else 0.0

    def ms_at(b: int) -> float:
        if b > bs[-1]:
            return float(ms[-1] + max(0.0, slope) * (b - bs[-1]))
        return float(np.interp(b, bs, ms))

    return ms_at


def robot_fed(idle_share: float, rt_p95_s: float, idle_share_b1: float, budget_s: float) -> bool:
    """Issue 40 item 4: idle share <= its batch-1 idle share + 5 points, and p95 round trip
    within what the leftover covers at the trigger point."""
    return idle_share <= idle_share_b1 + IDLE_SLACK + 1e-12 and rt_p95_s <= budget_s + 1e-12


def engine_valid(calls: Sequence, curve_ms) -> bool:
    """calls: (batch, measured ms). Valid when 95 % of calls took between half and twice the
    curve (a single late wake-up of a loaded machine does not void a run; a drifting engine does)."""
    if not calls:
        return False
    r = np.array([ms / curve_ms(b) for b, ms in calls])
    return bool(np.percentile(r, 95) <= ENGINE_TOL and np.percentile(r, 5) >= 1.0 / ENGINE_TOL)


def make_row(server, protocol, curve, robots, repeat, per_robot: list, idle_b1: float, budget_s: float,
             calls: Sequence, client_busy: float, refusals: int = 0, curve_ms=None) -> dict:
    """One attempted run. per_robot: {"idle_s", "task_s", "rt_s": [...]} for each robot that
    reported; a robot that did not report makes the row unfed. refusals: what the server
    refused during the run (connections, calls, requests; a cap the run hit): a row with any is
    unfed, whatever its robots' figures (issue 40 wants zero under the default caps).
    curve_ms: the curve the engine time is held to (a measured curve's; else CURVES[curve])."""
    rts = [x for r in per_robot for x in r["rt_s"]]
    idle = [r["idle_s"] / r["task_s"] for r in per_robot]
    fed = not refusals and len(per_robot) == robots and all(
        r["rt_s"] and robot_fed(i, float(np.percentile(r["rt_s"], 95)), idle_b1, budget_s)
        for r, i in zip(per_robot, idle))
    pct = (lambda q: round(float(np.percentile(rts, q)) * 1e3, 2)) if rts else (lambda q: None)
    row = {"server": server, "protocol": protocol, "curve": curve, "robots": robots, "repeat": repeat, "fed": fed,
           "rt_p50_ms": pct(50), "rt_p95_ms": pct(95), "idle_fraction": round(statistics.fmean(idle), 4) if idle else None,
           "mean_batch": round(statistics.fmean(b for b, _ in calls), 2) if calls else None,
           "valid": engine_valid(calls, curve_ms or CURVES[curve]), "client_core_busy": round(client_busy, 3),
           "refusals": int(refusals)}
    assert tuple(row) == ROW_KEYS
    return row


def capacity_of(rows: list) -> dict:
    """One server/protocol/curve's rows: per repeat the largest fleet with it and every smaller
    one fed (and valid), the first unfed size; measured = the median over repeats, its range
    beside it. Client-bound when the client core was over 80 % busy at or below the first
    unfed size: the capacity is then only a lower bound, reported as ">= N"."""
    per = {}
    for rep in sorted({r["repeat"] for r in rows}):
        mine = sorted((r for r in rows if r["repeat"] == rep), key=lambda r: r["robots"])
        cap, first = 0, None
        for r in mine:
            if r["fed"] and r["valid"] and first is None:
                cap = r["robots"]
            elif first is None:
                first = r["robots"]
        bound = any(r["client_core_busy"] > CLIENT_BOUND_BUSY for r in mine if first is None or r["robots"] <= first)
        per[rep] = (cap, first, bound, all(r["valid"] for r in mine if first is None or r["robots"] <= first))
    caps = [c for c, _, _, _ in per.values()]
    firsts = [f for _, f, _, _ in per.values() if f is not None]
    measured = int(statistics.median(caps)) if caps else 0
    bound = any(b for _, _, b, _ in per.values())
    return {"measured": measured, "predicted": None,
            "first_unfed": int(statistics.median(firsts)) if len(firsts) == len(per) and firsts else None,
            "client_bound": bound, "reported": f">= {measured}" if bound else str(measured),
            "per_repeat": [c for c in caps], "range": [min(caps), max(caps)] if caps else None,
            "valid_rows_only": all(v for *_, v in per.values()),
            "rows_with_refusals": sum(1 for r in rows if r.get("refusals"))}


def paired_ratio(ours: dict, theirs: dict) -> Optional[dict]:
    """Capacity ratios repeat by repeat (repeat r of both ran interleaved, under the same load):
    the median and the range over repeats (with 3 repeats the range is the interval there is)."""
    pairs = [(a, b) for a, b in zip(ours["per_repeat"], theirs["per_repeat"])]
    rat = [a / b if b else None for a, b in pairs]
    if not rat or any(x is None for x in rat):
        return {"ratios": rat, "median": None, "range": None}
    return {"ratios": [round(x, 2) for x in rat], "median": round(statistics.median(rat), 2),
            "range": [round(min(rat), 2), round(max(rat), 2)]}


def round_trip_budget_s(horizon: int, trigger: int, control_hz: float, latest_only: bool = False) -> float:
    """The fed rule's round trip: the bench's own robots, leftover_s; LeRobot's RobotClient
    (latest_only), its reply before the `trigger` actions it asked with run out: trigger x dt."""
    return trigger / control_hz if latest_only else leftover_s(horizon, trigger, control_hz)


def predicted_capacity(sizes: Sequence, *, curve: str, horizon: int, trigger: int, control_hz: float,
                       rounds: int, phases_seed: int, budget_s: float, scheduler: str = "remaining",
                       serial: bool = False, latest_only: bool = False, points: Optional[dict] = None) -> dict:
    """The simulator's capacity on the same curve, fleet sizes, chunking and start phases, by
    the same rule as the bench: the largest size whose robots all keep idle share <= the
    one-robot share + 5 points and p95 round trip <= budget_s (round_trip_budget_s).
    serial: one request at a time (max_batch 1, FIFO), the serial servers' shape.
    latest_only: the robots are LeRobot's RobotClient (sim/simulator.py's _LatestOnlyRobot): a
    chunk replaces the queue, one request per (H - 1 - trigger) ticks, not one per H.
    points: a measured curve's {batch: ms} (curve_fn)."""
    from ..sim.simulator import Simulator
    from ..sim.workload import TaskSpec, Workload

    curve_ms = curve_fn(curve, points)
    prof = {b: curve_ms(b) for b in (1, 2, 4, 8, 16, 32, 64, 128)}
    if serial:
        prof = {1: prof[1]}
    rnds = {"static": (horizon,) * rounds, "dynamic": (horizon,) * rounds}
    # The robots ask with `trigger` actions left: the slack that makes ceil(slack x L(1) x hz) = trigger.
    slack = max(1.0, (trigger - 0.5) / (prof[1] / 1e3 * control_hz))
    worst, cap, first, idle1 = {}, 0, None, None
    for n in sizes:
        wl = Workload("robots-per-engine", prof, tuple(TaskSpec(f"rpe-{i}", control_hz, rnds) for i in range(n)))
        sim = Simulator(wl, "fifo" if serial else scheduler, seed=0, trigger_slack=slack, latest_only=latest_only)
        res = sim.run_fleet(n, starts=start_phases(n, horizon / control_hz, phases_seed))
        shares = [o.idle_s / o.latency for o in res.outcomes]
        p95 = [float(np.percentile(o.round_trips, 95)) for o in res.outcomes]
        idle1 = shares[0] if idle1 is None else idle1
        worst[n] = {"max_idle_share": round(max(shares), 4), "max_rt_p95_ms": round(1e3 * max(p95), 2)}
        if all(robot_fed(i, p, idle1, budget_s) for i, p in zip(shares, p95)) and first is None:
            cap = n
        elif first is None:
            first = n
            break
    return {"predicted": cap, "first_unfed": first, "trigger_actions": trigger, "per_size": worst}


def start_phases(n: int, period_s: float, seed: int) -> list:
    """Robots start at seeded phases within one chunk period: unsynchronised, as real ones are,
    and the same phases in the bench and in the simulator."""
    return sorted(float(x) for x in np.random.default_rng([seed, n]).uniform(0.0, period_s, n))


def check_report(rep: dict) -> None:
    """The report of record's shape (issue 40): raises ValueError naming what is off."""
    if tuple(rep) != REPORT_KEYS:
        raise ValueError(f"report keys {tuple(rep)} != {REPORT_KEYS}")
    for r in rep["rows"]:
        if tuple(r) != ROW_KEYS:
            raise ValueError(f"row keys {tuple(r)} != {ROW_KEYS}")
    for section, must in (("capacity", {"measured", "predicted", "first_unfed", "client_bound"}),
                          ("added_latency_ms", {"p50", "p95"})):
        for k, v in rep[section].items():
            s, p, c = _split_key(k)
            if s not in SERVERS or p not in PROTOCOLS or c not in CURVES:
                raise ValueError(f"{section} key {k!r} is not <server>_<protocol>_<curve>")
            if not must <= set(v):
                raise ValueError(f"{section}[{k!r}] lacks {sorted(must - set(v))}")


def _split_key(k: str) -> tuple:
    for s in SERVERS:
        if k.startswith(s + "_"):
            rest = k[len(s) + 1:]
            for p in PROTOCOLS:
                if rest.startswith(p + "_"):
                    return s, p, rest[len(p) + 1:]
    return None, None, None
