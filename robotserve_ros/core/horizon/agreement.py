"""Plan-agreement horizon: §2.2's offline criterion, measured online for free (beyond the paper).

Seed 000 §2.2 finds the round-optimal H by comparing a re-planned trajectory with the recorded
one. The server holds exactly such a pair at every round: the new chunk is a re-plan from a
fresh observation, and the task's previous chunk says what the robot would have done next.
Where they agree, the world went as the previous plan expected and open-loop actions are not
going stale; where they part (a gust moved the puck, contact changed), re-plan sooner. So:
H = the number of leading actions on which the new chunk agrees (within `tau`, action units
divided by `scale`) with the rest of the previous chunk (the whole chunk when the overlap
agrees throughout), grown at most `growth` x the previous H per round (an agreeing but
short overlap is weak evidence), within [h_min, chunk]. The first
round of a task, or a chunk without its task id, gets h_min. No extra compute: one chunk per
round, as static H.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional

import numpy as np

from ..types import HorizonDecision
from .base import BadUpdates, HorizonPolicy


class PlanAgreementHorizon(HorizonPolicy):
    name = "agreement"
    knob, knob_above = "plan-agreement threshold tau", 0.0

    def __init__(self, tau: float = 10.0, h_min: int = 1, growth: float = 2.0, scale=None,
                 max_tasks: int = 100_000) -> None:
        self.tau = self._set_bounds(tau, h_min)
        if not (math.isfinite(growth) and growth >= 1):
            raise ValueError("growth must be a finite number >= 1")
        self.growth = float(growth)
        self.scale = None if scale is None else np.asarray(scale, np.float64)
        self.max_tasks = int(max_tasks)
        # task_id -> (round_id, actions, H) of its latest round, and of the one before it (a
        # round served again, e.g. after a requeue, compares with the round before it).
        self._last: OrderedDict = OrderedDict()

    def forget(self, task_id: str) -> None:
        self._last.pop(task_id, None)

    def choose(self, result, param=None):
        a = np.asarray(result.actions, np.float64)
        n = len(a)
        if a.ndim != 2 or not np.all(np.isfinite(a)):
            raise BadUpdates(f"actions must be a finite [chunk, action_dim] array, got shape {a.shape}")
        tau = self.tau if param is None else float(param)
        tid, rnd = result.task_id, result.round_id
        if tid is None or rnd is None:
            return HorizonDecision(min(self.h_min, n), f"no task id with the chunk: H_min={self.h_min}")
        entry = self._last.get(tid)
        prev = None
        if entry is not None:
            latest, before = entry
            if latest[0] < rnd:
                prev = latest
            elif latest[0] == rnd:
                prev = before  # the same round again
            # a smaller round id: the task restarted; no previous plan
        rest = None if prev is None or prev[1].shape != a.shape else prev[1][prev[2]:]
        if rest is None:
            h, why = min(self.h_min, n), "no previous plan of this task"
        elif len(rest) == 0:
            h, why = min(self.h_min, n), "the previous plan was executed to its end: nothing to compare, H_min"
        else:
            m = min(len(rest), n)
            d = a[:m] - rest[:m]
            if self.scale is not None:
                d = d / self.scale
            off = np.linalg.norm(d, axis=-1) > tau
            # No disagreement on the whole overlap: nothing says the plan went stale, so the
            # growth cap alone bounds H (it may pass the overlap's end).
            agree = int(np.argmax(off)) if off.any() else n
            cap = max(self.h_min, int(math.floor(self.growth * prev[2])))
            h = min(self.clamp(agree, n), cap)
            why = f"agrees with the previous plan on {min(agree, m)} of {m} actions (tau={tau:g}), growth cap {cap}: H={h}"
        if entry is not None and entry[0][0] == rnd:
            self._last[tid] = ((rnd, a, h), entry[1])
        else:
            self._last[tid] = ((rnd, a, h), entry[0] if entry is not None and entry[0][0] < rnd else None)
        self._last.move_to_end(tid)
        while len(self._last) > self.max_tasks:
            self._last.popitem(last=False)
        return HorizonDecision(h, why)
