"""`robotserve bench timely --trace FILE --out DIR [--sim]`: replay a TimelyLLM trace (seed 002
§6-7) under TimelyLLM and its baselines side by side, in one run.

- `--sim`: the whole trace on the virtual clock, engine times from the measured LLM profile
  (profiles/smollm2_135m_llm.json), robots executing each skill for its recorded duration.
- live (default): the real SmolLM2-135M engine on this CPU through the live serving loop
  (core/timely/live.py), robots in-process on the wall clock; a window of the trace (the first
  `--live-window` seconds of requests: this CPU cannot serve the whole trace live).

Plans: the trace has the skills and their durations, not the text; each plan is rendered
from its skills (timely/trace.py) and the model is constrained to produce exactly that text,
token by token (ForcedText), with one skill per line: the stop checker's segments are the
recorded skills. Writes DIR/timely.json (per scheduler: utility_urgent_mean,
utility_normal_mean, utility_mean, response_time_mean_s, waiting_time_total_s,
decision_ms_median, and more), and reports/timely/<trace>_<mode>.md + .png.
"""
from __future__ import annotations

import heapq
import json
import os
import statistics
import threading
import time
from pathlib import Path

from ..cli_types import scratch
from ..core.errors import ConfigError
from ..core.timely import SCHEDULER_NAMES, SEGMENT_SCHEDULERS, LLMProfile, Plan, SkillTimeModel, TimelyCore, TUF
from ..profiles import load_llm_profile as load_profile
from ..timely.metrics import PlanResult, summarize
from ..timely.trace import SYSTEM, agent_kind, load_trace, plan_specs, tokenize_specs

PROFILE = "smollm2_135m_llm"


def add_arguments(p) -> None:
    from ..cli_types import positive

    p.add_argument("--trace", required=True, help="TimelyLLM trace JSON (its _config.json beside it)")
    p.add_argument("--out", required=True, help="directory for timely.json")
    p.add_argument("--sim", action="store_true", help="virtual-clock replay of the whole trace from the profile")
    p.add_argument("--schedulers", nargs="+", default=SCHEDULER_NAMES, metavar="NAME",
                   help=f"from {', '.join(SCHEDULER_NAMES)}")
    p.add_argument("--profile", default=PROFILE, help="LLM profile of record name or JSON file")
    p.add_argument("--max-batch", type=positive(int), default=16, help="running batch bound (memory), every scheduler")
    p.add_argument("--live-window", type=positive(), default=30.0,
                   help="live: replay the requests of the trace's first N seconds")
    p.add_argument("--segment-ms", type=positive(), default=None,
                   help="--sim only: scale the profile so that a mean segment at batch 1 takes this long (the "
                        "paper's engine: 90 ms per segment, §7.1); default: this CPU's profile as measured")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="prefill each whole prompt (default: the kind's system turn is a server-side prefix, "
                        "prefilled once, §4.1)")
    p.add_argument("--report-dir", default=scratch("timely"), help="Markdown + PNG report folder (the record: reports/timely)")
    p.set_defaults(func=cli)


def prepare(trace: str):
    from ..engines.llm.convert import default_model_dir
    from ..engines.torch_env import import_torch

    records, config = load_trace(trace)
    specs = plan_specs(records)
    import_torch()  # transformers after the torchvision shim
    from transformers import AutoTokenizer

    folder = default_model_dir()
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"no LLM model folder at {folder}: run `robotserve llm-convert` (make does)")
    tok = AutoTokenizer.from_pretrained(folder)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tokenize_specs(specs, tok, lambda ids: tok.decode(ids, skip_special_tokens=True), {eos}, eos)
    skill_time = SkillTimeModel.from_records(records, agent_kind)
    return specs, config, skill_time, eos


def decision_bench(profile: LLMProfile, skill_time: SkillTimeModel, n: int = 8, repeats: int = 2000) -> dict:
    """Table 4's measure: one scheduling decision (priority update of every waiting segment,
    batch admission, item choice) with n tasks in the system; median ms per scheduler."""
    from ..core.clock import VirtualClock

    out = {}
    for name in SCHEDULER_NAMES:
        samples = []
        for r in range(repeats):
            clock = VirtualClock(10.0)
            core = TimelyCore(SEGMENT_SCHEDULERS.create(name), profile, skill_time, clock, max_batch=n)
            for i in range(n):
                urgent = i % 3 == 0
                p = Plan(i, f"a{i}", "drone", 10.0 - 0.1 * i, TUF(2, .2, .5) if urgent else TUF(1, 1, 1.5), 100,
                         urgent=urgent)
                if i % 2:  # half of them suspended, their robot executing a skill
                    p.k, p.prefilled, p.exec_end_est = 1, True, 10.0 + 0.3 * i
                core.submit(p)
            t0 = time.perf_counter()
            core.dispatch()
            samples.append((time.perf_counter() - t0) * 1000)
        out[name] = round(statistics.median(samples), 4)
    return out


def run_sim(specs, names, profile, skill_time, args, est, mx) -> dict:
    from ..timely.sim import simulate

    res = {}
    for name in names:
        results, core = simulate(specs, name, profile, skill_time, max_batch=args.max_batch,
                                 seg_tokens_est=est, seg_tokens_max=mx, prefix_cache=args.prefix_cache)
        res[name] = summarize(results, core.decision_ms_median())
        res[name]["decision_ms_median_at_8"] = core.decision_ms_median(8)
        res[name]["engine_items"] = core.stats.items
    return res


def run_live(specs, names, profile, skill_time, args, est, mx, eos, engine=None, live_cls=None) -> dict:
    """`engine` / `live_cls`: another backend's (bench llm-backends: vLLM's VLLMEngine and
    VLLMTimely); default the own engine, loaded here, and core/timely/live.py's loop."""
    from ..core.clock import WallClock
    from ..engines.llm import ForcedText, LLMEngine
    from ..core.timely.live import LiveTimely
    from ..engines.llm.stop import StopChecker

    t_first = specs[0].trigger
    window = [s for s in specs if s.trigger - t_first <= args.live_window]
    live_cls = live_cls or LiveTimely
    if engine is None:
        engine = LLMEngine.load(threads=1)
    if live_cls is LiveTimely and args.prefix_cache:  # vLLM's prefix caching needs no call
        for kind in sorted({s.kind for s in window}):
            engine.cache_prefix(engine.chat_prefix(SYSTEM[kind]))
    if live_cls is LiveTimely:  # warm-up: the first forward passes are slow (allocations)
        engine.prefill([("warm", window[0].prompt_ids)])
        engine.decode(["warm"], 3)
        engine.free("warm")
    res = {}
    for name in names:
        clock = WallClock()
        core = TimelyCore(SEGMENT_SCHEDULERS.create(name), profile, skill_time, clock, max_batch=args.max_batch,
                          seg_tokens_est=est, seg_tokens_max=mx, timer=time.perf_counter)
        by_id = {s.job_id: s for s in window}
        results = {s.job_id: PlanResult.start(s) for s in window}
        robot_free = {s.job_id: 0.0 for s in window}
        done = threading.Event()
        left = [len(window)]
        timers: list = []
        lock = threading.Condition()
        server_box = []

        def at(t, fn):
            with lock:
                heapq.heappush(timers, (t, id(fn), fn))
                lock.notify()

        def on_event(e):
            r, s = results[e.plan_id], by_id[e.plan_id]
            if e.kind == "segment":
                start = max(e.t, robot_free[e.plan_id])
                r.segment(e.k, e.t, start, s.skills[e.k][1])
                robot_free[e.plan_id] = start + s.skills[e.k][1]
                at(start, lambda pid=e.plan_id, k=e.k, t=start: server_box[0].progress(pid, k, t))
            elif e.kind == "done":
                if e.text:
                    r.error = e.text
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        server = live_cls(engine, core, on_event, stop_checker=StopChecker, max_segment_tokens=64).start()
        server_box.append(server)
        t0 = clock.now()
        for s in window:
            def arrive(s=s):
                results[s.job_id].arrival = clock.now()
                server.submit(Plan(s.job_id, s.agent_id, s.kind, clock.now(), TUF.from_list(s.tuf), len(s.prompt_ids),
                                   urgent=s.urgent, max_segments=len(s.skills)),
                              s.prompt_ids, ForcedText(s.forced_ids, eos))
            at(t0 + s.trigger - t_first, arrive)
        deadline = t0 + args.live_window + max(s.exec_s for s in window) * 3 + 120
        while not done.is_set() and clock.now() < deadline:
            with lock:
                while timers and timers[0][0] <= clock.now():
                    _, _, fn = heapq.heappop(timers)
                    lock.release()
                    try:
                        fn()
                    finally:
                        lock.acquire()
                wait = (timers[0][0] - clock.now()) if timers else 0.05
                lock.wait(timeout=min(max(wait, 0.0), 0.05))
        server.close()
        for pid in list(getattr(engine, "requests", list)()):
            engine.free(pid)
        res[name] = summarize(list(results.values()), core.decision_ms_median())
        res[name]["decision_ms_median_at_8"] = core.decision_ms_median(8)
        gen = server.engine_s
        res[name]["segmentation_overhead"] = {
            "stop_check_s": round(server.stop_check_s, 4), "kv_move_s": round(getattr(engine, "kv_move_s", 0.0), 4),
            "engine_s": round(gen, 3), "segments": core.stats.segments,
            "overhead_pct_of_generation": round(100 * (server.stop_check_s + getattr(engine, "kv_move_s", 0.0)) / gen, 3)
            if gen else None}
        if hasattr(server, "prefix_saving"):
            res[name]["prefix_cache"] = server.prefix_saving()
        engine.kv_move_s, engine.kv_move_cpu_s, engine.kv_moves = 0.0, 0.0, 0
        res[name]["live_window_s"] = args.live_window
        print(f"  {name}: {json.dumps({k: v for k, v in res[name].items() if k != 'per_task_type'})}", flush=True)
    return res


def cli(args) -> int:
    bad = [n for n in args.schedulers if n not in SCHEDULER_NAMES]
    if bad:
        raise ConfigError(f"--schedulers: {', '.join(bad)} not one of {', '.join(SCHEDULER_NAMES)}")
    if args.segment_ms is not None and not args.sim:
        raise ConfigError("--segment-ms scales the simulated engine: it needs --sim")
    profile, prof_rec = load_profile(args.profile)
    load0 = os.getloadavg()
    specs, config, skill_time, eos = prepare(args.trace)
    segs = [n for s in specs for n in s.seg_tokens]
    est = statistics.fmean(segs)
    mx = max(segs)  # the template's segment bound: the paper's "maximum token length" (§7.1)
    speedup = 1.0
    if args.segment_ms is not None:
        ctx = statistics.fmean(len(s.prompt_ids) for s in specs)
        speedup = est * profile.step_s(1, ctx) * 1000 / args.segment_ms
        profile = scaled(prof_rec["llm_profile"], speedup)
    mode = "sim" if args.sim else "live"
    print(f"timely bench ({mode}): {len(specs)} plans from {args.trace}; segment tokens mean {est:.1f}, max {mx}; "
          f"prompt tokens mean {statistics.fmean(len(s.prompt_ids) for s in specs):.0f}", flush=True)
    t0 = time.perf_counter()
    if args.sim:
        res = run_sim(specs, args.schedulers, profile, skill_time, args, est, mx)
    else:
        res = run_live(specs, args.schedulers, profile, skill_time, args, est, mx, eos)
    decisions = decision_bench(profile, skill_time)
    for name in res:
        res[name]["decision_ms_median_8_tasks_microbench"] = decisions[name]
    load1 = os.getloadavg()
    meta = {"trace": str(args.trace), "mode": mode, "plans": len(specs), "trace_config": {k: config.get(k) for k in (
        "num_agents", "max_num_per_event", "lambda_rate")}, "profile": args.profile,
        "profile_dtype": prof_rec.get("dtype"), "max_batch": args.max_batch,
        "segment_tokens_mean": round(est, 2), "segment_tokens_max": mx,
        "prompt_tokens_mean": round(statistics.fmean(len(s.prompt_ids) for s in specs), 1),
        "engine_speedup": round(speedup, 3), "segment_ms": args.segment_ms,
        "prefix_cache": args.prefix_cache,
        "prefill_tokens_mean": round(statistics.fmean(len(s.prompt_ids) - (s.prefix_len if args.prefix_cache else 0)
                                                      for s in specs), 1),
        "plan_template": "one line per recorded skill, name(arg); the engine is forced to this text (ForcedText)",
        "utility": "Eq. 1 at the response time, not clamped (negative past the cutoff); *_clamped: 0 past the "
                   "cutoff; a ratio is given only where both sides are > 0",
        "loadavg_before": load0, "loadavg_after": load1, "wall_s": round(time.perf_counter() - t0, 1)}
    if not args.sim:
        meta["live_window_s"] = args.live_window
        meta["live_plans"] = next(iter(res.values()))["plans"]
    out = {name: res[name] for name in args.schedulers}
    out["ratios"] = ratios(res)
    out["meta"] = meta
    d = Path(args.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "timely.json").write_text(json.dumps(out, indent=1) + "\n")
    from .timely_report import write_report

    tag = f"_seg{args.segment_ms:g}ms" if args.segment_ms is not None else ""
    md = write_report(out, Path(args.report_dir), f"{Path(args.trace).stem}_{mode}{tag}")
    print(json.dumps(out["ratios"], indent=1))
    print(f"-> {d / 'timely.json'}, {md}")
    return 0


def scaled(block: dict, speedup: float) -> LLMProfile:
    """The profile with every latency divided by `speedup` (a faster engine, same shape)."""
    b = json.loads(json.dumps(block))
    b["prefill_ms"]["ms"] = [m / speedup for m in b["prefill_ms"]["ms"]]
    b["decode_step_ms"]["ms"] = [[m / speedup for m in row] for row in b["decode_step_ms"]["ms"]]
    if "regather_ms" in b:
        b["regather_ms"]["ms"] = [[m / speedup for m in row] if isinstance(row, list) else row / speedup
                                  for row in b["regather_ms"]["ms"]]
    return LLMProfile.from_block(b)


def ratios(res: dict) -> dict:
    t, f = res.get("timely"), res.get("fcfs")
    if not t or not f:
        return {}

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b not in (None, 0) and a > 0 and b > 0 else None

    wt, wf = t["waiting_time_total_s"], f["waiting_time_total_s"]
    return {"utility_urgent_timely_over_fcfs": ratio(t["utility_urgent_mean"], f["utility_urgent_mean"]),
            "utility_urgent_clamped_timely_over_fcfs": ratio(t["utility_urgent_mean_clamped"],
                                                             f["utility_urgent_mean_clamped"]),
            "utility_urgent_gain_over_fcfs": None if t["utility_urgent_mean"] is None or f["utility_urgent_mean"] is None
            else round(t["utility_urgent_mean"] - f["utility_urgent_mean"], 4),
            "utility_mean_timely_over_fcfs": ratio(t["utility_mean"], f["utility_mean"]),
            "waiting_time_reduction_vs_fcfs": round(1 - wt / wf, 4) if wf else None,
            "response_time_reduction_vs_fcfs": round(1 - t["response_time_mean_s"] / f["response_time_mean_s"], 4)
            if f["response_time_mean_s"] else None}
