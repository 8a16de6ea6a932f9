"""Tasks belong to the robot that opened them: a MAC over the whole message, keyed per robot.

A robot and the server share a key (one file per robot, `<key_dir>/<robot id>.key`, the
robot id being its namespace without the leading slash, '/' as '.'). Every srv/Infer request
and every progress message carries HMAC-SHA256(key, kind, body), the body being the whole
message as sent with its MAC field empty (the protocol serializes it: CDR for ROS), so no
field the server acts on (task_done, the round, the observation, the exec info) can be
changed without the key. The message's auth stamp is its sequence number: per task and kind,
a stamp older than the newest accepted one is a replay and refused, the same stamp with a
different body is refused, and a byte-identical re-send is accepted (robots re-send a round
by design; the fleet answers it once). A task id is bound to the robot that opens it and must
lie in that robot's namespace (`<robot>/...`), so no enrolled robot can claim another's next
task. What this stops: forging, altering or replaying another robot's progress or requests,
squatting its tasks. What it does not: DDS lets every participant read everything, so an
eavesdropper still sees observations and chunks; only SROS 2 (encryption and access control
per enclave) stops that. Pure Python: hmac, hashlib."""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path
from typing import Optional

from .errors import RequestError

MIN_KEY_BYTES = 16
_DOMAIN = b"robotserve/task-auth/2\0"  # a MAC of this scheme is never one of another
KINDS = ("infer", "refresh", "progress")  # what a MAC is for: a request never passes as progress


class NotTaskOwner(RequestError):
    """The task belongs to another robot, or the message's MAC or sequence does not verify."""


def key_file_name(robot_id: str) -> str:
    """`/fleet/arm3` -> `fleet.arm3.key`: one flat folder of keys."""
    return robot_id.strip("/").replace("/", ".") + ".key"


def body_mac(key: bytes, kind: str, body: bytes) -> bytes:
    """HMAC-SHA256 over the message kind (length-prefixed) and the message body."""
    k = kind.encode("utf-8")
    return hmac.new(key, _DOMAIN + struct.pack("!I", len(k)) + k + bytes(body), hashlib.sha256).digest()


def in_namespace(task_id: str, robot_id: str) -> bool:
    """A task id a robot may open: `<robot id without its leading slash>/...`."""
    prefix = robot_id.strip("/") + "/"
    return len(prefix) > 1 and task_id.startswith(prefix) and len(task_id) > len(prefix)


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
    robot it belongs to, and per task and kind the newest accepted (sequence, body digest).
    `check` raises NotTaskOwner (counted by the caller) or returns."""

    def __init__(self, key_dir: str, max_skew_s: float, max_tasks: int = 100_000) -> None:
        if not os.path.isdir(key_dir):
            raise ValueError(f"key_dir {key_dir!r} is not a folder")
        self.key_dir, self.max_skew_s, self.max_tasks = key_dir, max_skew_s, max_tasks
        self.keys: dict = {}  # robot id -> key (None: no key file)
        self.owner: dict = {}  # task id -> robot id
        self.seen: dict = {}  # (task id, kind) -> (sequence, sha256 of the body) newest accepted

    def _key(self, robot_id: str) -> Optional[bytes]:
        if robot_id not in self.keys:
            try:
                self.keys[robot_id] = read_key(os.path.join(self.key_dir, key_file_name(robot_id)))
            except (OSError, ValueError):
                self.keys[robot_id] = None
            while len(self.keys) > self.max_tasks:  # names of robots without keys must not grow it
                self.keys.pop(next(iter(self.keys)))
        return self.keys[robot_id]

    def check(self, task_id: str, robot_id: str, kind: str, seq: int, body: bytes, mac: bytes, now: float,
              bind: bool) -> bool:
        """Verify one message (`seq`: its auth stamp in ns); `bind`: a request that may open the
        task for its robot. Returns True when this call bound the task (undo with forget)."""
        owner = self.owner.get(task_id)
        if owner is not None and owner != robot_id:
            raise NotTaskOwner(f"task {task_id!r} belongs to another robot")
        if not robot_id or not mac:
            raise NotTaskOwner("this server binds tasks to robots: robot_id and auth_mac are required")
        key = self._key(robot_id)
        if key is None:
            raise NotTaskOwner("no key for this robot_id")
        if abs(seq * 1e-9 - now) > self.max_skew_s:
            raise NotTaskOwner(f"auth stamp is more than {self.max_skew_s} s from the server's clock")
        if not hmac.compare_digest(body_mac(key, kind, body), bytes(mac)):
            raise NotTaskOwner("auth_mac does not verify over this message")
        if owner is None:
            if not bind:
                raise NotTaskOwner(f"task {task_id!r} is not open")
            if not in_namespace(task_id, robot_id):
                raise NotTaskOwner(f"robot {robot_id!r} opens tasks named '{robot_id.strip('/')}/...', "
                                   f"not {task_id!r}")
        self._sequence(task_id, kind, seq, hashlib.sha256(bytes(body)).digest())
        if owner is None:
            self.owner[task_id] = robot_id
            return True
        return False

    def _sequence(self, task_id: str, kind: str, seq: int, digest: bytes) -> None:
        """Replays refused: older than the newest accepted, or its sequence with another body."""
        last = self.seen.get((task_id, kind))
        if last is not None:
            if seq < last[0]:
                raise NotTaskOwner(f"replayed {kind}: its auth stamp is older than the newest accepted for this task")
            if seq == last[0] and digest != last[1]:
                raise NotTaskOwner(f"a different {kind} under a used auth stamp")
        self.seen[(task_id, kind)] = (seq, digest)

    def forget(self, task_id: str) -> None:
        self.owner.pop(task_id, None)
        for kind in KINDS:
            self.seen.pop((task_id, kind), None)
