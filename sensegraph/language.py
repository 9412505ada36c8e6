"""Corpus language: English, Chinese or Japanese. Chinese corpora get Chinese prompts and answers.
Japanese is told apart from Chinese by its kana; it has no prompts of its own yet, so it gets the
English ones, which ask the model to write in the language of the text (`language_note` says so
to the user)."""
from __future__ import annotations

import re
from collections.abc import Iterable

LANGUAGES = ("en", "zh", "ja")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Hiragana, katakana (without the middle dot U+30FB, which Chinese also writes between the parts
# of a foreign name), katakana extensions and half-width katakana.
_KANA = re.compile(r"[\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9d]")
_LATIN = re.compile(r"[A-Za-z]")
# Japanese writes its particles and endings in hiragana: among the Han and kana of the samples in
# tests/test_language.py, a kanji-heavy news sentence has 27% kana, prose over half. A Chinese
# text has none, or a stray one in a quoted name (3% in the test's sample); Xiyouji has none.
KANA_SHARE = 0.1
JAPANESE_NOTE = ("Japanese detected: there are no Japanese prompts yet; the English prompts are used "
                 "and ask the model to write in Japanese")


def detect_language(texts: Iterable[str], sample_chars: int = 200_000) -> str:
    """'zh' or 'ja' when Han and kana characters outnumber a quarter of the Latin letters in a
    sample of the text ('ja' if kana are at least `KANA_SHARE` of them), else 'en'. Letters
    rather than words are compared because Chinese and Japanese have no spaces."""
    han = kana = latin = seen = 0
    for text in texts:
        chunk = text[: max(0, sample_chars - seen)]
        han += len(_HAN.findall(chunk))
        kana += len(_KANA.findall(chunk))
        latin += len(_LATIN.findall(chunk))
        seen += len(chunk)
        if seen >= sample_chars:
            break
    cjk = han + kana
    if cjk <= latin / 4:
        return "en"
    return "ja" if kana >= KANA_SHARE * cjk else "zh"


def resolve_language(setting: str, texts: Iterable[str]) -> str:
    """The `language` setting if it names a language, else the one detected in `texts`."""
    return setting if setting in LANGUAGES else detect_language(texts)


def language_note(language: str) -> str | None:
    """What the user is told about a language the prompts do not cover yet, or None."""
    return JAPANESE_NOTE if language == "ja" else None
