"""The TimelyLLM trace replay on the virtual clock (timely/sim.py) and `robotserve bench timely`:
a burst of normal plans with urgent ones among them, where TimelyLLM answers the urgent
requests sooner than whole-plan FCFS and keeps robots waiting less; the bench's JSON schema
and its refusals. No torch for the simulator part."""
import json

import pytest

from robotserve_ros.core.timely import LLMProfile, SkillTimeModel
from robotserve_ros.timely.metrics import summarize
from robotserve_ros.timely.sim import simulate
from robotserve_ros.timely.trace import PlanSpec

PROFILE = LLMProfile.from_block({"prefill_ms": {"tokens": [16, 128], "ms": [30, 80]},
                                 "decode_step_ms": {"batch": [1, 4, 16], "context": [64, 512], "ms": [[40, 45], [45, 55], [80, 110]]}})
SKILLS = SkillTimeModel({"drone": {"s": 1.5, "g": 2.0, "mf": 1.0, "d": 1.0}})


def burst(n_normal=8, n_urgent=3, t=1.0):
    specs = []
    for i in range(n_normal):
        specs.append(PlanSpec(i, t + 0.001 * i, f"a{i}", 0, "drone", "find the cat", [1, 1, 1.5], False,
                              [("s(cat)", 1.5), ("g(cat)", 2.0), ("s(dog)", 1.5)], prompt_ids=list(range(90)),
                              seg_tokens=[5, 5, 6]))
    for j in range(n_urgent):
        i = n_normal + j
        specs.append(PlanSpec(i, t + 0.02 + 0.001 * j, f"a{i}", 7, "drone", "[E] evade", [2, 0.2, 0.5], True,
                              [("d(1)", 1.0), ("mf(50)", 1.0)], prompt_ids=list(range(60)), seg_tokens=[4, 6]))
    return specs


def run(name, specs):
    results, core = simulate(specs, name, PROFILE, SKILLS, seg_tokens_est=5, seg_tokens_max=6)
    return summarize(results, core.decision_ms_median()), results


def test_every_scheduler_completes_every_plan_with_its_recorded_skills():
    specs = burst()
    for name in ("timely", "fcfs", "fcfs_stream", "seg_fcfs", "seg_edf"):
        s, results = run(name, specs)
        assert s["plans_complete"] == len(specs), name
        for r, spec in zip(results, specs):
            assert [k for k, *_ in r.segments] == list(range(len(spec.skills)))
            starts = [st for _, _, st, _ in r.segments]
            ends = [st + e for _, _, st, e in r.segments]
            assert all(b >= a - 1e-9 for a, b in zip(ends, starts[1:]))  # one skill after another
            assert all(d <= st for _, d, st, _ in r.segments)  # never before it was generated


def test_timely_serves_urgent_requests_sooner_than_whole_plan_fcfs():
    specs = burst()
    t, _ = run("timely", specs)
    f, _ = run("fcfs", specs)
    assert t["utility_urgent_mean"] > f["utility_urgent_mean"]
    assert t["per_task_type"]["drone-7-urgent"]["response_time_mean_s"] < f["per_task_type"]["drone-7-urgent"]["response_time_mean_s"]
    assert t["waiting_time_total_s"] < f["waiting_time_total_s"]
    # fcfs hands the whole plan over at once: its response time is the plan's generation
    assert f["response_time_mean_s"] > t["response_time_mean_s"]


def test_bench_refuses_a_bad_scheduler_name_with_one_line(tmp_path, capsys):
    from robotserve_ros.cli import main

    trace = tmp_path / "t.json"
    trace.write_text("[]")
    assert main(["bench", "timely", "--trace", str(trace), "--out", str(tmp_path / "out"), "--schedulers", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nosuch" in err[0] and "timely" in err[0]
    assert main(["bench", "timely", "--trace", str(trace), "--out", str(tmp_path / "out"), "--sim"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trace" in err[0]


def test_bench_sim_writes_the_schema_of_record(tmp_path):
    pytest.importorskip("transformers")
    from robotserve_ros.cli import main
    from robotserve_ros.engines.llm.convert import default_model_dir

    if not (default_model_dir() / "tokenizer.json").is_file():
        pytest.skip("the converted LLM folder is not built (make llm)")
    recs = [{"job_id": i, "trigger time": 1.0 + 0.001 * i, "agent_id": i, "trace_id": 7 if i % 3 == 0 else 0,
             "task_input": ("Scene: [dog x:0.4] Task: [E] evade the dog" if i % 3 == 0
                            else "Scene: [] Task: [A] Could you find the cat?"),
             "exe_time_detail": [["mu", 2.5], ["ml", 2.2]] if i % 3 == 0 else [["s(", 1.6], ["g(", 2.5]],
             "task_exe_time": 4.7, "tuf": [2, 0.2, 0.5] if i % 3 == 0 else [1, 1, 1.5]} for i in range(9)]
    trace = tmp_path / "mini.json"
    trace.write_text(json.dumps(recs))
    (tmp_path / "mini_config.json").write_text(json.dumps({"num_agents": 9}))
    out = tmp_path / "out"
    assert main(["bench", "timely", "--trace", str(trace), "--out", str(out), "--sim",
                 "--report-dir", str(tmp_path / "rep")]) == 0
    doc = json.loads((out / "timely.json").read_text())
    for name in ("timely", "fcfs", "fcfs_stream", "seg_fcfs", "seg_edf"):
        assert {"utility_urgent_mean", "utility_normal_mean", "utility_mean", "response_time_mean_s",
                "waiting_time_total_s", "decision_ms_median"} <= set(doc[name])
        assert doc[name]["plans_complete"] == 9
    assert (tmp_path / "rep" / "mini_sim.md").is_file() and (tmp_path / "rep" / "mini_sim.png").is_file()
