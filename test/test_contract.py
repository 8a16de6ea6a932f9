"""core/contract.py: every one of the five serving cores answers the one contract (submit one
request object, dispatch items to named slots, complete / fail an item, cancel, stats as
plain data) on a VirtualClock, and the calls do what they say; sim/loop.py's one
virtual-clock loop serves every one of them to the end. No ROS, no torch."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pytest

from robotserve_ros.core import EngineProfile, InferenceRequest, ServingCore, Tier, VirtualClock, make_scheduler
from robotserve_ros.core.contract import ServingContract, contract_problems
from robotserve_ros.core.language_frames import LanguageFrameCore, LanguageRequest
from robotserve_ros.core.nova import PartitionPlan, VLMCore, VLMRequest, make_vlm_scheduler
from robotserve_ros.core.slo import SLORequest, StepResult, make_slo_core
from robotserve_ros.core.timely import SEGMENT_SCHEDULERS, SegmentOutcome, TimelyCore
from robotserve_ros.sim.loop import VirtualLoop
from conftest import zeros_chunk
from test_nova_core import small_profile
from test_slo_core import profile as slo_profile
from test_timely_core import PROFILE as TIMELY_PROFILE, SKILLS, plan


@dataclass
class Case:
    """How to speak to one core: its requests, what its engine returns for an item, and
    what each call must have changed (core-specific evidence that the call took effect)."""

    build: Callable
    requests: Callable          # () -> three request objects, a, b, c
    result: Callable            # (core, item) -> the engine's result for the item
    ids: tuple                  # the three requests' ids (for cancel)
    after_complete: Callable    # (core, handles, out) -> None, asserts
    after_fail: Callable        # (core, handles, item, out) -> None, asserts
    served: Callable            # (core, handles) -> True once every request was served


def _action_core(clock):
    prof = EngineProfile({1: 100.0, 2: 120.0})
    return ServingCore(make_scheduler("fifo"), [Tier("edge", prof, slots=2, max_batch=1)], clock)


def _action_fail(core, handles, item, gave_up):
    task = item.requests[0].task_id
    assert gave_up == [] and task in core.pending  # requeued, not lost
    assert core.stats.requeued == 1


ACTION = Case(
    build=_action_core,
    requests=lambda: [InferenceRequest(t, 0) for t in ("a", "b", "c")],
    result=lambda core, item: [zeros_chunk(4) for _ in item.requests],
    ids=("a", "b", "c"),
    after_complete=lambda core, handles, out: (len(out) == 1 and out[0].horizon == 4
                                               and core.stats.completed == 1) or pytest.fail(f"replies {out}"),
    after_fail=_action_fail,
    served=lambda core, handles: core.stats.completed == 3 and not core.pending,
)


def _timely_result(core, item):
    return {pid: SegmentOutcome(1, "s(cat)") for pid in item.plan_ids}


TIMELY = Case(
    build=lambda clock: TimelyCore(SEGMENT_SCHEDULERS.create("seg_fcfs"), TIMELY_PROFILE, SKILLS, clock),
    requests=lambda: [plan(p, 0.0) for p in ("a", "b", "c")],
    result=_timely_result,
    ids=("a", "b", "c"),
    after_complete=lambda core, handles, out: ([e.kind for e in out] == ["segment"]
                                               and core.stats.segments == 1) or pytest.fail(f"events {out}"),
    after_fail=lambda core, handles, item, out: ([e.kind for e in out] == ["done"] * len(item.plan_ids)
                                                 and not any(p in core.plans for p in item.plan_ids))
    or pytest.fail(f"events {out}"),
    served=lambda core, handles: core.stats.plans_done == 3 and not core.plans,
)


def _slo_result(core, item):
    if item.slot == "prefill":
        return StepResult({r.req_id: 7 for r in item.requests})
    return StepResult({r.req_id: [8] for r in item.batch})


def _slo_failed(core, handles, item, out):
    reqs = item.requests if item.slot == "prefill" else item.batch
    assert reqs and all(r.failed == "engine_failure" for r in reqs)


SLO = Case(
    build=lambda clock: make_slo_core("fcfs_cb", slo_profile(), clock, chunk_tokens=20),
    requests=lambda: [SLORequest(r, 20, 4) for r in ("a", "b", "c")],
    result=_slo_result,
    ids=("a", "b", "c"),
    after_complete=lambda core, handles, out: (handles[0].first_token_s is not None and handles[0].tokens == [7])
    or pytest.fail("the first request got no first token"),
    after_fail=_slo_failed,
    served=lambda core, handles: all(r.finished and r.tokens == [7, 8, 8, 8] for r in handles),
)


NOVA = Case(
    build=lambda clock: VLMCore(make_vlm_scheduler("fcfs", PartitionPlan(small_profile())), 8, clock),
    requests=lambda: [VLMRequest(r, None, tiles=1, prompt_tokens=10, max_tokens=3) for r in ("a", "b", "c")],
    result=lambda core, item: None,  # the engine writes into the requests' payloads
    ids=("a", "b", "c"),
    after_complete=lambda core, handles, out: (handles[0].stage == "prefill" and handles[0].t_vision[1] == 0.1)
    or pytest.fail(f"a is in {handles[0].stage}"),
    after_fail=lambda core, handles, item, out: (out == [item.front] and item.front.error == "engine_failure")
    or pytest.fail(f"finished {out}"),
    served=lambda core, handles: all(r.stage == "done" and r.tokens_out == 3 for r in handles) and core.idle(),
)


class _LanguageEngine:
    """The engine's side of the language core: admitted requests, one token a round each."""

    def __init__(self):
        self.active, self.published = {}, []

    def admit(self, q: LanguageRequest):
        rid = f"lang-{q.task_id}"
        self.active[rid] = q
        return rid

    def drop(self, rid, reason):
        self.active.pop(rid, None)

    def round(self):
        return [(rid, [1]) for rid in self.active]


def _language_core(clock):
    eng = _LanguageEngine()
    core = LanguageFrameCore(clock, has_work=lambda: bool(eng.active), decode_round=eng.round,
                             publish=eng.published.extend, admit=eng.admit, drop=eng.drop)
    core.engine = eng
    return core


LANGUAGE = Case(
    build=_language_core,
    requests=lambda: [LanguageRequest(t, "where is the cup?", 4) for t in ("a", "b", "c")],
    result=lambda core, item: core.engine.round(),
    ids=("lang-a", "lang-b", "lang-c"),
    after_complete=lambda core, handles, out: (len(core.engine.published) == 3 and core.counts["rounds"] == 1)
    or pytest.fail(f"published {core.engine.published}"),
    after_fail=lambda core, handles, item, out: (core.counts["failed_rounds"] == 1 and not core.snapshot()["decoding"])
    or pytest.fail("a failed round must free the decode slot"),
    served=lambda core, handles: {rid for rid, _ in core.engine.published} == set(handles),
)

CASES = {"action_chunks": ACTION, "timely": TIMELY, "slo": SLO, "nova": NOVA, "language_frames": LANGUAGE}


@pytest.mark.parametrize("name", list(CASES))
def test_the_core_answers_the_contract_with_its_signatures(name):
    core = CASES[name].build(VirtualClock())
    assert isinstance(core, ServingContract)
    assert contract_problems(core) == []


@pytest.mark.parametrize("name", list(CASES))
def test_submit_dispatch_complete_fail_cancel_and_stats_as_plain_data(name):
    case, clock = CASES[name], VirtualClock()
    core = case.build(clock)
    handles = [core.submit(q) for q in case.requests()]
    items = core.dispatch()
    assert items, "three requests waiting and nothing dispatched"
    assert all(i.slot in core.slots for i in items)
    clock.advance_to(0.1)
    case.after_complete(core, handles, core.complete(items[0], case.result(core, items[0])))
    clock.advance_to(0.2)
    if name == "language_frames":
        core.frame()  # a round needs a frame (or an idle period) since the last one
    nxt = core.dispatch() or items[1:]
    assert nxt, "nothing left to fail"
    case.after_fail(core, handles, nxt[0], core.fail(nxt[0], "engine_failure"))
    live = [i for i in case.ids if core.cancel(i, "cancelled")]
    assert live, "no request was left to cancel"
    assert core.cancel("nobody", "cancelled") is False or name == "language_frames"
    snap = core.snapshot()
    assert isinstance(snap, dict) and json.loads(json.dumps(snap)) == snap


@pytest.mark.parametrize("name", list(CASES))
def test_the_one_virtual_clock_loop_serves_every_core_to_the_end(name):
    case, clock = CASES[name], VirtualClock()
    core = case.build(clock)
    handles = []
    # the engine model: every item takes 0.1 s; its result is what the case's engine returns
    loop = VirtualLoop(clock, core.dispatch, lambda item: (0.1, case.result(core, item)), core.complete)
    for i, q in enumerate(case.requests()):
        loop.at(0.01 * i, lambda q=q: handles.append(core.submit(q)))
    loop.run()
    assert len(handles) == 3 and clock.now() >= 0.1
    assert case.served(core, handles)


def test_a_core_missing_a_call_or_with_the_wrong_shape_is_named():
    class Half:
        clock, slots = VirtualClock(), {"w": 1}

        def submit(self, request, now):  # the caller's time: the contract takes the core's clock
            ...

        def dispatch(self):
            return []

    problems = contract_problems(Half())
    assert not isinstance(Half(), ServingContract)
    assert "submit: extra parameter now has no default" in problems
    assert {"no complete", "no fail", "no cancel", "no snapshot"} <= set(problems)
