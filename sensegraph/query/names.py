"""Which entities a question names: whole-name matching, tolerant to case and width, in
scripts with spaces (a name must not run on into a longer word: "AI" is not in "said") and in
those without (Chinese, Japanese and Korean names are found as substrings)."""
from __future__ import annotations

import unicodedata

import pandas as pd


def _joined(char: str) -> bool:
    """Whether `char` is of a script whose words run into their neighbours: Han and kana have no
    spaces, and Korean attaches particles to the noun (서울에), so a name there is any substring."""
    return ("\u3040" <= char <= "\u30ff" or "\u3400" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af"
            or "\uf900" <= char <= "\ufaff")


def _fold(text: str) -> str:
    # NFKC makes full-width letters (ＡＩ, common in Chinese text) plain; casefold ignores case.
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _bounded(text: str, at: int, edge: str) -> bool:
    """Whether a name whose first or last character is `edge` may end next to `text[at]`.
    A Latin name must not run on into another Latin letter or digit ("AI" is not in "said");
    a Han name has no spaces around it, so any neighbour will do (as may a Han neighbour of a
    Latin name: "AI" in "AI技术")."""
    if at < 0 or at >= len(text) or _joined(edge) or not edge.isalnum():
        return True
    return not text[at].isalnum() or _joined(text[at])


def _occurs(name: str, text: str) -> bool:
    """Whether the whole of `name` occurs in `text` (both as returned by `_fold`)."""
    start = text.find(name)
    while start != -1:
        end = start + len(name)
        if _bounded(text, start - 1, name[0]) and _bounded(text, end, name[-1]):
            return True
        start = text.find(name, start + 1)
    return False


def named_in(titles: list[str], text: str) -> list[int]:
    """Positions of the `titles` that occur in `text` as whole names."""
    folded = _fold(text)
    return [i for i, title in enumerate(titles) if len(name := _fold(str(title))) >= 2 and _occurs(name, folded)]


def named_entities(entities: pd.DataFrame, text: str) -> list[str]:
    """Ids of the entities whose name occurs in `text` as a whole name, longest names first."""
    ids, titles = entities["id"].tolist(), entities["title"].tolist()
    named = [(len(_fold(str(titles[i]))), ids[i]) for i in named_in(titles, text)]
    return [eid for _, eid in sorted(named, reverse=True)]  # "Alex Mercer" before "Alex"
