"""The LeRobot endpoint on an existing Fleet (serve/: the inference server node's) instead of
policy groups of its own: every client that names the policy that fleet's engine serves
joins that one group, batched with the fleet's other robots."""
from __future__ import annotations

import os

import grpc

from ..policy_source import NOT_ALLOWED, PolicySourceError, resolve_policy
from ..tensors import shown
from .groups import PolicyGroup, PolicyGroups
from .payloads import Refused


class Fleet:
    """A serve.Fleet, for LeRobotCompatServicer(fleet=...): its lock is the servicer's
    (re-entrant: replies submit the held observations under it)."""

    def __init__(self, fleet) -> None:
        self.fleet, self.engine, self.lock = fleet, fleet.engine, fleet.lock

    def groups(self, cfg, clock, lock, supported, refresher) -> "FleetGroups":
        return FleetGroups(self, cfg, clock, lock, supported, refresher)


class FleetGroups(PolicyGroups):
    """One group, the fleet's; a client naming another policy is refused."""

    def __init__(self, fleet: Fleet, *args) -> None:
        super().__init__(*args)
        eng = fleet.engine
        self.policy_dir, self.policy_type = eng.policy_dir, eng.policy_type
        self.group = PolicyGroup(("fleet", self.policy_dir or eng.name), eng, fleet.fleet)
        self.groups[self.group.key] = self.group

    def get(self, ptype: str, path: str, n_joints: int) -> PolicyGroup:
        try:  # the same containment as everywhere; a stand-in engine serves any name within it
            real = resolve_policy(path, self.cfg.policy_dirs, self.cfg.allow_hub, must_exist=self.policy_dir is not None).path
        except PolicySourceError as e:
            code = grpc.StatusCode.PERMISSION_DENIED if e.code == NOT_ALLOWED else grpc.StatusCode.FAILED_PRECONDITION
            raise Refused(e.code, code, e.message) from None
        if self.policy_dir is None:
            return self.group
        if real != os.path.realpath(self.policy_dir) or ptype != self.policy_type:
            raise Refused("bad_policy", grpc.StatusCode.INVALID_ARGUMENT,
                          f"this server serves one {self.policy_type} policy; {shown(ptype)} {shown(path, 80)} is not it")
        return self.group

    def idle(self, now: float, in_use: set) -> list:  # the fleet's engine is never unloaded from here
        return []

    def close(self) -> None:  # the fleet's owner closes it and its engine
        pass
