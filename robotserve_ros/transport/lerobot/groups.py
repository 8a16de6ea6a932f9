"""Policy groups: one per loaded policy, each its engine and a one-tier Fleet (serve/) over
it. Clients naming the same policy share a group (and batches); different models never
share a batch."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Optional

import grpc

from ...serve import Fleet, fleet_over
from ...serve.build import engine_rtc_shape
from .config import CompatConfig
from ..policy_source import NOT_ALLOWED, PolicySourceError, resolve_policy
from ..tensors import shown
from .payloads import IMAGE_PREFIX, STATE_KEY, Layout, Refused

log = logging.getLogger("robotserve.lerobot")
TIER = "edge"  # each group serves on its own local engine: one tier


class PolicyGroup:
    def __init__(self, key: tuple, engine, fleet: Fleet) -> None:
        self.key, self.engine, self.fleet = key, engine, fleet
        self.last_used = time.monotonic()  # a session started on it last (policy_idle_s)

    # Its fleet's core and runner, for tests and benches that look inside (serve/ owns them).
    core = property(lambda self: self.fleet._core)
    runner = property(lambda self: self.fleet._runner)

    def stats(self) -> dict:
        """`errors`: requests the core refused or failed (the core's counts)."""
        return self.fleet.core_stats()


def _bad(msg: str) -> Refused:
    return Refused("bad_policy", grpc.StatusCode.INVALID_ARGUMENT, msg)


class PolicyGroups:
    """The loaded policies, by (policy type, resolved path[, action size])."""

    def __init__(self, cfg: CompatConfig, clock, lock, supported: tuple, refresher=None) -> None:
        self.cfg, self.clock, self.lock, self.supported = cfg, clock, lock, supported
        self.refresher = refresher
        self.groups: dict[tuple, PolicyGroup] = {}
        self._load_lock = threading.Lock()  # one policy load at a time; each loads once
        self.unloaded = 0  # groups unloaded: idle past policy_idle_s, or to make room

    def resolve(self, spec) -> tuple:
        """Check a RemotePolicyConfig; its group (loaded once), layout and chunk length."""
        ptype, path, apc = spec.policy_type, spec.pretrained_name_or_path, spec.actions_per_chunk
        feats, rename = spec.lerobot_features, spec.rename_map
        if not isinstance(ptype, str) or ptype not in self.supported:
            raise _bad(f"policy type {shown(str(ptype))} is not one LeRobot's async inference serves ({', '.join(self.supported)})")
        if isinstance(apc, bool) or not isinstance(apc, int) or apc < 1:
            raise _bad(f"actions_per_chunk must be an integer >= 1, got {shown(str(apc))}")
        if not isinstance(path, str) or not path:
            raise _bad("pretrained_name_or_path must be a non-empty string")
        if not isinstance(feats, dict) or not isinstance(rename, dict):
            raise _bad("lerobot_features and rename_map must be dicts")
        state = feats.get(STATE_KEY)
        names = state.get("names") if isinstance(state, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _bad(f"lerobot_features needs '{STATE_KEY}' with its joint 'names' (as hw_to_dataset_features writes it)")
        cams = [k for k, v in feats.items() if isinstance(k, str) and k.startswith(IMAGE_PREFIX)]
        group = self.get(ptype, path, len(names))
        return group, self._layout(group, names, cams, rename), apc

    def get(self, ptype: str, path: str, n_joints: int) -> PolicyGroup:
        cfg = self.cfg
        try:  # a local dir under policy_dirs or an allowed hub id; outside and missing: one answer
            resolved = Path(resolve_policy(path, cfg.policy_dirs, cfg.allow_hub, must_exist=cfg.engine == "lerobot").path)
        except PolicySourceError as e:
            code = grpc.StatusCode.PERMISSION_DENIED if e.code == NOT_ALLOWED else grpc.StatusCode.FAILED_PRECONDITION
            raise Refused(e.code, code, e.message) from None
        if cfg.engine == "lerobot":
            from ...engines.lerobot_engine import PolicyDirError, check_policy_dir

            try:
                found = check_policy_dir(resolved)["type"]
            except PolicyDirError as e:
                raise _bad(f"{shown(str(e), 300)} (a policy folder of config.json and safetensors weights)") from None
            if found != ptype:
                raise _bad(f"policy type {shown(ptype)} asked for, but {shown(path)} holds a {shown(str(found))} policy")
            key = (ptype, str(resolved))
        else:  # a stand-in engine: one per policy name and action size
            key = (ptype, str(resolved), n_joints)
        with self._load_lock:
            g = self.groups.get(key)
            if g is None:
                self._make_room()
                g = self._load(key, str(resolved), n_joints)
                with self.lock:
                    self.groups[key] = g
            g.last_used = time.monotonic()
        return g

    def _make_room(self) -> None:
        """Before a load, at max_policy_groups: unload the least recently used group no
        session is on; none: refused (each group holds an engine and its runner's threads)."""
        if len(self.groups) < self.cfg.max_policy_groups:
            return
        with self.lock:
            in_use = self.in_use()
            free = sorted((g for g in self.groups.values() if g not in in_use), key=lambda g: g.last_used)
        if not free:
            raise Refused("too_many_policies", grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.cfg.max_policy_groups} policies are loaded and in use (max_policy_groups); retry later")
        self.unload(free[0])

    def in_use(self) -> set:
        """Under the lock: the groups a session is on (the servicer sets `sessions`)."""
        return {c.group for c in self.sessions()} if self.sessions is not None else set()

    sessions = None  # callable -> the servicer's live sessions

    def idle(self, now: float, in_use: set) -> list:
        """Under the lock: groups no session is on, unused for policy_idle_s."""
        return [g for g in self.groups.values() if g not in in_use and now - g.last_used > self.cfg.policy_idle_s]

    def unload(self, g: PolicyGroup) -> None:
        """Free a group: its fleet's threads end and its engine closes (outside the lock)."""
        with self.lock:
            if self.groups.get(g.key) is not g or g in self.in_use():  # a session took it meanwhile
                return
            del self.groups[g.key]
            self.unloaded += 1
        log.info("policy %s %s unloaded (no session on it)", shown(g.key[0]), shown(g.key[1], 200))
        g.fleet.close()
        g.engine.close()

    def _load(self, key: tuple, path: str, n_joints: int) -> PolicyGroup:
        from ...core.profile import EngineProfile
        from ...engines import make_engine

        cfg, ec = self.cfg, self.cfg.engine_config
        params = ec.chosen
        profile = ec.engine_profile() if ec.batch_sizes else None  # else the engine's own
        if ec.name == "lerobot":
            params["policy_dir"] = path
        else:
            params.setdefault("action_dim", n_joints)
            params.setdefault("realtime", True)
            profile = profile or EngineProfile({1: 30.0})
        t = time.monotonic()
        try:
            engine = make_engine(ec.name, profile, **params)
        except (OSError, TypeError, ValueError, KeyError) as e:
            raise Refused("policy_load_failed", grpc.StatusCode.FAILED_PRECONDITION,
                          f"cannot load {key[0]} policy from {shown(path)}: {shown(str(e), 300)}") from None
        log.info("loaded %s policy from %s in %.1f s", shown(key[0]), shown(path, 200), time.monotonic() - t)
        fleet = fleet_over(engine, cfg.scheduler_config.build(), self.clock, tier=TIER, max_batch=cfg.max_batch, slots=1,
                           refresher=self.refresher, stale_obs_s=cfg.stale_obs_s, lock=self.lock,
                           rtc_shape=engine_rtc_shape(engine))
        return PolicyGroup(key, engine, fleet.start())

    def _layout(self, g: PolicyGroup, names: list, cams: list, rename: dict) -> Layout:
        eng = g.engine
        image_keys = eng.image_keys
        if image_keys is None:  # a stand-in engine takes whatever the robot has
            return Layout(list(names), [(k[len(IMAGE_PREFIX):], None) for k in cams])
        if len(names) != eng.state_dim:
            raise _bad(f"the robot has {len(names)} joints, the {g.key[0]} policy takes a state of {eng.state_dim}")
        by_policy_key = {rename.get(k, k): k for k in cams}  # LeRobot's rename_map: robot key -> policy key
        cameras = []
        for k, (_, h, w) in zip(image_keys, eng.image_shapes):
            if k not in by_policy_key:
                raise _bad(f"the policy takes camera '{k}' but the robot sends {sorted(cams) or 'none'} "
                           f"(map one with rename_map)")
            cameras.append((by_policy_key[k][len(IMAGE_PREFIX):], (h, w)))
        return Layout(list(names), cameras)

    def close(self) -> None:
        for g in list(self.groups.values()):
            g.fleet.close()
            g.engine.close()
