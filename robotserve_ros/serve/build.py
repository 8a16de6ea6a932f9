"""Where a Fleet is put together: engines, tiers (the local engine, remote GPU servers over
gRPC, Ray Serve pools), placement, the core and its Runner, once, for every front end.

`build_tiers(config, clock)` builds the engines and tiers of an inference server's config
(seed 000 §3.2.3: hybrid edge/cloud placement); `build_fleet(config, clock, ...)` puts the
core and its Runner over them. `fleet_over(engine, scheduler, clock, ...)` is the one-tier
fleet of a stand-alone endpoint (openpi, a LeRobot policy group, the GPU server).

A config error comes out as ValueError(where, what) (the parameter and the problem) or the
config's own ConfigError; the caller turns it into its one line."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

from ..core.admission import Admission, tier_rounds_per_s
from ..core.placement import hybrid_tiers
from ..core.serving import ServingCore, Tier
from .fleet import Fleet


@dataclass
class TierSet:
    """The engines a fleet serves on: `engine` is the local (edge) one."""

    engine: object
    tiers: list
    engines: dict
    placement: object = None
    pools: list = field(default_factory=list)  # Ray tiers: their slots follow their replicas

    def close(self) -> None:
        for eng in {id(x): x for x in [self.engine, *self.engines.values()]}.values():
            eng.close()


def build_tiers(c, clock) -> TierSet:
    """The edge engine, the cloud tiers (GPU servers: their profiles fetched from them; the
    links' down-until times are on `clock`, which the placement reads) and the Ray pools
    (a slot per replica, transport/ray_pool.py) of an InferenceServerConfig."""
    from ..engines import make_engine

    engine = c.engine.build()
    engines: dict = {}
    try:
        edge = Tier("edge", engine.profile, max_batch=c.max_batch or None)
        clouds = {n: {"slots": t.slots, "max_batch": t.max_batch, "rtt_s": t.rtt_s,
                      "bandwidth_bps": t.bandwidth_bps, **t.engine_params()} for n, t in c.tiers().items()}
        tiers, engines, placement = hybrid_tiers(
            edge, engine, clouds, lambda link, **kw: make_engine("remote", None, link=link, clock=clock.now, **kw),
            c.placement.name, c.placement.chosen)
        for n, t in c.ray_tier_configs().items():
            try:
                profile, kw = t.engine_params_for(c.engine, n, os.getpid())
                engines[n] = make_engine("ray", profile, **kw)
            except Exception as e:  # ray missing, a cluster not reachable, a replica that cannot start
                raise ValueError(n, f"{type(e).__name__}: {e}") from e
            tiers.append(Tier(n, engines[n].profile, slots=engines[n].slots, max_batch=t.max_batch or None))
    except Exception:
        TierSet(engine, [], engines).close()
        raise
    return TierSet(engine, tiers, engines, placement, list(c.ray_tier_configs()))


def build_fleet(c, clock, *, tiers: Optional[TierSet] = None, scheduler=None, refresher=None, rtc_shape=None,
                **fleet_kw) -> Fleet:
    """The fleet of an InferenceServerConfig `c` on `clock` (its scheduler and tiers built
    here unless given); fleet_kw go to Fleet (max_waiting, binder, task_timeout_s, observer,
    ...). Not started: call start(), then its Ray tiers follow their replicas."""
    scheduler = scheduler or c.scheduler.build()
    ts = tiers or build_tiers(c, clock)
    try:
        core = ServingCore(scheduler, ts.tiers, clock, horizon_params=c.horizon, placement=ts.placement,
                           refresher=refresher, stale_obs_s=c.stale_obs_s, rtc_shape=rtc_shape,
                           max_obs_age_s=getattr(c, "max_obs_age_s", 0.0) or None)
    except (TypeError, ValueError) as e:  # a horizon knob the policy does not take: say which
        ts.close()
        raise ValueError("horizon", str(e)) from e
    adm = getattr(c, "admission", None)  # (an InferenceServerConfig's; other front ends admit everyone)
    if adm is not None and "admission" not in fleet_kw and (adm.max_tasks or adm.by_capacity):
        fleet_kw["admission"] = Admission(adm.max_tasks, tier_rounds_per_s(ts.tiers) if adm.by_capacity else None,
                                          adm.headroom, idle_s=c.task_timeout_s)
    fleet = Fleet(core, ts.engines, **fleet_kw)
    fleet.engine, fleet.pools = ts.engine, ts.pools
    return fleet


def server_fleet(c, clock, tiers: TierSet, *, refresher, binder, on_error, scheduler=None, **fleet_kw) -> Fleet:
    """An inference server's fleet (InferenceServerConfig `c`), the same whether its core runs in
    the node's process or in a core process of its own (serve/core_process.py): the RTC shape of
    its engine, its waiting-call and task limits, refresh ahead of the next batch."""
    return build_fleet(c, clock, tiers=tiers, scheduler=scheduler, refresher=refresher, binder=binder,
                       rtc_shape=(tiers.engine.action_dim, tiers.engine.chunk_len), max_waiting=c.max_waiting,
                       task_timeout_s=c.task_timeout_s, now=time.monotonic, on_error=on_error,
                       prefresh_lead_s=min(0.5 * c.stale_obs_s, 2 * c.refresh_timeout_s), **fleet_kw)


def fleet_over(engine, scheduler, clock, *, tier: str = "edge", max_batch: Optional[int] = None,
               slots: Optional[int] = None, refresher=None, stale_obs_s: Optional[float] = None,
               serve_with=None, rtc_shape=None, **fleet_kw) -> Fleet:
    """A one-tier fleet: `engine` (or `serve_with`, a wrapper the runner calls instead) on
    one tier of `slots` slots (default: the engine's own, else 1). rtc_shape: (action_dim,
    chunk_len) an RTC leftover is checked against at submit (engine_rtc_shape). Not started."""
    n = slots if slots is not None else getattr(engine, "slots", 1)  # a test double may not be an Engine
    fleet = fleet_of(scheduler, [Tier(tier, engine.profile, slots=n, max_batch=max_batch)], {tier: serve_with or engine},
                     clock, refresher=refresher, stale_obs_s=stale_obs_s, rtc_shape=rtc_shape, **fleet_kw)
    fleet.engine = engine
    return fleet


def engine_rtc_shape(engine) -> Optional[tuple]:
    """(action_dim, chunk_len) of an engine that inpaints (supports_rtc), for ServingCore's check of
    a request's RTC leftover when it arrives; None otherwise."""
    dim, chunk = getattr(engine, "action_dim", None), getattr(engine, "chunk_len", None)
    ok = getattr(engine, "supports_rtc", False) and isinstance(dim, int) and isinstance(chunk, int)
    return (dim, chunk) if ok else None


def fleet_of(scheduler, tiers: list, engines: dict, clock, *, placement=None, refresher=None,
             stale_obs_s: Optional[float] = None, horizon_params=None, rtc_shape=None, **fleet_kw) -> Fleet:
    """A fleet over given tiers and their engines (the simulator's: a virtual clock, its
    engine model per tier, placement over them). Not started; a simulator drives its steps."""
    core = ServingCore(scheduler, tiers, clock, placement=placement, refresher=refresher, stale_obs_s=stale_obs_s,
                       rtc_shape=rtc_shape, **({} if horizon_params is None else {"horizon_params": horizon_params}))
    fleet = Fleet(core, engines, **fleet_kw)
    fleet.engine, fleet.pools = next(iter(engines.values())), []
    return fleet
