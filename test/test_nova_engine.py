"""Nova's staged VLM engine (seed 003): vision encode, prefill and batched decode as separate
calls give the unstaged model's greedy tokens, token for token; so do chunked prefill and the
layer-offloaded vision encoder (§III-E)."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from robotserve_ros.engines.vlm import StagedVLM  # noqa: E402

N = 10


@pytest.fixture(scope="module")
def vlm():
    torch.set_num_threads(1)
    return StagedVLM("tiny", seed=1)


def _requests():
    rng = np.random.default_rng(0)
    return [(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), "pick up the red cube"),
            (rng.integers(0, 255, (100, 150, 3), dtype=np.uint8), "what is on the table now"),  # 4 tiles + thumb
            (rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), "open")]


def test_staged_batched_decode_equals_generate(vlm):
    refs, seqs = [], []
    for img, prompt in _requests():
        pv, ids = vlm.pixel_values(img), vlm.tokenize(prompt)
        refs.append(vlm.generate_reference(ids, pv, N))
        seqs.append(vlm.prefill(ids, vlm.encode_vision(pv)))
    assert len({s.prompt_len for s in seqs}) == 3  # different lengths share one decode batch
    # requests join the batch at different times (in-flight batching)
    vlm.decode(seqs[:1])
    vlm.decode(seqs[:2])
    while any(len(s.tokens) < N for s in seqs):
        vlm.decode([s for s in seqs if len(s.tokens) < N])
    for ref, s in zip(refs, seqs):
        assert len(ref) == N
        assert s.tokens[:N] == ref


def test_chunked_prefill_equals_generate(vlm):
    img, prompt = _requests()[1]
    pv, ids = vlm.pixel_values(img), vlm.tokenize(prompt)
    ref = vlm.generate_reference(ids, pv, N)
    seq = vlm.start(ids, vlm.encode_vision(pv))
    chunks = 0
    while not vlm.prefill_chunk(seq, 7):
        chunks += 1
    assert chunks >= 2 and seq.prefilled
    while len(seq.tokens) < N:
        vlm.decode([seq])
    assert seq.tokens == ref


def test_vision_offload_same_output_less_resident(tmp_path):
    torch.set_num_threads(1)
    plain = StagedVLM("tiny", seed=3)
    off = StagedVLM("tiny", seed=3, offload_dir=str(tmp_path), physical_layers=2)
    assert off.vision_bytes() < plain.vision_bytes()
    img, prompt = _requests()[0]
    pv = plain.pixel_values(img)
    for _ in range(2):  # the second pass starts from the prefetched wrap-around layers
        assert torch.equal(plain.encode_vision(pv), off.encode_vision(pv))
    ids = plain.tokenize(prompt)
    assert off.generate_reference(ids, pv, N) == plain.generate_reference(ids, pv, N)


def test_bad_image_and_shape_are_refused(vlm):
    with pytest.raises(ValueError, match="HxWx3"):
        vlm.pixel_values(np.zeros((8, 8), dtype=np.uint8))
    with pytest.raises(ValueError, match="choose one of"):
        StagedVLM("huge")


@pytest.mark.parametrize("name", ["nova", "chunked_prefill"])
def test_live_partitioned_server_answers_equal_the_plain_model(vlm, name):
    """Through core.nova's live path (LiveDriver, front + decode workers on a CPU partition,
    in-flight batched decode): every answer equals the unstaged model's, token for token."""
    from robotserve_ros.core.nova import PartitionPlan, VLMCore, VLMRequest, make_vlm_scheduler
    from robotserve_ros.core.nova.live import NovaServer
    from robotserve_ros.engines.vlm import StageExecutor
    from robotserve_ros.engines.vlm_partition import CpuCorePartition

    cores = sorted(os.sched_getaffinity(0))[:2]
    mech = CpuCorePartition(cores=cores, max_threads=1)  # one thread per worker keeps the test quick
    if mech.total < 2:
        pytest.skip("a partition needs 2 cores")
    from test_nova_core import small_profile

    prof = small_profile(total=mech.total)
    plan = PartitionPlan(prof, tokens=N)
    ex = StageExecutor(vlm, mech)
    server = NovaServer(VLMCore(make_vlm_scheduler(name, plan, **({"budget": 9} if name != "nova" else {})),
                                mech.total), ex).start()
    try:
        reqs, refs = [], []
        for i, (img, prompt) in enumerate(_requests()):
            f = ex.request_fields(img, prompt)
            refs.append(vlm.generate_reference(f["payload"]["ids"], f["payload"]["pixels"], N))
            r = VLMRequest(f"r{i}", None, tiles=f["tiles"], prompt_tokens=f["prompt_tokens"], max_tokens=N,
                           payload=f["payload"])
            reqs.append((r, server.submit(r)))
        for r, ev in reqs:
            assert ev.wait(60), f"{r.rid} not answered"
        for (r, _), ref in zip(reqs, refs):
            assert r.error is None
            assert r.payload["seq"].tokens == ref
    finally:
        server.close()
    if name == "nova":
        assert set(mech.applied) == {"front", "decode"}  # both workers applied their shares


def test_gpu_partitions_refuse_clearly_without_a_gpu():
    from robotserve_ros.core.nova import PartitionUnavailable
    from robotserve_ros.engines.vlm_partition import MECHANISMS

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    for name in ("green_context", "mps"):
        with pytest.raises(PartitionUnavailable, match=f"{name} partition unavailable: no CUDA device"):
            MECHANISMS.create(name)


def test_cpu_partition_gives_each_worker_thread_its_own_share():
    import threading

    from robotserve_ros.engines.vlm_partition import CpuCorePartition

    mech = CpuCorePartition(cores=[0, 1, 2, 3], pin=False)
    assert mech.cores_for("front", 3) == [0, 1, 2] and mech.cores_for("decode", 1) == [3]  # disjoint
    seen = {}

    def worker(stage, units):
        mech.apply(stage, units)
        seen[stage] = torch.get_num_threads()

    for stage, units in (("front", 3), ("decode", 1)):
        th = threading.Thread(target=worker, args=(stage, units))
        th.start()
        th.join()
    assert seen == {"front": 3, "decode": 1}
    assert mech.applied["front"] == (3, (0, 1, 2)) and mech.applied["decode"] == (1, (3,))
