"""A causal LM engine with per-request KV caches kept across suspensions (seed 002 §4.1).

Prefill and decode are separate engine calls so that a serving core can schedule them:
- `prefill(items)` runs each prompt once, keeps its KV and returns its first token;
- `decode(req_ids, steps)` runs `steps` greedy decode steps for a batch of requests of
  different lengths (continuous batching: the set may change between calls);
- a request between calls is *suspended*: its KV and its pending token stay here, and the
  next `decode` resumes it without a second prefill (§4.1 "context switching");
- `export_kv` / `import_kv` hand a prefilled request to another engine instance
  (disaggregated prefill / decode); `free` drops it.

Batching, measured choice: per-request caches (no padding kept while suspended) gathered
into one left-padded `DynamicCache` when the running set changes; while the set stays the
same, successive `decode` calls reuse that batch cache with no copy. RoPE positions are
passed per row so left padding does not shift them; padded slots are masked out.

A request's state: the KV of every token fed so far, and `pending`: the last token
produced but not yet fed (after prefill, the first output token), so a greedy run split
anywhere gives the tokens of one uninterrupted run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Iterable, Optional, Sequence

from ...core.errors import ConfigError
from ..torch_env import import_torch

# fn(tokens generated so far by this request) -> allowed next token ids, or None for any.
Constraint = Callable[[Sequence[int]], Optional[Sequence[int]]]


@dataclass
class _Request:
    kv: Optional[list]          # [(k, v)] per layer, each [1, kv_heads, length, head_dim]; None while in the batch
    length: int                 # tokens in the KV
    pending: int                # produced, not yet fed
    generated: list = field(default_factory=list)
    constraint: Optional[Constraint] = None


class LLMEngine:
    """Greedy generation with suspend / resume. Not thread-safe: one caller at a time (the
    serving core's decode slot); `prefill` and `decode` may be called from different threads
    only if the caller serialises them."""

    def __init__(self, model, tokenizer, *, max_context: int = 2048, name: str = "llm") -> None:
        self.torch = import_torch()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.max_context = int(max_context)
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        cfg = model.config
        self.n_layers = cfg.num_hidden_layers
        self.eos_ids = _eos_ids(model, tokenizer)
        self._reqs: dict[Hashable, _Request] = {}
        self._batch: Optional[_Batch] = None
        self._prefixes: list = []   # [(token ids, KV)]: server-side prompt prefixes, prefilled once
        # time spent moving KV between per-request caches and the batch cache (the cost of
        # keeping suspended requests' KV apart: part of the segmentation overhead)
        self.kv_moves = 0
        self.kv_move_s = 0.0       # wall time
        self.kv_move_cpu_s = 0.0   # CPU time of the calling thread (the profile's measure)

    # ---- loading ----
    @classmethod
    def load(cls, folder: str | Path | None = None, *, dtype: str | None = None, threads: int | None = 1,
             max_context: int = 2048) -> "LLMEngine":
        """The converted SmolLM2 folder (engines/llm/convert.py) or any local Llama-like folder."""
        from .convert import default_model_dir

        torch = import_torch()
        if threads:
            torch.set_num_threads(int(threads))
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = Path(folder) if folder else default_model_dir()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"no model folder at {folder}: run `robotserve llm-convert` (the Makefile does)")
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype) if dtype else "auto")
        return cls(model, tok, max_context=max_context, name=folder.name)

    # ---- text ----
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode_text(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_prompt(self, user: str, system: str | None = None) -> list[int]:
        """The model's chat template around a prompt (plain encoding if it has none)."""
        tmpl = getattr(self.tokenizer, "chat_template", None)
        if not tmpl:
            return self.encode((system + "\n" if system else "") + user + "\n")
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return list(self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True))

    def chat_prefix(self, system: str) -> list[int]:
        """The system turn alone: the prefix every chat_prompt(..., system) starts with."""
        tmpl = getattr(self.tokenizer, "chat_template", None)
        if not tmpl:
            return self.encode(system + "\n")
        return list(self.tokenizer.apply_chat_template([{"role": "system", "content": system}],
                                                       add_generation_prompt=False))

    # ---- requests ----
    def has(self, req_id: Hashable) -> bool:
        return req_id in self._reqs

    def length(self, req_id: Hashable) -> int:
        """Tokens in the request's KV (prompt + generated tokens already fed)."""
        return self._reqs[req_id].length

    def cache_prefix(self, ids: Sequence[int]) -> int:
        """Prefill a prompt prefix once (seed 002 §4.1: the fixed parts of robot requests,
        skill set and guidance, are stored on the server). A later prompt that starts with
        it copies its KV and prefills only the rest. Returns the prefix's length."""
        ids = list(ids)
        if not ids or any(p == ids for p, _ in self._prefixes):
            return len(ids)
        with self.torch.inference_mode():
            res = self.model(input_ids=self.torch.tensor([ids], device=self.device), use_cache=True)
        self._prefixes.append((ids, _cache_to_list(res.past_key_values)))
        self._prefixes.sort(key=lambda x: -len(x[0]))  # the longest match first
        return len(ids)

    def cached_prefix_len(self, ids: Sequence[int]) -> int:
        ids = list(ids)
        for p, _ in self._prefixes:
            if len(ids) > len(p) and ids[:len(p)] == p:
                return len(p)
        return 0

    def prefill(self, items: Sequence[tuple[Hashable, Sequence[int]]],
                constraints: Optional[dict] = None) -> dict[Hashable, int]:
        """Run each prompt, keep its KV; returns each request's first output token."""
        torch = self.torch
        out = {}
        for req_id, ids in items:
            ids = list(ids)
            if not ids:
                raise ValueError(f"request {req_id!r}: empty prompt")
            if len(ids) >= self.max_context:
                raise ValueError(f"request {req_id!r}: {len(ids)} prompt tokens, limit {self.max_context - 1}")
            if req_id in self._reqs:
                raise ValueError(f"request {req_id!r} already holds a KV cache")
            n = self.cached_prefix_len(ids)
            past = None
            if n:
                from transformers import DynamicCache

                kv = next(kv for p, kv in self._prefixes if len(p) == n and ids[:n] == p)
                past = _list_to_cache(DynamicCache, [(k.clone(), v.clone()) for k, v in kv])
            with torch.inference_mode():
                res = self.model(input_ids=torch.tensor([ids[n:]], device=self.device), past_key_values=past,
                                 use_cache=True)
            kv = _cache_to_list(res.past_key_values)
            r = _Request(kv=kv, length=len(ids), pending=-1,
                         constraint=(constraints or {}).get(req_id))
            r.pending = self._pick(res.logits[0, -1], r)
            r.generated.append(r.pending)
            self._reqs[req_id] = r
            out[req_id] = r.pending
        return out

    def decode(self, req_ids: Sequence[Hashable], steps: int = 1) -> dict[Hashable, list[int]]:
        """`steps` batched greedy decode steps for these (prefilled) requests; each gets
        `steps` new tokens. The set may differ from the previous call's (join / leave)."""
        torch = self.torch
        req_ids = list(req_ids)
        if not req_ids or steps < 1:
            return {r: [] for r in req_ids}
        for rid in req_ids:
            if rid not in self._reqs:
                raise KeyError(f"request {rid!r} has no KV cache (not prefilled, or freed)")
            if self._reqs[rid].length + steps > self.max_context:
                raise ValueError(f"request {rid!r} would pass the context limit {self.max_context}")
        b = self._batch_for(req_ids)
        out = {r: [] for r in req_ids}
        rows = [self._reqs[r] for r in b.ids]
        with torch.inference_mode():
            for _ in range(steps):
                inp = torch.tensor([[r.pending] for r in rows], device=self.device)
                pos = torch.tensor([[r.length] for r in rows], device=self.device)
                b.mask = torch.cat([b.mask, b.mask.new_ones((len(rows), 1))], dim=1)
                res = self.model(input_ids=inp, attention_mask=b.mask, position_ids=pos,
                                 past_key_values=b.cache, use_cache=True,
                                 cache_position=torch.tensor([b.width], device=self.device))
                b.cache, b.width = res.past_key_values, b.width + 1
                logits = res.logits[:, -1]
                for i, r in enumerate(rows):
                    r.length += 1
                    r.pending = self._pick(logits[i], r)
                    r.generated.append(r.pending)
                    out[b.ids[i]].append(r.pending)
        return out

    def generated(self, req_id: Hashable) -> list[int]:
        """Every token produced for the request so far (the first one from prefill on)."""
        return list(self._reqs[req_id].generated)

    def export_kv(self, req_id: Hashable) -> dict:
        """The request's whole state (KV tensors, pending token, tokens so far), removed
        here; `import_kv` on another engine of the same model resumes it."""
        self._scatter()
        r = self._reqs.pop(req_id)
        return {"kv": r.kv, "length": r.length, "pending": r.pending, "generated": list(r.generated),
                "constraint": r.constraint}

    def import_kv(self, req_id: Hashable, state: dict) -> None:
        if req_id in self._reqs:
            raise ValueError(f"request {req_id!r} already holds a KV cache")
        kv = [(k.to(self.device, self.dtype), v.to(self.device, self.dtype)) for k, v in state["kv"]]
        if len(kv) != self.n_layers or kv[0][0].shape[2] != state["length"]:
            raise ValueError(f"request {req_id!r}: KV does not fit this model ({len(kv)} layers)")
        self._reqs[req_id] = _Request(kv=kv, length=int(state["length"]), pending=int(state["pending"]),
                                      generated=list(state["generated"]), constraint=state.get("constraint"))

    def free(self, req_id: Hashable) -> bool:
        """Drop the request's KV (request done or dropped). False if it held none."""
        if req_id not in self._reqs:
            return False
        if self._batch is not None and req_id in self._batch.ids:
            self._scatter()
        del self._reqs[req_id]
        return True

    def kv_bytes(self, req_id: Hashable) -> int:
        return self._reqs[req_id].length * self.kv_bytes_per_token()

    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layers * self._kv_heads() * self._head_dim() * _elem_size(self.dtype)

    def requests(self) -> list:
        return list(self._reqs)

    # ---- internals ----
    def _pick(self, logits, r: _Request) -> int:
        allowed = r.constraint(r.generated) if r.constraint is not None else None
        if allowed is None:
            return int(logits.argmax())
        allowed = list(allowed)
        idx = self.torch.tensor(allowed, device=logits.device)
        return allowed[int(logits.index_select(0, idx).argmax())]

    def _batch_for(self, req_ids: list) -> "_Batch":
        """The batch cache for this running set. Built once per change of the set, in one copy:
        rows that stay are copied from the old batch cache, rows that join from their own
        caches; rows that leave get their own unpadded copy (kept while suspended)."""
        old = self._batch
        if old is not None and set(old.ids) == set(req_ids):
            return old
        t0, c0 = time.perf_counter(), time.thread_time()
        torch = self.torch
        staying = {}
        for rid, rows in self._batch_rows(old).items():
            if rid in req_ids:
                staying[rid] = rows  # views: copied once into the new batch below
            else:
                self._reqs[rid].kv = [(k.clone(), v.clone()) for k, v in rows]
        reqs = [self._reqs[r] for r in req_ids]
        width = max(r.length for r in reqs)
        sources = [staying.get(rid) or r.kv for rid, r in zip(req_ids, reqs)]
        layers = []
        for li in range(self.n_layers if len(reqs) > 1 or staying else 0):
            k0 = sources[0][li][0]
            shape = (len(reqs), k0.shape[1], width, k0.shape[3])
            K, V = k0.new_zeros(shape), k0.new_zeros(shape)
            for i, (r, src) in enumerate(zip(reqs, sources)):
                K[i:i + 1, :, width - r.length:] = src[li][0]
                V[i:i + 1, :, width - r.length:] = src[li][1]
            layers.append((K, V))
        if not layers:  # one request from its own cache: no padding, nothing to copy
            layers = list(sources[0])
        for r in reqs:
            r.kv = None  # the batch cache holds it now
        mask = torch.zeros((len(reqs), width), dtype=torch.long, device=self.device)
        for i, r in enumerate(reqs):
            mask[i, width - r.length:] = 1
        from transformers import DynamicCache

        self._batch = _Batch(list(req_ids), _list_to_cache(DynamicCache, layers), mask, width)
        self.kv_moves += 1
        self.kv_move_s += time.perf_counter() - t0
        self.kv_move_cpu_s += time.thread_time() - c0
        return self._batch

    def _scatter(self) -> None:
        """Give every request of the running batch its own unpadded KV back."""
        b, self._batch = self._batch, None
        for rid, rows in self._batch_rows(b).items():
            self._reqs[rid].kv = [(k.clone(), v.clone()) for k, v in rows]

    def _batch_rows(self, b: Optional["_Batch"]) -> dict:
        """Each live request's unpadded rows of the batch cache, as views."""
        if b is None:
            return {}
        legacy = _cache_to_list(b.cache)
        out = {}
        for i, rid in enumerate(b.ids):
            r = self._reqs.get(rid)
            if r is not None:
                start = b.width - r.length
                out[rid] = [(k[i:i + 1, :, start:], v[i:i + 1, :, start:]) for k, v in legacy]
        return out

    def _kv_heads(self) -> int:
        c = self.model.config
        return getattr(c, "num_key_value_heads", None) or c.num_attention_heads

    def _head_dim(self) -> int:
        c = self.model.config
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


@dataclass
class _Batch:
    ids: list
    cache: object
    mask: object     # [B, width] 1 for real tokens, 0 for left padding
    width: int       # padded cache length


def _cache_to_list(cache) -> list:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache.to_legacy_cache()]


def _list_to_cache(DynamicCache, layers: list):
    cache = DynamicCache()
    for li, (k, v) in enumerate(layers):
        cache.update(k, v, li)
    return cache


def _elem_size(dtype) -> int:
    return {"torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2}.get(str(dtype), 4)


def _eos_ids(model, tokenizer) -> set:
    ids = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        ids.update(e if isinstance(e, (list, tuple)) else ([e] if e is not None else []))
    for t in ("<|im_end|>", "<|endoftext|>"):
        conv = getattr(tokenizer, "convert_tokens_to_ids", None)
        if conv is not None:
            i = conv(t)
            if isinstance(i, int) and i != getattr(tokenizer, "unk_token_id", None):
                ids.add(i)
    return ids


def live_engines(model: str | None, dtype: str | None):
    """Two engine instances sharing one set of weights (each its own KV caches): the prefill
    worker's and the decode worker's (seed 004's disaggregation). torch at one intra-op
    thread: each worker one core."""
    try:
        pe = LLMEngine.load(model, dtype=dtype, threads=1)
    except ImportError as e:
        raise ConfigError(f"the live runs need the LLM engine (robotserve_ros/engines/llm): {e}") from None
    de = LLMEngine(pe.model, pe.tokenizer, max_context=pe.max_context, name=pe.name + "-decode")
    return pe, de
