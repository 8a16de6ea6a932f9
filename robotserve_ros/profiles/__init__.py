"""Engine profiles of record: the one place measured latency-vs-batch data lives.

Each `NAME.json` here is what `robotserve profile` writes (the engine profile the scheduler
and placement read, every sample, the machine and method), or an LLM engine's profile
(`robotserve llm-profile`; core/llm_profile.py), the one the SLO and segment schedulers read.
Built-in workloads, node defaults and config files name a profile (`engine_profile:
smolvla_tiny`) instead of pasting its numbers; `reports/profiles/NAME.md` is each one's short
report.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.errors import ConfigError, UnknownName
from ..core.profile import EngineProfile

PROFILES_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """The engine profiles of record: those with a latency-vs-batch block (the SLO-only LLM
    profile has none, so a policy engine cannot be given it)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json") if "engine_profile" in json.loads(p.read_text()))


def path_of(name: str) -> Path:
    """A profile of record by name, or a JSON file by path."""
    return Path(name) if name.endswith(".json") else PROFILES_DIR / f"{name}.json"


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


def load_profile_file(path) -> EngineProfile:
    """The EngineProfile in a `robotserve profile` JSON (or a workload file's engine block),
    or a profile of record by name (robotserve_ros/profiles/NAME.json)."""
    if str(path) in names():
        return profile_of_record(str(path))
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"profile file {str(p)!r}: cannot read it as JSON ({e})") from None
    block = obj.get("engine_profile") or obj.get("engine") if isinstance(obj, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("batch_latency_ms"), dict):
        raise ValueError(f"profile file {str(p)!r}: no engine_profile.batch_latency_ms (write it with `robotserve profile`)")
    try:
        return EngineProfile(block["batch_latency_ms"], gain_tol=float(block.get("gain_tol", 0.05)))
    except ValueError as e:
        raise ValueError(f"profile file {str(p)!r}: {e}") from None


def load_llm_profile(name: str):
    """The LLM engine's profile (core/llm_profile.py) and its whole record, from a profile of
    record's name or a JSON file."""
    from ..core.llm_profile import LLMProfile

    try:
        rec = json.loads(path_of(name).read_text())
        return LLMProfile.from_record(rec), rec
    except (OSError, json.JSONDecodeError, ValueError) as e:
        raise ConfigError(f"--profile {name!r}: {e}") from None
