"""Tasks belong to their first caller: a per-task MAC keyed per robot (issue 29).

A robot and the server share a key (one file per robot, `<key_dir>/<robot id>.key`, the
robot id being its namespace without the leading slash, '/' as '.'). Every srv/Infer request
and every progress message of a task carries HMAC-SHA256(key, task_id, round_id, stamp); the
first verified request binds the task to its robot, and anything later for that task must
verify under that same robot's key. What this stops: a node on the domain that does not hold
the key (blind spoofing: ending another robot's task, re-sending its task and round to take
its chunk). What it does not stop: DDS lets every participant read requests and progress, so
an eavesdropper can replay a message it saw within `max_skew_s`; only SROS 2 (encryption and
access control per enclave) stops that. Pure Python: hmac, hashlib."""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path
from typing import Optional

from .errors import RequestError

MIN_KEY_BYTES = 16


class NotTaskOwner(RequestError):
    """The task belongs to another robot, or the request's MAC does not verify."""


def key_file_name(robot_id: str) -> str:
    """`/fleet/arm3` -> `fleet.arm3.key`: one flat folder of keys."""
    return robot_id.strip("/").replace("/", ".") + ".key"


def task_mac(key: bytes, task_id: str, round_id: int, stamp_ns: int) -> bytes:
    """HMAC-SHA256 over task, round and stamp, length-prefixed so no two tuples share bytes."""
    t = task_id.encode("utf-8")
    return hmac.new(key, struct.pack("!I", len(t)) + t + struct.pack("!Iq", int(round_id), int(stamp_ns)),
                    hashlib.sha256).digest()


def read_key(path: str) -> bytes:
    """A key file's bytes (surrounding whitespace stripped); an empty or short one is an error."""
    key = Path(path).read_bytes().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"key file {path}: {len(key)} bytes, at least {MIN_KEY_BYTES}")
    return key


def new_key() -> bytes:
    return os.urandom(32).hex().encode()


class TaskBinder:
    """The server's side: robot keys read from `key_dir` (once per robot, cached), task ->
    robot it belongs to. `check` raises NotTaskOwner (counted by the caller) or returns."""

    def __init__(self, key_dir: str, max_skew_s: float, max_tasks: int = 100_000) -> None:
        if not os.path.isdir(key_dir):
            raise ValueError(f"key_dir {key_dir!r} is not a folder")
        self.key_dir, self.max_skew_s, self.max_tasks = key_dir, max_skew_s, max_tasks
        self.keys: dict = {}  # robot id -> key (None: no key file)
        self.owner: dict = {}  # task id -> robot id

    def _key(self, robot_id: str) -> Optional[bytes]:
        if robot_id not in self.keys:
            try:
                self.keys[robot_id] = read_key(os.path.join(self.key_dir, key_file_name(robot_id)))
            except (OSError, ValueError):
                self.keys[robot_id] = None
            while len(self.keys) > self.max_tasks:  # names of robots without keys must not grow it
                self.keys.pop(next(iter(self.keys)))
        return self.keys[robot_id]

    def check(self, task_id: str, round_id: int, robot_id: str, stamp_ns: int, mac: bytes, now: float,
              bind: bool) -> str:
        """Verify one message; `bind`: a request that may make the task its robot's. Returns the robot id."""
        owner = self.owner.get(task_id)
        if owner is not None and owner != robot_id:
            raise NotTaskOwner(f"task {task_id!r} belongs to another robot")
        if not robot_id or not mac:
            raise NotTaskOwner("this server binds tasks to robots: robot_id and auth_mac are required")
        key = self._key(robot_id)
        if key is None:
            raise NotTaskOwner("no key for this robot_id")
        if abs(stamp_ns * 1e-9 - now) > self.max_skew_s:
            raise NotTaskOwner(f"auth_stamp is more than {self.max_skew_s} s from the server's clock")
        if not hmac.compare_digest(task_mac(key, task_id, round_id, stamp_ns), bytes(mac)):
            raise NotTaskOwner("auth_mac does not verify")
        if owner is None and bind:
            self.owner[task_id] = robot_id
        return robot_id

    def forget(self, task_id: str) -> None:
        self.owner.pop(task_id, None)
