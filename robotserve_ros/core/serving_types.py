"""The data of the serving loop (core/serving.py): where batches run (`Tier`), what runs there
(`Dispatch`), how a priority order is spread over free tiers (`Placement`, Algorithm 1 phase 3
of seed 000), the refresh of stale observations (`Refresher`, `RefreshGate`) and the counts
(`ServingStats`)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from .profile import EngineProfile
from .types import InferenceRequest, PendingRequest


@dataclass
class Tier:
    """A place batches run: a local engine (edge) or a remote GPU server (cloud)."""

    name: str
    profile: EngineProfile
    slots: int = 1  # batches it runs at once
    max_batch: Optional[int] = None  # default: the profile's saturation batch
    busy: int = 0

    @property
    def batch_limit(self) -> int:
        return self.max_batch or self.profile.saturation_batch

    @property
    def free(self) -> bool:
        return self.busy < self.slots


@dataclass
class Dispatch:
    id: int
    tier: str
    requests: list  # PendingRequest, in priority order
    started: float

    @property
    def slot(self) -> str:  # the contract's name for where an item runs
        return self.tier


class Placement(Protocol):
    def place(self, ordered: Sequence[PendingRequest], free: Sequence[Tier], now: float) -> list[tuple[Tier, list]]:
        """Assign a prefix of the priority order to free tiers (Algorithm 1 phase 3)."""
        ...


class FillInOrder:
    """Fill free tiers in the order given (edge first), each up to its batch limit."""

    def place(self, ordered, free, now):
        out, i = [], 0
        for tier in free:
            if i >= len(ordered):
                break
            n = tier.batch_limit
            out.append((tier, list(ordered[i : i + n])))
            i += n
        return out


# A refresher returns (observation, stamp) fetched from the robot, or None if it cannot.
# A refresher fetches fresh observations for a batch's stale requests, all at once and within
# its own deadline (dispatch must never wait on robots one by one): one (observation, stamp)
# or None per request, in order.
Refresher = Callable[[Sequence[InferenceRequest]], Sequence[Optional[tuple]]]


@dataclass
class ServingStats:
    errors: Counter = field(default_factory=Counter)
    last_error: dict = field(default_factory=dict)  # kind -> the newest refusal's reason, for the operator
    submitted: int = 0
    superseded: int = 0
    dispatched: int = 0
    batches: int = 0
    completed: int = 0
    requeued: int = 0
    dropped_replies: int = 0
    refreshes: int = 0
    refresh_failures: int = 0
    refresh_skipped: int = 0  # stale at dispatch, not asked: robots were not answering refreshes in time
    given_up: int = 0  # requests answered with an error after max_failures failed batches
    resent_requests: int = 0  # a round asked again while queued or generating: attached, not run twice
    replies_replayed: int = 0  # a round asked again after its reply: answered from the reply cache
    obs_age_sum: float = 0.0
    obs_age_n: int = 0
    obs_age_max: float = 0.0


class RefreshGate:
    """Whether a dispatch waits for fresh observations (Algorithm 1 line 20) or goes with the
    ones it has. The refresh is worth its wait only while robots answer it in time: an
    exponentially weighted success rate of recent refreshes (at dispatch and ahead of it)
    below `floor` closes the gate, so an overloaded fleet whose robots cannot answer does not
    cost the engine one refresh timeout per batch. Refreshes ahead of dispatch (off the
    engine's path) keep measuring; without them every `probe_every`-th closed batch still asks."""

    def __init__(self, floor: float = 0.25, alpha: float = 0.1, probe_every: int = 10) -> None:
        self.floor, self.alpha, self.probe_every = floor, alpha, probe_every
        self.success = 1.0
        self._closed_batches = 0

    def record(self, ok: bool) -> None:
        self.success += self.alpha * ((1.0 if ok else 0.0) - self.success)

    def open(self) -> bool:
        if self.success >= self.floor:
            return True
        self._closed_batches += 1
        return self._closed_batches % self.probe_every == 0
