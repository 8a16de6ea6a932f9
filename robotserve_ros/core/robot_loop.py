"""One robot's side of asynchronous inference, as a loop every robot driver can run (seed 000
§2.1, §5.1; issue 34 item 1): trigger point, hold, re-send, progress, RTC leftover and
episode (task) bookkeeping. What the robot IS (ROS topics, a Meta-World env, a light host's
synthetic robot) stays behind a few hooks (RobotHooks); what carries a request (srv/Infer, a
virtual-clock core) stays with the driver. Pure Python: no rclpy, no clock of its own (every
call is given `now`).

Per control tick the driver calls `tick(now, hooks)` and acts on its event:
- "finished": the task is over (hooks.task_over()); the driver reports it done (progress
  with task_done, or the core's finish_task), then calls `next_task(now)` if more follow;
- "send": the actions left fell to the trigger point (core/robot_timing.trigger_actions) and
  the task needs more, or a re-send of the open round is due: the driver sends round
  `round` of `task_id` with `exec_info()` (and `rtc_leftover(hooks)` for real-time chunking)
  and calls `sent(now)`;
- "overdue": the open round went unanswered past request_timeout_s (said once; still re-sent).
With nothing to execute the robot holds position and the tick counts as idle.
On an answer: `answered(now)` when the chunk was used, `refused(now, reason)` when it was an
error or a chunk the robot cannot use (asked again after retry_s; after an `overloaded`
refusal, after retry_s doubled per refusal in a row), `restart(now)` when the server forgot
the task (the motion goes on under a new task id from round 0). The re-send interval follows
the reply times the robot measured (robot_timing.ResendTimer), kept across tasks.

A driver with no control ticks (an event loop on a virtual or wall clock replaying recorded
rounds: the trace simulator, bench hybrid, bench ray) runs ReplayRobot instead: the same
trigger point and execution rule, each round's times computed in closed form per event.
core/robot_timing is imported here alone; drivers take its names from this module.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence, Union

from .robot_timing import (alone_latency, exec_start, OpenRound, QueueHint, refusal_backoff, request_after,
                           ResendTimer, trigger_actions)
from .types import ExecInfo

__all__ = ["RobotHooks", "RobotLoop", "ReplayRobot", "loop_fields", "rtc_leftover", "trigger_actions",
           "alone_latency", "QueueHint"]


class RobotHooks(Protocol):
    """What the robot is. `execute` runs one control tick: True when an action ran, False when
    the robot held (nothing queued)."""

    def execute(self) -> bool: ...

    def left(self) -> int:
        """Actions queued and not yet executed."""
        ...

    def task_over(self) -> bool: ...

    def needs_more(self) -> bool:
        """Whether the task needs another round (False: the queue finishes it)."""
        ...


class RobotLoop:
    """The timing and bookkeeping of one robot (see the module docstring)."""

    __slots__ = ("name", "hz", "trigger", "resend_after_s", "request_timeout_s", "retry_s", "task_k", "task_id",
                 "round", "outstanding", "open_round", "retry_at", "task_start", "exec_start", "idle", "chunks",
                 "steps", "held", "done", "finished_tasks", "continued", "resend_timer", "overloads")

    def __init__(self, name: str, control_hz: float, trigger: int, *, resend_after_s: float = 2.0,
                 request_timeout_s: float = 30.0, retry_s: float = 0.2, now: float = 0.0,
                 hint: Optional[QueueHint] = None) -> None:
        if not control_hz > 0 or trigger < 0:
            raise ValueError(f"control_hz must be > 0 and trigger >= 0, got {control_hz}, {trigger}")
        self.name, self.hz, self.trigger = name, float(control_hz), int(trigger)
        self.resend_after_s, self.request_timeout_s, self.retry_s = resend_after_s, request_timeout_s, retry_s
        self.task_k = self.finished_tasks = self.continued = self.overloads = 0
        self.resend_timer = ResendTimer.for_robot(resend_after_s, control_hz, hint)  # hint: the server's queue
        self.start_task(now)

    @classmethod
    def for_latency(cls, name: str, control_hz: float, expected_latency_s: float, **kw) -> "RobotLoop":
        """Trigger point from the round trip the robot expects (core/robot_timing)."""
        return cls(name, control_hz, trigger_actions(expected_latency_s, control_hz), **kw)

    # --- tasks -------------------------------------------------------------------------------
    def start_task(self, now: float, keep_motion: bool = False) -> None:
        """A task starts (task id <name>/task<k>, round 0). keep_motion: the same motion goes on
        under a new id (the server forgot the task): its start, idle, steps and chunks are kept."""
        self.task_id = f"{self.name}/task{self.task_k}"
        self.round = 0
        self.outstanding = self.done = False
        self.open_round = OpenRound(self.resend_timer)
        self.retry_at = 0.0
        if not keep_motion:
            self.chunks = 0
            self.task_start: Optional[float] = None
            self.exec_start = now
            self.idle = 0.0
            self.steps = self.held = 0

    def next_task(self, now: float) -> None:
        self.task_k += 1
        self.start_task(now)

    def restart(self, now: float) -> None:
        """The server answered unknown_task / task_dropped: go on under a new id from round 0."""
        self.task_k += 1
        self.continued += 1
        self.start_task(now, keep_motion=True)
        self.retry_at = now + self.retry_s  # (after start_task, which clears it)

    # --- the control tick --------------------------------------------------------------------
    def tick(self, now: float, hooks: RobotHooks, ready: Union[bool, Callable[[], bool]] = True,
             draining: bool = False) -> tuple:
        """One control tick: (whether an action ran, event) with event None, "finished", "send"
        or "overdue" (module docstring). ready: the server can be reached (a callable is asked
        only when a send is otherwise due: robot_client logs a missing server then); draining:
        no new rounds, a due re-send still goes."""
        if self.done:
            return False, None
        commanded = hooks.execute()
        if commanded:
            self.steps += 1
        elif self.task_start is not None:
            self.held += 1
            self.idle += 1.0 / self.hz
        if hooks.task_over():
            self.done = True
            self.finished_tasks += 1
            return commanded, "finished"
        if self.outstanding:
            act = self.open_round.check(now, self.resend_after_s, self.request_timeout_s)
            if act == "overdue":
                return commanded, "overdue"
            if act != "resend":
                return commanded, None
            self.outstanding = False  # the earlier call stays open: the first answer wins
        if (self.open_round.resending or not draining) and now >= self.retry_at \
                and (self.open_round.resending or (hooks.left() <= self.trigger and hooks.needs_more())) \
                and (ready() if callable(ready) else ready):
            return commanded, "send"
        return commanded, None

    def held_ticks(self, n: int) -> None:
        """n control ticks the robot held while waiting for its open round, which a driver slept
        through (a virtual clock need not run a tick that changes nothing): counted as tick() would."""
        for _ in range(n):  # (added one by one: the same float sum as n ticks)
            self.held += 1
            self.idle += 1.0 / self.hz

    # --- the open round ----------------------------------------------------------------------
    def exec_info(self, hooks: RobotHooks) -> Optional[ExecInfo]:
        """Last execution info (seed 000 §3.2.1): none with round 0."""
        return ExecInfo(self.exec_start, hooks.left(), self.hz) if self.round > 0 else None

    def sent(self, now: float) -> None:
        if self.task_start is None:
            self.task_start = now
        self.outstanding = True
        self.open_round.sent(now)

    def heard_queued(self) -> None:
        """An earlier call of the open round was answered `duplicate_request`: it reached the
        server (the re-send interval may learn from the round's first send)."""
        self.open_round.heard_queued()

    def answered(self, now: float) -> None:
        """The round's chunk joined the queue: a new execution phase starts, the next round is next."""
        self.outstanding = False
        self.open_round.answered(now)
        self.overloads = 0
        self.exec_start = now
        self.chunks += 1
        self.round += 1

    def refused(self, now: float, reason: str = "") -> None:
        """An error, or a chunk the robot cannot use: the same round again after retry_s; a
        server that refused it as `overloaded` is asked again later each time in a row."""
        self.outstanding = False
        self.overloads = self.overloads + 1 if reason == "overloaded" else 0
        self.retry_at = now + refusal_backoff(self.retry_s, self.overloads)


def rtc_leftover(queued) -> "object":
    """Real-time chunking (core/rtc.py): the robot's unexecuted actions as the request's guide."""
    import numpy as np

    from .rtc import RtcGuide

    q = list(queued)
    return RtcGuide(np.asarray(q, np.float32) if q else np.zeros((0, 0), np.float32))


def loop_fields(cls: type, names: Sequence[str], attr: str = "loop", renamed: Optional[dict] = None) -> type:
    """Show a RobotLoop's fields as a driver's own (read and written through `attr`), so code
    written against the driver's attributes needs no change; `renamed`: driver name -> loop name."""
    def field(name: str) -> property:
        return property(lambda self: getattr(getattr(self, attr), name),
                        lambda self, v: setattr(getattr(self, attr), name, v))

    for name in names:
        setattr(cls, name, field(name))
    for own, name in (renamed or {}).items():
        setattr(cls, own, field(name))
    return cls


class ReplayRobot:
    """A robot replaying a recorded task (its rounds' lengths in actions) for a driver with no
    control ticks: the rule RobotLoop ticks through, in closed form per event (seed 000 §2.1,
    §5.1; core/robot_timing). A round's chunk starts executing when it has arrived and the last
    one ran out (the robot holds in between: idle); the next round goes out when `trigger`
    actions are left, at once if the round is shorter; after the last round the task ends when
    its last action has run. (A ticked robot counts an action done as its tick starts, so it
    asks up to one control period sooner than this closed form.)"""

    __slots__ = ("task_id", "rounds", "hz", "trigger", "arrival", "round", "prev_end", "idle", "exec_start")

    def __init__(self, task_id: str, rounds: Sequence[int], control_hz: float, trigger: int, arrival: float) -> None:
        if not control_hz > 0 or trigger < 0 or not len(rounds):
            raise ValueError(f"control_hz must be > 0, trigger >= 0 and rounds not empty, got {control_hz}, "
                             f"{trigger}, {len(rounds)} rounds")
        self.task_id, self.rounds, self.hz, self.trigger, self.arrival = task_id, rounds, float(control_hz), int(trigger), arrival
        self.round = 0  # the round being requested (or, after the last, the count)
        self.prev_end: Optional[float] = None  # when the last chunk's actions run out
        self.idle = 0.0
        self.exec_start = arrival

    @classmethod
    def for_latency(cls, task_id: str, rounds: Sequence[int], control_hz: float, expected_latency_s: float,
                    arrival: float) -> "ReplayRobot":
        """Trigger point from the round trip the robot expects, as RobotLoop.for_latency."""
        return cls(task_id, rounds, control_hz, trigger_actions(expected_latency_s, control_hz), arrival)

    def horizon(self) -> int:
        """Actions the open round asks for: the recorded round's."""
        return int(self.rounds[self.round])

    def remaining(self) -> int:
        """Rounds left, the open one included (what the trace knows exactly)."""
        return len(self.rounds) - self.round

    def answered(self, now: float) -> tuple:
        """The open round's chunk arrived at `now`: ("request", when the next round goes out,
        its ExecInfo), or after the last round ("done", when the task ends, the last ExecInfo
        with nothing left)."""
        n = self.rounds[self.round]
        start = exec_start(now, self.prev_end)
        self.idle += start - (self.arrival if self.prev_end is None else self.prev_end)
        self.prev_end, self.exec_start = start + n / self.hz, start
        self.round += 1
        if self.round < len(self.rounds):
            return "request", start + request_after(n, self.trigger, self.hz), ExecInfo(start, min(n, self.trigger), self.hz)
        return "done", self.prev_end, ExecInfo(start, 0, self.hz)
