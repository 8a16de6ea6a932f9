"""`robotserve bench oxygen` (seed 001 §4): wrong flags exit 2 with one line; the JSON rows
follow the issue's schema and the summary flags targets met or missed from the numbers; a
short in-process run of each mode decodes the tokens it should (N per frame; OxyGen at a
steady decode batch of N/k)."""
from __future__ import annotations

import pytest

from robotserve_ros.bench import oxygen as bo


def run_cli(capsys, *args):
    from robotserve_ros.cli import main

    try:
        code = main(["bench", "oxygen", *args])
    except SystemExit as e:  # argparse's errors
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, word", [(["--modes", "sequential,turbo"], "turbo"),
                                        (["--decode-tokens", "0,5"], "--decode-tokens"),
                                        (["--device", "tpu"], "--device")])
def test_bad_flags_exit_2_with_one_line(tmp_path, capsys, args, word):
    code, err = run_cli(capsys, "--out", str(tmp_path), *args)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and word in lines[0], err


def synthetic_doc():
    rows = []
    for n, seq_hz, oxy_hz, mem in ((1, 100.0, 120.0, 500.0), (20, 50.0, 110.0, 510.0), (50, 30.0, 50.0, 700.0)):
        for mode, hz, m in (("sequential", seq_hz, 500.0), ("parallel", seq_hz * 0.9, 1000.0),
                            ("kv_sharing", seq_hz * 1.2, 500.0), ("oxygen", oxy_hz, mem)):
            rows.append({"mode": mode, "decode_tokens": n, "denoise_steps": 10, "action_hz": hz,
                         "tokens_per_s": hz / 5 * n, "avg_decode_batch": n / 5 if mode == "oxygen" else 1.0,
                         "peak_memory_mb": m})
    return {"device": "cpu: test", "rows": rows, "tokens_per_frame": 5, "action_horizon": 5,
            "policy": {"size": "default", "parameters": 1.0e6}, "frames_per_block": 6, "blocks_per_config": 3,
            "threads_per_process": 1, "poisson": [], "loadavg_before": [1, 1, 1], "loadavg_after": [1, 1, 1],
            "wall_s": 1.0}


def test_summary_flags_targets_from_the_numbers_and_report_is_written(tmp_path):
    doc = synthetic_doc()
    s = bo.summarize(doc)
    checks = {c["decode_tokens"]: c for c in s["oxygen_vs_sequential"]}
    assert checks[1]["speed_target_met"] is None  # the target is for >= 20 tokens
    assert checks[20]["speed_target_met"] is True and checks[20]["action_speedup"] == pytest.approx(2.2)
    assert checks[50]["speed_target_met"] is False  # x1.67
    assert checks[20]["memory_target_met"] is True and checks[50]["memory_target_met"] is False  # +2% / +40%
    doc["summary"] = s
    bo.write_report(doc, tmp_path)
    md = (tmp_path / "oxygen.md").read_text()
    assert "N=50 S=10: action frequency x1.67 (target >= 2: MISSED)" in md
    assert "memory +40.0% (<= 20%: MISSED)" in md
    assert (tmp_path / "oxygen.png").stat().st_size > 10_000
    assert all(set(r) == set(bo.ROW_KEYS) for r in doc["rows"])


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    pytest.importorskip("lerobot")
    from lerobot_policies import make_policy_dir

    d = make_policy_dir("smolvla", tmp_path_factory.mktemp("bench") / "vla", steps=2)
    return bo._load(str(d), "cpu", 2, 1)


@pytest.mark.parametrize("mode", ["sequential", "kv_sharing", "oxygen"])
def test_each_mode_decodes_n_tokens_per_frame(eng, mode):
    n, frames = 6, 4
    warm = 1 + (3 if mode == "oxygen" else 0)  # N/k frames to reach the steady batch
    r = bo.run_inline(eng, mode, n, 2, frames, warm, seed=0)
    # tokens_per_s / action_hz = tokens per frame / H: N per frame at steady state
    assert r["tokens_per_s"] / r["action_hz"] * eng.chunk_len == pytest.approx(n)
    assert r["avg_decode_batch"] == pytest.approx(n / 2 if mode == "oxygen" else 1.0)
    assert len(eng.kv) == 0  # nothing left holding KV after the block
