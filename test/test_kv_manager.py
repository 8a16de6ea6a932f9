"""The unified KV cache manager (core/kv_manager.py, seed 001 §3.2-3.3), no torch: STORE /
RETRIEVE / UPDATE / REMOVE, k tokens per request per frame, a finished request's KV freed
exactly once, requests joining and leaving between frames, admission and context checks."""
from __future__ import annotations

import pytest

from robotserve_ros.core.errors import RequestError
from robotserve_ros.core.kv_manager import BadPrompt, LanguageState, Overloaded, UnifiedKVManager, check_context


def make(k=3, max_active=8):
    freed = []
    return UnifiedKVManager(tokens_per_frame=k, max_active=max_active, free=freed.append), freed


def st(task, n, kv="kv"):
    return LanguageState(rid="", task_id=task, max_tokens=n, prompt_tokens=2, kv=f"{kv}-{task}", kv_bytes=100)


def test_store_assigns_sequential_ids_and_retrieve_update():
    m, _ = make()
    a, b = m.store(st("a", 5)), m.store(st("b", 5))
    assert a != b and m.retrieve(a).task_id == "a"
    s = m.retrieve(b)
    s.tokens.append(7)
    m.update(b, s)
    assert m.retrieve(b).tokens == [7]
    with pytest.raises(RequestError, match="no language request"):
        m.retrieve("nope")


def test_k_tokens_per_frame_and_length_finish_frees_once():
    m, freed = make(k=3)
    rid = m.store(st("a", 7))
    per_frame = []
    while len(m):
        plan = m.plan_frame()
        assert len(plan) == 1
        s, n = plan[0]
        per_frame.append(n)
        m.commit(s.rid, list(range(n)))
        m.end_frame(len(plan))
    assert per_frame == [3, 3, 1]
    assert freed == ["kv-a"]
    assert m.kv_bytes() == 0
    with pytest.raises(RequestError):
        m.retrieve(rid)


def test_eos_ends_a_request_early():
    m, freed = make(k=4)
    m.store(st("a", 10))
    (s, n), = m.plan_frame()
    out = m.commit(s.rid, [5, 9, 1, 1], eos_id=9)
    assert out.finished and out.reason == "eos" and out.tokens == [5, 9]
    assert freed == ["kv-a"] and len(m) == 0
    assert m.commit(s.rid, [1]) is None  # a request removed meanwhile (cancelled mid-round): ignored


def test_requests_join_and_leave_between_frames():
    """Cross-frame batching: a long request keeps its progress while short ones join and end."""
    m, freed = make(k=2)
    long_rid = m.store(st("long", 8))
    batches = []
    for frame in range(4):
        if frame in (1, 2):
            m.store(st(f"short{frame}", 2))
        plan = m.plan_frame()
        batches.append(sorted(s.task_id for s, _ in plan))
        for s, n in plan:
            m.commit(s.rid, [frame] * n)
        m.end_frame(len(plan))
    assert batches == [["long"], ["long", "short1"], ["long", "short2"], ["long"]]
    assert sorted(freed) == ["kv-long", "kv-short1", "kv-short2"]
    assert m.avg_decode_batch() == pytest.approx(6 / 4)
    assert m.counts["decoded_tokens"] == 8 + 2 + 2


def test_admission_limit_and_cancel_task():
    m, freed = make(max_active=2)
    m.store(st("a", 5))
    m.store(st("b", 5))
    with pytest.raises(Overloaded, match="max_active 2"):
        m.store(st("c", 5))
    assert freed == ["kv-c"]  # the refused request's KV is not leaked
    ended = m.cancel_task("a")
    assert [s.reason for s in ended] == ["cancelled"] and "kv-a" in freed
    m.close()
    assert len(m) == 0 and sorted(freed) == ["kv-a", "kv-b", "kv-c"]


def test_check_context():
    check_context(20, 5, 10, 35)
    with pytest.raises(BadPrompt, match="over the model's context limit of 34"):
        check_context(20, 5, 10, 34)
    with pytest.raises(BadPrompt, match="empty"):
        check_context(20, 0, 10, 100)
    with pytest.raises(ValueError):
        UnifiedKVManager(tokens_per_frame=0)
