"""Horizon-policy registry. Users add their own with `register_horizon_policy`."""
from __future__ import annotations

from ..registry import Registry
from .agreement import PlanAgreementHorizon
from .base import BadUpdates, HorizonPolicy, respect_rtc_delay
from .confidence import ConfidenceHorizon, confidence_horizon
from .learned import LearnedHorizon
from .schedule import ScheduleNormalisedHorizon
from .self_consistency import SelfConsistencyEngine, SelfConsistencyHorizon
from .static import StaticHorizon

HORIZON_POLICIES: Registry[HorizonPolicy] = Registry("horizon policy", {
    "static": StaticHorizon, "confidence": ConfidenceHorizon, "schedule": ScheduleNormalisedHorizon,
    "self_consistency": SelfConsistencyHorizon, "learned": LearnedHorizon, "agreement": PlanAgreementHorizon,
})


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
    "respect_rtc_delay",
]
