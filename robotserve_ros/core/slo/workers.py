"""Disaggregated prefill and decode workers (seed 004 §2.1, DistServe-style PD disaggregation).

Two engine instances of the same model: one only prefills, one only decodes. Each is a slot
of `core/loop.py`'s LiveDriver (one thread each; with torch at one intra-op thread per call
the two workers run on separate CPU cores, the GIL released inside torch's kernels). A
prefilled request's KV cache is exported by the prefill engine and imported by the decode
engine when the request first decodes: in-process tensors, the transfer timed both sides.
The SLOServingCore decides what each worker does next; the workers only execute. Pure
Python beside the core (the engines are passed in, their times read on the core's clock),
like every live adapter: core/runner.py, core/nova/live.py, core/timely/live.py.

Engine interface (robotserve_ros/engines/llm's LLMEngine): prefill([(req_id, token_ids)]) ->
{req_id: first_token}; decode(req_ids, steps=1) -> {req_id: [tokens]}; export_kv(req_id),
import_kv(req_id, kv), free(req_id), kv_bytes(req_id); eos_ids (a set; optional).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from ..loop import LiveDriver
from .serving import PREFILL, DecodeItem, PrefillItem, SLOServingCore, StepResult

log = logging.getLogger("robotserve.slo")


class DisaggregatedWorkers:
    def __init__(self, core: SLOServingCore, prefill_engine, decode_engine, *, stop_at_eos: bool = True,
                 on_event: Optional[Callable] = None) -> None:
        if core.chunk_tokens:
            raise ValueError("the live engine prefills whole prompts: use chunk_tokens=0")
        if core.kv_handover_in_core:
            raise ValueError("live workers time the KV handover themselves: use kv_handover_in_core=False")
        self.core, self.pe, self.de = core, prefill_engine, decode_engine
        # A benchmark generates to max_tokens whatever the text says (as vLLM's ignore_eos does).
        self.eos = frozenset(getattr(decode_engine, "eos_ids", ()) or ()) if stop_at_eos else frozenset()
        self._handover: dict = {}      # req_id -> exported KV, waiting for the decode worker
        self._imported: set = set()    # req_ids whose KV lives in the decode engine
        self._lock = threading.Lock()
        self.kv = {"handovers": 0, "bytes": 0, "export_s": 0.0, "import_s": 0.0}
        self.on_event = on_event
        self.driver = LiveDriver.for_core(core, self.run, on_crash=self.on_crash, name="slo-dispatcher")

    def start(self) -> "DisaggregatedWorkers":
        self.driver.start()
        return self

    def kick(self) -> None:
        self.driver.kick()

    def close(self) -> None:
        self.driver.close()

    # --- slot work ----------------------------------------------------------------------------
    def run(self, slot, item) -> None:
        if slot == PREFILL:
            self._prefill(item)
        else:
            self._decode(item)

    def _prefill(self, item: PrefillItem) -> None:
        reqs = item.requests
        for r, a, b in item.chunks:
            if a != 0 or b != r.prompt_len:
                raise ValueError(f"request {r.req_id}: the engine prefills whole prompts, got tokens [{a}, {b})")
        t0 = self.core.clock.now()
        first = self.pe.prefill([(r.req_id, list(r.prompt_tokens)) for r in reqs])
        t1 = self.core.clock.now()
        eos = frozenset(rid for rid, tok in first.items() if tok in self.eos)
        for r in reqs:
            if r.max_tokens > 1 and r.req_id not in eos:
                nbytes = self.pe.kv_bytes(r.req_id)
                kv = self.pe.export_kv(r.req_id)
                with self._lock:
                    self._handover[r.req_id] = kv
                    self.kv["bytes"] += int(nbytes)
            self.pe.free(r.req_id)
        t2 = self.core.clock.now()
        with self._lock:
            self.kv["export_s"] += t2 - t1
        self.core.complete(item, StepResult(first, eos, t1 - t0))
        if self.on_event:
            self.on_event("prefill", item, t1 - t0)

    def _decode(self, item: DecodeItem) -> None:
        t0 = self.core.clock.now()
        for r in item.batch:
            if r.req_id not in self._imported:
                with self._lock:
                    kv = self._handover.pop(r.req_id)
                self.de.import_kv(r.req_id, kv)
                self._imported.add(r.req_id)
                self.kv["handovers"] += 1
        t1 = self.core.clock.now()
        self.kv["import_s"] += t1 - t0
        out = self.de.decode([r.req_id for r in item.batch], steps=1)
        t2 = self.core.clock.now()
        eos = frozenset(rid for rid, toks in out.items() if any(t in self.eos for t in toks))
        self.core.complete(item, StepResult(out, eos, t2 - t1))
        for r in item.batch:
            if r.finished:
                self._release(r.req_id)
        if self.on_event:
            self.on_event("decode", item, t2 - t1)

    def _release(self, req_id: str) -> None:
        if req_id in self._imported:
            self._imported.discard(req_id)
            try:
                self.de.free(req_id)
            except Exception:  # freeing must not stop the decode worker
                log.exception("freeing %s failed", req_id)
        with self._lock:
            self._handover.pop(req_id, None)

    def on_crash(self, slot, item, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        if slot == PREFILL:
            for r in item.requests:
                try:
                    self.pe.free(r.req_id)
                except Exception:
                    pass
                with self._lock:
                    self._handover.pop(r.req_id, None)
            self.core.fail(item, reason)
        else:
            self.core.fail(item, reason)
            for r in item.batch:
                self._release(r.req_id)

    def stats(self) -> dict:
        with self._lock:
            k = dict(self.kv)
        n = max(1, k["handovers"])
        k.update({"kv_handover_ms_mean": 1000 * (k["export_s"] + k["import_s"]) / n, "waiting_handover": len(self._handover)})
        return k
