"""Refresh ahead (seed 000 Algorithm 1 lines 20-21, done early): the part of `Runner` that
fetches, before a tier's batch ends, the stale observations of the requests its next batch
would take, so the engine does not wait on the robots between batches. Live driver only."""
from __future__ import annotations

import logging

from .schedulers import SchedulingContext

log = logging.getLogger("robotserve.runner")


class RefreshAhead:
    """Mixed into `Runner`: uses its core, lock, prefresh_lead_s, prefreshes, _prefresh_at,
    _prefresh_wake and _stop."""

    def prefresh(self, tier_name: str) -> int:
        """Seed 000 Algorithm 1 lines 20-21 ahead of time: fetch the observations that will be
        stale at the tier's next dispatch (prefresh_lead_s from now) for the requests the
        scheduler would put in its next batch now. Outside the lock (a round trip to the
        robots); a request dispatched or replaced meanwhile keeps what it has. The dispatch
        itself still decides and still refreshes whatever is stale then. Returns the number
        of observations replaced."""
        core, lead = self.core, self.prefresh_lead_s or 0.0
        if core.refresher is None or core.stale_obs_s is None:
            return 0
        with self.lock:
            if not core.pending:
                return 0
            tier, now = core.tier(tier_name), core.clock.now()
            ordered = core.scheduler.select(list(core.pending.values()), SchedulingContext(now, core.ledger, core.epoch),
                                            tier.batch_limit)[: tier.batch_limit]
            due = [p for p in ordered if p.request.obs_stamp is not None and now + lead - p.request.obs_stamp > core.stale_obs_s]
        if not due:
            return 0
        fresh = list(core.refresher([p.request for p in due]))
        if len(fresh) != len(due):
            fresh = [None] * len(due)
        done = 0
        with self.lock:
            for p, f in zip(due, fresh):
                core.refresh_gate.record(f is not None)
                if f is None:
                    self.prefreshes["failed"] += 1
                elif core.pending.get(p.task_id) is not p:
                    self.prefreshes["skipped"] += 1
                else:
                    p.request.observation, p.request.obs_stamp = f
                    self.prefreshes["ok"] += 1
                    done += 1
        return done

    def _prefresh_loop(self) -> None:
        while not self._stop.is_set():
            with self._prefresh_wake:
                now = self.core.clock.now()
                due = [t for t, at in self._prefresh_at.items() if at <= now]
                if not due:
                    nxt = min(self._prefresh_at.values(), default=None)
                    self._prefresh_wake.wait(0.5 if nxt is None else min(0.5, max(0.0, nxt - now)))
                    continue
                for t in due:
                    del self._prefresh_at[t]
            for t in due:
                try:
                    self.prefresh(t)
                except Exception:  # freshness is an optimisation: never cost a round
                    log.exception("refresh ahead on %s failed", t)
