"""`robotserve profile-slo --out FILE`: the LLM SLO profile the seed-004 schedulers and the
simulator read (core/slo/profile.py), measured on the engine the live workers use:
- prefill latency vs prompt tokens (batch 1, whole prompt);
- decode step latency vs batch size and context length (the LUT of Algorithm 3), rows of
  equal context; the first step after the running set changes is timed apart (the engine
  regathers its batch KV then: `regather_s`);
- the KV handover from a prefill engine to a decode engine (export + import), vs tokens.
Each point is the median of `repeats`, batch sizes visited in a rotated order each repeat.
torch runs at one intra-op thread (the live workers' setting: one core each).
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from ..core.slo import LLMProfile
from ..machine import machine_info


def measure(pe, de, *, prompt_tokens=(16, 64, 128, 256, 512, 1024, 1536, 1900), batches=(1, 2, 4, 8, 16),
            contexts=(64, 256, 512, 1024, 1800), steps: int = 4, repeats: int = 3, log=print) -> LLMProfile:
    torch = pe.torch
    vocab = int(pe.model.config.vocab_size)
    g = torch.Generator().manual_seed(0)

    def prompt(n):
        return torch.randint(100, min(vocab, 20000), (n,), generator=g).tolist()

    def clone(state):
        return {**state, "kv": [(k.clone(), v.clone()) for k, v in state["kv"]], "generated": list(state["generated"])}

    load0 = [round(x, 2) for x in os.getloadavg()]
    pe.prefill([("warm", prompt(32))])
    de.import_kv("warm", pe.export_kv("warm"))
    de.decode(["warm"], 2)
    de.free("warm")
    pre = {n: [] for n in prompt_tokens}
    hand = {n: [] for n in prompt_tokens}
    kv_bytes = {}
    for rep in range(repeats):
        order = list(prompt_tokens[rep % len(prompt_tokens):]) + list(prompt_tokens[:rep % len(prompt_tokens)])
        for n in order:
            p = prompt(n)
            t0 = time.perf_counter()
            pe.prefill([("p", p)])
            t1 = time.perf_counter()
            kv_bytes[n] = pe.kv_bytes("p")
            de.import_kv("p", pe.export_kv("p"))
            t2 = time.perf_counter()
            de.free("p")
            pre[n].append(t1 - t0)
            hand[n].append(t2 - t1)
        log(f"prefill repeat {rep + 1}/{repeats}: " + ", ".join(f"{n}:{1000 * pre[n][-1]:.0f}ms" for n in prompt_tokens))
    step = {b: {} for b in batches}
    regather = {b: {} for b in batches}
    for c in contexts:
        pe.prefill([("base", prompt(c))])
        base = pe.export_kv("base")
        ids = [f"r{i}" for i in range(max(batches))]
        for rid in ids:
            de.import_kv(rid, clone(base))
        st = {b: [] for b in batches}
        rg = {b: [] for b in batches}
        for rep in range(repeats):
            order = list(batches[rep % len(batches):]) + list(batches[:rep % len(batches)])
            for b in order:
                t0 = time.perf_counter()
                de.decode(ids[:b], 1)  # a new running set: the engine gathers its batch KV first
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                de.decode(ids[:b], steps)
                per = (time.perf_counter() - t0) / steps
                st[b].append(per)
                rg[b].append(max(0.0, first - per))
        for b in batches:
            step[b][c] = statistics.median(st[b])
            regather[b][c] = statistics.median(rg[b])
        for rid in ids:
            de.free(rid)
        log(f"decode ctx {c}: " + ", ".join(f"b{b}:{1000 * step[b][c]:.0f}ms(+{1000 * regather[b][c]:.0f})" for b in batches))
    # the handover's cost per token: least squares over the prompt sizes
    xs = sorted(prompt_tokens)
    ys = [statistics.median(hand[n]) for n in xs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = max(0.0, my - slope * mx)
    # A larger batch or a longer context never takes less time: the LUT is the running max of
    # the medians along both (load on a shared machine makes single cells dip); raw in meta.
    raw_step = {b: dict(row) for b, row in step.items()}
    for i, b in enumerate(batches):
        for j, c in enumerate(contexts):
            lower = [step[batches[i - 1]][c]] if i else []
            lower += [step[b][contexts[j - 1]]] if j else []
            step[b][c] = max([step[b][c]] + lower)
    pre_med = {n: statistics.median(pre[n]) for n in xs}
    for i in range(1, len(xs)):
        pre_med[xs[i]] = max(pre_med[xs[i]], pre_med[xs[i - 1]])
    meta = {"model": getattr(pe, "name", "?"), "dtype": str(getattr(pe, "dtype", "?")),
            "torch_threads": torch.get_num_threads(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "repeats": repeats, "machine": machine_info(), "loadavg_start": load0,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "regather_s": {str(b): {str(c): v for c, v in row.items()} for b, row in regather.items()},
            "kv_handover_s": {str(n): statistics.median(hand[n]) for n in xs},
            "kv_bytes": {str(n): kv_bytes[n] for n in xs},
            "raw_decode_step_s": {str(b): {str(c): v for c, v in row.items()} for b, row in raw_step.items()},
            "samples": {"prefill_s": {str(n): pre[n] for n in xs}}}
    return LLMProfile(pre_med,
                      {b: {c: s for c, s in row.items()} for b, row in step.items()},
                      max(0.0, slope), fixed, meta)


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="profile JSON (robotserve_ros/profiles/NAME.json for one of record)")
    p.add_argument("--model", default=None, help="LLM folder (default: the converted SmolLM2)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")


def cli(a) -> int:
    from ..engines.llm.engine import live_engines

    pe, de = live_engines(a.model, a.dtype)
    kw = dict(prompt_tokens=(16, 64, 256), batches=(1, 2, 4), contexts=(64, 256), steps=2) if a.quick else {}
    prof = measure(pe, de, repeats=max(1, a.repeats), **kw)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.save(out)
    print(json.dumps({"out": str(out), "prefill_s": prof.prefill.to_json(), "decode_b1_s": prof.decode.to_json()["1"],
                      "kv_handover_s_per_token": prof.kv_s_per_token}, indent=1))
    return 0
