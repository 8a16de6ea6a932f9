"""The gRPC wire's version (proto/*.proto), so edge servers and GPU servers can be upgraded
one machine at a time (docs/nodes.md, "Upgrading a fleet").

WIRE_VERSION goes up with every change of the proto; MIN_WIRE_VERSION is the oldest peer
this side still serves: it moves only when a change is not additive (a field's meaning
changed or one that was required is gone). A peer that says nothing is version 1, the wire
before versions (proto3 reads a missing field as 0)."""
from __future__ import annotations

from typing import Optional

import grpc

WIRE_VERSION = 2  # 2: versions on InferBatchRequest and ProfileReply (additive)
MIN_WIRE_VERSION = 1  # every change since 1 was additive: a version-1 peer is served


def said(version: int) -> int:
    return int(version) or 1


def refusal(peer_version: int, peer_min: int, peer: str) -> Optional[str]:
    """None if this side and a peer of `peer_version` (serving peers from `peer_min` on)
    can talk; else the one line saying why, naming both versions."""
    v, m = said(peer_version), said(peer_min)
    if v < MIN_WIRE_VERSION:
        return (f"the {peer} speaks wire version {v}; this one speaks {WIRE_VERSION} and serves "
                f"versions {MIN_WIRE_VERSION} and later: upgrade the {peer}")
    if WIRE_VERSION < m:
        return (f"the {peer} speaks wire version {v} and serves versions {m} and later; this one speaks "
                f"{WIRE_VERSION}: upgrade this one")
    return None


def versions() -> dict:
    """This side's versions, as the proto's fields."""
    return {"wire_version": WIRE_VERSION, "min_wire_version": MIN_WIRE_VERSION}


def refuse_call(request, context, counts, peer: str) -> None:
    """A call from a peer this side cannot serve ends FAILED_PRECONDITION, both versions named (counted)."""
    why = refusal(request.wire_version, request.min_wire_version, peer)
    if why is not None:
        counts["wire_version"] += 1
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
