"""`robotserve openpi-server`'s server: one policy (a local directory or an allowed hub id),
its engine, a one-tier Fleet (serve/) with the configured scheduler, and the openpi
endpoint on that Fleet."""
from __future__ import annotations

import logging
import time

from ...core.clock import WallClock
from ...serve import fleet_over
from ...serve.build import engine_rtc_shape
from ..policy_source import PolicySource, resolve_policy
from .config import OpenPiConfig
from .endpoint import OpenPiEndpoint

log = logging.getLogger("robotserve.openpi")
TIER = "edge"


def build_engine(cfg: OpenPiConfig, source: PolicySource):
    from ...core.profile import EngineProfile
    from ...engines import make_engine

    ec = cfg.engine_config
    params = ec.chosen
    profile = ec.engine_profile() if ec.batch_sizes else None  # else the engine's own
    if ec.name == "lerobot":
        params["policy_dir"] = source.path
    else:
        params.setdefault("realtime", True)
        profile = profile or EngineProfile({1: 30.0})
    return make_engine(ec.name, profile, **params)


class OpenPiServer:
    """The endpoint on a fleet of its own; `port` is the bound port (useful with port 0)."""

    def __init__(self, cfg: OpenPiConfig, clock=None) -> None:
        self.cfg = cfg
        self.source = (resolve_policy(cfg.policy, cfg.policy_dirs, cfg.allow_hub, revision=cfg.revision)
                       if cfg.engine == "lerobot" else PolicySource(cfg.policy or "simulated"))
        t = time.monotonic()
        self.engine = build_engine(cfg, self.source)
        log.info("loaded %s in %.1f s", self.source.describe(), time.monotonic() - t)
        self.clock = clock or WallClock()
        self.fleet = fleet_over(self.engine, cfg.scheduler_config.build(), self.clock, tier=TIER,
                                max_batch=cfg.max_batch, slots=1, rtc_shape=engine_rtc_shape(self.engine)).start()
        policy = {"type": self.engine.policy_type or cfg.engine, **self.source.describe()}
        try:
            self.endpoint = OpenPiEndpoint(cfg.endpoint, self.fleet, policy).start()
        except (OSError, ValueError):
            self.fleet.close()
            self.engine.close()
            raise
        self.port = self.endpoint.port

    def stats(self) -> dict:
        s = self.fleet.core_stats()
        core = {k: s[k] for k in ("batches", "served", "errors", "mean_batch")}
        return {"endpoint": self.endpoint.stats(), "core": core}

    def stop(self) -> None:
        self.endpoint.close()
        self.fleet.close()
        self.engine.close()
