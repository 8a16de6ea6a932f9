"""transport/openpi/budget.py on its own (no network): connections per key holder or address
within the total, frame bytes reserved in arrival order, a peer's own cap holding back only
that peer, a frame that can never fit refused, a waiter that leaves giving its turn up."""
from __future__ import annotations

import pytest

from robotserve_ros.transport.openpi.budget import Budgets, Caps, TooLarge

KEY, ADDR, OTHER = ("key", 0), ("addr", "10.0.0.1"), ("addr", "10.0.0.2")


def budgets() -> Budgets:
    return Budgets(Caps(connections=5, pending_bytes=100), per_key=Caps(4, 80), per_address=Caps(2, 50))


def test_connections_per_key_per_address_and_in_total():
    b = budgets()
    assert [b.admit(ADDR) for _ in range(3)] == [None, None, "max_connections_per_peer"]
    assert [b.admit(KEY) for _ in range(3)] == [None, None, None]
    assert b.admit(OTHER) == "max_connections"  # 5 in all
    b.leave(ADDR)
    assert b.admit(OTHER) is None and b.connections[ADDR] == 1
    b.leave(KEY)
    assert b.admit(KEY) is None
    assert b.admit(KEY) == "max_connections"


def test_frames_wait_in_turn_and_a_full_peer_holds_back_only_itself():
    b, granted = budgets(), []
    assert b.reserve(ADDR, 40, lambda: granted.append("a")).granted
    waiting_peer = b.reserve(ADDR, 20, lambda: granted.append("a2"))  # 60 > its address's 50
    assert not waiting_peer.granted
    assert b.reserve(OTHER, 30, lambda: granted.append("o")).granted  # another address passes it
    big = b.reserve(KEY, 40, lambda: granted.append("k"))  # 110 > the total 100: waits
    assert not big.granted
    late = b.reserve(OTHER, 10, lambda: granted.append("late"))  # fits, but would overtake on the total
    assert not late.granted and b.held_total == 70
    b.release(ADDR, 40)  # frees its address and the total
    assert granted == ["a2", "k", "late"] and b.held_total == 100 and not b.waiting


def test_a_frame_that_can_never_fit_is_refused_and_a_leaver_gives_its_turn_up():
    b, granted = budgets(), []
    with pytest.raises(TooLarge) as e:
        b.reserve(ADDR, 51, lambda: None)
    assert (e.value.name, e.value.cap) == ("max_pending_bytes_per_peer", 50)
    with pytest.raises(TooLarge) as e:
        b.reserve(KEY, 81, lambda: None)
    assert e.value.name == "max_pending_bytes_per_key"
    b.reserve(KEY, 80, lambda: None)
    gone = b.reserve(OTHER, 30, lambda: granted.append("gone"))
    after = b.reserve(ADDR, 10, lambda: granted.append("after"))
    assert not gone.granted and not after.granted
    b.cancel(gone)  # its connection closed while waiting: the one behind it fits now
    assert granted == ["after"] and after.granted and not b.waiting and b.held_total == 90
    b.release(KEY, 80)
    b.release(ADDR, 10)
    assert b.held_total == 0 and not b.held


def test_the_budget_parameters_are_typed():
    from robotserve_ros.transport.openpi.config import EndpointConfig

    for name in ("max_connections_per_key", "max_pending_bytes_per_key"):
        with pytest.raises(ValueError, match=name):
            EndpointConfig(**{name: 0})
    with pytest.raises(ValueError, match="heap_mmap_threshold"):
        EndpointConfig(heap_mmap_threshold=-1)
    d = EndpointConfig()
    assert (d.max_connections, d.max_connections_per_key, d.max_connections_per_peer) == (512, 256, 16)
    assert d.budgets().per_key == Caps(256, 128 << 20) and d.heap_mmap_threshold == 0
