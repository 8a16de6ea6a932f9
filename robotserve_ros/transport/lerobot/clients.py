"""One connected LeRobot client's state (guarded by the servicer's lock)."""
from __future__ import annotations

from typing import Optional

import grpc
import numpy as np

from .groups import PolicyGroup
from .payloads import Layout, Refused

RTC_HEADER = "robotserve-rtc"  # a session's real-time chunking, on its policy setup call: on / off (absent: the server's rtc)
_SAYS = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def rtc_option(context, default: bool) -> bool:
    """The session's RTC from its SendPolicyInstructions metadata (LeRobot's client sends none:
    the server's `rtc`); a value other than on/off is refused naming the header."""
    said = [v for k, v in context.invocation_metadata() or () if k == RTC_HEADER]
    if not said:
        return default
    if len(said) > 1 or not isinstance(said[0], str) or said[0].lower() not in _SAYS:
        raise Refused("bad_rtc", grpc.StatusCode.INVALID_ARGUMENT,
                      f"metadata {RTC_HEADER} must be one of on, off (true/false, 1/0), got {said[:2]!r}"[:200])
    return _SAYS[said[0].lower()]


class Client:
    """One LeRobot client: its task, the rounds it sent and what it was handed."""

    def __init__(self, key: str, task_id: str, now: float, fps: float) -> None:
        self.key, self.task_id = key, task_id  # key: the session id
        self.peer = ""  # the connection that started it (shown in stats and logs)
        self.lru = 0.0  # monotonic time of its last call: least recently used sessions are evicted first
        self.held_bytes = 0  # observation bytes it holds (newest, held): max_session_bytes
        self.group: Optional[PolicyGroup] = None
        self.spec = None  # the policy instructions it runs (an evicted session is re-established from them)
        self.session = None  # its group's fleet session (serve/), once it named a policy
        self.layout: Optional[Layout] = None
        self.actions_per_chunk = 1
        self.next_round = 0
        self.rounds: dict = {}  # round_id -> (timestep, timestamp) of its observation
        self.predicted: set = set()  # timesteps already submitted (LeRobot's _predicted_timesteps)
        self.last_state: Optional[np.ndarray] = None
        self.newest = None  # (timestep, timestamp, Observation): the newest received, filtered or not
        self.held = None  # (timestep, timestamp, Observation) waiting for the round in flight
        self.ready = None  # (ChunkReply, timestep, timestamp) not yet fetched
        self.delivered_until = -1
        self.exec_start: Optional[float] = None
        self.served = None  # core.rtc_rebuild.ServedChunk: the last chunk handed over (rtc on)
        self.rtc = False  # this session's real-time chunking (rtc_option)
        self.hz = float(fps)
        self.rate_anchor = None  # (timestep, client timestamp) where the current busy stretch began
        self.last_seen = now
        self.counts = {"observations": 0, "filtered": 0, "rounds": 0, "refreshed": 0, "answered": 0,
                       "chunks": 0, "actions": 0}
        self.trace: list = []  # delivered action rows (keep_trace)

    def measure_rate(self, step: int, stamp: float, busy: bool) -> None:
        """Control rate from a stretch of observations the robot had actions queued for
        throughout: an idle robot's timestep stands still and would read as a slow one."""
        if not busy:
            self.rate_anchor = None
            return
        if self.rate_anchor is None:
            self.rate_anchor = (step, stamp)
            return
        ds, dt = step - self.rate_anchor[0], stamp - self.rate_anchor[1]
        if dt >= 0.25 and ds > 0:  # long enough that one action more or less is a small error
            self.hz = min(1000.0, max(1.0, 0.7 * self.hz + 0.3 * ds / dt))
            self.rate_anchor = (step, stamp)

    def submitted(self, rid: int, step: int, stamp: float, obs) -> None:
        """Round `rid` from the observation at `step` is queued (LeRobot's _predicted_timesteps)."""
        self.next_round += 1
        self.counts["rounds"] += 1
        self.rounds[rid] = (step, stamp)
        self.rounds.pop(rid - 64, None)
        self.predicted.add(step)
        if len(self.predicted) > 4096:
            self.predicted = {s for s in self.predicted if s >= step}
        self.last_state = obs.joints
