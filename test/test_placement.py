"""Algorithm 1 phase 3 (seed 000 §3.2.3): edge first, cloud when it beats the edge delay."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros.core import EngineProfile, Tier
from robotserve_ros.core.observation import Observation
from robotserve_ros.core.placement import PLACEMENTS, LinkEstimate, ShortestDelay, make_placement, payload_bytes
from robotserve_ros.core.serving import FillInOrder
from robotserve_ros.core.types import InferenceRequest, PendingRequest

EDGE = EngineProfile({1: 100.0, 4: 200.0})  # 4 requests per 200 ms batch
CLOUD = EngineProfile({1: 30.0, 4: 60.0})


def pending(n: int, side: int = 0) -> list:
    out = []
    for i in range(n):
        o = Observation(images=[np.zeros((side, side, 3), np.uint8)]) if side else None
        out.append(PendingRequest(InferenceRequest(f"t{i}", 0, observation=o), 0.0, i, 0, 0.0))
    return out


def setup(rtt=0.1, bw=125e6):
    edge, cloud = Tier("edge", EDGE), Tier("cloud", CLOUD)
    link = LinkEstimate(rtt_s=rtt, bandwidth_bps=bw)
    return edge, cloud, link, ShortestDelay({"cloud": link}, [edge])


def test_short_edge_queue_stays_on_edge():
    edge, cloud, _, pl = setup()
    out = pl.place(pending(5), [edge, cloud], 0.0)
    # 4 fit the edge batch; the 5th would complete at the edge after 200 + 100 ms, the cloud
    # takes 130 ms.
    assert [(t.name, len(b)) for t, b in out] == [("edge", 4), ("cloud", 1)]
    edge2, cloud2, _, pl2 = setup(rtt=0.3)  # a slower link (330 ms): the 5th waits for the edge
    out = pl2.place(pending(5), [edge2, cloud2], 0.0)
    assert [(t.name, len(b)) for t, b in out] == [("edge", 4)]
    out = pl2.place(pending(3), [edge2, cloud2], 0.0)
    assert [(t.name, len(b)) for t, b in out] == [("edge", 3)]


def test_long_edge_queue_offloads_to_cloud():
    edge, cloud, _, pl = setup(rtt=0.4)
    ordered = pending(20)
    out = dict((t.name, b) for t, b in pl.place(ordered, [edge, cloud], 0.0))
    assert out["edge"] == ordered[:4]  # line 15: the head of the priority order stays on the edge
    # Requests 5-8 would complete on the edge at 300-400 ms (< 430 ms cloud): they stay
    # queued for the edge; the next ones would complete >= 500 ms, so the cloud takes a
    # full batch of them (430-460 ms).
    assert out["cloud"] == ordered[8:12]
    # The edge is busy until 200 ms: with only the cloud free, t4-t7 still wait for the edge.
    edge.busy = 1
    out = pl.place(ordered[4:], [cloud], 0.0)
    assert [p.task_id for _, b in out for p in b] == [f"t{i}" for i in range(8, 12)]


def test_edge_delay_counts_edge_compute_not_only_queueing():
    # Algorithm 1 line 17 compares the cloud latency with the delay until the request would
    # COMPLETE on the edge: the edge frees at 200 ms, then computes it for 100 ms.
    edge, cloud, _, pl = setup(rtt=0.1)
    pl.place(pending(4), [edge], 0.0)  # the edge runs a batch of 4 until 200 ms
    edge.busy = 1
    # At 150 ms the edge frees in 50 ms (< the 130 ms cloud), but completes at 150 ms (> 130 ms).
    out = pl.place(pending(1), [cloud], 0.15)
    assert [(t.name, len(b)) for t, b in out] == [("cloud", 1)]
    edge2, cloud2, _, slow = setup(rtt=0.3)  # 330 ms cloud: the edge's 150 ms wins
    slow.place(pending(4), [edge2], 0.0)
    edge2.busy = 1
    assert slow.place(pending(1), [cloud2], 0.15) == []


def test_transfer_time_counts_against_the_cloud():
    edge, cloud, _, pl = setup(rtt=0.05, bw=0.5e6)  # 0.5 MB/s: a 150 KB image costs 300 ms
    out = pl.place(pending(6, side=224), [edge, cloud], 0.0)
    assert [t.name for t, _ in out] == ["edge"]
    edge2, cloud2, _, fast = setup(rtt=0.05, bw=1e9)
    out = fast.place(pending(6, side=224), [edge2, cloud2], 0.0)
    assert [(t.name, len(b)) for t, b in out] == [("edge", 4), ("cloud", 2)]
    assert payload_bytes(pending(1, side=224)[0].request) == 224 * 224 * 3


def test_a_link_sending_compressed_frames_is_priced_at_its_wire_bytes():
    """The same slow link as above, but its frames go as JPEG (30x fewer bytes, measured by the
    remote engine): the transfer no longer outweighs the edge's queue."""
    edge, cloud, link, pl = setup(rtt=0.05, bw=0.5e6)
    link.observe_payload(5_000, 224 * 224 * 3)
    assert link.wire_ratio == pytest.approx(5_000 / 150_528) and link.as_dict()["wire_ratio"] == link.wire_ratio
    out = pl.place(pending(6, side=224), [edge, cloud], 0.0)
    assert [(t.name, len(b)) for t, b in out] == [("edge", 4), ("cloud", 2)]
    link.observe_payload(150_528, 150_528)  # raw again: the ratio moves back by alpha
    assert 5_000 / 150_528 < link.wire_ratio < 1


def test_down_link_is_not_used():
    edge, cloud, link, pl = setup(rtt=0.01)
    link.mark_down(now=0.0)
    assert [t.name for t, _ in pl.place(pending(10), [edge, cloud], 0.5)] == ["edge"]
    assert "cloud" in [t.name for t, _ in pl.place(pending(10), [edge, cloud], 5.0)]  # down_s passed


def test_link_estimates_follow_measurements():
    link = LinkEstimate(rtt_s=0.5, bandwidth_bps=1e9, alpha=0.5)
    for _ in range(10):
        link.observe_rtt(0.1)
    assert link.rtt_s == pytest.approx(0.1, abs=1e-3)
    # Calls that spend 0.1 s of round trip + 1 s moving 10 MB: 10 MB/s.
    for _ in range(10):
        link.observe_call(10_000_000, 1.1)
    assert link.bandwidth_bps == pytest.approx(10e6, rel=0.01)
    assert link.transfer_s(1_000_000) == pytest.approx(0.1, rel=0.01)
    # A small call is a round-trip sample: the estimate moves towards it.
    link.observe_call(100, 0.3)
    assert 0.1 < link.rtt_s < 0.3


def test_registry_default_and_names():
    assert isinstance(make_placement("fill_in_order"), FillInOrder)
    assert {"fill_in_order", "shortest_delay"} <= set(PLACEMENTS.names())
    with pytest.raises(ValueError):
        ShortestDelay({}, [])
