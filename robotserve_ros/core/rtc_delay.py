"""The RTC inference delay d, predicted by the server at dispatch (issue 28 item 2).

Real-time chunking (Black, Galliker & Levine, arXiv 2506.07339, §4) freezes the first d actions
of the next chunk: the robot executes them from its current chunk while the next one is being
generated, so d is the number of control steps between the observation being sent and the
chunk arriving. On a robot's own machine d is the model's latency; in a shared fleet it is
queueing plus generation, and only the dispatcher knows both: the request's time in the queue
(seed 000 §3.2.1, the last execution info it carries: the control rate) and the batch it joins,
whose latency the engine profile gives (seed 000 §3.2.2).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from .types import PendingRequest


def predict_delay_steps(sent_at: float, dispatch_at: float, latency_s: float, control_hz: float,
                        leftover_actions: int) -> int:
    """d = control steps the robot executes between sending the request (sent_at) and the chunk
    arriving (dispatch_at + the batch's generation latency), at most the leftover it has: once
    the leftover runs out the robot holds, and the new chunk resumes at that action (RTC §4)."""
    steps = math.ceil(max(0.0, dispatch_at + latency_s - sent_at) * control_hz - 1e-9)
    return max(0, min(steps, int(leftover_actions)))


def set_rtc_delays(batch: Sequence[PendingRequest], latency_s: float, now: float) -> None:
    """At dispatch, for each request of `batch` that carries an RTC guide: its d, from the time
    it arrived (the send time as the server sees it: the way in is not counted), now, and the
    profile latency of the batch it runs in. A request dispatched again (requeued) gets a new d."""
    for p in batch:
        req = p.request
        if req.rtc is None or req.exec_info is None:
            continue
        d = predict_delay_steps(p.arrival, now, latency_s, req.exec_info.control_hz, len(req.rtc.leftover))
        req.rtc = req.rtc.with_delay(d)


def follow_refresh(req, old_timestep: int) -> None:
    """A request whose observation the server refreshed at dispatch (seed 000 Algorithm 1 lines
    20-21): the new chunk's row 0 is the fresh observation's timestep, so the leftover's rows the
    robot executed since sending go (RTC §4: the leftover's row 0 is the new chunk's row 0), and
    so does as much of d, which was counted from the send (set_rtc_delays)."""
    g = req.rtc
    if g is None or g.delay_steps is None:
        return
    ran = max(0, int(getattr(req.observation, "timestep", old_timestep)) - int(old_timestep))
    if ran:
        left = g.leftover[ran:]
        req.rtc = replace(g, leftover=left, delay_steps=max(0, min(g.delay_steps - ran, len(left))))
