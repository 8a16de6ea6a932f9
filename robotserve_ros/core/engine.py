"""The engine roles: `Engine` runs one batch of requests through a policy and returns action
chunks; `TextEngine` and `VisionLanguageEngine` are what the language cores (TimelyLLM, SLO,
Nova) call. All are built by name from engines.ENGINES, and test_engine_contract.py holds
every registered engine to its role.

Everything the serving path reads of an engine is declared here, with the value an engine
that does not say means: a stand-in engine (simulated, a remote GPU server) takes whatever
observation comes and names no cameras; a LeRobot policy fills in what its checkpoint says.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Hashable, Optional, Protocol, Sequence, runtime_checkable

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


@runtime_checkable
class TextEngine(Protocol):
    """An LLM the language cores serve (seed 002 §4.1, seed 004): tokens in, tokens out, the KV
    cache of each request kept between calls (engines/llm). vLLM's backend answers the
    tokenizer half and generates in its own process (engines/llm/vllm_backend.py)."""

    name: str
    max_context: int
    eos_ids: set  # tokens that end a generation

    def encode(self, text: str) -> list: ...

    def decode_text(self, ids) -> str: ...

    def chat_prompt(self, user: str, system: Optional[str] = None) -> list: ...

    def cache_prefix(self, ids) -> int: ...

    def cached_prefix_len(self, ids) -> int: ...


@runtime_checkable
class KvTextEngine(TextEngine, Protocol):
    """A TextEngine whose prefill and decode steps the server schedules itself (not vLLM's)."""

    def prefill(self, items, *args, **kw): ...

    def decode(self, req_ids: Sequence[Hashable], steps: int = 1) -> dict: ...

    def free(self, req_id: Hashable) -> bool: ...


@runtime_checkable
class VisionLanguageEngine(Protocol):
    """A VLM split into stages the Nova core schedules apart (seed 003): vision encode,
    (chunked) prefill, decode."""

    def tokenize(self, text: str) -> list: ...

    def detokenize(self, ids) -> str: ...

    def encode_vision(self, pixel_values): ...

    def prefill_chunk(self, seq, n: int) -> bool: ...

    def decode(self, seqs) -> list: ...
