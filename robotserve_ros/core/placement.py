"""Placement: which tier runs which requests (Algorithm 1 phase 3 of seed 000).

`fill_in_order` (the default) fills free tiers in the order given, edge first.
`shortest_delay` is Kairos' hybrid edge-cloud placement (§3.2.3, Algorithm 1 lines 15-19):
the first N_e requests of the priority order go to the edge; each later one goes to the
cloud when the estimated cloud latency -- the cloud profile at that batch size + the
network round trip + the batch's bytes at the measured bandwidth -- is below its estimated
edge delay -- the wait until an edge slot frees plus the edge compute of the batch it would
join, i.e. when it would complete there -- while the cloud has room (|S_c| < N_c).

The round trip and the bandwidth are LinkEstimates moved by measurements at run time
(pings and call timings fed by the transport), starting from configured guesses.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from .registry import Registry
from .serving import FillInOrder, Placement, Tier
from .types import InferenceRequest, PendingRequest


class LinkEstimate:
    """Round trip and bandwidth of one edge-cloud link, as EWMAs of measurements.

    observe_rtt: a ping's round trip (no payload to speak of).
    observe_call: a call that moved `nbytes` and spent `net_s` on the network (its wall
    time minus the server's engine time); what the round trip does not explain is transfer.
    A call of probe_bytes or more always measures bandwidth (else an estimate far too high
    would never learn). A failed call marks the link down for `down_s`; a later success or ping brings it back.
    observe_payload: wire bytes per observation payload byte of a call (1 for raw tensors; a
    link that sends camera frames as JPEG measures it), so a request is priced at what it
    puts on the wire, not at its raw arrays.
    """

    def __init__(
        self, rtt_s: float = 0.1, bandwidth_bps: float = 125e6, alpha: float = 0.3, down_s: float = 2.0,
        probe_bytes: int = 64 << 10,
    ) -> None:
        if not (rtt_s >= 0 and bandwidth_bps > 0 and 0 < alpha <= 1):
            raise ValueError("rtt_s >= 0, bandwidth_bps > 0 and 0 < alpha <= 1 are needed")
        self.rtt_s, self.bandwidth_bps, self.alpha, self.down_s = float(rtt_s), float(bandwidth_bps), alpha, down_s
        self.probe_bytes = probe_bytes  # a call this large always measures bandwidth
        self.rtt_samples = 0
        self.bw_samples = 0
        self.down_until = -math.inf
        self.wire_ratio, self.ratio_samples = 1.0, 0

    def transfer_s(self, nbytes: int) -> float:
        return nbytes / self.bandwidth_bps

    def observe_rtt(self, rtt_s: float) -> None:
        if not (math.isfinite(rtt_s) and rtt_s >= 0):
            return
        self.rtt_s = rtt_s if self.rtt_samples == 0 else self.rtt_s + self.alpha * (rtt_s - self.rtt_s)
        self.rtt_samples += 1

    def observe_call(self, nbytes: int, net_s: float) -> None:
        if not (math.isfinite(net_s) and net_s >= 0):
            return
        transfer = self.transfer_s(nbytes)
        if nbytes < self.probe_bytes and transfer < 0.2 * self.rtt_s:
            # A small payload: the call was a round trip (what little transfer it had aside).
            self.observe_rtt(net_s - transfer)
        elif net_s > self.rtt_s:
            # What the round trip does not explain was transfer: a bandwidth sample.
            bw = nbytes / (net_s - self.rtt_s)
            self.bandwidth_bps = bw if self.bw_samples == 0 else self.bandwidth_bps + self.alpha * (bw - self.bandwidth_bps)
            self.bw_samples += 1

    def observe_payload(self, wire_bytes: int, payload_bytes: int) -> None:
        if payload_bytes > 0 and wire_bytes >= 0:
            r = wire_bytes / payload_bytes
            self.wire_ratio = r if self.ratio_samples == 0 else self.wire_ratio + self.alpha * (r - self.wire_ratio)
            self.ratio_samples += 1

    def mark_down(self, now: float) -> None:
        self.down_until = now + self.down_s

    def mark_up(self) -> None:
        self.down_until = -math.inf

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def as_dict(self) -> dict:
        return {"rtt_s": self.rtt_s, "bandwidth_bps": self.bandwidth_bps, "rtt_samples": self.rtt_samples,
                "bw_samples": self.bw_samples, "wire_ratio": self.wire_ratio}


def payload_bytes(req: InferenceRequest) -> int:
    """Observation bytes a request puts on the wire (images + joints)."""
    obs = req.observation
    if obs is None:
        return 0
    n = sum(int(np.asarray(im).nbytes) for im in getattr(obs, "images", ()))
    return n + int(np.asarray(getattr(obs, "joints", ())).nbytes)


class ShortestDelay:
    """Algorithm 1 phase 3: prefer the edge, offload a request to the cloud when the cloud
    gets it back sooner than the edge would.

    links: cloud tier name -> LinkEstimate; every other tier is edge. edge_tiers: the edge
    Tier objects the serving core owns (busy ones too: their expected free time is the
    start of every edge queueing delay). The placement remembers when the batches it sent
    to each edge tier should end (profile latency), so it needs no view of the core.
    """

    def __init__(
        self,
        links: Mapping[str, LinkEstimate],
        edge_tiers: Sequence[Tier],
        reply_bytes: int = 0,
        bytes_of: Callable[[InferenceRequest], int] = payload_bytes,
        overhead_bytes: int = 256,
    ) -> None:
        if not edge_tiers:
            raise ValueError("shortest_delay needs at least one edge tier")
        self.links = dict(links)
        self.edge_tiers = list(edge_tiers)
        self.reply_bytes, self.bytes_of, self.overhead_bytes = reply_bytes, bytes_of, overhead_bytes
        self._ends: dict[str, list] = {t.name: [] for t in self.edge_tiers}
        self.offloaded = 0
        self.kept = 0

    def _edge_free_at(self, now: float, just_sent: set) -> float:
        """When the first edge slot is expected to be free: its running batches' predicted
        ends (one per busy slot; a batch past its prediction counts as ending now)."""
        best = math.inf
        for t in self.edge_tiers:
            running = t.busy + (t.name in just_sent)  # the core counts this round's batch after place()
            ends = sorted(e for e in self._ends[t.name] if e > now)[-running:] if running else []
            self._ends[t.name] = ends
            best = min(best, min(ends) if len(ends) >= t.slots else now)
        return best

    def place(self, ordered: Sequence[PendingRequest], free: Sequence[Tier], now: float):
        clouds = [t for t in free if t.name in self.links and self.links[t.name].up(now)]
        edges = [t for t in free if t.name not in self.links]
        out, i = [], 0
        # Line 15: S_e <- S[1:N_e], the free edge capacity.
        for t in edges:
            if i >= len(ordered):
                break
            batch = list(ordered[i : i + t.batch_limit])
            i += len(batch)
            out.append((t, batch))
            self._ends[t.name].append(now + t.profile.latency_s(len(batch)))
        self.kept += i
        if not clouds or i >= len(ordered):
            return out
        # Lines 16-19: each later request to the cloud when it beats its edge delay.
        edge = max(self.edge_tiers, key=lambda t: t.batch_limit)
        b_e, l_e = edge.batch_limit, edge.profile.latency_s(edge.batch_limit)
        free_at = self._edge_free_at(now, {t.name for t, _ in out})
        queued = 0  # requests ahead of this one in the edge queue (beyond S_e)
        ci, cloud_batch, cloud_bytes = 0, [], 0
        for p in ordered[i:]:
            if ci >= len(clouds):
                break
            t = clouds[ci]
            link = self.links[t.name]
            # Line 17 "edge delay", phase 3 "shortest estimated delay": until it would complete
            # on the edge (queueing + the compute of the batch it joins), not only until it starts.
            edge_delay = max(0.0, free_at - now) + (queued // b_e) * l_e + edge.profile.latency_s(queued % b_e + 1)
            nb = self.bytes_of(p.request) * link.wire_ratio + self.reply_bytes + self.overhead_bytes
            cloud = t.profile.latency_s(len(cloud_batch) + 1) + link.rtt_s + link.transfer_s(cloud_bytes + nb)
            if cloud < edge_delay:
                cloud_batch.append(p)
                cloud_bytes += nb
                if len(cloud_batch) >= t.batch_limit:  # |S_c| < N_c: this cloud slot is full
                    out.append((t, cloud_batch))
                    ci, cloud_batch, cloud_bytes = ci + 1, [], 0
            else:
                queued += 1
        if cloud_batch:
            out.append((clouds[ci], cloud_batch))
        self.offloaded += sum(len(b) for t, b in out if t.name in self.links)
        return out


PLACEMENTS: Registry[Placement] = Registry("placement")
PLACEMENTS.register("fill_in_order", FillInOrder)  # no knobs: any given is refused
PLACEMENTS.register("shortest_delay", ShortestDelay)


def make_placement(name: str, **params) -> Placement:
    return PLACEMENTS.create(name, **params)


def hybrid_tiers(edge: Tier, edge_engine, clouds: Mapping[str, Mapping], connect: Callable,
                 placement: str = "fill_in_order", placement_params: Optional[Mapping] = None):
    """The edge tier plus one cloud tier per entry of `clouds` (name -> slots, max_batch,
    rtt_s, bandwidth_bps, and the rest for `connect(link, **rest)`, which returns the tier's
    engine: the transport's, injected so core imports none), and the placement over them.
    Returns (tiers, engines by tier name, placement). On any failure the engines made so far
    are closed and ValueError(tier name or "placement", what went wrong) is raised."""
    tiers, engines, links = [edge], {edge.name: edge_engine}, {}
    at = "placement"
    try:
        for name, spec in clouds.items():
            at, kw = name, dict(spec)
            slots, max_batch = int(kw.pop("slots", 1)), kw.pop("max_batch", None) or None
            link = links[name] = LinkEstimate(**{k: float(kw.pop(k)) for k in ("rtt_s", "bandwidth_bps") if k in kw})
            eng = engines[name] = connect(link, **kw)
            tiers.append(Tier(name, eng.profile, slots=slots, max_batch=max_batch))
        at = "placement"
        pp = dict(placement_params or {})
        if placement == "shortest_delay":  # it reads the links the transport measures (§3.2.3)
            pp = {"links": links, "edge_tiers": [edge], **pp}
        return tiers, engines, make_placement(placement, **pp)
    except Exception as e:
        for name, eng in engines.items():
            if name != edge.name:
                eng.close()
        raise ValueError(at, str(e)) from e  # (where, what): the caller names the parameter


__all__ = ["LinkEstimate", "PLACEMENTS", "ShortestDelay", "hybrid_tiers", "make_placement", "payload_bytes"]
