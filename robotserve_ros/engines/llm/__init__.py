"""The LLM engine (seed 002 §4.1): a Hugging Face causal LM with per-request KV caches kept
across suspensions, batched decode steps, KV export/import, and the segment stop checker.
torch and transformers are imported only in this package (never by core)."""
from .convert import default_model_dir
from .engine import LLMEngine
from .stop import ForcedText, StopChecker

__all__ = ["LLMEngine", "StopChecker", "ForcedText", "default_model_dir", "tiny_engine", "ByteTokenizer"]


def __getattr__(name):  # the tiny test model without importing transformers at package import
    if name in ("tiny_engine", "tiny_llama", "ByteTokenizer"):
        from . import tiny

        return getattr(tiny, name)
    raise AttributeError(name)
