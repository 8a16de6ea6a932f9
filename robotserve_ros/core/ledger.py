"""Task ledger: per-task generation and execution intervals and the wait ratio.

Seed 000 §3.2.1. Round j has a generation interval G_j (dispatch to chunk ready) and an
execution interval E_j (robot starts executing chunk j to its last action). The server
sees G_j itself; E_j arrives piggybacked on the next request (start of the running
execution, actions left, control rate) or on the final progress report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .types import ExecInfo


@dataclass
class Span:
    start: float
    end: Optional[float] = None

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass
class TaskRecord:
    task_id: str
    t_start: float  # arrival of the task's first request
    gens: list = field(default_factory=list)  # Span per round; end None while generating
    execs: list = field(default_factory=list)  # Span or None per round, end always known
    round_ids: list = field(default_factory=list)
    waits: list = field(default_factory=list)  # W_j of each closed round
    closed_wait: float = 0.0  # initial wait + sum of closed W_j
    attained: float = 0.0  # accumulated generation time (least attained service)
    last_exec_len: float = 0.0  # |E_last|, Kairos' estimate of the next execution
    finished_at: Optional[float] = None
    # The open (not yet closed) wait is max(0, min(now, open_cap) - open_anchor);
    # kept up to date on every event so a scheduling decision costs O(1) per request.
    open_anchor: float = float("inf")
    open_cap: float = float("inf")

    @property
    def rounds(self) -> int:
        return len(self.gens)


class TaskLedger:
    """Keeps each task's rounds and answers wait-ratio queries in O(1)."""

    def __init__(self, count_initial_wait: bool = True) -> None:
        # The gap from a task's first request to its first generation is lifetime spent
        # waiting for compute (Eq. 1's definition); Algorithm 1 alone would start at zero.
        self.count_initial_wait = count_initial_wait
        self.tasks: dict[str, TaskRecord] = {}

    # --- events -------------------------------------------------------------------
    def open_task(self, task_id: str, now: float) -> TaskRecord:
        rec = self.tasks[task_id] = TaskRecord(task_id, now)
        return rec

    def record_request(self, task_id: str, round_id: int, now: float, exec_info: Optional[ExecInfo]) -> int:
        """Add the task's next round; returns its index (0 for the first round)."""
        rec = self.tasks[task_id]
        k = rec.rounds
        if exec_info is not None and k > 0:
            self._set_exec(rec, k - 1, exec_info, now)
        rec.gens.append(None)
        rec.execs.append(None)
        rec.round_ids.append(round_id)
        self._close(rec)
        return k

    def cancel_last_round(self, task_id: str) -> None:
        """Forget a round whose request was withdrawn before it was dispatched."""
        rec = self.tasks[task_id]
        if rec.gens and rec.gens[-1] is None:
            rec.gens.pop()
            rec.execs.pop()
            rec.round_ids.pop()
            self._close(rec)

    def record_dispatch(self, task_id: str, k: int, now: float) -> None:
        rec = self.tasks[task_id]
        rec.gens[k] = Span(now)
        if k == 0 and self.count_initial_wait:
            rec.closed_wait += max(0.0, now - rec.t_start)
        self._close(rec)

    def record_requeue(self, task_id: str, k: int) -> None:
        """Round k's generation failed before it finished: it waits in the queue again."""
        rec = self.tasks[task_id]
        g = rec.gens[k]
        if g is not None and g.end is None:
            if k == 0 and self.count_initial_wait:
                rec.closed_wait -= max(0.0, g.start - rec.t_start)
            # W_{k-1} may have been closed by this dispatch's start: open it again.
            while len(rec.waits) > max(0, k - 1):
                rec.closed_wait -= rec.waits.pop()
            rec.gens[k] = None
            self._close(rec)

    def record_complete(self, task_id: str, k: int, now: float) -> None:
        rec = self.tasks[task_id]
        g = rec.gens[k]
        g.end = now
        rec.attained += g.length
        self._close(rec)

    def record_finish(self, task_id: str, now: float, exec_info: Optional[ExecInfo]) -> None:
        """The task's last execution phase is over (final progress report)."""
        rec = self.tasks[task_id]
        if exec_info is not None and rec.rounds > 0:
            self._set_exec(rec, rec.rounds - 1, exec_info, now)
        rec.finished_at = now
        self._close(rec)

    def remove(self, task_id: str) -> Optional[TaskRecord]:
        return self.tasks.pop(task_id, None)

    # --- queries ------------------------------------------------------------------
    def wait_ratio(self, task_id: str, now: float) -> float:
        """Eq. 1: accumulated wait over lifetime, in [0, 1]."""
        return wait_ratio(self.tasks[task_id], now)

    def total_wait(self, task_id: str, now: float) -> float:
        rec = self.tasks[task_id]
        return rec.closed_wait + open_wait(rec, now)

    # --- internals ----------------------------------------------------------------
    @staticmethod
    def _set_exec(rec: TaskRecord, j: int, info: ExecInfo, now: float) -> None:
        start = info.exec_start
        g = rec.gens[j]
        if g is not None and g.end is not None and start < g.end:
            start = g.end  # a chunk cannot run before it exists: clamp clock skew
        end = max(start, info.end(now))
        rec.execs[j] = Span(start, end)
        rec.last_exec_len = end - start

    def _close(self, rec: TaskRecord) -> None:
        """Close W_j for every round whose dominant side's next start is known (Fig. 8)."""
        j = len(rec.waits)
        while j + 1 < rec.rounds:
            g, e = rec.gens[j], rec.execs[j]
            if g is None or g.end is None or e is None:
                break
            if g.length >= e.length:  # generation-dominated: gap G_j end -> G_{j+1} start
                nxt = rec.gens[j + 1]
                if nxt is None:
                    break
                w = nxt.start - g.end
            else:  # execution-dominated: gap E_j end -> E_{j+1} start
                nxt = rec.execs[j + 1]
                if nxt is None:
                    break
                w = nxt.start - e.end
            w = max(0.0, w)
            rec.waits.append(w)
            rec.closed_wait += w
            j += 1
        self._refresh_open(rec)

    def _refresh_open(self, rec: TaskRecord) -> None:
        """Where the current, not yet closed, gap started (and where it stops growing)."""
        inf = float("inf")
        rec.open_anchor, rec.open_cap = inf, inf
        j = len(rec.waits)
        if j == 0 and rec.rounds and rec.gens[0] is None:
            if self.count_initial_wait:
                rec.open_anchor = rec.t_start
            return
        if j + 1 >= rec.rounds:
            return
        g, e = rec.gens[j], rec.execs[j]
        if g is None or g.end is None or e is None:
            return
        if g.length >= e.length:
            rec.open_anchor = g.end  # G_{j+1} has not started, else W_j were closed
            return
        rec.open_anchor = e.end  # robot idle since E_j ended, until chunk j+1 is ready
        nxt = rec.gens[j + 1]
        if nxt is not None and nxt.end is not None:
            rec.open_cap = nxt.end


def open_wait(rec: TaskRecord, now: float) -> float:
    w = (now if now < rec.open_cap else rec.open_cap) - rec.open_anchor
    return w if w > 0 else 0.0


def wait_ratio(rec: TaskRecord, now: float) -> float:
    """Eq. 1 (seed 000 §3.2.2): accumulated wait over the task's lifetime, in [0, 1]."""
    life = now - rec.t_start
    if life <= 0:
        return 0.0
    w = (now if now < rec.open_cap else rec.open_cap) - rec.open_anchor
    w = (rec.closed_wait + (w if w > 0 else 0.0)) / life
    return 1.0 if w > 1.0 else w
