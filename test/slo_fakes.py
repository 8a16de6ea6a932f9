"""A test double of the LLM engine API (robotserve_ros/engines/llm LLMEngine) for the SLO
workers' tests: deterministic tokens from the context, KV = the context list. Not a model."""
from __future__ import annotations

import time


class FakeLLMEngine:
    eos_ids = frozenset({0})

    def __init__(self, step_s: float = 0.0, fail_on: str | None = None) -> None:
        self.step_s, self.fail_on = step_s, fail_on
        self.kv: dict = {}
        self.calls: list = []

    def encode(self, text: str) -> list:
        return [ord(c) % 90 + 10 for c in text]

    def detokenize(self, ids) -> str:
        return "".join(chr(65 + (i % 26)) for i in ids)

    @staticmethod
    def _next(ctx) -> int:
        return (sum(ctx) * 31 + len(ctx)) % 97 + 3  # never 0 (EOS) unless asked

    def prefill(self, items):
        self.calls.append(("prefill", [rid for rid, _ in items]))
        time.sleep(self.step_s)
        out = {}
        for rid, toks in items:
            if rid == self.fail_on:
                raise RuntimeError(f"fake failure on {rid}")
            ctx = list(toks)
            ctx.append(self._next(ctx))
            self.kv[rid] = ctx
            out[rid] = ctx[-1]
        return out

    def decode(self, req_ids, steps=1):
        self.calls.append(("decode", list(req_ids)))
        time.sleep(self.step_s)
        out = {}
        for rid in req_ids:
            toks = []
            for _ in range(steps):
                t = self._next(self.kv[rid])
                self.kv[rid].append(t)
                toks.append(t)
            out[rid] = toks
        return out

    def export_kv(self, rid):
        return list(self.kv[rid])

    def import_kv(self, rid, kv):
        self.kv[rid] = list(kv)

    def free(self, rid):
        self.kv.pop(rid, None)

    def kv_bytes(self, rid) -> int:
        return 8 * len(self.kv.get(rid, ()))
