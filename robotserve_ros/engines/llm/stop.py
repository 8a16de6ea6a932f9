"""The segment stop checker (seed 002 §4.1 "Segmentation"): detokenize as tokens come and
end the segment at a skill boundary (the plan format's delimiter: one skill per line), at
an end-of-sequence token, or at the segment token limit. Pure Python: the decode loops of
the serving core and the engine's tests use it; the tokenizer is passed in.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence


class StopChecker:
    """One per request. `feed(token)` returns None while the segment goes on, else why it
    ended: "delimiter" (a skill is complete), "eos" (the plan is complete) or "max_tokens".
    `take()` returns the finished segment's tokens and text and starts the next segment."""

    def __init__(self, decode: Callable[[Sequence[int]], str], eos_ids: Iterable[int] = (),
                 delimiter: str = "\n", max_tokens: int = 16) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not delimiter:
            raise ValueError("the skill delimiter must not be empty")
        self.decode, self.eos_ids = decode, set(eos_ids)
        self.delimiter, self.max_tokens = delimiter, int(max_tokens)
        self.tokens: list[int] = []
        self.reason: Optional[str] = None

    def feed(self, token: int) -> Optional[str]:
        if self.reason is not None:
            raise RuntimeError("segment already ended: take() it first")
        if token in self.eos_ids:
            self.reason = "eos"
            return self.reason
        self.tokens.append(int(token))
        # decoding only this segment's tokens: a handful, so each check costs microseconds
        if self.delimiter in self.decode(self.tokens):
            self.reason = "delimiter"
        elif len(self.tokens) >= self.max_tokens:
            self.reason = "max_tokens"
        return self.reason

    def take(self) -> tuple[list[int], str, Optional[str]]:
        toks, reason = self.tokens, self.reason
        text = self.decode(toks).split(self.delimiter, 1)[0].strip()
        self.tokens, self.reason = [], None
        return toks, text, reason


class ForcedText:
    """A plan template as a decoding constraint: the request may only produce `token_ids`,
    in order, then an end-of-sequence token. Greedy decoding under it still costs one decode
    step per token; only the choice of token is fixed (the 135M model cannot plan freely)."""

    def __init__(self, token_ids: Sequence[int], eos_id: int) -> None:
        self.ids, self.eos_id = list(token_ids), int(eos_id)

    def __call__(self, generated: Sequence[int]) -> list[int]:
        n = len(generated)
        return [self.ids[n]] if n < len(self.ids) else [self.eos_id]
