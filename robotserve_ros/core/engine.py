"""The Engine role: run one batch of requests through a model and return action chunks.

Everything the serving path reads of an engine is declared here, with the value an engine
that does not say means: a stand-in engine (simulated, a remote GPU server) takes whatever
observation comes and names no cameras; a LeRobot policy fills in what its checkpoint says.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Sequence

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
    # Whether the engine class can inpaint at all (a SmolVLA checkpoint then decides supports_rtc).
    rtc_capable = False
    # What it takes: an ObservationSpec (cameras, size, joints); None: whatever comes.
    observation_spec = None
    # The policy's camera keys and their (C, H, W) shapes, its joint-state width; None: any.
    image_keys: Optional[list] = None
    image_shapes: Optional[list] = None
    state_dim: Optional[int] = None
    # Its output: action columns, their names, actions per chunk; None: not known.
    action_dim: Optional[int] = None
    action_names: Optional[list] = None
    chunk_len: Optional[int] = None
    # Where it came from (a LeRobot checkpoint: its type and folder); None for stand-ins.
    policy_type: Optional[str] = None
    policy_dir: Optional[str] = None
    # Batches it runs at once (a Ray pool: one per replica).
    slots = 1

    @abstractmethod
    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]: ...

    def forget(self, task_id: str) -> None:
        """Drop what the engine keeps for a finished task (its observation history); no-op here."""

    def close(self) -> None:
        """Release what the engine holds (models, connections)."""


# The attributes above, for the engine contract test and for wrappers that pass them on.
DECLARED = ("name", "profile", "supports_rtc", "rtc_capable", "observation_spec", "image_keys", "image_shapes",
            "state_dim", "action_dim", "action_names", "chunk_len", "policy_type", "policy_dir", "slots")
