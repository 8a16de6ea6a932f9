"""The live core of language beside actions (core/language_frames.py, seed 001 §3.3): one
decode round per frame (or per idle period for standalone questions), never while an action
batch is in flight, and driven by core/loop.py's LiveDriver like every live path."""
from __future__ import annotations

import time

from robotserve_ros.core.clock import VirtualClock, WallClock
from robotserve_ros.core.language_frames import SLOT, DecodeRound, LanguageFrameCore
from robotserve_ros.core.loop import LiveDriver


def make(clock, work=True, idle=0.05):
    rounds, published = [], []
    core = LanguageFrameCore(clock, has_work=lambda: work if isinstance(work, bool) else work(),
                             decode_round=lambda: rounds.append(clock.now()) or [len(rounds)],
                             publish=published.append, idle_frame_s=idle)
    return core, rounds, published


def test_one_round_per_frame_and_never_during_an_action_batch():
    clock = VirtualClock()
    core, rounds, published = make(clock)
    assert core.dispatch() == []  # no frame yet, not idle yet
    core.action_started()
    clock.advance_to(1.0)  # idle long enough, but an action batch is in flight
    assert core.dispatch() == []
    assert core.counts["deferred_for_actions"] == 1
    core.action_ended()  # a frame
    core.action_started()
    core.action_ended()  # a second frame before the decode worker ran
    items = core.dispatch()
    assert items == [DecodeRound(2)] and items[0].slot == SLOT
    assert core.dispatch() == []  # one round at a time
    core.run(SLOT, items[0])
    assert published == [[1]] and core.counts["rounds"] == 1


def test_idle_rounds_serve_standalone_questions_and_nothing_without_work():
    clock = VirtualClock()
    active = {"n": 1}
    core, rounds, _ = make(clock, work=lambda: active["n"] > 0, idle=0.1)
    clock.advance_to(0.05)
    assert core.dispatch() == []
    clock.advance_to(0.1)
    item, = core.dispatch()
    assert item.frames == 0 and core.counts["idle_rounds"] == 1
    core.run(item.slot, item)
    active["n"] = 0
    clock.advance_to(5.0)
    core.frame()
    assert core.dispatch() == []  # nothing to decode


def test_live_driver_runs_the_rounds_between_action_batches():
    core, rounds, published = make(WallClock(), idle=0.01)
    drv = LiveDriver.for_core(core, core.run, poll_s=0.005, name="language")
    core.set_kick(drv.kick)
    drv.start()
    try:
        for _ in range(20):  # action batches of 5 ms, back to back
            core.action_started()
            time.sleep(0.005)
            core.action_ended()
            time.sleep(0.002)
        deadline = time.monotonic() + 2
        while len(published) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        drv.close()
    assert len(published) >= 3
    assert core.counts["frames"] == 20
