"""Engine profiles of record: the one place measured latency-vs-batch data lives.

Each `NAME.json` here is what `robotserve profile` writes (the engine profile the scheduler
and placement read, every sample, the machine and method). Built-in workloads, node
defaults and config files name a profile (`engine_profile: smolvla_tiny`) instead of
pasting its numbers; `reports/profiles/NAME.md` is each one's short report.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.errors import UnknownName
from ..core.profile import EngineProfile

PROFILES_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def record(name: str) -> dict:
    """The whole profile record (samples, machine, method) of a profile of record."""
    path = PROFILES_DIR / f"{name}.json"
    if not name or "/" in name or not path.is_file():
        raise UnknownName(f"unknown engine profile '{name}'; profiles of record: {', '.join(names())}")
    return json.loads(path.read_text())


def batch_latency_ms(name: str) -> dict[int, float]:
    """batch -> median ms of a profile of record."""
    return {int(b): float(ms) for b, ms in record(name)["engine_profile"]["batch_latency_ms"].items()}


def profile_of_record(name: str) -> EngineProfile:
    return EngineProfile(batch_latency_ms(name))
