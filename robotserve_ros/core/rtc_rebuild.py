"""A session's RTC leftover, rebuilt on the server (issue 28 item 2) for clients that send none:
LeRobot's robot_client and openpi's clients know nothing of real-time chunking (remote RTC is
an open request of LeRobot, huggingface/lerobot issue 2562), but the server knows the last chunk
it handed the session and when, and the client's timing tells how much of it ran since. The
unexecuted rest is the leftover the next chunk is inpainted to (RTC, arXiv 2506.07339 §4).

Executed since the chunk was handed over: the client's own timestep where it sends one (LeRobot:
the observation's timestep, the chunk's rows being timesteps first_timestep + i), else the time
since x the control rate (openpi: no timestep on the wire). The leftover's row 0 is aligned with
the new chunk's row 0, as RtcGuide wants.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .rtc import RtcGuide


@dataclass(frozen=True)
class ServedChunk:
    """The server's reply log for one session: the last chunk handed over, its first row's
    timestep (None where the client has no timesteps), and when it was handed over."""

    actions: np.ndarray
    first_timestep: Optional[int]
    sent_at: float


def executed_since(served: ServedChunk, now: float, control_hz: float, timestep: Optional[int] = None) -> int:
    """Rows of the served chunk the client has run by `now` (or by its observation at `timestep`)."""
    if timestep is not None and served.first_timestep is not None:
        n = timestep - served.first_timestep
    else:
        n = math.floor(max(0.0, now - served.sent_at) * control_hz + 1e-9)
    return int(min(max(n, 0), len(served.actions)))


def rebuild_leftover(served: Optional[ServedChunk], now: float, control_hz: float,
                     timestep: Optional[int] = None) -> Optional[np.ndarray]:
    """The rows of the last served chunk the client has not run yet, [k, action_dim] float32;
    None when nothing was served or all of it ran (the next chunk is generated unguided)."""
    if served is None:
        return None
    rest = np.asarray(served.actions, np.float32)[executed_since(served, now, control_hz, timestep):]
    return rest if len(rest) else None


def rebuilt_guide(served: Optional[ServedChunk], now: float, control_hz: float,
                  timestep: Optional[int] = None) -> Optional[RtcGuide]:
    """What an endpoint sets as its request's rtc: the rebuilt leftover, or None (unguided)."""
    left = rebuild_leftover(served, now, control_hz, timestep)
    return None if left is None else RtcGuide(left)
