"""Per-skill execution-time model (seed 002 §4.3 "Choice of priority parameters"): the
expected execution time of a generated segment, from offline profiling of each skill. Like
the paper it keeps the minimum seen per (agent kind, skill), so the next segment is planned
for the worst case (the robot finishing early). Built here from a trace's recorded
`exe_time_detail` (the traces' own skill profiles)."""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping


class SkillTimeModel:
    def __init__(self, table: Mapping[str, Mapping[str, float]], default_s: float = 1.0) -> None:
        self.table = {k: dict(v) for k, v in table.items()}
        self.default_s = float(default_s)

    @classmethod
    def from_records(cls, records: Iterable[Mapping], kind_of=lambda r: "drone") -> "SkillTimeModel":
        mins: dict = defaultdict(dict)
        for r in records:
            kind = kind_of(r)
            for skill, secs in r.get("exe_time_detail", []):
                name = skill_name(skill)
                cur = mins[kind].get(name)
                mins[kind][name] = float(secs) if cur is None else min(cur, float(secs))
        return cls(mins)

    def estimate(self, kind: str, skill_text: str) -> float:
        return self.table.get(kind, {}).get(skill_name(skill_text), self.default_s)

    def kinds(self) -> list[str]:
        return sorted(self.table)


def skill_name(text: str) -> str:
    """The skill of a plan line: 's(' / 's(cat)' -> 's', 'mf' / 'mf(50)' -> 'mf'."""
    t = text.strip()
    i = t.find("(")
    return (t[:i] if i >= 0 else t.split()[0] if t.split() else t).strip()
