"""Nova's serving core (seed 003), no torch: partition plan (Pareto frontier, Eq. 3 and 5),
the schedulers' stage order and batching on the virtual clock, the simulator's bookkeeping."""
import pytest

from robotserve_ros.core.clock import VirtualClock
from robotserve_ros.core.nova import (PartitionPlan, StageProfile, VLMCore, VLMRequest, make_vlm_scheduler, paper_profile,
                                      pareto_frontier)
from robotserve_ros.core.nova.partition import PlanPoint
from robotserve_ros.core.nova.serving import VLM_SCHEDULERS
from robotserve_ros.sim.nova import Workload, simulate, summarize


def small_profile(total=8):
    """Compute-bound front stages (1/units), memory-bound decode (flat above 3 units)."""
    units = range(1, total + 1)
    return StageProfile(total=total, vision={u: 0.8 / u for u in units},
                        prefill={u: (0.01 / u, 0.002 / u) for u in units},
                        decode={u: {1: 0.03 * max(1, 3 / u), 8: 0.035 * max(1, 3 / u)} for u in units},
                        corun={"front": 1.1, "decode": 1.1})


def test_pareto_frontier_keeps_only_undominated_points():
    pts = [PlanPoint(1, 1, 5.0, 1.0), PlanPoint(2, 2, 4.0, 0.8), PlanPoint(3, 3, 6.0, 0.9), PlanPoint(4, 4, 3.0, 0.5)]
    front = pareto_frontier(pts)
    assert {(p.n_v) for p in front} == {1, 2, 4}  # (3,3) is beaten by (1,1) on both


def test_plan_eq5_gives_decode_fewer_units_as_load_grows():
    plan = PartitionPlan(small_profile(), tokens=50, prompt_tokens=100, tbt_max_s=0.07)
    assert plan.frontier and all(p in plan.points for p in plan.frontier)
    best = min(plan.points, key=lambda p: p.latency_s)
    assert (plan.n0_v, plan.n0_p) == (best.n_v, best.n_p)  # Eq. 3
    shares = [plan.decode_units("vision", p) for p in range(1, 8)]
    assert shares[0] == plan.n0_v
    assert all(a >= b for a, b in zip(shares, shares[1:]))  # monotone in the pending count
    assert shares[-1] == plan.n_min and plan.n_min < plan.n0_v
    assert plan.profile.t_decode(plan.n_min, 2, corun=True) <= 0.07  # the TBT bound holds at n_min


def test_plan_needs_two_units():
    with pytest.raises(ValueError, match=">= 2"):
        PartitionPlan(small_profile(total=1))


def _run(name, profile, reqs, **kw):
    plan = PartitionPlan(profile, tokens=20, prompt_tokens=60, tbt_max_s=0.07)
    core = VLMCore(make_vlm_scheduler(name, plan, **kw), profile.total)
    simulate(core, profile, reqs)
    return core


@pytest.mark.parametrize("name", ["nova", "static_partition", "fcfs", "prefill_first", "chunked_prefill"])
def test_every_scheduler_finishes_every_request_in_stage_order(name):
    wl = Workload("t", tiles=(1, 3), text_tokens=(10, 30), out_tokens=(5, 20), image_seq_len=10)
    reqs = wl.requests(rate=1.0, n=40, seed=1)
    core = _run(name, small_profile(), reqs)
    assert len(core.done) == 40 and core.idle()
    for r in core.done:
        assert r.tokens_out == r.max_tokens
        assert r.arrival <= r.t_vision[0] <= r.t_vision[1] <= r.t_prefill[0] <= r.t_prefill[1] <= r.t_done
        assert all(w >= -1e-9 for w in r.waits().values())
    row = summarize(core.done, scheduler=name, workload="t", rate=1.0)
    assert row["max_latency_s"] >= row["p95_latency_s"] >= 0 and row["throughput_rps"] > 0


def test_nova_runs_decode_beside_the_front_stage_and_sequential_baselines_do_not():
    wl = Workload("t", tiles=(1, 1), out_tokens=(30, 30), image_seq_len=10)
    reqs = wl.requests(rate=2.0, n=20, seed=2)
    seen = {}
    for name in ("nova", "fcfs"):
        core = VLMCore(make_vlm_scheduler(name, PartitionPlan(small_profile(), tokens=30)), 8)
        ops = []
        orig = core.dispatch
        core.dispatch = lambda orig=orig, ops=ops: (lambda x: (ops.extend(x), x)[1])(orig())
        simulate(core, small_profile(), reqs if name == "nova" else wl.requests(rate=2.0, n=20, seed=2))
        seen[name] = ops
    nova_slots = {op.slot for op in seen["nova"]}
    assert nova_slots == {"front", "decode"}
    assert any(op.corun and op.kind == "decode" for op in seen["nova"])
    # a co-running decode gets a share, the front the rest; alone a stage gets everything
    assert all(op.units < 8 for op in seen["nova"] if op.corun)
    assert {op.slot for op in seen["fcfs"]} == {"worker"} and all(op.units == 8 for op in seen["fcfs"])


def test_nova_inflight_batching_joins_after_the_running_batch():
    prof = small_profile()
    clock = VirtualClock()
    core = VLMCore(make_vlm_scheduler("nova", PartitionPlan(prof, tokens=10)), 8, clock)
    a = VLMRequest("a", 0.0, tiles=0, prompt_tokens=10, max_tokens=10)
    b = VLMRequest("b", 0.0, tiles=0, prompt_tokens=10, max_tokens=10)
    core.submit(a)
    core.submit(b)
    pa, = core.dispatch()
    assert pa.kind == "prefill" and pa.front is a
    clock.advance_to(0.1)
    core.complete(pa)
    ops = {op.slot: op for op in core.dispatch()}
    assert ops["front"].front is b and ops["decode"].batch == [a]
    clock.advance_to(0.12)
    core.complete(ops["front"])  # b is ready while a's decode step still runs
    assert core.dispatch() == []  # b waits for the running batch (§III-D)
    clock.advance_to(0.13)
    core.complete(ops["decode"])
    d2, = core.dispatch()
    assert d2.kind == "decode" and {r.rid for r in d2.batch} == {"a", "b"}


def test_prefill_first_holds_decode_until_the_limit():
    clock = VirtualClock()
    core = VLMCore(make_vlm_scheduler("prefill_first", PartitionPlan(small_profile()), limit=3), 8, clock)
    reqs = [VLMRequest(str(i), 0.0, tiles=0, prompt_tokens=5, max_tokens=5) for i in range(4)]
    for r in reqs:
        core.submit(r)
    kinds = []
    t = 0.0
    for _ in range(4):
        clock.advance_to(t)
        op, = core.dispatch()
        kinds.append(op.kind)
        t += 0.1
        clock.advance_to(t)
        core.complete(op)
    assert kinds == ["prefill", "prefill", "prefill", "decode"]  # 3 waiting decodes reach the limit


def test_chunked_prefill_splits_the_prompt_and_batches_decodes_into_it():
    clock = VirtualClock()
    core = VLMCore(make_vlm_scheduler("chunked_prefill", PartitionPlan(small_profile()), budget=16), 8, clock)
    a = VLMRequest("a", 0.0, tiles=0, prompt_tokens=10, max_tokens=10)
    b = VLMRequest("b", 0.0, tiles=0, prompt_tokens=40, max_tokens=10)
    core.submit(a)
    core.submit(b)
    op, = core.dispatch()
    clock.advance_to(0.1)
    core.complete(op)
    op, = core.dispatch()
    assert op.kind == "hybrid" and op.front is b and op.batch == [a] and op.chunk == 15
    clock.advance_to(0.2)
    core.complete(op)
    assert b.prefilled == 15 and core.prefill_q[0] is b and a.tokens_out == 2


def test_registry_names_and_unknown_name():
    assert set(VLM_SCHEDULERS.names()) == {"nova", "static_partition", "fcfs", "prefill_first", "chunked_prefill"}
    with pytest.raises(Exception, match="known:"):
        make_vlm_scheduler("vllm", PartitionPlan(small_profile()))


def test_profile_round_trips_and_paper_profile_is_marked_synthetic():
    p = small_profile()
    q = StageProfile.from_dict(p.to_dict())
    assert q.t_vision(3, 2) == pytest.approx(p.t_vision(3, 2)) and q.t_decode(5, 4) == pytest.approx(p.t_decode(5, 4))
    pp = paper_profile()
    assert pp.measured is False and pp.total == 84
    assert pp.t_vision(84) == pytest.approx(0.8068)


def test_cancel_ends_a_queued_request_now_and_a_running_one_when_its_op_ends():
    clock = VirtualClock()
    core = VLMCore(make_vlm_scheduler("fcfs", PartitionPlan(small_profile())), 8, clock)
    a = VLMRequest("a", 0.0, tiles=1, prompt_tokens=10, max_tokens=5)
    b = VLMRequest("b", 0.0, tiles=1, prompt_tokens=10, max_tokens=5)
    core.submit(a)
    core.submit(b)
    op, = core.dispatch()
    assert op.front is a
    clock.advance_to(0.05)
    core.cancel("b", "deadline")  # queued: gone at once
    assert b.stage == "done" and b.error == "deadline" and not core.vision_q
    clock.advance_to(0.06)
    core.cancel("a", "deadline")  # running: ends with its op
    assert a.stage != "done"
    clock.advance_to(0.1)
    assert core.complete(op) == [a] and a.error == "deadline"
    assert core.idle() and core.dispatch() == []


def test_bench_nova_wrong_value_is_one_line_and_exit_2():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "robotserve_ros.cli", "bench", "nova", "--out", "/tmp/x", "--shape", "huge"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--shape" in lines[0] and "smolvlm2_500m" in lines[0]
