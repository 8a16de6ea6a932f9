"""A robot client's account of its rounds, for live benchmarks (robot_client's and
light_fleet's `stats_file`): every request and answer keyed by (task_id, round_id), chunk
lateness and control-tick timing, written as JSON on shutdown. Plain Python, no rclpy."""
from __future__ import annotations

import json
import os
import time
from collections import Counter


class ClientAccount:
    """Per-robot accounting for live benchmarks, on time.monotonic(): requests and answers
    keyed by (task_id, round_id), chunk lateness (how long the robot had been holding
    position when the chunk arrived; 0 if it came before the queue ran dry) and the
    intervals between control ticks."""

    def __init__(self, robot: str, hz: float) -> None:
        self.robot, self.hz = robot, hz
        self.requests = self.resent = self.chunks = self.duplicates = self.mismatched = self.left_task_answers = 0
        self.answers_to_resent = 0  # a second answer to a round sent twice: expected, never used twice
        self.errors = Counter()
        self.sent: dict = {}  # (task, round) -> send time, until answered
        self.keys = set()  # (task, round) of every request sent
        self.resent_keys = set()  # (task, round) sent more than once
        self.seen = set()  # (task, round) of every chunk received
        self.log: list = []  # [task, round, arrival, reply_ms, lateness_ms] per chunk the robot used
        self.dry_since = None  # when the robot started holding position, while it holds
        self.ticks = Counter()  # commanded / holding (in a task, queue dry) / waiting (no task request yet)
        self.tick_ms = Counter()  # interval between control ticks, rounded to 1 ms -> count
        self.tick_s = Counter()  # ticks per second of time.monotonic()
        self.late_tick_s = Counter()  # ticks more than 1.5 periods after the previous one, per second
        self.first_tick = self.last_tick = None
        # Fault injection (live/fault.py): messages dropped by kind, and per round lost while open
        # [kind, drop time, expected queue wait s, re-send interval s, first re-send, served, drops]
        self.dropped = Counter()
        self.lost: dict = {}

    def tick(self, commanded: bool, in_task: bool) -> None:
        now = time.monotonic()
        if self.last_tick is not None:
            dt = now - self.last_tick
            self.tick_ms[int(round(1000 * dt))] += 1
            if dt > 1.5 / self.hz:
                self.late_tick_s[int(now)] += 1
        else:
            self.first_tick = now
        self.tick_s[int(now)] += 1
        self.last_tick = now
        self.ticks["commanded" if commanded else "holding" if in_task else "waiting"] += 1
        if not commanded and in_task and self.dry_since is None:
            self.dry_since = now

    def on_send(self, key: tuple) -> None:
        self.requests += 1
        if key in self.keys:
            self.resent += 1
            self.resent_keys.add(key)
        self.keys.add(key)
        now = time.monotonic()
        self.sent.setdefault(key, now)  # a round's reply time runs from its first send
        lost = self.lost.get(key)
        if lost is not None and lost[4] is None:
            lost[4] = now  # the lost round asked for again

    def on_drop(self, key: tuple, kind: str, wait_s: float, interval_s: float) -> None:
        """A request of the open round `key` never sent, or its reply discarded (kind): the round
        is lost until answered; its recovery is timed from the first drop."""
        self.dropped[kind] += 1
        lost = self.lost.get(key)
        if lost is None:
            self.lost[key] = [kind, time.monotonic(), wait_s, interval_s, None, None, 1]
        else:
            lost[6] += 1

    def on_answer(self, key: tuple, resp) -> float:
        """Any answer (chunk or error) to the request of `key`; returns its round trip in ms."""
        t = self.sent.pop(key, None)
        ms = 1000 * (time.monotonic() - t) if t is not None else float("nan")
        if resp is None:
            self.errors["no_response"] += 1
        elif resp.status.code != 0:
            self.errors[resp.status.reason] += 1
        else:
            got = (resp.chunk.task_id, resp.chunk.round_id)
            self.mismatched += got != key
            if got in self.seen:  # a round answered twice: expected only if it was sent twice
                if got in self.resent_keys:
                    self.answers_to_resent += 1
                else:
                    self.duplicates += 1
            self.seen.add(got)
            self.chunks += 1
        return ms

    def on_chunk_used(self, key: tuple, reply_ms: float, queue_left: int) -> None:
        now = time.monotonic()
        late = now - self.dry_since if self.dry_since is not None else 0.0
        self.log.append([key[0], key[1], round(now, 4), round(reply_ms, 3), round(1000 * late, 3)])
        lost = self.lost.get(key)
        if lost is not None and lost[5] is None:
            lost[5] = now
        if queue_left > 0:
            self.dry_since = None

    def dump(self, path: str, extra: dict) -> None:
        now = time.monotonic()
        out = {
            "robot": self.robot, "control_hz": self.hz, "requests": self.requests, "resent": self.resent,
            "chunks": self.chunks, "duplicates": self.duplicates, "answers_to_resent": self.answers_to_resent,
            "mismatched": self.mismatched,
            "left_task_answers": self.left_task_answers, "errors": dict(self.errors),
            "unanswered": [[k[0], k[1], round(now - t, 4)] for k, t in self.sent.items()],
            "chunk_log": self.log, "ticks": dict(self.ticks), "tick_interval_ms": {str(k): v for k, v in sorted(self.tick_ms.items())},
            "ticks_per_s": {str(k): v for k, v in sorted(self.tick_s.items())},
            "late_ticks_per_s": {str(k): v for k, v in sorted(self.late_tick_s.items())},
            "first_tick": self.first_tick, "last_tick": self.last_tick, "closed_at": now,
            "holding_now_s": now - self.dry_since if self.dry_since is not None else 0.0,
            "resent_rounds": sorted(k[1] for k in self.resent_keys),  # which rounds were asked for again
            "dropped": dict(self.dropped), "lost_rounds": [[k[0], k[1], *v] for k, v in self.lost.items()], **extra,
        }
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, path)
