"""The vLLM backend of the LLM services (issue 25, docs/vllm.md): a vLLM engine in its own
process and venv (`make vllm`), driven from the project's venv over stdio
(engines/llm/vllm_host.py; its client, `VLLMHost` / `VLLMEngine`, is engines/llm/vllm_client.py),
and the two live loops that put the project's schedulers on it
through vLLM's public API only:

- `VLLMTimely` (planner, seed 002): the segment serving core decides which waiting
  segments run (its order and its §4.4 admission); each admitted segment is one vLLM
  generate call whose prompt is the plan so far, its `priority` the segment's rank in the
  PUD order (Eq. 4) at submission. Suspension is the call ending at the skill delimiter;
  resumption is the next call, whose prefill vLLM's automatic prefix caching mostly skips
  (the KV the own engine keeps by hand): counted per resumed segment (`prefix_stats`).
- `VLLMGenerate` (generate, seed 004): one call per request, `priority` its TTFT deadline
  (urgency order, §3.1) for the SLO schedulers, arrival order for fcfs_cb.

Text: the same tokenizer folder is read in this venv (vllm_client.py) with transformers 4 (the tokenizer fix of
vllm_prepare.py gives the same ids in both venvs): token ids cross the pipe, never text.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable, Hashable, Optional, Sequence

from ...core.errors import BadPrompt, ConfigError
from ...core.timely.plan import DONE, RUNNING, WAITING
from ...core.timely.serving import Event, SegmentOutcome, WorkItem
from .vllm_client import (  # noqa: F401  (the backend's names, imported from here)
    DEFAULT_MODEL,
    DEFAULT_PYTHON,
    HOST,
    REPO,
    VLLMEngine,
    VLLMHost,
    VLLMTokenizer,
    VLLMUnavailable,
    cpu_support,
    vllm_config,
)

log = logging.getLogger("robotserve.vllm")


class _Running:
    """What a busy-flag-free driver needs of LiveTimely's `driver`."""

    def __init__(self) -> None:
        self.running = True


class VLLMTimely:
    """The planner's live loop on vLLM (LiveTimely's interface: submit / progress / cancel /
    close). A waiting segment is sent as one call with `priority` from the core's scheduler:
    TimelyLLM's potential-utility density (Eq. 4) at the moment it is sent, EDF's deadline,
    FCFS's arrival (vLLM runs the lowest first; ties in arrival order). Which segments are
    sent, `admission`:
    - "vllm" (default): every waiting segment at once; vLLM's continuous batching decides the
      batch (up to max_num_seqs) and the priority decides who waits when it is full;
    - "core": only what the scheduler's admission lets run (Timely: §4.4's latency-guided
      batch size, predicted from the own engine's profile).
    Non-segmented schedulers (fcfs, fcfs_stream) send the whole plan as one call, as vLLM
    serves a plan. What does not survive: a priority is fixed once sent (§4.3's dynamic
    update reaches only segments still waiting here), and "core" admission predicts with a
    profile of another engine."""

    def __init__(self, engine: VLLMEngine, core, on_event: Callable[[Event], None], *, stop_checker: Callable,
                 delimiter: str = "\n", max_segment_tokens: int = 32, max_prompt_tokens: Optional[int] = None,
                 admission: str = "vllm") -> None:
        if admission not in ("vllm", "core"):
            raise ConfigError(f"admission {admission!r}: one of vllm, core")
        self.admission = admission
        self._epoch = core.clock.now()
        self.engine, self.core, self.on_event, self.stop_checker = engine, core, on_event, stop_checker
        self.delimiter, self.max_segment_tokens = delimiter, int(max_segment_tokens)
        self.max_prompt_tokens = int(max_prompt_tokens or engine.max_context // 2)
        self._lock = threading.RLock()
        self._ctx: dict = {}        # plan id -> {"ids": prompt + generated, "stop", "forced": [ids], "t0"}
        self._inflight: dict = {}   # plan id -> call id
        self._seq = itertools.count()
        self.failures = 0
        self.engine_s = 0.0
        self.stop_check_s = 0.0
        self.prefix_stats: list = []   # per resumed segment: (prompt tokens, cached tokens)
        self.driver = _Running()

    def start(self) -> "VLLMTimely":
        return self

    def close(self) -> None:
        self.driver.running = False
        with self._lock:
            calls = list(self._inflight.values())
        for c in calls:
            self.engine.host.abort(c)

    def submit(self, plan, prompt_ids: Sequence[int], constraint=None) -> None:
        ids = list(prompt_ids)
        if not ids:
            raise BadPrompt("empty prompt")
        if len(ids) > self.max_prompt_tokens:
            raise BadPrompt(f"prompt of {len(ids)} tokens, over the limit of {self.max_prompt_tokens}")
        plan.prompt_tokens = plan.context = plan.prefill_tokens = len(ids)
        forced = list(constraint.ids) if constraint is not None and hasattr(constraint, "ids") else None
        with self._lock:
            self.core.submit(plan)
            self._ctx[plan.id] = {"ids": ids, "forced": forced, "n_prompt": len(ids),
                                  "stop": self.stop_checker(self.engine.decode_text, self.engine.eos_ids,
                                                            delimiter=self.delimiter, max_tokens=self.max_segment_tokens)}
        self._pump()

    def progress(self, plan_id: Hashable, k: int, t: float, expected_exec_s: float = 0.0) -> None:
        self.core.segment_started(plan_id, k, t, expected_exec_s)
        self._pump()

    def cancel(self, plan_id: Hashable) -> None:
        with self._lock:
            self.core.cancel(plan_id)
            self._ctx.pop(plan_id, None)
            call = self._inflight.pop(plan_id, None)
        if call:
            self.engine.host.abort(call)
        self._pump()

    # ---- internals ----
    def _pump(self) -> None:
        """Admit what the scheduler lets run now and send each as one call."""
        if not self.driver.running:
            return
        sends = []
        with self._lock, self.core.lock:
            core, now = self.core, self.core.clock.now()
            waiting = [p for p in core.plans.values() if p.state == WAITING]
            if waiting:
                ordered = core.scheduler.order(waiting, now, core.ctx)
                admitted = ordered if self.admission == "vllm" else core.scheduler.admit(core.running, ordered, now, core.ctx)
                for p in admitted:
                    p.state = RUNNING
                    core.running.append(p)
            for p in core.running:
                if p.id not in self._inflight and p.id in self._ctx:
                    call = f"{p.id}#{next(self._seq)}"
                    self._inflight[p.id] = call
                    sends.append((p, call, self._priority(p, now)))
        for p, call, rank in sends:
            self._send(p, call, rank)

    def _priority(self, p, now: float) -> int:
        """vLLM's integer priority (lower first) from the core's scheduler: Eq. 4's value
        (x 1e4: Pri is capped at |alpha| / G_ref, ~20 here), EDF's deadline or the arrival (ms)."""
        sch = self.core.scheduler
        if hasattr(sch, "priority"):  # TimelyLLM: (-Pri, deadline, arrival)
            return int(round(sch.priority(p, now, self.core.ctx, 1)[0] * 1e4))
        t = p.arrival + p.tuf.ert if sch.name == "seg_edf" else p.arrival
        return int(round((t - self._epoch) * 1000))

    def _send(self, p, call: str, rank: int) -> None:
        c = self._ctx.get(p.id)
        if c is None:
            return
        segmented = self.core.scheduler.segmented
        left_segments = max(p.max_segments - p.k, 1)
        kw = {}
        if c["forced"] is not None:  # the bench's plan template: exactly its tokens, one decode step each
            todo = c["forced"][len(c["ids"]) - c["n_prompt"]:]
            n = _forced_segment_len(todo, self.engine.decode_text, self.delimiter) if segmented else len(todo)
            kw = {"max_tokens": max(n, 1), "min_tokens": max(n, 1), "ignore_eos": True}
        else:
            n = self.max_segment_tokens * (1 if segmented else left_segments)
            kw = {"max_tokens": n, "stop": [self.delimiter] if segmented else None}
        c["t0"] = time.monotonic()
        c["resumed"] = len(c["ids"]) > c["n_prompt"]
        try:
            self.engine.host.generate(call, c["ids"], priority=rank,
                                      on_tokens=lambda toks, pid=p.id, call=call: self._on_tokens(pid, call, toks),
                                      on_done=lambda m, pid=p.id, call=call: self._on_done(pid, call, m), **kw)
        except RuntimeError:
            self._on_done(p.id, call, {"error": "shutting_down"})

    def _on_tokens(self, pid, call: str, toks: list) -> None:
        events = []
        with self._lock:
            c = self._ctx.get(pid)
            if c is None or self._inflight.get(pid) != call:
                return
            t1 = time.monotonic()
            for tok in toks:
                done_n = len(c["ids"]) - c["n_prompt"]
                if c["forced"] is not None and done_n < len(c["forced"]):
                    tok = c["forced"][done_n]  # the template's token: same count, same text as the own engine
                c["ids"].append(int(tok))
                reason = c["stop"].feed(tok)
                if reason:
                    toks_seg, text, reason = c["stop"].take()
                    self.stop_check_s += time.monotonic() - t1
                    events += self._complete(pid, len(toks_seg) + (reason == "eos"), text, reason == "eos")
                    if pid not in self._ctx or self.core.scheduler.segmented:
                        break
        self._emit(events)

    def _on_done(self, pid, call: str, m: dict) -> None:
        events = []
        with self._lock:
            if self._inflight.get(pid) != call:
                return
            del self._inflight[pid]
            c = self._ctx.get(pid)
            if c is not None:
                self.engine_s += time.monotonic() - c.get("t0", time.monotonic())
                if c.get("resumed") and "prompt" in m:
                    self.prefix_stats.append((m["prompt"], m.get("cached", 0)))
            if "error" in m:
                self.failures += m["error"] != "shutting_down"
                with self.core.lock:
                    p = self.core.plans.get(pid)
                    if p is not None and p.state != DONE:
                        self.core._finish(p, self.core.clock.now(), m["error"])
                        events.append(Event("done", pid, self.core.clock.now(), p.k, m["error"], True))
                self._ctx.pop(pid, None)
            elif c is not None:
                st = c["stop"]
                p = self.core.plans.get(pid)
                if p is not None and p.state == RUNNING and st.tokens:
                    # the call ended (its bound, or vLLM's stop string) before the checker did;
                    # a whole-plan call that ended at a segment's end is sent on by _pump
                    toks_seg, text, _ = st.take()
                    events += self._complete(pid, len(toks_seg), text, False)
        self._emit(events)
        self._pump()

    def _complete(self, pid, n_tokens: int, text: str, plan_done: bool) -> list:
        """One segment ended: the core's bookkeeping as for the own engine."""
        p = self.core.plans.get(pid)
        if p is None:
            return []
        p.prefilled = True
        events = self.core.complete(WorkItem("decode", [pid], n_tokens), {pid: SegmentOutcome(n_tokens, text, plan_done)})
        for e in events:
            if e.kind == "done":  # (max_segments) a whole-plan call may still be generating
                self._ctx.pop(pid, None)
                if pid in self._inflight:
                    self.engine.host.abort(self._inflight[pid])
        return events

    def _emit(self, events: list) -> None:
        for e in events:
            try:
                self.on_event(e)
            except Exception:
                log.exception("planner: delivering %s for %s failed", e.kind, e.plan_id)

    def prefix_saving(self) -> dict:
        """Of the resumed segments' prompts, the share vLLM's prefix cache did not prefill."""
        n = sum(a for a, _ in self.prefix_stats)
        c = sum(b for _, b in self.prefix_stats)
        return {"resumed_segments": len(self.prefix_stats), "prompt_tokens": n, "cached_tokens": c,
                "saved_pct": round(100 * c / n, 1) if n else None}


def _forced_segment_len(todo: list, decode: Callable, delimiter: str) -> int:
    """Tokens of the forced plan up to and including the one that completes a skill line."""
    for i in range(1, len(todo) + 1):
        if delimiter in decode(todo[:i]):
            return i
    return len(todo)


class VLLMWorkers:
    """srv/Generate's requests on vLLM, in place of core/slo/workers.py's DisaggregatedWorkers
    (same start / kick / close / stats). The SLO core still admits, validates and records
    every request; what its prefill queue holds is sent at once, one call each, in its
    prefill policy's order, `priority` = the TTFT deadline in ms (seed 004 §3.1's urgency
    order as far as a fixed per-request priority carries it) for the SLO schedulers, arrival
    order for fcfs_cb. vLLM's continuous batching decides the decode batch: the slack-guided
    decode batching (§3.2) has no public hook there."""

    def __init__(self, core, engine: VLLMEngine, scheduler: str, stop_at_eos: bool = True) -> None:
        """stop_at_eos False: exactly max_tokens each (benchmarks, as DisaggregatedWorkers')."""
        self.core, self.engine, self.scheduler = core, engine, scheduler
        self._exact = {} if stop_at_eos else {"ignore_eos": True}
        self._epoch = core.clock.now()
        self._inflight: set = set()
        self.cached_tokens = self.prompt_tokens = 0

    def start(self) -> "VLLMWorkers":
        return self

    def kick(self) -> None:
        core = self.core
        with core.lock:
            now = core.clock.now()
            todo = core.prefill_policy.order(list(core.prefill_queue), now, core.profile.prefill)
            core.prefill_queue.clear()
            self._inflight.update(r.req_id for r in todo)
        for r in todo:
            prio = r.seq if self.scheduler == "fcfs_cb" else int((r.ttft_deadline_s - self._epoch) * 1000)
            try:
                exact = {"min_tokens": r.max_tokens, **self._exact} if self._exact else {}
                self.engine.host.generate(r.req_id, r.prompt_tokens, r.max_tokens, priority=prio, **exact,
                                          on_tokens=lambda t, r=r: self._tokens(r, t),
                                          on_done=lambda m, r=r: self._done(r, m))
            except RuntimeError:
                self._done(r, {"error": "shutting_down"})

    def _tokens(self, r, toks: list) -> None:
        with self.core.lock:
            if r.first_token_s is None:
                r.first_token_s, r.prefilled = self.core.clock.now(), r.prompt_len
            r.tokens += toks
            r.n_gen += len(toks)

    def _done(self, r, m: dict) -> None:
        core = self.core
        with core.lock:
            self._inflight.discard(r.req_id)
            if "error" in m:
                core._fail(r, m["error"])
                return
            self.prompt_tokens += m.get("prompt", 0)
            self.cached_tokens += m.get("cached", 0)
            r.eos = m.get("finish") == "stop"
            if r.first_token_s is None:  # nothing generated (max_tokens reached at once)
                r.first_token_s = core.clock.now()
            core._finish(r, core.clock.now())

    def close(self) -> None:
        with self.core.lock:
            ids = list(self._inflight)
        for rid in ids:
            self.engine.host.abort(rid)

    def stats(self) -> dict:
        return {"kv_handover_ms_mean": 0.0, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens}
