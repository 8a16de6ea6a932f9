"""`robotserve llm-profile` measures the one LLM profile every LLM scheduler reads: the record
it writes loads as core/llm_profile.LLMProfile with the segment scheduler's reading, the SLO
schedulers' (prefill profile, decode LUT) and the KV handover between two engines."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from robotserve_ros.core.clock import VirtualClock  # noqa: E402
from robotserve_ros.core.llm_profile import LLMProfile  # noqa: E402
from robotserve_ros.core.slo import make_slo_core  # noqa: E402
from robotserve_ros.engines.llm import tiny_engine  # noqa: E402
from robotserve_ros.engines.llm.profile import measure  # noqa: E402


@pytest.fixture(scope="module")
def record():
    torch.set_num_threads(1)
    eng = tiny_engine(0)
    rec = measure(eng, prompt_tokens=(8, 32), batches=(1, 2), contexts=(16, 48), steps=2, repeats=1)
    assert eng.requests() == []  # every request it measured is freed (or handed over and freed there)
    return rec


def test_one_record_feeds_both_schedulers(record):
    block = record["llm_profile"]
    assert block["kv_handover_s_per_token"] >= 0 and block["kv_handover_fixed_s"] >= 0
    assert set(record["samples_ms"]["kv_handover"]) == {"8", "32"}
    prof = LLMProfile.from_record(record)
    # the segment scheduler's reading (seed 002) and the SLO schedulers' (seed 004), same tables
    assert prof.prefill_s(32) == pytest.approx(prof.prefill.predict(32))
    assert prof.step_s(2, 48) == pytest.approx(prof.decode.raw(2, 48))
    assert prof.kv_handover_s(100) == pytest.approx(block["kv_handover_fixed_s"] + 100 * block["kv_handover_s_per_token"])
    make_slo_core("urgency_slack", prof.fresh(), VirtualClock())  # the SLO core takes it as measured


def test_a_record_without_the_block_is_refused_by_name():
    with pytest.raises(ValueError, match="llm-profile"):
        LLMProfile.from_record({"schema": "robotserve.engine_profile/1"})
