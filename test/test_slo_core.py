"""SLO-aware LLM serving core (seed 004): SLO validation, urgency prefill, slack-guided
decode, the core's request lifecycle and the virtual-clock simulator. No ROS, no torch."""
from __future__ import annotations

import math

import pytest

from robotserve_ros.core.clock import VirtualClock
from robotserve_ros.core.errors import RequestError
from robotserve_ros.core.slo import (DECODE, PREFILL, SLO_SCHEDULERS, BadPrompt, BadSLO, ContinuousBatching,
                                     FcfsPrefill, LLMProfile, LLMRequest, SlackGuided, SLODefaults, SLORequest, StepResult,
                                     UrgencyPrefill, make_slo_core, resolve_slo, select_chunks)
from robotserve_ros.slo.sim import simulate
from robotserve_ros.slo.workload import LengthMix, Req, poisson_requests


def profile(kv=0.0) -> LLMProfile:
    # prefill 1 ms/token + 10 ms; decode 20 ms at batch 1 ctx 100, growing with batch and context
    pre = {str(n): 0.01 + 0.001 * n for n in (10, 100, 1000, 4000)}
    dec = {str(b): {str(c): 0.02 * (1 + 0.1 * (b - 1)) * (1 + c / 1000) for c in (100, 1000, 4000)} for b in (1, 4, 16)}
    return LLMProfile(pre, dec, kv)


def req(rid, plen, arrival=0.0, ttft=1.0, tpot=0.1, n_gen=0, first=None, seq=0):
    r = LLMRequest(rid, plen, 50, ttft, tpot, arrival, seq=seq)
    r.n_gen, r.first_token_s = n_gen, first
    return r


def test_slo_defaults_and_refusals():
    d = SLODefaults(2.0, 0.05, 16)
    assert resolve_slo(0, 0, d) == (2.0, 0.05)
    assert resolve_slo(1.5, 0.2, d) == (1.5, 0.2)
    for bad in ((-1, 0), (0, -0.01), (math.nan, 0), (0, math.inf), ("x", 0)):
        with pytest.raises(BadSLO) as e:
            resolve_slo(*bad, d)
        assert e.value.code == "bad_deadline" and isinstance(e.value, RequestError)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        SLODefaults(0.0, 0.05)


def test_core_refuses_bad_requests_and_counts_them():
    core = make_slo_core("urgency_slack", profile(), VirtualClock(), context_limit=100)
    with pytest.raises(BadPrompt, match="context limit"):
        core.submit(SLORequest("a", 90, 20))
    with pytest.raises(BadPrompt, match=">= 1 token"):
        core.submit(SLORequest("b", 0, 5))
    with pytest.raises(BadSLO):
        core.submit(SLORequest("c", 10, 5, ttft_slo_s=-2))
    core.submit(SLORequest("d", 10, 5))
    with pytest.raises(BadPrompt, match="already"):
        core.submit(SLORequest("d", 10, 5))
    assert core.stats.refused == {"bad_prompt": 3, "bad_deadline": 1}
    assert core.stats.submitted == 1 and len(core.prefill_queue) == 1


def test_urgency_puts_short_prompt_ahead_of_an_earlier_long_one():
    p = profile().prefill
    long_, short = req("long", 3000, 0.0, ttft=5.0, seq=0), req("short", 50, 0.01, ttft=1.0, seq=1)
    assert FcfsPrefill().order([long_, short], 0.02, p)[0] is long_     # head-of-line blocking
    assert UrgencyPrefill().order([long_, short], 0.02, p)[0] is short  # short first, long still on time


def test_urgency_deprioritises_a_request_that_cannot_make_it_but_keeps_it():
    p = profile().prefill
    hopeless = req("hopeless", 3000, 0.0, ttft=1.0, seq=0)  # 3 s of prefill for a 1 s SLO
    a, b = req("a", 100, 0.1, ttft=2.0, seq=1), req("b", 200, 0.2, ttft=2.0, seq=2)
    order = UrgencyPrefill().order([hopeless, a, b], 0.3, p)
    assert order[-1] is hopeless and set(order) == {hopeless, a, b}


def test_urgency_maximises_ttft_slos_met():
    """Moore-Hodgson: dropping the one long job lets three short ones make it."""
    p = profile().prefill
    long_ = req("L", 900, 0.0, ttft=1.0, seq=0)   # 0.91 s: feasible alone
    shorts = [req(f"s{i}", 250, 0.0, ttft=1.0 if i else 0.9, seq=i + 1) for i in range(3)]  # 0.26 s each
    order = UrgencyPrefill().order([long_] + shorts, 0.0, p)
    assert order[-1] is long_
    t, met = 0.0, 0
    for r in order:
        t += p.predict(r.prompt_len)
        met += t <= r.ttft_deadline_s
    assert met == 3
    t, met_fcfs = 0.0, 0
    for r in FcfsPrefill().order([long_] + shorts, 0.0, p):
        t += p.predict(r.prompt_len)
        met_fcfs += t <= r.ttft_deadline_s
    assert met_fcfs == 1


def test_chunked_prefill_fills_the_budget_and_cuts_the_last():
    a, b, c = req("a", 300), req("b", 500), req("c", 100)
    a.prefilled = 100
    assert [(r.req_id, s, e) for r, s, e in select_chunks([a, b, c], 512)] == [("a", 100, 300), ("b", 0, 312)]
    assert [(r.req_id, s, e) for r, s, e in select_chunks([b, a], 0)] == [("b", 0, 500)]


def test_slack_guided_runs_short_requests_in_a_long_ones_slack():
    lut = profile().decode
    now = 10.0
    # the long request is 20 tokens ahead of its 100 ms TPOT SLO; the short ones are fresh
    long_ = req("L", 3800, tpot=0.1, n_gen=5, first=now - 0.05, seq=0)
    shorts = [req(f"s{i}", 80, tpot=0.2, n_gen=1, first=now, seq=i + 1) for i in range(3)]
    batch = SlackGuided().select([long_] + shorts, now, lut, 16)
    assert set(batch) == set(shorts)
    assert ContinuousBatching().select([long_] + shorts, now, lut, 16) == [long_] + shorts
    # requests already behind their TPOT SLO join only where the step costs the on-time one nothing
    late = [req(f"x{i}", 80, tpot=0.01, n_gen=1, first=now - 1.0, seq=i + 1) for i in range(3)]
    assert set(SlackGuided().select(late + [long_], now, lut, 16)) == set(late + [long_])
    # Algorithm 3 as printed: no slack to exploit -> decode all
    assert SlackGuided(literal=True).select(late + [long_], now, lut, 16) == late + [long_]


def test_slack_guided_keeps_a_straggler_out_of_the_short_ones_step_when_no_slack_is_left():
    # a padded batch pays for its longest context in every row: here a long row costs 8x
    dec = {str(b): {str(c): 0.02 * (1 + b * c / 500) for c in (100, 4000)} for b in (1, 2, 4)}
    lut = LLMProfile({"10": 0.01, "1000": 0.1}, dec).decode
    now = 10.0
    # everyone a little behind (none hopeless: 200 tokens to catch up in)
    shorts = [req(f"s{i}", 80, tpot=0.05, n_gen=3, first=now - 0.2, seq=i) for i in range(2)]
    long_ = req("L", 3800, tpot=0.5, n_gen=3, first=now - 1.1, seq=2)
    for r in shorts + [long_]:
        r.max_tokens = 200
    batch = SlackGuided().select(shorts + [long_], now, lut, 16)
    assert set(batch) == set(shorts)  # the long row would cut the step's tokens/s several times
    assert SlackGuided(literal=True).select(shorts + [long_], now, lut, 16) == shorts + [long_]  # "decode all"


def test_slack_guided_deprioritises_a_request_that_can_no_longer_meet_its_tpot():
    lut = profile().decode
    now = 10.0
    hopeless_ = req("H", 80, tpot=0.03, n_gen=2, first=now - 1.0, seq=0)   # 2 s behind, 48 tokens left
    hopeless_.max_tokens = 50
    fresh = [req(f"f{i}", 80, tpot=0.05, n_gen=1, first=now, seq=i + 1) for i in range(2)]
    sg = SlackGuided()
    batch = sg.select([hopeless_] + fresh, now, lut, 2)
    assert set(batch) == set(fresh)
    assert SlackGuided(deprioritise=False).select([hopeless_] + fresh, now, lut, 2)[0] is hopeless_


def test_lut_follows_observed_steps():
    lut = profile().decode
    before = lut.step_s(4, 1000)
    for _ in range(3):
        lut.observe(4, 1000, 2 * before)
    assert lut.step_s(4, 1000) == pytest.approx(2 * before)
    # a cell not observed yet follows the mean of all observations
    assert lut.step_s(1, 100) == pytest.approx(2 * lut.raw(1, 100))
    lut.observe(1, 100, lut.raw(1, 100))
    assert lut.step_s(1, 100) == pytest.approx(lut.raw(1, 100))


def test_request_lifecycle_through_the_core():
    clock = VirtualClock()
    done = []
    core = make_slo_core("urgency_slack", profile(kv=0.001), clock, defaults=SLODefaults(1.0, 0.1, 3),
                         on_done=done.append)
    r = core.submit(SLORequest("q", 20))
    assert r.max_tokens == 3
    [item] = core.dispatch()
    assert item.slot == PREFILL and core.dispatch() == []
    clock.advance_to(0.05)
    core.complete(item, StepResult({"q": 7}))
    assert r.first_token_s == 0.05 and r.tokens == [7] and core.dispatch() == []  # KV still in handover
    clock.advance_to(0.05 + 0.001 * 20)
    t = clock.now()
    for tok in (8, 9):
        [item] = core.dispatch()
        assert item.slot == DECODE and item.batch == [r]
        t += 0.02
        clock.advance_to(t)
        core.complete(item, StepResult({"q": [tok]}))
    assert r.finished and r.tokens == [7, 8, 9] and done == [r]
    assert r.ttft_s == pytest.approx(0.05) and r.tpot_met() and r.ttft_met()
    assert core.dispatch() == []


def test_failed_items_fail_only_their_requests():
    clock = VirtualClock()
    core = make_slo_core("fcfs_cb", profile(), clock)
    a, b = core.submit(SLORequest("a", 10, 4)), core.submit(SLORequest("b", 10, 4))
    [item] = core.dispatch()
    core.fail(item, "engine_failure")
    assert a.failed == "engine_failure" and b.failed is None
    [item] = core.dispatch()
    assert item.requests == [b]


def test_registry_has_the_four_schedulers_and_algorithm_3_as_printed():
    assert SLO_SCHEDULERS.names() == ["fcfs_cb", "slack_only", "urgency_only", "urgency_slack", "urgency_slack_alg3"]
    assert "kairos_slo" not in SLO_SCHEDULERS  # one name per thing: kairos is the seed-000 action scheduler
    assert SLO_SCHEDULERS.create("urgency_slack_alg3").decode.literal
    s = SLO_SCHEDULERS.create("slack_only")
    assert isinstance(s.prefill, FcfsPrefill) and isinstance(s.decode, SlackGuided)
    with pytest.raises(KeyError, match="known: fcfs_cb"):
        SLO_SCHEDULERS.create("nope")


def test_simulator_is_deterministic_and_urgency_beats_fcfs_on_head_of_line_blocking():
    p = profile()
    # a long prompt, then a burst of short ones right behind it
    reqs = [Req("L", 0.0, 3500, 5)] + [Req(f"s{i}", 0.01 * (i + 1), 60, 5) for i in range(8)]
    kw = dict(ttft_slo_s=1.0, tpot_slo_s=0.2, noise=0.0, chunk_tokens=256)  # chunked prefill (§3.1)
    f = simulate(p, "fcfs_cb", reqs, **kw)
    k = simulate(p, "urgency_slack", reqs, **kw)
    assert f["finished"] == k["finished"] == 9
    assert f["ttft_attainment"] == 0.0  # every short one waits behind 3.5 s of prefill
    assert k["ttft_attainment"] == pytest.approx(8 / 9)
    mix_reqs = poisson_requests(LengthMix(), 2.0, 60, seed=3)
    a = simulate(p, "urgency_slack", mix_reqs, ttft_slo_s=1.0, tpot_slo_s=0.1, seed=1)
    b = simulate(p, "urgency_slack", mix_reqs, ttft_slo_s=1.0, tpot_slo_s=0.1, seed=1)
    assert a == b and a["finished"] == 60
