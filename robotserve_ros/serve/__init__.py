"""The one port between client protocols and the serving core (pure Python: no rclpy, grpc
or torch imports). `build_fleet` puts engines, tiers, placement, the core and its Runner
together once; `Fleet.session(protocol, robot, auth)` opens a protocol's way in;
`Session.submit(req)` returns a future of the round's reply. See fleet.py."""
from __future__ import annotations

from ..core.runner import STAGES, StageTrace  # the stage observer's vocabulary, for front ends
from ..core.serving import Tier  # a place batches run: what a fleet is built over
from . import wire  # noqa: F401  (the engine core process's messages)
from .build import TierSet, build_fleet, build_tiers, fleet_of, fleet_over, server_fleet
from .fleet import REFUSALS, Fleet, Proof, Refused, Session

__all__ = ["REFUSALS", "STAGES", "Fleet", "Proof", "Refused", "Session", "StageTrace", "Tier", "TierSet",
           "build_fleet", "build_tiers", "fleet_of", "fleet_over", "server_fleet"]
