"""Corpus language: Chinese corpora get Chinese prompts and answers."""
from __future__ import annotations

import re
from collections.abc import Iterable

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")


def detect_language(texts: Iterable[str], sample_chars: int = 200_000) -> str:
    """'zh' when Han characters outnumber Latin letters in a sample of the text, else 'en'.
    Letters rather than words are compared because Chinese has no spaces."""
    han = latin = seen = 0
    for text in texts:
        chunk = text[: max(0, sample_chars - seen)]
        han += len(_HAN.findall(chunk))
        latin += len(_LATIN.findall(chunk))
        seen += len(chunk)
        if seen >= sample_chars:
            break
    return "zh" if han > latin / 4 else "en"


def resolve_language(setting: str, texts: Iterable[str]) -> str:
    return setting if setting in ("en", "zh") else detect_language(texts)
