"""The planner's per-skill time model of record (skill_times.json: minimum recorded time per
skill in the TimelyLLM traces, seed 002 §4.3) and the agent kinds it serves."""
from __future__ import annotations

import json
from pathlib import Path

from ..core.timely import SkillTimeModel

SKILL_TIMES = Path(__file__).resolve().parent / "skill_times.json"


def default_skill_time() -> SkillTimeModel:
    return SkillTimeModel(json.loads(SKILL_TIMES.read_text())["seconds"])
