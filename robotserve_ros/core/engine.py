"""The Engine role: run one batch of requests through a model and return action chunks."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from .profile import EngineProfile
from .types import ChunkResult, InferenceRequest


class Engine(ABC):
    """A model runner (torch, remote GPU server, simulated). The dispatcher reads `profile`
    to size batches and estimate latency; `infer` returns one result per request, in order."""

    name = "?"
    profile: EngineProfile
    # Whether infer() honours a request's rtc guide (core/rtc.py); engines that do not
    # generate unguided and leave ChunkResult.rtc_delay_steps None.
    supports_rtc = False

    @abstractmethod
    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]: ...

    def forget(self, task_id: str) -> None:
        """Drop what the engine keeps for a finished task (its observation history); no-op here."""

    def close(self) -> None:
        """Release what the engine holds (models, connections)."""
