"""core/loop.py: the live driver every serving core uses (pure Python, threads only)."""
import threading
import time
from typing import NamedTuple

import pytest

from robotserve_ros.core.loop import LiveDriver


class Item(NamedTuple):  # a work item names its slot
    slot: str
    n: object


def _until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)
    return cond()


def test_items_go_to_their_slot_and_each_slot_runs_one_at_a_time():
    lock = threading.Lock()
    todo = [Item("prefill", i) for i in range(5)] + [Item("decode", i) for i in range(5)]
    done, running, overlap = [], {"prefill": 0, "decode": 0}, []

    def dispatch():
        with lock:
            out = list(todo)
            todo.clear()
        return out

    def run(slot, item):
        with lock:
            running[slot] += 1
            overlap.append(running[slot])
        time.sleep(0.002)
        with lock:
            running[slot] -= 1
            done.append((slot, item.n))

    d = LiveDriver({"prefill": 1, "decode": 1}, dispatch, run).start()
    d.kick()
    assert _until(lambda: len(done) == 10)
    d.close()
    assert max(overlap) == 1  # one thread per slot: never two items of a slot at once
    assert sorted(i for s, i in done if s == "prefill") == list(range(5))
    assert [i for s, i in done if s == "decode"] == list(range(5))  # a slot keeps the dispatch order


def test_a_crashing_item_is_reported_and_the_slot_serves_the_next():
    todo, done, crashed = ["bad", "good"], [], []

    def dispatch():
        out = [Item("w", x) for x in todo]
        todo.clear()
        return out

    def run(slot, item):
        if item.n == "bad":
            raise RuntimeError("boom")
        done.append(item.n)

    d = LiveDriver({"w": 1}, dispatch, run, on_crash=lambda s, i, e: crashed.append((s, i, str(e)))).start()
    d.kick()
    assert _until(lambda: done == ["good"])
    d.close()
    assert crashed == [("w", Item("w", "bad"), "boom")]


def test_a_failing_dispatch_does_not_stop_the_loop():
    calls = {"n": 0}
    done = []

    def dispatch():
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("core bug")
        return [Item("w", calls["n"])] if calls["n"] == 2 else []

    d = LiveDriver({"w": 2}, dispatch, lambda s, i: done.append(i.n), poll_s=0.01).start()
    d.kick()
    assert _until(lambda: done == [2])
    d.close()


def test_slots_need_threads():
    with pytest.raises(ValueError, match="slot"):
        LiveDriver({"w": 0}, lambda: [], lambda s, i: None)
