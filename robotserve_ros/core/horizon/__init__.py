"""Horizon-policy registry. Users add their own with `register_horizon_policy`."""
from __future__ import annotations

from ..registry import Registry
from .base import HorizonPolicy
from .confidence import ConfidenceHorizon, confidence_horizon
from .static import StaticHorizon

HORIZON_POLICIES: Registry[HorizonPolicy] = Registry("horizon policy")
HORIZON_POLICIES.register("static", StaticHorizon)
HORIZON_POLICIES.register("confidence", ConfidenceHorizon)


def register_horizon_policy(name: str, factory) -> None:
    """Make `factory(**params) -> HorizonPolicy` selectable by clients under `name`."""
    HORIZON_POLICIES.register(name, factory)


def make_horizon_policy(name: str, **params) -> HorizonPolicy:
    return HORIZON_POLICIES.create(name, **params)


__all__ = [
    "HORIZON_POLICIES",
    "HorizonPolicy",
    "ConfidenceHorizon",
    "StaticHorizon",
    "confidence_horizon",
    "make_horizon_policy",
    "register_horizon_policy",
]
