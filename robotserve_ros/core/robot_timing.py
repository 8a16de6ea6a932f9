"""The robot side of asynchronous inference, as timing (seed 000 §2.1, §5.1): one set of
pure functions that the simulator, robot_client and bench hybrid all call, so a simulated
robot and a real one trigger their next request at the same action.

A round's chunk starts executing when it has arrived and the previous round's actions
have run out; the next request goes out when the actions left fall to the trigger point,
ceil(batch-1 generation latency x control rate), or at once if the round is shorter.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence


def trigger_actions(batch1_latency_s: float, control_hz: float) -> int:
    """Actions left at which the next request goes out: just enough to hide generation."""
    return math.ceil(batch1_latency_s * control_hz - 1e-9)


def exec_start(chunk_ready: float, prev_exec_end: Optional[float]) -> float:
    """The robot holds position until both the chunk is there and the last one is done."""
    return chunk_ready if prev_exec_end is None or prev_exec_end < chunk_ready else prev_exec_end


def request_after(actions: int, trigger: int, control_hz: float) -> float:
    """Seconds from a round's execution start to the next round's request."""
    return max(0, actions - trigger) / control_hz


def alone_latency(rounds: Sequence[int], control_hz: float, batch1_latency_s: float) -> float:
    """Contention-free end-to-end latency: every request served at once at batch 1."""
    trig = trigger_actions(batch1_latency_s, control_hz)
    t_req, prev_end = 0.0, None
    for n in rounds:
        start = exec_start(t_req + batch1_latency_s, prev_end)
        prev_end = start + n / control_hz
        t_req = start + request_after(n, trig, control_hz)
    return prev_end


def backed_off(resend_after_s: float, resends: int, max_backoff: float = 8.0) -> float:
    """The re-send interval after `resends` re-sends of a round: doubled per re-send, capped."""
    return resend_after_s * min(2.0 ** resends, max_backoff)


def unanswered_action(now: float, sent_at: float, first_sent_at: float, resend_after_s: float,
                      request_timeout_s: float, resends: int = 0, max_backoff: float = 8.0,
                      overdue_told: bool = False) -> Optional[str]:
    """What a robot does about its unanswered round: "resend" the same round once its resend
    interval passed since the last send (a lost reply is recovered); "overdue", once, when
    request_timeout_s passed since the first send (say so and count it); else None.

    The interval doubles with each re-send of the round (resend_after_s, 2x, 4x, ... capped at
    max_backoff x): a reply that is only late (a loaded robot or server) is not asked for again
    and again, and every re-send makes the server answer once more (replayed from its cache)
    on top of the work that made it late. A round is never given up: a robot without its
    chunk holds position, and giving up would not bring the next one sooner -- it would only
    turn a late reply into a lost one (seen at load 20: replies 12-30 s late to one starved
    robot process). A restarted server answers unknown_task, and the robot goes on from there."""
    if now - sent_at > backed_off(resend_after_s, resends, max_backoff):
        return "resend"
    if not overdue_told and now - first_sent_at > request_timeout_s:
        return "overdue"
    return None


def refusal_backoff(retry_s: float, overloads: int, cap_s: float = 30.0) -> float:
    """Pause before asking again after a refusal: retry_s, doubled per `overloaded` refusal in
    a row (capped): a server at capacity is not asked again every retry_s by every robot."""
    return retry_s if overloads <= 0 else min(cap_s, retry_s * 2.0 ** overloads)


class QueueHint:
    """The server's word on its queue: how long a round sent now is expected to wait (the
    server publishes it, nodes/inference_server.py `queue_topic`). One per robot process,
    shared by its robots' timers; a word older than `fresh_s` is not taken."""

    __slots__ = ("wait_s", "at", "fresh_s")

    def __init__(self, fresh_s: float = 3.0) -> None:
        self.wait_s, self.at, self.fresh_s = 0.0, float("-inf"), fresh_s

    def heard(self, wait_s: float, now: float) -> None:
        if math.isfinite(wait_s) and wait_s >= 0:
            self.wait_s, self.at = wait_s, now

    def wait(self, now: float) -> float:
        return self.wait_s if now - self.at <= self.fresh_s else 0.0


class ResendTimer:
    """When a robot re-sends its unanswered round, from the reply times it measured: RFC 6298's
    retransmission timer (SRTT + max(G, 4 RTTVAR), alpha 1/8, beta 1/4). A round that is queued
    on the server is answered after the queue's wait, so the interval follows the queue and a
    queued round is not asked for again (57 % of all requests at 300 light robots were such
    re-sends); a lost one is re-sent once that wait has passed. Before the first answer it is
    `initial_s`; never below `floor_s` nor above `max_s`. An infinite initial_s never re-sends
    (the simulator's robots, whose engine loses nothing).

    The sample runs from the round's FIRST send: the server never runs a round twice, so the
    answer to a re-send of a queued round comes when the first call's would have. A re-sent
    round is sampled only when the server said its first call was there (it answers the older
    call `duplicate_request` when a re-send finds the round queued or generating: OpenRound.
    heard_queued); otherwise the first call or its reply was lost and the time from the first
    send is the re-send interval plus a wait, not a wait: skipped, as Karn's rule skips every
    re-sent sample (RFC 6298 §3). Sampled, one lost round of a 75 ms robot raised its interval
    to 21 s (fault injection, bench fleet-live --fault-drop).

    With a QueueHint the timer learns what the server's word does not explain: each sample is
    the reply time less the wait the server expected when the round was first sent, and the
    interval is the wait it expects now + that learnt margin. A plain RFC 6298 timer on reply
    times that include the queue carries a start-up queue for dozens of rounds (a real robot
    whose round 0 waited 6.2 s behind 100 robots had a 20 s interval for the rest of the run,
    so a round lost at the end was not asked for again before the bench's settle ended); a
    server word that is too short every time is learnt as margin, so those rounds are not
    asked for again either. Before a robot's first answer (all robots starting at once behind
    one queue) the interval is at least the server's expected wait + one granularity + 100 ms:
    the server's word is all it knows."""

    __slots__ = ("initial_s", "floor_s", "max_s", "granularity_s", "srtt", "rttvar", "rto", "samples", "hint")

    def __init__(self, initial_s: float, floor_s: float = 0.0, max_s: float = 60.0, granularity_s: float = 0.0,
                 hint: Optional[QueueHint] = None) -> None:
        if not initial_s > 0 or floor_s < 0 or not max_s > 0:
            raise ValueError(f"initial_s and max_s must be > 0 and floor_s >= 0, got {initial_s}, {max_s}, {floor_s}")
        self.initial_s, self.floor_s, self.max_s, self.granularity_s = initial_s, floor_s, max_s, granularity_s
        self.srtt: Optional[float] = None
        self.rttvar = 0.0
        self.rto = initial_s
        self.samples = 0
        self.hint = hint

    @classmethod
    def for_robot(cls, initial_s: float, control_hz: float, hint: Optional[QueueHint] = None) -> "ResendTimer":
        """A robot's: at least one control period over the mean reply time, and at least a tenth
        of the first guess (<= 1 s): a reply a tick late is not lost."""
        return cls(initial_s, floor_s=min(initial_s / 10, 1.0), granularity_s=1.0 / control_hz, hint=hint)

    def expected_wait(self, now: float) -> float:
        """The server's word on a round sent now (0 without one)."""
        return self.hint.wait(now) if self.hint is not None and not math.isinf(self.initial_s) else 0.0

    def interval(self, now: float) -> float:
        """Seconds after a send that its re-send is due (before doubling per re-send)."""
        if self.hint is None or math.isinf(self.initial_s):
            return self.rto
        wait, least = self.hint.wait(now), self.granularity_s + 0.1
        if self.samples == 0:
            return min(self.max_s, max(self.rto, wait + least))
        return min(self.max_s, wait + max(self.rto, least))

    def sample(self, rtt_s: float, expected_wait_s: float = 0.0) -> None:
        """A round answered rtt_s after its first send, when the server expected it to wait
        expected_wait_s: the timer learns the rest (RFC 6298 §2.2-2.3 on it)."""
        if math.isinf(self.initial_s) or not math.isfinite(rtt_s) or rtt_s < 0:
            return
        if math.isfinite(expected_wait_s) and expected_wait_s > 0:
            rtt_s = max(0.0, rtt_s - expected_wait_s)
        if self.srtt is None:
            self.srtt, self.rttvar = rtt_s, rtt_s / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt_s)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt_s
        self.samples += 1
        self.rto = min(self.max_s, max(self.floor_s, self.srtt + max(self.granularity_s, 4 * self.rttvar)))


class OpenRound:
    """A robot's open round as re-send state (unanswered_action's inputs): when it was first
    and last sent, how often re-sent, whether it was reported overdue, and whether a re-send is
    due. robot_client and light_fleet each keep one per robot. With a ResendTimer (kept across
    the robot's rounds) the re-send interval is the timer's, and an answered round samples it."""

    __slots__ = ("sent_at", "first_sent_at", "resends", "overdue_told", "resending", "timer", "first_arrived",
                 "expected_wait")

    def __init__(self, timer: Optional[ResendTimer] = None) -> None:
        self.sent_at = self.first_sent_at = self.expected_wait = 0.0
        self.resends = 0
        self.overdue_told = self.resending = self.first_arrived = False
        self.timer = timer

    def sent(self, now: float) -> None:
        """The round went out: a re-send if one was due, else a new round."""
        self.sent_at = now
        if self.resending:
            self.resends += 1
        else:
            self.first_sent_at, self.resends, self.overdue_told, self.first_arrived = now, 0, False, False
            self.expected_wait = self.timer.expected_wait(now) if self.timer is not None else 0.0
        self.resending = False

    def heard_queued(self) -> None:
        """The server answered an earlier call of this round `duplicate_request`: the round was
        queued or generating when a re-send came, so its first call got through."""
        self.first_arrived = True

    def answered(self, now: float) -> None:
        """The round's chunk came: the timer learns how long the queue made it wait (a re-sent
        round only if its first call got through: ResendTimer)."""
        if self.timer is not None and (self.resends == 0 or self.first_arrived):
            self.timer.sample(now - self.first_sent_at, self.expected_wait)

    def resend_due_at(self, now: float, resend_after_s: float) -> float:
        """When check() will first say "resend" for this round (the timer's interval when there is one)."""
        interval = self.timer.interval(now) if self.timer is not None else resend_after_s
        return self.sent_at + backed_off(interval, self.resends)

    def check(self, now: float, resend_after_s: float, request_timeout_s: float) -> Optional[str]:
        """unanswered_action for this round (its interval the timer's when there is one);
        "resend" marks a re-send due, "overdue" is said once."""
        if self.timer is not None:
            resend_after_s = self.timer.interval(now)
        act = unanswered_action(now, self.sent_at, self.first_sent_at, resend_after_s, request_timeout_s,
                                self.resends, overdue_told=self.overdue_told)
        if act == "resend":
            self.resending = True
        elif act == "overdue":
            self.overdue_told = True
        return act
