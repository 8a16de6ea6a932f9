"""Virtual-clock replay of a TimelyLLM trace (seed 002 §6-7) through the segment serving core.

The engine is the measured profile (core/llm_profile.py): a prefill takes the profile's
time for the prompt's tokens, a decode step its time at the running batch and mean context
(+ rebuilding the batch KV when the running set changed). Each plan's segments have the
token counts of its rendered plan (trace.py), so segment ends fall where the live stop
checker puts them. Robots: a segment handed over at t starts at max(t, the previous
segment's end) + the network latency and runs for its recorded duration (exe_time_detail);
the robot reports each start to the core (PlanProgress).

The core's `dispatch` / `complete` are the live path's steps, on sim/loop.py's one
virtual-clock loop; only the clock and the engine's times differ.
"""
from __future__ import annotations

import time
from typing import Optional

from ..core.clock import VirtualClock
from ..core.timely import SEGMENT_SCHEDULERS, LLMProfile, Plan, SegmentOutcome, SkillTimeModel, TimelyCore, TUF
from ..sim.loop import VirtualLoop
from .metrics import PlanResult
from .trace import PlanSpec


def simulate(specs: list[PlanSpec], scheduler: str, profile: LLMProfile, skill_time: SkillTimeModel, *,
             max_batch: int = 16, seg_tokens_est: float = 6.0, seg_tokens_max: int = 12,
             network_s: float = 0.008, scheduler_params: Optional[dict] = None, prefix_cache: bool = True) -> tuple[list[PlanResult], TimelyCore]:
    clock = VirtualClock(0.0)
    core = TimelyCore(SEGMENT_SCHEDULERS.create(scheduler, **(scheduler_params or {})), profile, skill_time, clock,
                      max_batch=max_batch, seg_tokens_est=seg_tokens_est, seg_tokens_max=seg_tokens_max,
                      timer=time.perf_counter)
    by_id = {s.job_id: s for s in specs}
    # a cached system prefix (the server-side skill set) is not prefilled per request
    prefill_tokens = {s.job_id: len(s.prompt_ids) - (s.prefix_len if prefix_cache else 0) for s in specs}
    results = {s.job_id: PlanResult.start(s) for s in specs}
    robot_free = {s.job_id: 0.0 for s in specs}
    def arrive(s: PlanSpec) -> None:
        core.submit(Plan(s.job_id, s.agent_id, s.kind, clock.now(), TUF.from_list(s.tuf), len(s.prompt_ids),
                         urgent=s.urgent, max_segments=len(s.skills), prefill_tokens=prefill_tokens[s.job_id]))

    def engine(item) -> tuple:  # the engine model: the measured profile
        if item.kind == "prefill":
            dur = profile.prefill_s(prefill_tokens[item.plan_ids[0]])
        else:
            ctx = sum(core.plans[i].context for i in item.plan_ids) / len(item.plan_ids)
            dur = profile.step_s(len(item.plan_ids), ctx)
            if item.batch_changed and len(item.plan_ids) > 1:
                dur += profile.regather_s(len(item.plan_ids), ctx)
        return dur, dur

    def engine_done(item, engine_s: float) -> None:
        # each plan's segments end where its rendered plan's token counts put them
        now, outcomes = clock.now(), {}
        for pid in item.plan_ids:
            p = core.plans.get(pid)
            if p is None:
                continue
            segs = by_id[pid].seg_tokens
            done_seg = p.seg_tokens + 1 >= segs[p.k]
            outcomes[pid] = SegmentOutcome(1, by_id[pid].skills[p.k][0] if done_seg else None,
                                           plan_done=done_seg and p.k == len(segs) - 1)
        for e in core.complete(item, outcomes, engine_s):
            if e.kind == "segment":
                r, s = results[e.plan_id], by_id[e.plan_id]
                start = max(now + network_s, robot_free[e.plan_id])
                r.segment(e.k, now, start, s.skills[e.k][1])
                robot_free[e.plan_id] = start + s.skills[e.k][1]
                # the robot gives no estimate: the skill model's
                loop.at(start, core.segment_started, e.plan_id, e.k, start)

    loop = VirtualLoop(clock, core.dispatch, engine, engine_done)
    for s in specs:
        loop.at(s.trigger, arrive, s)
    loop.run()
    return [results[s.job_id] for s in specs], core
