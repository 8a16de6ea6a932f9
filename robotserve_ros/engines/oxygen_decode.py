"""OxyGen's language side (seed 001 §3.2-3.3): the prefix KV a SmolVLA frame leaves behind,
a language request's own KV grown from it, and the VLM text stream that decodes all active
requests of every frame in one batch. OxyGenEngine (engines/oxygen.py) mixes it in and sets
what it reads: torch, device, the VLM pieces (_vwe, _text, _lm_head, head_dim, _emb_scale),
the tokenizer, eos_id and the request manager kv (core/kv_manager.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class _Prefix:
    """A batch's prefix KV (SmolVLA's dict: layer -> key_states/value_states [B, L, Hkv, D])."""

    kv: dict
    pad_masks: object  # [B, L] bool

    def row(self, i: int) -> "_Prefix":
        """Row i as a view: no copy, the action expert's KV is the language request's start."""
        kv = {l: {"key_states": d["key_states"][i:i + 1], "value_states": d["value_states"][i:i + 1]}
              for l, d in self.kv.items()}
        return _Prefix(kv, self.pad_masks[i:i + 1])


class _LangKV:
    """A language request's KV (torch side of LanguageState.kv): per-layer keys/values
    [1, L, Hkv, D], which positions are real, the next position, and the next token."""

    __slots__ = ("k", "v", "mask", "pos", "next_token", "prompt")

    def __init__(self, prefix: _Prefix, prompt) -> None:
        n = len(prefix.kv)
        self.k = [prefix.kv[l]["key_states"] for l in range(n)]
        self.v = [prefix.kv[l]["value_states"] for l in range(n)]
        self.mask = prefix.pad_masks.bool()
        self.pos = int(prefix.pad_masks.sum())  # SmolVLA positions: cumsum(pad_mask) - 1
        self.next_token: Optional[int] = None
        self.prompt = prompt  # token ids [1, P], prefilled by the first decode round

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v)) + self.mask.numel()


class TextDecoding:
    """The VLM text stream of OxyGenEngine: its layers run here on new tokens, with LeRobot's
    rope and attention, against KV it keeps per request."""

    # --- decoding --------------------------------------------------------------------------
    def _embed(self, ids):
        return self._vwe.embed_language_tokens(ids) * self._emb_scale

    def _layers(self, x, pos, kbuf, vbuf, start: int, att):
        """The VLM text layers on new tokens x [B, q, H] at positions pos [B, q], appending
        their keys/values to per-layer buffers at [start, start + q) and attending to
        [0, start + q) under att [B, q, start + q]. Mirrors SmolVLMWithExpertModel.forward
        (forward_attn_layer + its residual path) for the VLM stream. Returns normed hidden."""
        B, q = x.shape[:2]
        end = start + q
        sin, cos = self._rope_tables(pos)  # once for all layers (LeRobot's apply_rope, same arithmetic)
        apply_rope = lambda t, _p: self._rope(t, sin, cos)  # noqa: E731
        for l, layer in enumerate(self._text.layers):
            h = layer.input_layernorm(x)
            shape = (B, q, -1, self.head_dim)
            h = h.to(dtype=layer.self_attn.q_proj.weight.dtype)
            qs = apply_rope(layer.self_attn.q_proj(h).view(shape), pos)
            kbuf[l][:, start:end] = apply_rope(layer.self_attn.k_proj(h).view(shape), pos)
            vbuf[l][:, start:end] = layer.self_attn.v_proj(h).view(shape)
            a = self._vwe.eager_attention_forward(att, B, self.head_dim, qs, kbuf[l][:, :end], vbuf[l][:, :end])
            if a.dtype != layer.self_attn.o_proj.weight.dtype:
                a = a.to(layer.self_attn.o_proj.weight.dtype)
            out = layer.self_attn.o_proj(a)
            out += x
            res = out.clone()
            out = layer.mlp(layer.post_attention_layernorm(out))
            out += res
            x = out
        return self._text.norm(x)

    def _rope_tables(self, positions, max_wavelength=10_000):
        """sin/cos of smolvlm_with_expert.apply_rope for positions [B, q], computed as it does."""
        torch, d = self.torch, self.head_dim
        freq = (2.0 / d) * torch.arange(d // 2, dtype=torch.float32, device=self.device)
        radians = positions[..., None].to(torch.float32) / (max_wavelength ** freq)[None, None, :].to(torch.float32)
        radians = radians[..., None, :]
        return torch.sin(radians), torch.cos(radians)

    def _rope(self, x, sin, cos):
        dtype, half = x.dtype, x.shape[-1] // 2
        x = x.to(self.torch.float32)
        x1, x2 = x.split(half, dim=-1)
        res = self.torch.empty_like(x)
        res[..., :half] = x1 * cos - x2 * sin
        res[..., half:] = x2 * cos + x1 * sin
        return res.to(dtype)

    def _logits(self, hidden):
        return self._lm_head(hidden).float()

    def _prefill_prompt(self, h: _LangKV) -> None:
        """The prompt on top of the shared prefix KV (a copy from here on: the view is dropped)."""
        torch = self.torch
        P = int(h.prompt.shape[1])
        L = int(h.mask.shape[1])
        kb = [torch.cat([k, k.new_zeros((1, P, *k.shape[2:]))], 1) for k in h.k]
        vb = [torch.cat([v, v.new_zeros((1, P, *v.shape[2:]))], 1) for v in h.v]
        pos = torch.arange(h.pos, h.pos + P, device=self.device)[None]
        causal = torch.ones(P, P, dtype=torch.bool, device=self.device).tril()
        att = torch.cat([h.mask[:, None, :].expand(1, P, L), causal[None]], 2)
        hid = self._layers(self._embed(h.prompt), pos, kb, vb, L, att)
        h.k, h.v = kb, vb
        h.mask = torch.cat([h.mask, torch.ones(1, P, dtype=torch.bool, device=self.device)], 1)
        h.pos += P
        h.next_token = int(self._logits(hid[:, -1]).argmax(-1))
        h.prompt = None

    def decode_frame(self) -> list:
        """One frame of language (Alg. 1 lines 5-13): prefill new prompts, BATCH every active
        request, k greedy steps at once, UNBATCH, UPDATE or REMOVE. Returns [(state, new token
        ids)] for the requests that advanced (a finished one has finished=True)."""
        torch = self.torch
        with self.kv.lock:  # the handles as planned: a request cancelled from here on keeps its KV for this round
            planned = [(st, n, st.kv) for st, n in self.kv.plan_frame()]
        if not planned:
            return []
        plan = [(st, n) for st, n, _ in planned]
        hs = [h for _, _, h in planned]
        with torch.inference_mode():
            for h in hs:
                if h.prompt is not None:
                    self._prefill_prompt(h)
            want = [n for _, n in plan]
            B, steps = len(hs), max(want)
            Lmax = max(int(h.mask.shape[1]) for h in hs)
            # BATCH (§3.2 Eq. 8): right-pad each KV to Lmax (masked), room for the new tokens.
            nl = len(hs[0].k)
            kb, vb = [], []
            for l in range(nl):
                k0, v0 = hs[0].k[l], hs[0].v[l]
                K = k0.new_zeros((B, Lmax + steps, *k0.shape[2:]))
                V = v0.new_zeros((B, Lmax + steps, *v0.shape[2:]))
                for i, h in enumerate(hs):
                    n = h.k[l].shape[1]
                    K[i, :n], V[i, :n] = h.k[l][0], h.v[l][0]
                kb.append(K)
                vb.append(V)
            mask = torch.zeros(B, Lmax + steps, dtype=torch.bool, device=self.device)
            for i, h in enumerate(hs):
                mask[i, : h.mask.shape[1]] = h.mask[0]
            pos0 = torch.tensor([h.pos for h in hs], device=self.device)
            new = [[] for _ in hs]
            fed = [0] * B  # tokens each row fed (its KV columns Lmax .. Lmax+fed)
            live = [True] * B
            cur = [h.next_token for h in hs]
            for j in range(steps):
                go = []
                for i in range(B):
                    if not live[i] or j >= want[i]:
                        live[i] = False
                        continue
                    t = cur[i]
                    new[i].append(t)
                    last = (self.eos_id is not None and t == self.eos_id) or (
                        len(plan[i][0].tokens) + len(new[i]) >= plan[i][0].max_tokens)
                    if last:
                        live[i] = False
                    else:
                        go.append(i)
                if not go:
                    break
                mask[:, Lmax + j] = True
                ids = torch.tensor([[c] for c in cur], dtype=torch.long, device=self.device)
                att = mask[:, None, : Lmax + j + 1]
                hid = self._layers(self._embed(ids), (pos0 + j)[:, None], kb, vb, Lmax + j, att)
                nxt = self._logits(hid[:, -1]).argmax(-1).tolist()
                for i in go:
                    cur[i] = int(nxt[i])
                    fed[i] += 1
            # UNBATCH: each request keeps its own KV plus the columns it fed.
            for i, h in enumerate(hs):
                n, f = int(h.mask.shape[1]), fed[i]
                if f:
                    h.k = [torch.cat([h.k[l], kb[l][i:i + 1, Lmax:Lmax + f]], 1) for l in range(nl)]
                    h.v = [torch.cat([h.v[l], vb[l][i:i + 1, Lmax:Lmax + f]], 1) for l in range(nl)]
                    h.mask = torch.cat([h.mask, torch.ones(1, f, dtype=torch.bool, device=self.device)], 1)
                    h.pos += f
                h.next_token = cur[i]
                del n
            del kb, vb
        out = []
        for (st, _), h, toks in zip(plan, hs, new):
            if st.finished:  # cancelled while this round ran: its tokens go nowhere
                continue
            st.kv_bytes = h.nbytes()
            if self.kv.commit(st.rid, toks, self.eos_id) is not None:
                out.append((st, toks))
        self.kv.end_frame(B)
        return out

    def decode_text(self, ids) -> str:
        """Token ids -> text (a random-weight model names ids its small tokenizer lacks: <id>)."""
        vocab = len(self.tokenizer)
        words = []
        for t in ids:
            t = int(t)
            words.append(self.tokenizer.decode([t], skip_special_tokens=True) if t < vocab else f"<{t}>")
        return " ".join(w for w in words if w)
