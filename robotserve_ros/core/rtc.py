"""Real-time chunking served remotely (Black, Galliker & Levine, arXiv 2506.07339; issue 28).

The next chunk is generated as an inpainting of the actions the robot will still execute
while it is being generated. Two things cross the serving contract for it:
- the request's leftover: the actions of the robot's current chunk it had not executed when
  it sent the request (action space, [k, action_dim], first row executed next);
- the inference delay d in control steps, which only the server knows in a shared fleet
  (queueing + generation): set at dispatch, then d <= s <= H - d for the executed horizon s
  (paper §4). The reply says which d the engine used.

This module is the data of that contract only; the guidance lives in the engines and the
prediction of d in the dispatcher.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class RtcGuide:
    """One request's RTC inputs. leftover: [k, action_dim] float32, k >= 0 (k == 0: nothing to
    inpaint, the chunk is generated freely). delay_steps: d, None until the server sets it."""

    leftover: np.ndarray
    delay_steps: Optional[int] = None

    def problems(self, action_dim: Optional[int] = None) -> list[str]:
        out = []
        a = self.leftover
        if not isinstance(a, np.ndarray) or a.ndim != 2:
            return ["rtc leftover must be a 2-D array [actions, action_dim]"]
        if action_dim is not None and a.shape[0] and a.shape[1] != action_dim:
            out.append(f"rtc leftover has {a.shape[1]} values per action, the policy takes {action_dim}")
        if not np.all(np.isfinite(a)):
            out.append("rtc leftover holds a value that is not finite")
        if self.delay_steps is not None and self.delay_steps < 0:
            out.append(f"rtc delay_steps must be >= 0, got {self.delay_steps}")
        return out

    def sent_problems(self, action_dim: Optional[int] = None) -> list[str]:
        """problems(), and those of a guide that arrives with its delay set (a remote tier's
        request): the server that set d never sets it past the leftover (RTC §4: only leftover
        actions are frozen), so a longer d is a bad request, refused before it joins a batch."""
        out = self.problems(action_dim)
        if not out and self.delay_steps is not None and self.delay_steps > self.leftover.shape[0]:
            out.append(f"rtc delay_steps {self.delay_steps} is longer than the leftover ({self.leftover.shape[0]} actions)")
        return out

    def with_delay(self, d: int) -> "RtcGuide":
        return replace(self, delay_steps=int(d))
