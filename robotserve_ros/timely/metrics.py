"""Per-plan outcomes and the per-scheduler summary of the timely bench (seed 002 §7.1 metrics):
time utility (Eq. 1 at the response time), response time (request -> first skill handed to
the robot), robot waiting time (task completion - request - execution: every wait the
planning adds, first segment and later ones)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from ..core.timely import TUF


@dataclass
class PlanResult:
    job_id: int
    task_type: str
    urgent: bool
    tuf: list
    arrival: float
    exec_s: float
    n_segments: int
    segments: list = field(default_factory=list)    # (k, t_delivered, t_exec_start, exec_s)
    error: str = ""

    @classmethod
    def start(cls, spec) -> "PlanResult":
        return cls(spec.job_id, spec.task_type, spec.urgent, list(spec.tuf), spec.trigger, spec.exec_s, len(spec.skills))

    def segment(self, k: int, t_delivered: float, t_start: float, exec_s: float) -> None:
        self.segments.append((k, t_delivered, t_start, exec_s))

    @property
    def complete(self) -> bool:
        return len(self.segments) == self.n_segments and not self.error

    @property
    def response_time(self) -> Optional[float]:
        return (self.segments[0][1] - self.arrival) if self.segments else None

    @property
    def utility(self) -> Optional[float]:
        rt = self.response_time
        return TUF.from_list(self.tuf).utility(rt) if rt is not None else None

    @property
    def waiting_time(self) -> Optional[float]:
        if not self.complete:
            return None
        end = max(s[2] + s[3] for s in self.segments)
        return end - self.arrival - self.exec_s


def summarize(results: list[PlanResult], decision_ms: Optional[float]) -> dict:
    done = [r for r in results if r.complete]

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return round(statistics.fmean(xs), 4) if xs else None

    by_type = {}
    for tt in sorted({r.task_type for r in done}):
        rs = [r for r in done if r.task_type == tt]
        by_type[tt] = {"n": len(rs), "utility_mean": mean(r.utility for r in rs),
                       "response_time_mean_s": mean(r.response_time for r in rs),
                       "waiting_time_mean_s": mean(r.waiting_time for r in rs)}
    return {
        "utility_urgent_mean": mean(r.utility for r in done if r.urgent),
        "utility_normal_mean": mean(r.utility for r in done if not r.urgent),
        "utility_mean": mean(r.utility for r in done),
        "response_time_mean_s": mean(r.response_time for r in done),
        "waiting_time_total_s": round(sum(r.waiting_time for r in done), 3),
        "decision_ms_median": None if decision_ms is None else round(decision_ms, 4),
        # the README's reading of the TUF (utility 0 past the cutoff, never negative)
        "utility_urgent_mean_clamped": mean(max(r.utility, 0.0) for r in done if r.urgent),
        "utility_normal_mean_clamped": mean(max(r.utility, 0.0) for r in done if not r.urgent),
        "plans": len(results), "plans_complete": len(done),
        "per_task_type": by_type,
    }
