"""A SmolVLM2-shaped VLM whose three stages are separate calls (seed 003, Nova §II-A, §III-A).

`StagedVLM` holds one `transformers` SmolVLMForConditionalGeneration (the backbone LeRobot's
SmolVLA builds on), built from a local config with random weights (nothing downloaded):

- `encode_vision(images)`: vision encode (SigLIP ViT + connector) -> image hidden states;
- `prefill(prompt_ids, image_hidden)`: LLM prefill over the merged sequence -> a `Sequence`
  holding this request's own KV cache and its first (greedy) token;
- `prefill_chunk(seq, n)`: the same prefill a chunk of `n` positions at a time (the chunked
  prefill baseline; Sarathi-style chunks);
- `decode(seqs)`: one batched decode iteration over any set of sequences of different
  lengths (left-padded KV + attention mask), each keeping its KV between steps.

`generate_reference` is the unstaged model (`model.generate`, greedy): the staged path must
give the same tokens (test/test_nova_engine.py).

Images: a frame is cut into `side x side` tiles (plus a global thumbnail when it needs more
than one tile), as SmolVLM's image splitting does, so a high-resolution frame costs the
vision encoder proportionally more (the agent-like workload's screenshots / camera frames).

Text: a word-hash tokenizer (random weights make text meaningless anyway; ids are stable).
"""
from __future__ import annotations

import math
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence as Seq

from .tiny_policies import SMOLVLM2_500M
from .torch_env import import_torch

PAD, BOS, EOS, FAKE, IMAGE = 0, 1, 2, 3, 4
FIRST_WORD = 8

def _vlm_shape(vocab: int, hidden: int, inter: int, layers: int, heads: int, kv_heads: int, head_dim: int,
               max_pos: int, vision: tuple) -> dict:
    """A SmolVLM-shaped config: llama text + SigLIP vision (hidden, intermediate, layers, heads,
    image side) with 16-pixel patches, pixel shuffle by 2."""
    v_hidden, v_inter, v_layers, v_heads, image = vision
    return {
        "text_config": {"model_type": "llama", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
                        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                        "head_dim": head_dim, "max_position_embeddings": max_pos, "pad_token_id": 0},
        "vision_config": {"hidden_size": v_hidden, "intermediate_size": v_inter, "num_hidden_layers": v_layers,
                          "num_attention_heads": v_heads, "image_size": image, "patch_size": 16},
        "scale_factor": 2,
    }


# Shapes: text (llama) + vision (SigLIP) configs. "tiny" for tests, "small" for live CPU benches,
# "smolvlm2_500m" is SmolVLM2-500M's published shape (SmolVLA's default backbone).
SHAPES = {
    "tiny": _vlm_shape(256, 64, 128, 2, 4, 2, 16, 1024, vision=(32, 64, 3, 2, 64)),
    "small": _vlm_shape(4096, 256, 768, 6, 8, 4, 32, 4096, vision=(384, 1536, 8, 6, 224)),
    # the published shape SmolVLA's real-size policies use too (tiny_policies); image_seq_len is theirs
    "smolvlm2_500m": {k: v for k, v in SMOLVLM2_500M.items() if k != "image_seq_len"},
}


@dataclass
class Sequence:
    """One request's language state between stages: its KV (per layer, [1, kv_heads, L, d]),
    the tokens generated so far, and (while chunk-prefilling) the embeddings left to prefill."""
    prompt_len: int
    kv: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    pending: Optional[object] = None  # inputs_embeds not yet prefilled (chunked prefill)
    done_pos: int = 0

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[-2] if self.kv else 0

    @property
    def prefilled(self) -> bool:
        return self.pending is None


class StagedVLM:
    def __init__(self, shape: str | dict = "tiny", *, seed: int = 0, attn: str = "eager", threads: int = 0,
                 offload_dir: Optional[str] = None, physical_layers: int = 2) -> None:
        torch = import_torch()
        from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

        if isinstance(shape, str):
            if shape not in SHAPES:
                raise ValueError(f"vlm shape {shape!r}: choose one of {', '.join(SHAPES)}")
            shape = SHAPES[shape]
        self.torch = torch
        self.shape = shape
        text, vision = dict(shape["text_config"]), dict(shape["vision_config"])
        self.vocab = int(text["vocab_size"])
        self.side = int(vision["image_size"])
        patches = (self.side // int(vision["patch_size"])) ** 2
        self.image_seq_len = patches // (int(shape["scale_factor"]) ** 2)
        cfg = SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=shape["scale_factor"],
                            image_token_id=IMAGE, vocab_size=self.vocab)
        cfg._attn_implementation = attn
        cfg.text_config._attn_implementation = attn
        cfg.vision_config._attn_implementation = attn
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)
        with torch.no_grad():
            self.model = SmolVLMForConditionalGeneration(cfg).eval()
        self.model.generation_config.pad_token_id = PAD
        self.model.generation_config.eos_token_id = EOS
        self.offload = None
        if offload_dir is not None:
            self.offload = offload_vision_layers(self.model, Path(offload_dir), physical_layers)

    # ---- tokens and images -------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        span = self.vocab - FIRST_WORD
        return [FIRST_WORD + zlib.crc32(w.encode()) % span for w in text.split()]

    def detokenize(self, ids: Seq[int]) -> str:
        return " ".join(f"w{i}" for i in ids if i != EOS)

    def tiles(self, height: int, width: int) -> int:
        """How many vision-encoder images a frame of this size becomes (SmolVLM-like splitting)."""
        n = math.ceil(height / self.side) * math.ceil(width / self.side)
        return n + 1 if n > 1 else 1

    def pixel_values(self, image) -> object:
        """HxWx3 uint8 (numpy or tensor) -> [tiles, 3, side, side] floats in [-1, 1]."""
        torch = self.torch
        x = torch.as_tensor(image)
        if x.dim() != 3 or x.shape[-1] != 3:
            raise ValueError(f"image must be HxWx3, got {tuple(x.shape)}")
        x = x.permute(2, 0, 1).float().div(127.5).sub(1.0)[None]
        h, w = x.shape[-2:]
        gh, gw = math.ceil(h / self.side), math.ceil(w / self.side)
        F = torch.nn.functional
        if gh * gw == 1:
            return F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
        big = F.interpolate(x, size=(gh * self.side, gw * self.side), mode="bilinear", align_corners=False)
        tiles = big.unfold(2, self.side, self.side).unfold(3, self.side, self.side)  # 1,3,gh,gw,s,s
        tiles = tiles.permute(0, 2, 3, 1, 4, 5).reshape(gh * gw, 3, self.side, self.side)
        thumb = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
        return torch.cat([tiles, thumb], 0)

    def input_ids(self, prompt_ids: Seq[int], n_images: int) -> list[int]:
        ids = [BOS]
        for _ in range(n_images):
            ids += [FAKE] + [IMAGE] * self.image_seq_len + [FAKE]
        return ids + list(prompt_ids)

    # ---- the three stages ----------------------------------------------------------------
    def encode_vision(self, pixel_values):
        """Vision encode: [n, 3, side, side] -> image hidden states [n, image_seq_len, hidden]."""
        with self.torch.no_grad():
            return self.model.model.get_image_features(pixel_values[None])

    def start(self, prompt_ids: Seq[int], image_hidden) -> Sequence:
        """The merged (text + image) embeddings of a request, nothing prefilled yet."""
        torch = self.torch
        n_images = 0 if image_hidden is None else int(image_hidden.shape[0])
        ids = torch.tensor([self.input_ids(prompt_ids, n_images)])
        with torch.no_grad():
            emb = self.model.model.text_model.get_input_embeddings()(ids)
            if image_hidden is not None:
                emb = self.model.model.inputs_merger(ids, emb, image_hidden.to(emb.dtype))
        return Sequence(prompt_len=int(ids.shape[1]), pending=emb)

    def prefill(self, prompt_ids: Seq[int], image_hidden) -> Sequence:
        """LLM prefill of the whole prompt: the sequence with its KV and first token."""
        seq = self.start(prompt_ids, image_hidden)
        self.prefill_chunk(seq, seq.prompt_len)
        return seq

    def prefill_chunk(self, seq: Sequence, n: int) -> bool:
        """Prefill the next `n` prompt positions; True when the prompt is done (first token out)."""
        torch = self.torch
        from transformers import DynamicCache

        emb = seq.pending
        a, b = seq.done_pos, min(seq.prompt_len, seq.done_pos + max(1, int(n)))
        cache = DynamicCache()
        for i, (k, v) in enumerate(seq.kv):
            cache.update(k, v, i)
        with torch.no_grad():
            out = self.model(inputs_embeds=emb[:, a:b], past_key_values=cache, use_cache=True,
                             position_ids=torch.arange(a, b)[None], cache_position=torch.arange(a, b),
                             attention_mask=torch.ones(1, b, dtype=torch.long), logits_to_keep=1)
        seq.kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        seq.done_pos = b
        if b < seq.prompt_len:
            return False
        seq.pending = None
        seq.tokens.append(int(out.logits[0, -1].argmax()))
        return True

    def decode(self, seqs: Seq[Sequence]) -> list[int]:
        """One decode iteration for a batch of sequences of any lengths (in-flight batching):
        KV left-padded to the longest, padding masked out, each at its own position."""
        torch = self.torch
        from transformers import DynamicCache

        if not seqs:
            return []
        lens = [s.length for s in seqs]
        L = max(lens)
        cache = DynamicCache()
        for li in range(len(seqs[0].kv)):
            ks, vs = [], []
            for s, n in zip(seqs, lens):
                k, v = s.kv[li]
                if n < L:
                    pad = (0, 0, L - n, 0)
                    k, v = torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad)
                ks.append(k)
                vs.append(v)
            cache.update(torch.cat(ks), torch.cat(vs), li)
        mask = torch.zeros(len(seqs), L + 1, dtype=torch.long)
        for j, n in enumerate(lens):
            mask[j, L - n:] = 1
        ids = torch.tensor([[s.tokens[-1]] for s in seqs])
        with torch.no_grad():
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, attention_mask=mask,
                             position_ids=torch.tensor([[n] for n in lens]), cache_position=torch.tensor([L]),
                             logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1).tolist()
        layers = out.past_key_values.layers
        for j, (s, n) in enumerate(zip(seqs, lens)):
            s.kv = [(layer.keys[j:j + 1, :, L - n:], layer.values[j:j + 1, :, L - n:]) for layer in layers]
            s.tokens.append(int(nxt[j]))
        return nxt

    @staticmethod
    def finished(seq: Sequence, max_tokens: int) -> bool:
        return len(seq.tokens) >= max_tokens or (bool(seq.tokens) and seq.tokens[-1] == EOS)

    # ---- the unstaged model, for equality ------------------------------------------------
    def generate_reference(self, prompt_ids: Seq[int], pixel_values, max_tokens: int) -> list[int]:
        torch = self.torch
        n = 0 if pixel_values is None else int(pixel_values.shape[0])
        ids = torch.tensor([self.input_ids(prompt_ids, n)])
        kw = {} if pixel_values is None else {"pixel_values": pixel_values[None]}
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                      do_sample=False, **kw)
        return out[0, ids.shape[1]:].tolist()

    def vision_bytes(self) -> int:
        """Bytes of vision-encoder weights held in memory (the 'accelerator' share, §III-E)."""
        vm = self.model.model.vision_model
        return sum(p.numel() * p.element_size() for p in vm.parameters())


# ---- §III-E: layer-wise vision-encoder weight offload ---------------------------------------
class OffloadedEncoder:
    """Stands in for SmolVLMEncoder: K physical layers (reused buffers) hold the weights of
    the N logical layers in turn; logical layer i+K is swapped into buffer i%K (Eq. 7) by a
    loader thread as soon as layer i has run, so loading overlaps the next layers' compute.
    The N layers' weights live in a memory-mapped safetensors file (the 'host' copy)."""

    def __init__(self, layers, path: Path, k: int) -> None:
        import torch
        from safetensors.torch import save_file

        self.n, self.k = len(layers), max(1, min(int(k), len(layers)))
        tensors = {f"{i}.{name}": p.detach().contiguous() for i, layer in enumerate(layers)
                   for name, p in layer.state_dict().items()}
        path.mkdir(parents=True, exist_ok=True)
        self.file = path / "vision_layers.safetensors"
        save_file(tensors, str(self.file))
        self.names = list(layers[0].state_dict().keys())
        self.physical = [layers[i] for i in range(self.k)]  # the buffers keep layers 0..K-1 loaded
        self.loaded = [i for i in range(self.k)]
        self._host = _mmap_safetensors(self.file)  # zero-copy views of the file's pages
        self._ready = [threading.Event() for _ in range(self.k)]
        for e in self._ready:
            e.set()
        self._lock = threading.Lock()
        self.torch = torch
        import queue

        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.stall_s = 0.0
        threading.Thread(target=self._loader, name="vision-offload-loader", daemon=True).start()

    def _load(self, logical: int) -> None:
        slot = logical % self.k
        sd = self.physical[slot].state_dict()
        with self.torch.no_grad():
            for name in self.names:
                sd[name].copy_(self._host[f"{logical}.{name}"])  # one copy: page cache -> buffer
        self.loaded[slot] = logical
        self._ready[slot].set()

    def _loader(self) -> None:
        while True:
            logical = self._jobs.get()
            if logical is None:
                return
            self._load(logical)

    def _swap_in(self, logical: int) -> None:
        """Asynchronous swap-in on the loader thread (the paper's separate copy stream)."""
        self._ready[logical % self.k].clear()
        self._jobs.put(logical)

    def forward(self, inputs_embeds, attention_mask=None):
        from transformers.modeling_outputs import BaseModelOutput

        h = inputs_embeds
        with self._lock:  # one forward at a time owns the buffers
            for i in range(self.n):
                slot = i % self.k
                t0 = time.perf_counter()
                self._ready[slot].wait()
                self.stall_s += time.perf_counter() - t0  # compute waiting for a swap-in
                if self.loaded[slot] != i:  # not prefetched (first pass after a wrap that did not fit)
                    self._ready[slot].clear()
                    self._load(i)
                h = self.physical[slot](h, attention_mask)
                nxt = i + self.k
                if nxt < self.n:
                    self._swap_in(nxt)
                elif (nxt - self.n) % self.k == slot:  # prefetch the next pass's first layers (Eq. 7)
                    self._swap_in(nxt - self.n)
            for e in self._ready:
                e.wait()
        return BaseModelOutput(last_hidden_state=h)


def _mmap_safetensors(path: Path) -> dict:
    """name -> tensor viewing a memory-mapped safetensors file (no copy, nothing loaded yet)."""
    import json as _json
    import struct

    import numpy as np
    import torch

    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = _json.loads(fh.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = mm[8 + n + a: 8 + n + b].view(dtypes[info["dtype"]]).reshape(info["shape"])
        with warnings.catch_warnings():  # a read-only mapping: we only ever read from it
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(arr)
        out[name] = t.view(torch.bfloat16) if info["dtype"] == "BF16" else t
    return out


def offload_vision_layers(model, path: Path, k: int) -> OffloadedEncoder:
    import torch

    enc = model.model.vision_model.encoder
    off = OffloadedEncoder(list(enc.layers), path, k)
    keep = torch.nn.ModuleList(off.physical)
    enc.layers = keep  # only K layers stay resident; the rest are freed
    enc.forward = off.forward
    return off


# ---- the engine side of core.nova's live path ----------------------------------------------
class StageExecutor:
    """Runs a core.nova Op on a StagedVLM: applies the op's partition share on the calling
    worker thread first (before each forward pass, §III-D), then the stage call(s).

    A live request's payload: {"pixels": [tiles,3,s,s] or None, "ids": prompt ids} plus
    what the stages leave: "image_hidden", "seq"."""

    def __init__(self, vlm: StagedVLM, mechanism=None) -> None:
        self.vlm, self.mechanism = vlm, mechanism

    def request_fields(self, image, prompt: str) -> dict:
        """What a VLMRequest needs from the engine: tiles, prompt length (positions), payload."""
        pixels = None if image is None else self.vlm.pixel_values(image)
        ids = self.vlm.tokenize(prompt)
        tiles = 0 if pixels is None else int(pixels.shape[0])
        return {"tiles": tiles, "prompt_tokens": len(self.vlm.input_ids(ids, tiles)),
                "payload": {"pixels": pixels, "ids": ids, "image_hidden": None, "seq": None}}

    def __call__(self, op) -> None:
        vlm = self.vlm
        stage = "decode" if op.kind == "decode" else "front"
        if self.mechanism is not None:
            self.mechanism.apply(stage, op.units)
        f = op.front
        if op.kind == "vision":
            f.payload["image_hidden"] = vlm.encode_vision(f.payload["pixels"])
            return
        if f is not None:  # prefill or the chunk of a hybrid batch
            p = f.payload
            if p["seq"] is None:
                p["seq"] = vlm.start(p["ids"], p["image_hidden"])
                p["image_hidden"] = None
            if vlm.prefill_chunk(p["seq"], op.chunk):
                f.eos = p["seq"].tokens[-1] == EOS
        if op.batch:
            vlm.decode([r.payload["seq"] for r in op.batch])
            for r in op.batch:
                r.eos = r.payload["seq"].tokens[-1] == EOS
