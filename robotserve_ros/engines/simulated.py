"""A profile-driven engine: deterministic action chunks with the timing of a real policy.

Used by the simulator (virtual time: no sleeping) and by the live server when no model is
configured (realtime: sleeps the profile's latency for the batch). With `updates=True` it
also emits per-step denoising updates shaped like a diffusion policy's: geometric
coarse-to-fine refinement that sums exactly to the chunk, with the actions past a
per-round convergence boundary still moving at the last step, so the confidence horizon
policy has something real to read.

Real-time chunking, as a stand-in only (supports_rtc): a request with an RTC guide gets a
chunk whose first d rows are its leftover's first d rows (what guided denoising freezes,
RTC arXiv 2506.07339 §4), the rest as without, and reports that d: node tests of the remote
RTC path run without torch. No inpainting happens; docs/rtc_serving.md says so.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..core.engine import Engine
from ..core.knobs import knob
from ..core.observation import Observation
from ..core.profile import EngineProfile
from ..core.types import ChunkResult, InferenceRequest


@dataclass(frozen=True)
class SimulatedKnobs:
    """The simulated engine's knobs (a config's engine.simulated.*), checked before it is built."""

    chunk_size: int = knob(50, "actions per chunk", lo=1)
    action_dim: int = knob(6, "action dimensions", lo=1)
    steps: int = knob(10, "denoising steps whose updates it emits", lo=2)
    updates: bool = knob(False, "emit per-step denoising updates (the confidence horizon reads them)")
    realtime: bool = knob(False, "sleep the engine profile's latency for each batch (a live server)")
    seed: int = knob(0, "seed of the chunks", lo=0)


class SimulatedEngine(Engine):
    name = "simulated"
    supports_rtc = True  # a stand-in: the leftover's first d rows copied (module docstring)

    def __init__(
        self,
        profile: EngineProfile,
        chunk_size: int = 50,
        action_dim: int = 6,
        steps: int = 10,
        updates: bool = False,
        realtime: bool = False,
        seed: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if chunk_size < 1 or action_dim < 1 or steps < 2:
            raise ValueError("chunk_size and action_dim must be >= 1, steps >= 2")
        self.profile = profile
        self.chunk_size, self.action_dim, self.steps = chunk_size, action_dim, steps
        self.updates, self.realtime, self.seed = updates, realtime, seed
        self._sleep = sleep
        self._t = np.arange(chunk_size, dtype=np.float64)[:, None]
        self._decay = 0.5 ** np.arange(steps, dtype=np.float64)
        self._decay /= self._decay.sum()

    @property
    def chunk_len(self) -> int:  # the name the other engines use
        return self.chunk_size

    def example_observation(self, rng: np.random.Generator) -> Observation:
        """A synthetic observation (this engine reads only task and round): for profiling."""
        return Observation(joints=rng.standard_normal(self.action_dim).astype(np.float32))

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        if self.realtime and batch:
            self._sleep(self.profile.latency_s(len(batch)))
        return [self._one(r) for r in batch]

    def _actions(self, req: InferenceRequest, key: int) -> np.ndarray:
        """The chunk's actions before the RTC stand-in: a smooth per-task curve along the rounds."""
        phase = (key % 997) / 997.0 * 2 * np.pi + np.arange(self.action_dim)
        t0 = req.round_id * self.chunk_size
        return (0.5 * np.sin(0.05 * (self._t + t0) + phase)).astype(np.float32)

    def _one(self, req: InferenceRequest) -> ChunkResult:
        key = zlib.crc32(req.task_id.encode())
        actions = self._actions(req, key)
        d = getattr(req.rtc, "delay_steps", None)
        if d is not None:  # the RTC stand-in: the frozen prefix is the leftover's (at most all of it)
            d = min(int(d), len(req.rtc.leftover), len(actions))
            actions[:d] = req.rtc.leftover[:d]
        if not self.updates:
            return ChunkResult(actions, rtc_delay_steps=d)
        rng = np.random.default_rng([self.seed, key, req.round_id])
        x_t = rng.standard_normal(actions.shape)
        upd = self._decay[:, None, None] * (actions.astype(np.float64) - x_t)[None]
        # Past the boundary the last step still moves: a large late correction, cancelled
        # by the first step so x_T + sum(updates) stays exactly the chunk.
        boundary = int(rng.integers(self.chunk_size // 4, self.chunk_size + 1))
        if boundary < self.chunk_size:
            kick = rng.standard_normal((self.chunk_size - boundary, self.action_dim)) * 0.5
            upd[-1, boundary:] += kick
            upd[0, boundary:] -= kick
        return ChunkResult(actions, upd.astype(np.float32), rtc_delay_steps=d)
