"""The data of one round (docs/architecture.md, "One round, as data"), as plain dataclasses."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass(frozen=True)
class ExecInfo:
    """Last execution info piggybacked on a request (seed 000 §3.2.1, §4 "Last Exec Info").

    exec_start: when the running execution phase started (server time line);
    actions_left: actions of that phase not yet executed when the request was sent;
    control_hz: the robot's control rate. Its end is derived, not sent.
    """

    exec_start: float
    actions_left: int
    control_hz: float

    def end(self, sent_at: float) -> float:
        return sent_at + self.actions_left / self.control_hz

    def problems(self) -> list[str]:
        out = []
        if not math.isfinite(self.exec_start):
            out.append("exec_start is not finite")
        if not math.isfinite(self.control_hz) or self.control_hz <= 0:
            out.append(f"control_hz must be > 0, got {self.control_hz}")
        if not math.isfinite(self.actions_left) or self.actions_left < 0 or self.actions_left != int(self.actions_left):
            out.append(f"actions_left must be a whole number >= 0, got {self.actions_left}")
        return out


@dataclass(frozen=True)
class HorizonChoice:
    """The execution-horizon policy a client asks for, with its one knob (H or t)."""

    policy: str = "static"
    param: Optional[float] = None


@dataclass
class InferenceRequest:
    task_id: str
    round_id: int
    exec_info: Optional[ExecInfo] = None
    horizon: HorizonChoice = field(default_factory=HorizonChoice)
    observation: Any = None
    # When the observation was captured; the dispatcher refreshes it when it grew stale.
    obs_stamp: Optional[float] = None
    # Absolute time the next chunk is needed by; derived from exec_info when absent.
    deadline: Optional[float] = None
    # The client's estimate of the rounds its task still needs, this one included (a scripted
    # task or a planner with known segments knows it); None when unknown.
    remaining_rounds: Optional[int] = None
    # What kind of task this is (a task template / suite name, e.g. "libero-spatial"): the
    # `remaining` scheduler learns per type how long finished tasks ran. Never a length.
    # Absent: the observation's instruction, when it has one.
    task_type: Optional[str] = None
    # 0: the request itself; j > 0: a self-consistency replica (same observation, the engine
    # draws other noise for it and keeps no history for it). Set by the server, never a client.
    sample: int = 0
    # Real-time chunking (core/rtc.py RtcGuide): the robot's unexecuted leftover, and the
    # delay d the server predicts at dispatch. None: the chunk is generated without guidance.
    rtc: Any = None
    # The oldest observation a chunk of this robot may be generated from (s); None: the server's.
    max_obs_age_s: Optional[float] = None

    @property
    def kind(self) -> Optional[str]:
        """The task's type as the server sees it: task_type, else the instruction."""
        return self.task_type or getattr(self.observation, "instruction", None) or None


@dataclass
class PendingRequest:
    """A request the server accepted and has not dispatched yet."""

    request: InferenceRequest
    arrival: float
    seq: int  # global arrival order: FIFO and every tie-break
    epoch: int  # dispatch epoch at arrival; skipped rounds = current epoch - epoch
    deadline: float
    round_index: int = 0  # the round's position in the task's ledger
    record: Any = None  # the ledger record it belongs to: a reply never lands on a restarted task
    # A re-sent round already answered: its cached reply, handed back without generating again.
    replay: Any = None
    failures: int = 0  # batches it was in that failed (a poison request must not cycle forever)

    @property
    def task_id(self) -> str:
        return self.request.task_id


@dataclass
class ChunkResult:
    """What an engine returns for one request.

    actions: [chunk, action_dim]; updates: per-step per-action denoising updates
    [steps, chunk, action_dim] (seed 000 §3.1), None for policies without denoising.
    initial_noise: the x_T the updates start from, [chunk, action_dim], in the same
    (normalized) space: initial_noise + updates.sum(0) is the chunk before unnormalizing.
    state: the observation's joint state the chunk was generated from (what the server
    already has), for horizon policies that read the observation (the learned horizon).
    samples: extra chunks of the same request drawn with other noise in the same batch,
    [K, chunk, action_dim] in action space (batch self-consistency); None when none were drawn.
    task_id, round_id: whose chunk this is (engines that know fill them), for horizon
    policies that compare a task's consecutive plans (core/horizon/agreement.py).
    """

    actions: np.ndarray
    updates: Optional[np.ndarray] = None
    initial_noise: Optional[np.ndarray] = None
    state: Optional[np.ndarray] = None
    samples: Optional[np.ndarray] = None
    task_id: Optional[str] = None
    round_id: Optional[int] = None
    # The RTC delay d (control steps) the engine inpainted with; None when it ran unguided.
    rtc_delay_steps: Optional[int] = None


@dataclass
class HorizonDecision:
    horizon: int
    reason: str


@dataclass
class ChunkReply:
    """The trimmed chunk the action manager returns to the robot."""

    task_id: str
    round_id: int
    actions: np.ndarray  # [horizon, action_dim]
    horizon: int
    reason: str
    chunk_len: int
    tier: str
    generated_at: float
    # The RTC delay d the chunk was inpainted with (ChunkResult.rtc_delay_steps); None: unguided.
    rtc_delay_steps: Optional[int] = None
