"""The LeRobot endpoint on an existing fleet (the inference server node's Runner and engine)
instead of policy groups of its own: every client that names the policy that engine serves
joins that one group, batched with the fleet's other robots."""
from __future__ import annotations

import os

import grpc

from ..policy_source import NOT_ALLOWED, PolicySourceError, resolve_policy
from ..tensors import shown
from .groups import PolicyGroup, PolicyGroups
from .payloads import Refused


class Fleet:
    """A Runner and its engine, for LeRobotCompatServicer(fleet=...): its lock is the
    servicer's (re-entrant: replies submit the held observations under it)."""

    def __init__(self, runner, engine) -> None:
        self.runner, self.engine, self.lock = runner, engine, runner.lock

    def groups(self, cfg, clock, lock, supported, on_replies, refresher) -> "FleetGroups":
        return FleetGroups(self, cfg, clock, lock, supported, on_replies, refresher)


class FleetGroups(PolicyGroups):
    """One group, the fleet's; a client naming another policy is refused."""

    def __init__(self, fleet: Fleet, *args) -> None:
        super().__init__(*args)
        eng = fleet.engine
        self.policy_dir = getattr(eng, "policy_dir", None)
        self.policy_type = getattr(eng, "policy_type", None)
        self.group = PolicyGroup(("fleet", self.policy_dir or getattr(eng, "name", "engine")), eng,
                                 fleet.runner.core, fleet.runner)
        self.groups[self.group.key] = self.group
        fleet.runner.listen(self.on_replies)

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

    def close(self) -> None:  # the fleet's owner closes its Runner and engine
        pass
