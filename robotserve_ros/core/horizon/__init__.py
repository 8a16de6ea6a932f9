"""Horizon-policy registry. Users add their own with `register_horizon_policy`."""
from __future__ import annotations

from ..registry import Registry
from .agreement import PlanAgreementHorizon
from .base import BadUpdates, HorizonPolicy
from .confidence import ConfidenceHorizon, confidence_horizon
from .learned import LearnedHorizon
from .schedule import ScheduleNormalisedHorizon
from .self_consistency import SelfConsistencyEngine, SelfConsistencyHorizon
from .static import StaticHorizon

HORIZON_POLICIES: Registry[HorizonPolicy] = Registry("horizon policy")
HORIZON_POLICIES.register("static", StaticHorizon)
HORIZON_POLICIES.register("confidence", ConfidenceHorizon)
HORIZON_POLICIES.register("schedule", ScheduleNormalisedHorizon)
HORIZON_POLICIES.register("self_consistency", SelfConsistencyHorizon)
HORIZON_POLICIES.register("learned", LearnedHorizon)
HORIZON_POLICIES.register("agreement", PlanAgreementHorizon)


def register_horizon_policy(name: str, factory) -> None:
    """Make `factory(**params) -> HorizonPolicy` selectable by clients under `name`."""
    HORIZON_POLICIES.register(name, factory)


def make_horizon_policy(name: str, **params) -> HorizonPolicy:
    return HORIZON_POLICIES.create(name, **params)


__all__ = [
    "HORIZON_POLICIES",
    "BadUpdates",
    "HorizonPolicy",
    "ConfidenceHorizon",
    "LearnedHorizon",
    "PlanAgreementHorizon",
    "ScheduleNormalisedHorizon",
    "SelfConsistencyEngine",
    "SelfConsistencyHorizon",
    "StaticHorizon",
    "confidence_horizon",
    "make_horizon_policy",
    "register_horizon_policy",
]
