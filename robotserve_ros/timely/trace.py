"""TimelyLLM traces (../shared/data/timelyllm, CC BY 4.0, the TimelyLLM authors) and the plans
the replay generates for them.

A trace file is a JSON list of records (`job_id`, `trigger time`, `agent_id`, `trace_id`,
`task_input`, `exe_time_detail`, `task_exe_time`, `tuf`) with `<stem>_config.json` beside it.
The traces carry the plan's skills and durations, not its text, so the replay renders a
plan template: one line per recorded skill, `name(arg)` (arg: the first scene object, a
distance for the drone's moves), and the engine is constrained to produce exactly that
text (engines/llm ForcedText): the 135M model cannot plan freely, and the skills and their
execution times then follow the record while every token still costs a real decode step.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..core.errors import WorkloadError

ARM_SKILLS = {"move_to", "take", "drop"}
DRONE_MOVES = {"mf", "mb", "mu", "md", "ml", "mr"}
SYSTEM = {
    "drone": "You are a drone planner. Answer with skills, one per line: s(obj) search, g(obj) go to, "
             "iv(obj) is visible, l(text) log, tp() take picture, d(s) delay, mf/mu/md/ml/mr(cm) move.",
    "arm": "You are a robot arm planner. Answer with skills, one per line: move_to(obj), take(obj), drop(obj).",
}
RECORD_FIELDS = ("job_id", "trigger time", "agent_id", "trace_id", "task_input", "exe_time_detail", "tuf")


@dataclass
class PlanSpec:
    job_id: int
    trigger: float
    agent_id: str
    trace_id: int
    kind: str
    task_input: str
    tuf: list
    urgent: bool
    skills: list                       # [(line, exec_s)]
    prompt_ids: list = field(default_factory=list)
    forced_ids: list = field(default_factory=list)
    seg_tokens: list = field(default_factory=list)   # tokens per segment (the last one's end of sequence included)
    prefix_len: int = 0                # the kind's system part: a server-side prefix, prefilled once

    @property
    def plan_text(self) -> str:
        return "\n".join(s for s, _ in self.skills)

    @property
    def exec_s(self) -> float:
        return sum(e for _, e in self.skills)

    @property
    def task_type(self) -> str:
        return f"{self.kind}-{self.trace_id}" + ("-urgent" if self.urgent else "")


def load_trace(path) -> tuple[list[dict], dict]:
    p = Path(path)
    try:
        records = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkloadError("trace", f"cannot read {str(p)!r} as JSON ({e})") from None
    if not isinstance(records, list) or not records:
        raise WorkloadError("trace", f"{str(p)!r} must be a non-empty JSON list of records")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise WorkloadError(f"records[{i}]", "not an object")
        for f in RECORD_FIELDS:
            if f not in r:
                raise WorkloadError(f"records[{i}].{f}", "missing")
        if not isinstance(r["exe_time_detail"], list) or not r["exe_time_detail"]:
            raise WorkloadError(f"records[{i}].exe_time_detail", "must be a non-empty list of [skill, seconds]")
    cfg_path = p.with_name(p.stem + "_config.json")
    config = {}
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise WorkloadError("config", f"cannot read {str(cfg_path)!r} ({e})") from None
    return records, config


def agent_kind(record: dict) -> str:
    skills = {s for s, _ in record["exe_time_detail"]}
    return "arm" if skills <= ARM_SKILLS else "drone"


def _scene_object(task_input: str) -> str:
    m = re.search(r"Scene:\s*\[([A-Za-z_]+)", task_input)
    return m.group(1) if m else "target"


def render_skill(skill: str, obj: str) -> str:
    name = skill.rstrip("(").strip()
    if name in DRONE_MOVES:
        return f"{name}(50)"
    if name == "d":
        return "d(1)"
    if name == "tp":
        return "tp()"
    if name == "l":
        return f"l('{obj} found')"
    return f"{name}({obj})"


def plan_specs(records: list[dict], limit: Optional[int] = None) -> list[PlanSpec]:
    out = []
    for r in sorted(records, key=lambda r: (float(r["trigger time"]), r["job_id"]))[:limit]:
        obj = _scene_object(r["task_input"])
        tuf = list(r["tuf"])
        out.append(PlanSpec(
            job_id=int(r["job_id"]), trigger=float(r["trigger time"]), agent_id=str(r["agent_id"]),
            trace_id=int(r["trace_id"]), kind=agent_kind(r), task_input=str(r["task_input"]), tuf=tuf,
            urgent="[E]" in r["task_input"] or (len(tuf) == 3 and float(tuf[1]) < 1.0),
            skills=[(render_skill(s, obj), float(e)) for s, e in r["exe_time_detail"]]))
    return out


def tokenize_specs(specs: list[PlanSpec], tokenizer, decode, eos_ids, eos_id: int, max_tokens: int = 32) -> None:
    """Prompt ids (chat template + the kind's system line + task_input), the forced plan ids,
    and the token count of each segment as the stop checker splits it (what the simulator
    replays). Identical prompts are tokenized once."""
    from ..engines.llm.stop import StopChecker

    cache: dict = {}
    prefixes = {kind: system_prefix(tokenizer, kind) for kind in SYSTEM}
    for s in specs:
        key = (s.kind, s.task_input, s.plan_text)
        if key not in cache:
            msgs = [{"role": "system", "content": SYSTEM[s.kind]}, {"role": "user", "content": s.task_input}]
            prompt = list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True))
            forced = list(tokenizer.encode(s.plan_text, add_special_tokens=False))
            stop, counts, n = StopChecker(decode, eos_ids, max_tokens=max_tokens), [], 0
            for t in forced + [eos_id]:
                n += 1
                if stop.feed(t):
                    stop.take()
                    counts.append(n)
                    n = 0
            cache[key] = (prompt, forced, counts)
        s.prompt_ids, s.forced_ids, s.seg_tokens = (list(x) for x in cache[key])
        pre = prefixes[s.kind]
        s.prefix_len = len(pre) if s.prompt_ids[:len(pre)] == pre else 0
        if len(s.seg_tokens) != len(s.skills):
            raise WorkloadError(f"job {s.job_id}", f"plan template splits into {len(s.seg_tokens)} segments, "
                                f"not its {len(s.skills)} skills")


def system_prefix(tokenizer, kind: str) -> list[int]:
    """The token ids of the chat template's system turn for this agent kind: the fixed part
    of every request of that kind (seed 002 §4.1: stored on the server, prefilled once)."""
    return list(tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM[kind]}],
                                              add_generation_prompt=False))
