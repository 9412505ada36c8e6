"""The passage of a text unit that best matches a question, found without a model.

Lazy search reads text units through passages: a relevance test sees one window of consecutive
sentences (`lazy.snippet_tokens`), claim extraction a few of the best windows grown into their
neighbours (`lazy.claim_tokens`). A unit is ~1,200 tokens and the part that bears on a question
is usually a few sentences, so sending whole units paid for 10x the text the verdicts rest on.

Matching is lexical, BM25-style: terms are lowercased words (a light plural stem, stop-words
out) and, for Chinese, character bigrams (a lone character is its own term), so no segmenter or
model is needed. IDF comes from the index's text units, counted once per index and kept on it.
A window's score is the sum over the query's terms of weight x IDF x saturated term frequency;
the saturation makes a window that holds several of the query's terms beat one that repeats one.
Sentences end at . ! ? (not after Mr. and the like), at 。！？ and at blank lines; a sentence
longer than a window is cut at clause punctuation, then at words. A unit within the cap is sent
whole. Passages are on one line (line wraps are layout, and a Sources row is one line); "…"
marks where text was left out.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..tokens import count_tokens, truncate

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TERMS = re.compile(rf"([{CJK}]+)|([^\W_{CJK}]+)")
_END = re.compile(r"[.!?]+[\"'”’)\]_]*(?=\s)|[。！？]+[”’」』）]*|\n\s*\n")
_CLAUSE = re.compile(r"(?<=[,;:，；：、])")
_SPACE = re.compile(r"\s+")
_WORDS = re.compile(rf"[{CJK}]|[^\s{CJK}]+\s*|\s+")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "vs", "etc", "fig", "e.g", "i.e"}
STOP = frozenset("""a about above after again against all also am an and any are as at be because been
before being below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself no nor not now of off on once only or other our ours ourselves
out over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which while
who whom why will with would you your yours yourself yourselves""".split())
K1 = 1.2
ELLIPSIS = "…"


def terms(text: str) -> list[str]:
    """The matching terms of `text`, in order, repeats kept."""
    out: list[str] = []
    for cjk, word in _TERMS.findall(text.lower()):
        if cjk:
            out.extend([cjk] if len(cjk) == 1 else [cjk[i:i + 2] for i in range(len(cjk) - 1)])
        elif len(word) > 1 and word not in STOP:
            out.append(_stem(word))
    return out


def _stem(word: str) -> str:
    # Plurals only: "themes" must find "theme"; more stemming would merge words that differ.
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@dataclass
class Vocabulary:
    """Document frequencies of terms over an index's text units (BM25's IDF)."""

    units: int
    frequency: Counter

    @classmethod
    def of(cls, texts: Iterable[str]) -> "Vocabulary":
        frequency: Counter = Counter()
        n = 0
        for text in texts:
            frequency.update(set(terms(str(text or ""))))
            n += 1
        return cls(n, frequency)

    def idf(self, term: str) -> float:
        n = self.frequency.get(term, 0)
        return math.log(1 + (self.units - n + 0.5) / (n + 0.5))

    def weights(self, queries: Iterable[str]) -> dict[str, float]:
        """Query term -> weight: its IDF times the number of query texts that hold it (a term
        of the question and of two subqueries counts three times)."""
        count: Counter = Counter()
        for text in queries:
            count.update(set(terms(text)))
        return {t: c * self.idf(t) for t, c in count.items()}


def vocabulary(index) -> Vocabulary:
    """The index's vocabulary, counted on first use and kept on the index (as GraphIndex keeps
    its lookups), so a Searcher pays for it once."""
    key = "_lazy_vocabulary"
    if key not in index.__dict__:
        index.__dict__[key] = Vocabulary.of(index.text_units["text"].tolist())
    return index.__dict__[key]


@dataclass
class Sentence:
    text: str
    tokens: int
    hits: dict[str, int]  # query term -> occurrences


def sentences(text: str, cap: int) -> list[str]:
    """`text` cut into sentences, none longer than `cap` tokens (joined, they give `text` back)."""
    out: list[str] = []
    start = 0
    for m in _END.finditer(text):
        if m.group().startswith(".") and _abbreviation(text, m.start()):
            continue
        end = m.end()
        while end < len(text) and text[end].isspace():
            end += 1
        out.append(text[start:end])
        start = end
    if start < len(text):
        out.append(text[start:])
    return [piece for s in out if s.strip() for piece in _pieces(s, cap)]


def _abbreviation(text: str, dot: int) -> bool:
    word = re.search(r"([A-Za-z.]+)$", text[max(0, dot - 6):dot])
    return bool(word) and (word.group(1).lower() in _ABBREVIATIONS or len(word.group(1)) == 1)


def _pieces(sentence: str, cap: int) -> list[str]:
    if count_tokens(sentence) <= cap:
        return [sentence]
    out: list[str] = []
    for part in _CLAUSE.split(sentence):
        parts = [part] if count_tokens(part) <= cap else _WORDS.findall(part)
        for p in parts:
            if out and count_tokens(out[-1] + p) <= cap:
                out[-1] += p
            else:
                out.append(p if count_tokens(p) <= cap else truncate(p, cap))
    return out


def _score(tf: dict[str, int], weights: dict[str, float]) -> float:
    return sum(weights[t] * n * (K1 + 1) / (n + K1) for t, n in tf.items())


def passage(text: str, weights: dict[str, float], cap: int, window: int | None = None,
            windows: int | None = 1) -> str:
    """The best of `text` for a query within `cap` tokens: up to `windows` (None: any number)
    windows of consecutive sentences of at most `window` tokens (default `cap`), best first (each
    scored by what it adds to the windows already taken; ties to the earlier), then grown by
    their neighbours until the cap is full. Text within the cap comes back whole."""
    flat = " ".join(str(text or "").split())
    if count_tokens(flat) <= cap:
        return flat
    window = min(window or cap, cap)
    marker = count_tokens(f" {ELLIPSIS} ")  # the cost of one mark of left-out text
    parts = [Sentence(s, count_tokens(s), {}) for s in
             (_SPACE.sub(" ", p) for p in sentences(str(text), max(1, window - 2 * marker)))]
    for s in parts:
        s.hits = dict(Counter(t for t in terms(s.text) if t in weights))
    chosen: set[int] = set()
    spans: list[list[int]] = []  # [start, end) of each picked window, in pick order
    taken: Counter = Counter()
    used = 0

    def room() -> int:  # tokens left, less the marks the pieces so far may need
        return cap - used - marker * (len(spans) + 1)

    while windows is None or len(spans) < windows:
        best: tuple[float, int, int] | None = None
        base = _score(taken, weights)
        # A window is best started on a sentence that holds a query term: any other window is
        # beaten by the one that starts at its first such sentence (and reaches further).
        starts = [i for i, s in enumerate(parts) if s.hits and i not in chosen] or ([] if spans else [0])
        for i in starts:
            size, tf, j = 0, Counter(taken), i
            while j < len(parts) and j not in chosen and size + parts[j].tokens <= min(window, room() - marker):
                size += parts[j].tokens
                tf.update(parts[j].hits)
                j += 1
            if j > i:
                gain = _score(tf, weights) - base
                if best is None or gain > best[0] + 1e-9:
                    best = (gain, i, j)
        if best is None or (spans and best[0] <= 1e-9):
            break  # the first window is always taken: a unit with no query term starts at its top
        _, i, j = best
        for k in range(i, j):
            chosen.add(k)
            taken.update(parts[k].hits)
            used += parts[k].tokens
        spans.append([i, j])
    # The neighbours, for the context a claim needs ("he" is someone): one sentence per window
    # per round, round-robin over the windows in pick order, alternately after and before.
    grown = True
    turn = 0
    while grown:
        grown = False
        for span in spans:
            sides = (span[1], span[0] - 1) if turn % 2 == 0 else (span[0] - 1, span[1])
            for k in sides:
                if 0 <= k < len(parts) and k not in chosen and parts[k].tokens <= room():
                    chosen.add(k)
                    used += parts[k].tokens
                    span[0], span[1] = min(span[0], k), max(span[1], k + 1)
                    grown = True
                    break
        turn += 1
    if not chosen:  # no sentence fits (a cap below a few tokens): the start, cut
        return truncate(flat, cap)
    out: list[str] = []
    last = -1
    for k in sorted(chosen):
        if k != last + 1:
            out.append(ELLIPSIS + " ")
        out.append(parts[k].text)
        last = k
    text_out = "".join(out).strip() + ("" if last == len(parts) - 1 else f" {ELLIPSIS}")
    return text_out if count_tokens(text_out) <= cap else truncate(text_out, cap)


__all__ = ["terms", "Vocabulary", "vocabulary", "sentences", "passage"]
