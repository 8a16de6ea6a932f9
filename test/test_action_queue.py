"""The robot's action queue (seed 000 Figure 2b): stale actions of a late chunk are dropped,
the overlap with queued actions is blended by the chosen aggregate function."""
import numpy as np
import pytest

from robotserve_ros.core.action_queue import ActionQueue


def chunk(first_value, n, dim=2):
    return np.array([[first_value + i] * dim for i in range(n)], dtype=np.float32)


def test_first_chunk_is_queued_whole_and_popped_in_order():
    q = ActionQueue()
    assert q.merge(0, chunk(0, 4)) == (0, 0)
    assert [q.pop()[0] for _ in range(4)] == [0, 1, 2, 3]
    assert q.pop() is None and q.timestep == 4  # ran dry: the robot holds, the timestep stays


def test_late_chunk_drops_the_actions_already_executed():
    """Requested at timestep 2, arrives when the robot is at timestep 5: rows 0-2 are past."""
    q = ActionQueue("latest_only")
    q.merge(0, chunk(0, 5))
    for _ in range(5):
        q.pop()
    assert q.merge(2, chunk(100, 6)) == (3, 0)
    assert [q.pop()[0] for _ in range(3)] == [103, 104, 105]


@pytest.mark.parametrize("agg,expected", [("latest_only", 102.0), ("weighted_average", 0.3 * 2 + 0.7 * 102),
                                          ("average", 52.0), ("conservative", 0.7 * 2 + 0.3 * 102)])
def test_overlap_is_blended_by_the_aggregate(agg, expected):
    q = ActionQueue(agg)
    q.merge(0, chunk(0, 4))
    q.pop()
    q.pop()  # at timestep 2; actions for 2 and 3 still queued
    assert q.merge(2, chunk(102, 4)) == (0, 2)
    assert len(q) == 4
    assert q.pop()[0] == pytest.approx(expected)


def test_unknown_aggregate_is_refused():
    with pytest.raises(ValueError, match="unknown aggregate"):
        ActionQueue("median")


def test_queued_is_what_is_left_in_order_without_popping():
    q = ActionQueue("latest_only")
    q.merge(0, chunk(0, 4))
    q.pop()
    left = q.queued()  # what trajectory_chunk sends as one trajectory
    assert [a[0] for a in left] == [1.0, 2.0, 3.0] and len(q) == 3 and q.timestep == 1
