"""Disaggregated prefill/decode workers on core/loop.py's LiveDriver, with a test-double
engine (test/slo_fakes.py): the KV handover keeps each request's tokens exactly what one
engine would give, a failing request fails alone, the core's decisions are what runs."""
from __future__ import annotations

import threading
import time

from robotserve_ros.core.clock import WallClock
from robotserve_ros.core.slo import LLMProfile, SLODefaults, SLORequest, make_slo_core
from robotserve_ros.core.slo.workers import DisaggregatedWorkers
from slo_fakes import FakeLLMEngine


def profile() -> LLMProfile:
    pre = {"10": 0.01, "1000": 0.1}
    dec = {str(b): {"10": 0.01 * b, "1000": 0.02 * b} for b in (1, 8)}
    return LLMProfile(pre, dec)


def serve(scheduler, prompts, max_tokens, fail_on=None):
    done, ev = [], threading.Event()

    def on_done(r):
        done.append(r)
        if len(done) == len(prompts):
            ev.set()

    core = make_slo_core(scheduler, profile(), WallClock(), defaults=SLODefaults(5.0, 1.0, 4), kv_handover_in_core=False,
                         on_done=on_done)
    pe, de = FakeLLMEngine(0.002, fail_on=fail_on), FakeLLMEngine(0.002)
    w = DisaggregatedWorkers(core, pe, de).start()
    try:
        for i, p in enumerate(prompts):
            core.submit(SLORequest(f"q{i}", len(p), max_tokens, prompt_tokens=p))
            w.kick()
            time.sleep(0.001)
        assert ev.wait(20), f"only {len(done)} of {len(prompts)} answered"
    finally:
        w.close()
    return {r.req_id: r for r in done}, pe, de, w


def reference(prompt, n):
    e = FakeLLMEngine()
    toks = [e.prefill([("x", prompt)])["x"]]
    while len(toks) < n:
        toks += e.decode(["x"])["x"]
    return toks


def test_handover_keeps_every_requests_tokens():
    prompts = [[5 + i] * (3 + 7 * i) for i in range(6)]
    for sched in ("fcfs_cb", "urgency_slack"):
        out, pe, de, w = serve(sched, prompts, 6)
        for i, p in enumerate(prompts):
            r = out[f"q{i}"]
            assert r.failed is None and r.tokens == reference(p, 6)
            assert r.ttft_s is not None and r.tpot_s is not None
        assert pe.kv == {} and de.kv == {}  # freed on both sides
        assert w.stats()["handovers"] == len(prompts)
        assert {c[0] for c in pe.calls} == {"prefill"} and {c[0] for c in de.calls} == {"decode"}


def test_a_failing_prefill_fails_only_its_request():
    prompts = [[7] * 5, [8] * 6, [9] * 7]
    out, pe, de, w = serve("urgency_slack", prompts, 3, fail_on="q1")
    assert out["q1"].failed and "fake failure" in out["q1"].failed
    assert out["q0"].failed is None and out["q2"].failed is None
    assert out["q2"].tokens == reference(prompts[2], 3)


def test_the_real_engine_gives_the_same_tokens_through_the_handover():
    """Tiny random-weight Llama (engines/llm/tiny.py): prefill on one instance, decode on
    another after export/import, batched with others = one engine generating alone."""
    import pytest

    pytest.importorskip("transformers")
    from robotserve_ros.engines.llm.engine import LLMEngine
    from robotserve_ros.engines.llm.tiny import ByteTokenizer, tiny_llama

    model = tiny_llama(0)
    prompts = [list(b"pick the red cube" * (1 + i)) for i in range(4)]
    done, ev = [], threading.Event()

    def on_done(r):
        done.append(r)
        if len(done) == len(prompts):
            ev.set()

    core = make_slo_core("urgency_slack", profile(), WallClock(), defaults=SLODefaults(5.0, 1.0, 5),
                         kv_handover_in_core=False, on_done=on_done)
    pe, de = (LLMEngine(model, ByteTokenizer(), max_context=1024) for _ in range(2))
    w = DisaggregatedWorkers(core, pe, de, stop_at_eos=False).start()
    try:
        for i, p in enumerate(prompts):
            core.submit(SLORequest(f"q{i}", len(p), 5, prompt_tokens=p))
            w.kick()
        assert ev.wait(60)
    finally:
        w.close()
    alone = LLMEngine(model, ByteTokenizer(), max_context=1024)
    for i, p in enumerate(prompts):
        first = alone.prefill([("x", p)])["x"]
        ref = [first] + alone.decode(["x"], 4)["x"]
        alone.free("x")
        assert core.requests[f"q{i}"].tokens == ref
    assert pe.requests() == [] and de.requests() == []
    assert w.stats()["handovers"] == 4 and w.stats()["bytes"] > 0
