"""The one contract every serving core answers: action chunks (seed 000), LLM plans (002),
SLO chat (004), VLM stages (003) and language frames (001).

The shape follows vLLM's scheduler interface (vllm/v1/core/sched/interface.py, output.py):
requests go in one object at a time, the core hands out work, the caller runs the engine
and reports back, and the core's counters come out as plain data. What differs per paper is
what an item and a result are, never the calls:

- `slots`: slot name -> how many items it runs at once (a tier's engine slots; the prefill
  and decode workers; a VLM stage worker; the language decode worker);
- `submit(request)`: validate and queue one request object (a RequestError refuses it alone);
- `dispatch()`: the work items to start now, each naming its slot (`item.slot`);
- `complete(item, result)`: the engine ran `item`; `result` is what it returned;
- `fail(item, reason)`: the engine call for `item` failed;
- `cancel(request_id, reason)`: its sender is gone; True if the core held it;
- `snapshot()`: the core's counters and queue lengths, JSON-serialisable.

The clock is the core's own (`core.clock`, injected): no call takes the time from its caller,
so the same core runs on the wall clock (core/loop.py's LiveDriver) and on a virtual one
(sim/loop.py).
"""
from __future__ import annotations

import dataclasses
import inspect
from collections import Counter
from typing import Any, Mapping, Protocol, runtime_checkable

from .clock import Clock


@runtime_checkable
class ServingContract(Protocol):
    clock: Clock

    @property
    def slots(self) -> Mapping[str, int]: ...

    def submit(self, request) -> Any: ...

    def dispatch(self) -> list: ...

    def complete(self, item, result) -> Any: ...

    def fail(self, item, reason: str) -> Any: ...

    def cancel(self, request_id, reason: str = "cancelled") -> bool: ...

    def snapshot(self) -> dict: ...


CALLS = ("submit", "dispatch", "complete", "fail", "cancel", "snapshot")


def contract_problems(core) -> list[str]:
    """What keeps `core` from answering the contract (empty: it does): a missing member, or a
    call whose parameters differ from the contract's (extra ones must have defaults)."""
    out = [f"no {name}" for name in ("clock", "slots", *CALLS) if not hasattr(core, name)]
    for name in CALLS:
        if not hasattr(core, name):
            continue
        want = [p for p in inspect.signature(getattr(ServingContract, name)).parameters.values() if p.name != "self"]
        have = list(inspect.signature(getattr(core, name)).parameters.values())
        for i, w in enumerate(want):
            if i >= len(have) or have[i].kind not in (w.POSITIONAL_ONLY, w.POSITIONAL_OR_KEYWORD):
                out.append(f"{name}: parameter {i + 1} ({w.name}) missing")
            elif w.default is not w.empty and have[i].default is w.empty:
                out.append(f"{name}: parameter {have[i].name} needs a default, as the contract's {w.name}")
        out += [f"{name}: extra parameter {p.name} has no default" for p in have[len(want):]
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return out


def plain(value) -> Any:
    """A stats object as plain data (dataclasses, Counters, tuples -> dicts and lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (dict, Counter)):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
