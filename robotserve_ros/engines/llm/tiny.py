"""A tiny random-weight Llama and a byte-level tokenizer, built on the spot, so tests run the
same LLMEngine code as the 135M model without loading it."""
from __future__ import annotations

from typing import Iterable

from ..torch_env import import_torch


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; 256 end of sequence, 257 begin."""

    eos_token_id = 256
    bos_token_id = 257
    unk_token_id = None
    chat_template = None
    vocab_size = 258

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([self.bos_token_id] if add_special_tokens else []) + list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def convert_tokens_to_ids(self, token: str):
        return None


def tiny_llama(seed: int = 0, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               dtype: str = "float32"):
    """LlamaForCausalLM with SmolLM2's shape family (GQA, RoPE, tied embeddings), tiny."""
    torch = import_torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=ByteTokenizer.vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=1024, eos_token_id=ByteTokenizer.eos_token_id,
                      bos_token_id=ByteTokenizer.bos_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the init's: sharper logits, no near-ties in greedy
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return model.to(getattr(torch, dtype)).eval()


def tiny_engine(seed: int = 0, **kw):
    from .engine import LLMEngine

    return LLMEngine(tiny_llama(seed, **kw), ByteTokenizer(), max_context=1024, name="tiny-llama")
