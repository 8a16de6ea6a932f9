"""TimelyLLM (seed 002) in core: time-utility functions, the per-skill time model, the
segment schedulers (PUD priority, latency-guided batch size, baselines) and the segment
serving core. Pure Python."""
from ..llm_profile import LLMProfile
from .plan import Plan
from .schedulers import SCHEDULER_NAMES, SEGMENT_SCHEDULERS, Context, SegmentScheduler
from .serving import Event, SegmentOutcome, TimelyCore, WorkItem
from .skill_time import SkillTimeModel, skill_name
from .tuf import NORMAL, TUF, URGENT, BadDeadline

__all__ = ["Plan", "LLMProfile", "SCHEDULER_NAMES", "SEGMENT_SCHEDULERS", "Context", "SegmentScheduler",
           "Event", "SegmentOutcome", "TimelyCore", "WorkItem", "SkillTimeModel", "skill_name", "NORMAL",
           "TUF", "URGENT", "BadDeadline"]
