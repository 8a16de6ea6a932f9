"""`robotserve bench slo` end to end on small settings (simulator only): slo.json in the
issue's schema, the report files, and bad flags answered with one line and exit 2."""
from __future__ import annotations

import json

from robotserve_ros.cli import main

ROW = {"scheduler", "rate", "ttft_attainment", "tpot_attainment", "e2e_attainment", "decode_tokens_per_s", "mode"}


def test_bench_slo_writes_the_schema_and_the_report(tmp_path, capsys):
    out = tmp_path / "slo"
    assert main(["bench", "slo", "--out", str(out), "--live-requests", "0", "--sim-requests", "40", "--sim-seeds", "0",
                 "--sim-loads", "0.5", "1.5", "--no-sensitivity"]) == 0
    doc = json.loads((out / "slo.json").read_text())
    assert {r["scheduler"] for r in doc["rows"]} == {"urgency_slack", "fcfs_cb", "urgency_only", "slack_only"}
    assert all(set(r) == ROW and r["mode"] == "sim" for r in doc["rows"])
    assert all(0 <= r[k] <= 1 for r in doc["rows"] for k in ("ttft_attainment", "tpot_attainment", "e2e_attainment"))
    assert len({r["rate"] for r in doc["rows"]}) == 2
    assert (out / "slo.md").read_text().startswith("# SLO-aware") and (out / "slo.png").stat().st_size > 0
    assert "urgency_slack_alg3" in {d["scheduler"] for d in doc["details"]}


def test_bench_slo_bad_flags_exit_2_with_one_line(tmp_path, capsys):
    assert main(["bench", "slo", "--out", str(tmp_path), "--profile", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--profile" in err[0] and "none.json" in err[0]
    assert main(["bench", "slo", "--out", str(tmp_path), "--chunk-tokens", "-5"]) == 2
    assert "--chunk-tokens" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "engine_profile"}')
    assert main(["bench", "slo", "--out", str(tmp_path / "out"), "--profile", str(bad)]) == 2
    assert "llm_slo_profile" in capsys.readouterr().err
