"""KEY=VALUE command-line parameters (`--scheduler-param buckets=10`), shared by every command.

Low in the package (imports nothing of it) so the CLI and the transports parse them alike."""
from __future__ import annotations

import json
from typing import Iterable, Optional


def parse_key_values(items: Optional[Iterable[str]]) -> dict:
    """['k=1', 'name=x'] -> {'k': 1, 'name': 'x'}: a value is JSON when it parses as JSON,
    else the string. ValueError names the item that is not KEY=VALUE."""
    out = {}
    for it in items or ():
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise ValueError(f"parameter {it!r} is not KEY=VALUE")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out
