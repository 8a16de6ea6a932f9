"""The workload file: tasks as per-round executed-action counts, and the engine profile.

Exactly this JSON (README "Workload files"):
  {"name": str, "engine": {"batch_latency_ms": {"1": ms, "2": ms, ...}},
   "tasks": [{"id": str, "control_hz": hz,
              "rounds": {"static": [actions, ...], "dynamic": [actions, ...]}}]}
Each list gives the actions executed per round under that horizon policy, as a recorded
trace would (seed 000 §5.1: replayed tasks request at the recorded action index).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ..core.errors import WorkloadError
from ..core.profile import EngineProfile

HORIZON_MODES = ("static", "dynamic")


@dataclass(frozen=True)
class TaskSpec:
    id: str
    control_hz: float
    rounds: dict  # "static"/"dynamic" -> tuple of actions per round

    def total_actions(self, mode: str) -> int:
        return sum(self.rounds[mode])


@dataclass(frozen=True)
class Workload:
    name: str
    batch_latency_ms: dict
    tasks: tuple

    @property
    def profile(self) -> EngineProfile:
        return EngineProfile(self.batch_latency_ms)

    def max_round(self) -> int:
        return max(max(max(t.rounds[m]) for m in HORIZON_MODES) for t in self.tasks)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "engine": {"batch_latency_ms": {str(k): v for k, v in self.batch_latency_ms.items()}},
            "tasks": [
                {"id": t.id, "control_hz": t.control_hz, "rounds": {m: list(t.rounds[m]) for m in HORIZON_MODES}}
                for t in self.tasks
            ],
        }

    def save(self, path: Union[str, Path]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _keys(obj: dict, where: str, required: tuple) -> None:
    for k in required:
        if k not in obj:
            raise WorkloadError(f"{where}{k}" if where else k, "is missing")
    for k in obj:
        if k not in required:
            raise WorkloadError(f"{where}{k}", f"is not a field of the format (expected {', '.join(required)})")


def _number(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise WorkloadError(field, f"must be a positive finite number, got {v!r}")
    return float(v)


def parse_workload(obj: Any) -> Workload:
    if not isinstance(obj, dict):
        raise WorkloadError("(top level)", "must be a JSON object")
    _keys(obj, "", ("name", "engine", "tasks"))
    name = obj["name"]
    if not isinstance(name, str) or not name.strip():
        raise WorkloadError("name", "must be a non-empty string")
    eng = obj["engine"]
    if not isinstance(eng, dict):
        raise WorkloadError("engine", "must be an object")
    _keys(eng, "engine.", ("batch_latency_ms",))
    lat = eng["batch_latency_ms"]
    if not isinstance(lat, dict) or not lat:
        raise WorkloadError("engine.batch_latency_ms", 'must be a non-empty object {"1": ms, ...}')
    table = {}
    for b, ms in lat.items():
        if not (isinstance(b, str) and b.isdigit() and int(b) >= 1):
            raise WorkloadError(f"engine.batch_latency_ms.{b}", "batch size keys must be positive integers")
        table[int(b)] = _number(ms, f"engine.batch_latency_ms.{b}")
    try:
        EngineProfile(table)
    except ValueError as e:
        raise WorkloadError("engine.batch_latency_ms", str(e)) from None
    tasks = obj["tasks"]
    if not isinstance(tasks, list) or not tasks:
        raise WorkloadError("tasks", "must be a non-empty list")
    seen, out = set(), []
    for i, t in enumerate(tasks):
        w = f"tasks[{i}]"
        if not isinstance(t, dict):
            raise WorkloadError(w, "must be an object")
        _keys(t, w + ".", ("id", "control_hz", "rounds"))
        tid = t["id"]
        if not isinstance(tid, str) or not tid:
            raise WorkloadError(f"{w}.id", "must be a non-empty string")
        if tid in seen:
            raise WorkloadError(f"{w}.id", f"duplicate task id '{tid}'")
        seen.add(tid)
        hz = _number(t["control_hz"], f"{w}.control_hz")
        r = t["rounds"]
        if not isinstance(r, dict):
            raise WorkloadError(f"{w}.rounds", "must be an object with 'static' and 'dynamic' lists")
        _keys(r, f"{w}.rounds.", HORIZON_MODES)
        rounds = {}
        for m in HORIZON_MODES:
            lst = r[m]
            if not isinstance(lst, list) or not lst:
                raise WorkloadError(f"{w}.rounds.{m}", "must be a non-empty list of action counts")
            for j, n in enumerate(lst):
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise WorkloadError(f"{w}.rounds.{m}[{j}]", f"must be a whole number of actions >= 1, got {n!r}")
            rounds[m] = tuple(lst)
        out.append(TaskSpec(tid, hz, rounds))
    return Workload(name, table, tuple(out))


def load_workload(path: Union[str, Path]) -> Workload:
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except FileNotFoundError:
        raise WorkloadError("(file)", f"{p} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkloadError("(file)", f"{p} is not valid JSON: {e}") from None
    except OSError as e:  # a directory, no permission
        raise WorkloadError("(file)", f"{p} cannot be read: {e.strerror}") from None
    return parse_workload(obj)
