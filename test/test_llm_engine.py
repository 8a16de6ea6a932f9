"""LLMEngine (engines/llm): suspend/resume, batched decode across requests of different
lengths, KV export/import and the stop checker reproduce unsegmented greedy generation
exactly (tiny random-weight Llama built here; the 135M model was checked by hand)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from robotserve_ros.engines.llm import ForcedText, StopChecker, tiny_engine  # noqa: E402

N = 24
PROMPTS = {"a": "Scene: [] Task: [A] find the cat", "b": "hi", "c": "Task: [E] a boy is passing by, evade now please"}


@pytest.fixture(scope="module")
def eng():
    torch.set_num_threads(1)
    return tiny_engine(0)


def reference(e, ids, n=N):
    """Hugging Face's own greedy generate, one request, no interruption."""
    out = e.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_segmented_batched_generation_equals_uninterrupted_greedy(eng):
    e = eng
    ids = {k: e.encode(v) for k, v in PROMPTS.items()}
    ref = {k: reference(e, v) for k, v in ids.items()}
    got = {k: [t] for k, t in e.prefill([("a", ids["a"]), ("b", ids["b"])]).items()}
    for k, v in e.decode(["a"], 3).items():  # b suspended while a decodes alone
        got[k] += v
    for k, v in e.decode(["a", "b"], 4).items():  # b joins: lengths differ
        got[k] += v
    got["c"] = [e.prefill([("c", ids["c"])])["c"]]  # c joins mid-flight
    for k, v in e.decode(["b", "c", "a"], 5).items():
        got[k] += v
    for k, v in e.decode(["c"], 2).items():  # a and b leave, then come back
        got[k] += v
    for rid in ("a", "b", "c"):
        more = N - len(got[rid])
        for k, v in e.decode([rid], more).items():
            got[k] += v
    for rid in ref:
        assert got[rid] == ref[rid], rid
        assert e.generated(rid) == ref[rid]
        assert e.length(rid) == len(ids[rid]) + N - 1  # the last token is pending, not fed
    for rid in ref:
        assert e.free(rid)
    assert not e.has("a") and not e.free("a") and e.requests() == []


def test_export_import_moves_a_request_to_another_engine(eng):
    """Disaggregated prefill / decode: prefill here, decode on another instance."""
    e = eng
    ids = e.encode(PROMPTS["c"])
    ref = reference(e, ids, 12)
    first = e.prefill([("x", ids)])["x"]
    e.decode(["x"], 2)
    kv_bytes = e.kv_bytes("x")
    state = e.export_kv("x")
    assert not e.has("x")
    other = tiny_engine(0)
    other.import_kv("x", state)
    assert other.kv_bytes("x") == kv_bytes > 0
    rest = other.decode(["x"], 9)["x"]
    assert [first] + other.generated("x")[1:3] + rest == ref
    assert other.generated("x") == ref
    with pytest.raises(ValueError):
        other.import_kv("x", state)  # one KV per request id


def test_stop_checker_ends_segments_at_the_delimiter_max_tokens_and_eos(eng):
    e = eng
    plan = "s(cat)\ng(cat)\nmf(50)"
    forced = e.encode(plan)
    ids = e.encode(PROMPTS["a"])
    first = e.prefill([("p", ids)], constraints={"p": ForcedText(forced, e.tokenizer.eos_token_id)})["p"]
    stop = StopChecker(e.decode_text, e.eos_ids, delimiter="\n", max_tokens=16)
    segments, tok = [], first
    while True:
        reason = stop.feed(tok)
        if reason:
            toks, text, why = stop.take()
            segments.append((text, why))
            if why == "eos":
                break
        tok = e.decode(["p"], 1)["p"][0]
    assert segments == [("s(cat)", "delimiter"), ("g(cat)", "delimiter"), ("mf(50)", "eos")]
    e.free("p")
    short = StopChecker(e.decode_text, e.eos_ids, max_tokens=3)
    assert [short.feed(t) for t in e.encode("abc")] == [None, None, "max_tokens"]
    with pytest.raises(RuntimeError):
        short.feed(1)  # the finished segment must be taken first


def test_bad_requests_are_refused(eng):
    e = eng
    with pytest.raises(ValueError):
        e.prefill([("empty", [])])
    with pytest.raises(ValueError):
        e.prefill([("long", [1] * e.max_context)])
    with pytest.raises(KeyError):
        e.decode(["never-prefilled"], 1)
    assert e.requests() == []
