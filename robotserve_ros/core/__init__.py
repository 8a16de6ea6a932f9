"""The serving brain, pure Python + numpy: no rclpy, grpc or torch imports (docs/architecture.md)."""
from .clock import Clock, VirtualClock, WallClock
from .engine import Engine
from .errors import RequestError, WorkloadError
from .horizon import HORIZON_POLICIES, HorizonPolicy, make_horizon_policy, register_horizon_policy
from .ledger import TaskLedger, wait_ratio
from .profile import EngineProfile
from .schedulers import SCHEDULERS, Scheduler, SchedulingContext, make_scheduler
from .serving import Dispatch, FillInOrder, ServingCore, Tier
from .types import ChunkReply, ChunkResult, ExecInfo, HorizonChoice, HorizonDecision, InferenceRequest, PendingRequest

__all__ = [
    "Clock", "VirtualClock", "WallClock", "Engine", "RequestError", "WorkloadError",
    "HORIZON_POLICIES", "HorizonPolicy", "make_horizon_policy", "register_horizon_policy",
    "TaskLedger", "wait_ratio", "EngineProfile", "SCHEDULERS", "Scheduler", "SchedulingContext",
    "make_scheduler", "Dispatch", "FillInOrder", "ServingCore", "Tier", "ChunkReply", "ChunkResult",
    "ExecInfo", "HorizonChoice", "HorizonDecision", "InferenceRequest", "PendingRequest",
]
