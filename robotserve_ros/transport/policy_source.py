"""Where a served policy comes from: a local directory under the allowed policy directories,
or a hub id from an allow-list, through huggingface_hub's cache. Never a path outside both.

- Local paths are resolved with realpath (symlinks, `..`) BEFORE the containment check,
  whether or not they exist; a path outside the allowed directories and a missing one get
  ONE answer (same code, same text), so the answer does not tell which paths exist.
- Hub ids (`org/name`) must match a pattern of the allow-list (`lerobot/*,myorg/*`, fnmatch);
  they are fetched with snapshot_download (only *.json and *.safetensors), honour
  HF_HUB_OFFLINE (then the cache alone), and the snapshot is refused if it holds any pickle
  checkpoint (*.bin, *.pt, *.pth, *.ckpt, *.pkl): safetensors only, no code from the network.
  The revision is pinned to the snapshot's commit and logged.
- Anything client-sent that reaches a log or an answer is escaped (`shown`: no control characters).
"""
from __future__ import annotations

import fnmatch
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .tensors import shown

log = logging.getLogger("robotserve.policy_source")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
HUB_FILES = ["*.json", "*.safetensors"]
NOT_ALLOWED = "policy_not_allowed"


class PolicySourceError(ValueError):
    """`code`: policy_not_allowed (outside or missing: one answer), hub_unavailable, not_safetensors,
    hub_busy (too many hub ids resolved lately)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class PolicySource:
    path: str  # the local directory to load from (realpath)
    hub_id: Optional[str] = None
    revision: Optional[str] = None  # the hub commit it was pinned to

    def describe(self) -> dict:
        return {"hub_id": self.hub_id, "revision": self.revision} if self.hub_id else {"path": self.path}


def _offline() -> bool:
    from huggingface_hub import constants

    v = os.environ.get("HF_HUB_OFFLINE")
    return constants.HF_HUB_OFFLINE if v is None else v.strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_patterns(text: Optional[str]) -> tuple:
    """`--allow-hub lerobot/*,myorg/*` -> its patterns; ValueError names a malformed one."""
    pats = tuple(p.strip() for p in (text or "").split(",") if p.strip())
    for p in pats:
        if p.count("/") != 1 or not p.split("/")[0]:
            raise ValueError(f"--allow-hub pattern {p!r} is not ORG/NAME (wildcards allowed, e.g. lerobot/*)")
    return pats


def hub_allowed(spec: str, allow_hub: Sequence[str]) -> bool:
    return bool(HUB_ID.match(spec)) and ".." not in spec and any(fnmatch.fnmatchcase(spec, p) for p in allow_hub)


def resolve_policy(spec: str, policy_dirs: Sequence[str] = (), allow_hub: Sequence[str] = (), *,
                   revision: Optional[str] = None, must_exist: bool = True,
                   cache_dir: Optional[str] = None) -> PolicySource:
    """`spec` as a PolicySource, or PolicySourceError. With no policy_dirs any local directory
    may be loaded (the server's operator named it); a client-named path needs policy_dirs."""
    if not isinstance(spec, str) or not spec or "\x00" in spec:
        raise PolicySourceError(NOT_ALLOWED, "the policy must be a non-empty path or hub id")
    if hub_allowed(spec, allow_hub):
        return _from_hub(spec, revision, cache_dir)
    refused = PolicySourceError(
        NOT_ALLOWED, f"policy {shown(spec, 80)} is outside the directories this server loads policies from, or "
                     f"missing, and not an allowed hub id ({', '.join(allow_hub) or 'none allowed'})")
    try:
        real = os.path.realpath(os.path.expanduser(spec))  # before the check, existing or not
    except (OSError, ValueError, RuntimeError):  # an unknown ~user, a symlink loop
        raise refused from None
    if policy_dirs and not any(Path(real).is_relative_to(os.path.realpath(os.path.expanduser(d))) for d in policy_dirs):
        raise refused
    if must_exist and not os.path.isdir(real):
        raise refused  # the same answer as outside
    return PolicySource(real)


class HubResolutions:
    """Hub ids are named by clients, so resolving them is budgeted: each (id, revision) is
    resolved once per process and pinned, a failure is remembered for `failure_ttl_s` (asked
    again, it is answered from memory, not from the hub), at most `per_window` new resolutions
    start per `window_s` (past that: `hub_busy`, at once), and at most `max_entries` are kept
    (the oldest go). A name being resolved is resolved once: other callers wait for it."""

    def __init__(self, per_window: int = 8, window_s: float = 60.0, failure_ttl_s: float = 300.0,
                 max_entries: int = 256, clock=None) -> None:
        import threading
        import time
        from collections import OrderedDict, deque

        self.per_window, self.window_s, self.failure_ttl_s, self.max_entries = per_window, window_s, failure_ttl_s, max_entries
        self.clock = clock or time.monotonic
        self.entries: OrderedDict = OrderedDict()  # key -> PolicySource | (PolicySourceError, until) | Event (resolving)
        self.started: deque = deque()  # when each resolution of the window started
        self.lock = threading.Lock()
        self.hub_calls = 0

    def resolve(self, key: tuple, fetch) -> PolicySource:
        import threading

        while True:
            with self.lock:
                now, got = self.clock(), self.entries.get(key)
                if isinstance(got, PolicySource):
                    return got
                if isinstance(got, tuple) and now < got[1]:
                    raise got[0]
                if not isinstance(got, threading.Event):
                    while self.started and now - self.started[0] >= self.window_s:
                        self.started.popleft()
                    if len(self.started) >= self.per_window:
                        raise PolicySourceError("hub_busy", f"{self.per_window} hub ids resolved in the last "
                                                f"{self.window_s:g} s already; ask again later")
                    self.started.append(now)
                    self.hub_calls += 1
                    mine = self.entries[key] = threading.Event()
                    break
            got.wait(60.0)  # another caller is resolving the same name
        try:
            result = fetch()
        except Exception as e:  # noqa: BLE001 - remembered like any failure; never a stuck name
            err = e if isinstance(e, PolicySourceError) else PolicySourceError(
                "hub_unavailable", f"hub id {shown(key[0])} could not be resolved: {type(e).__name__}")
            result = (err, self.clock() + self.failure_ttl_s)
        with self.lock:
            self.entries[key] = result
            self.entries.move_to_end(key)
            while len(self.entries) > self.max_entries:
                old_key, old = next(iter(self.entries.items()))
                if isinstance(old, threading.Event):
                    break  # being resolved: it stays until done
                del self.entries[old_key]
        mine.set()
        if isinstance(result, tuple):
            raise result[0]
        return result


HUB = HubResolutions()  # one per process: every endpoint's clients share the budget


def _from_hub(hub_id: str, revision: Optional[str], cache_dir: Optional[str]) -> PolicySource:
    from huggingface_hub import constants

    key = (hub_id, revision, cache_dir or constants.HF_HUB_CACHE)
    # every client naming it gets the revision the first one pinned, no hub call each
    return HUB.resolve(key, lambda: _snapshot(hub_id, revision, cache_dir))


def _snapshot(hub_id: str, revision: Optional[str], cache_dir: Optional[str]) -> PolicySource:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = _offline()
    try:
        path = snapshot_download(hub_id, revision=revision, cache_dir=cache_dir, allow_patterns=HUB_FILES,
                                 local_files_only=offline)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        where = "the local hub cache (HF_HUB_OFFLINE is set)" if offline else "the hub or its local cache"
        raise PolicySourceError("hub_unavailable", f"hub id {hub_id}{'@' + shown(revision) if revision else ''} "
                                f"cannot be had from {where}: {type(e).__name__}") from None
    real = os.path.realpath(path)
    pickles = sorted(p.name for p in Path(real).rglob("*") if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise PolicySourceError("not_safetensors", f"hub id {hub_id} holds pickle checkpoint(s) {pickles[:3]}: "
                                "this server loads safetensors only")
    if not any(Path(real).glob("*.safetensors")):
        raise PolicySourceError("not_safetensors", f"hub id {hub_id} has no .safetensors weights")
    pinned = Path(path).name  # snapshots/<commit>: the revision it resolved to
    log.info("policy %s pinned at revision %s (%s)", hub_id, pinned, shown(real, 200))
    return PolicySource(real, hub_id, pinned)
