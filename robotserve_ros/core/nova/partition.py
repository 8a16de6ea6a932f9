"""Stage profiles, the partition interface and Nova's partition plan (seed 003, §III-B, §III-C).

A *partition* splits the device's compute units between the decode worker and the front
worker (vision encode or LLM prefill, which never co-run, §III-D). Units are SMs or an
MPS percentage on a GPU, cores on a CPU: the plan only sees integers `0 < d < total`.

`PartitionMechanism` is the one interface the engine side implements (CPU: per-worker
thread counts / core affinity; GPU: MPS percentage or green contexts). `StageProfile` holds
per-unit stage latencies measured on a device, `PartitionPlan` turns them into Nova's
choice: the Pareto frontier of ideal latency vs throughput (Eq. 1-4), the latency-optimal
static shares n0 (Eq. 3) and the load-adaptive share n_d(p) (Eq. 5).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterable, Optional


class PartitionUnavailable(RuntimeError):
    """The mechanism cannot run on this machine (e.g. no GPU); the message says why."""


class PartitionMechanism(ABC):
    """How a stage worker gets its share of the device. `apply(stage, units)` is called by
    the worker itself before each forward pass (§III-D: per-forward-pass granularity)."""

    name = "abstract"
    unit = "units"

    @property
    @abstractmethod
    def total(self) -> int:
        ...

    def check(self) -> None:
        """Raise PartitionUnavailable with the reason when it cannot run here."""

    @abstractmethod
    def apply(self, stage: str, units: int) -> None:
        ...

    def describe(self) -> dict:
        return {"mechanism": self.name, "unit": self.unit, "total": self.total}


def _interp(points: dict, x: float) -> float:
    """Piecewise-linear in x over {x_i: y_i}; flat beyond the ends."""
    xs = sorted(points)
    if x <= xs[0]:
        return points[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if x <= b:
            return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    return points[xs[-1]]


@dataclass
class StageProfile:
    """Measured stage latencies per number of units (seconds).

    vision[u]: one image tile; prefill[u] = (a, b): a + b * tokens; decode[u][batch]: one
    iteration; corun[stage]: slow-down of a stage while the other worker runs (shared
    memory bandwidth / caches, §III-B2)."""

    total: int
    vision: dict
    prefill: dict
    decode: dict
    corun: dict = field(default_factory=lambda: {"front": 1.0, "decode": 1.0})
    unit: str = "cores"
    device: str = "cpu"
    measured: bool = True
    note: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> "StageProfile":
        def ik(m):
            return {int(k): v for k, v in m.items()}

        return cls(total=int(d["total"]), vision={int(k): float(v) for k, v in d["vision"].items()},
                   prefill={int(k): tuple(v) for k, v in d["prefill"].items()},
                   decode={int(k): {int(b): float(t) for b, t in v.items()} for k, v in d["decode"].items()},
                   corun=dict(d.get("corun", {"front": 1.0, "decode": 1.0})), unit=d.get("unit", "cores"),
                   device=d.get("device", "cpu"), measured=bool(d.get("measured", True)), note=d.get("note", ""))

    def to_dict(self) -> dict:
        return {"total": self.total, "unit": self.unit, "device": self.device, "measured": self.measured,
                "note": self.note, "vision": self.vision, "prefill": {k: list(v) for k, v in self.prefill.items()},
                "decode": self.decode, "corun": self.corun}

    def t_vision(self, units: int, tiles: int = 1, corun: bool = False) -> float:
        t = _interp(self.vision, units) * max(1, tiles)
        return t * (self.corun.get("front", 1.0) if corun else 1.0)

    def t_prefill(self, units: int, tokens: int, corun: bool = False) -> float:
        a = _interp({k: v[0] for k, v in self.prefill.items()}, units)
        b = _interp({k: v[1] for k, v in self.prefill.items()}, units)
        t = max(a + b * max(1, tokens), 1e-6)  # a fitted line must not go below zero
        return t * (self.corun.get("front", 1.0) if corun else 1.0)

    def t_decode(self, units: int, batch: int, corun: bool = False) -> float:
        per_u = {u: _interp(tb, batch) for u, tb in self.decode.items()}
        return _interp(per_u, units) * (self.corun.get("decode", 1.0) if corun else 1.0)


@dataclass(frozen=True)
class PlanPoint:
    n_v: int  # decode units while co-running with vision encode
    n_p: int  # decode units while co-running with LLM prefill
    latency_s: float
    throughput_rps: float


class PartitionPlan:
    """Nova's partition choice from a profile (§III-C).

    Ideal pipelined latency for static decode shares (n_v, n_p), with N output tokens:
      T = Tv(total-n_v) + Tp(total-n_p) + N * (a_v td(n_v) + a_p td(n_p))      (Eq. 1)
    where a_v, a_p (Eq. 2) are the fractions of decode time spent beside vision / prefill,
    proportional to their durations in a saturated pipeline, and throughput
      X = 1 / (Tv + Tp)                                                          (Eq. 4)
    since vision and prefill run one after the other while decode overlaps them."""

    def __init__(self, profile: StageProfile, *, tokens: int = 50, tiles: int = 1, prompt_tokens: int = 64,
                 decode_batch: int = 2, tbt_max_s: Optional[float] = None, p_saturate: int = 4) -> None:
        self.profile, self.tokens, self.tiles, self.prompt_tokens = profile, tokens, tiles, prompt_tokens
        self.decode_batch, self.p_saturate = decode_batch, max(2, int(p_saturate))
        self.shares = list(range(1, profile.total))
        if not self.shares:
            raise ValueError(f"a partition needs >= 2 {profile.unit}, the profile has {profile.total}")
        self.points = [self._point(nv, np_) for nv in self.shares for np_ in self.shares]
        self.frontier = pareto_frontier(self.points)
        best = min(self.points, key=lambda p: (p.latency_s, -p.throughput_rps))
        self.n0_v, self.n0_p = best.n_v, best.n_p  # Eq. 3
        td1 = profile.t_decode(profile.total, decode_batch)
        self.tbt_max_s = tbt_max_s if tbt_max_s is not None else 3.0 * td1
        ok = [u for u in self.shares if profile.t_decode(u, decode_batch, corun=True) <= self.tbt_max_s]
        self.n_min = min(ok) if ok else max(self.shares)  # the TBT bound of Eq. 5
        # slope k of Eq. 5: n_d reaches n_min when p_saturate requests are pending (§V-A5)
        self.k_v = max(0.0, (self.n0_v - self.n_min) / (self.p_saturate - 1))
        self.k_p = max(0.0, (self.n0_p - self.n_min) / (self.p_saturate - 1))

    def _point(self, n_v: int, n_p: int) -> PlanPoint:
        pr, T = self.profile, self.profile.total
        tv = pr.t_vision(T - n_v, self.tiles, corun=True)
        tp = pr.t_prefill(T - n_p, self.prompt_tokens, corun=True)
        a_v, a_p = tv / (tv + tp), tp / (tv + tp)  # Eq. 2
        td = a_v * pr.t_decode(n_v, self.decode_batch, True) + a_p * pr.t_decode(n_p, self.decode_batch, True)
        return PlanPoint(n_v, n_p, tv + tp + self.tokens * td, 1.0 / (tv + tp))

    def decode_units(self, front_stage: str, pending: int) -> int:
        """Eq. 5: n_d = max(n_min, n0 - k (p - 1)), p = requests in vision/prefill."""
        n0, k = (self.n0_v, self.k_v) if front_stage == "vision" else (self.n0_p, self.k_p)
        if n0 <= self.n_min:
            return n0
        return int(max(self.n_min, math.floor(n0 - k * (max(1, pending) - 1) + 1e-9)))

    def describe(self) -> dict:
        return {"n0_vision": self.n0_v, "n0_prefill": self.n0_p, "n_min": self.n_min, "k_vision": self.k_v,
                "k_prefill": self.k_p, "tbt_max_s": self.tbt_max_s,
                "frontier": [p.__dict__ for p in self.frontier]}


def pareto_frontier(points: Iterable[PlanPoint]) -> list[PlanPoint]:
    """Points no other point beats on both latency (lower) and throughput (higher)."""
    pts = sorted(points, key=lambda p: (p.latency_s, -p.throughput_rps))
    out, best_x = [], -math.inf
    for p in pts:
        if p.throughput_rps > best_x:
            out.append(p)
            best_x = p.throughput_rps
    return out


def paper_profile() -> StageProfile:
    """A GPU-shaped profile synthesized from the paper's own numbers (NOT measured here):
    CogAgent on an RTX A6000 with 84 SMs, Table I at full SMs (vision 806.8 ms, prefill
    324.1 ms, decode 28.9 ms, 30.6 ms at batch 10), compute-bound vision/prefill scaling
    about as 1/SMs, memory-bound decode saturating near 36 SMs (§III-B2, Fig. 4), co-run
    slow-downs of ~10-20 % (Table IV). Lets the scheduler run at GPU partition granularity."""
    total = 84
    units = list(range(2, total + 1, 2))
    vision = {n: 0.8068 * (total / n) ** 0.95 for n in units}
    prefill = {n: (0.024 * (total / n) ** 0.9, 0.0003 * (total / n) ** 0.9) for n in units}  # ~1000 tokens
    decode = {n: {b: 0.0289 * max(1.0, (36 / n) ** 0.6) * (1 + 0.0065 * (b - 1)) for b in (1, 2, 4, 8, 16)}
              for n in units}
    return StageProfile(total=total, vision=vision, prefill=prefill, decode=decode,
                        corun={"front": 1.1, "decode": 1.2}, unit="SMs", device="paper-shaped RTX A6000 (synthetic)",
                        measured=False, note="synthesized from the paper's Table I, Fig. 4, Table IV; not measured")
