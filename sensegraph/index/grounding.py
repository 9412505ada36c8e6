"""Paper step 2.2, checked in code: is an extracted name in its text, and is it a name?

Models invent names, copy the prompt's examples, and small ones answer with common nouns
("city", "gasoline"), clauses ("just three weeks shy of his 42nd birthday") or dates typed as
anything. Everything here is checked against the text unit the record came from, with no LLM.
extract.py applies the checks by policy (`Settings.check_policy`): `lenient` (hosted and large
models) drops only what `grounded` rejects; `strict` (small models) also what `clause` and
`generic` call not a name; `off` nothing.

Every comparison is made on a folded form of both sides (`fold`): Unicode NFKC (full-width
digits and letters), accents removed ("Zurich" for "Zürich"), case folded, traditional Chinese
characters as simplified ones (OpenCC t2s: 紅樓夢 for 红楼梦), the dots of abbreviations dropped
("U.S." is "US"), a word hyphenated across a line break joined ("Ger-\\nmany"), and title marks
《》「」『』 around a name taken off (《红楼梦》 is the name 红楼梦). The stored name keeps its spelling.

- `grounded`: the name occurs in the unit. Tolerant to case, punctuation, possessives and
  inflection: two words are one when they share a stem of at least 4 letters and differ only by
  an inflection ("churches"/"church", "hammering") or a demonym ending ("Swedish"/"Sweden",
  "Italian"/"Italy"); between two words the text writes as names only the demonym endings count,
  so "Georgia" is not grounded by "George", nor "Austria" by "Austin", "Nigeria" by "Niger",
  "Parish" by "Paris", "Adams" by "Adam". Every number of a name must occur as written ("Apollo
  12" is not grounded by "Apollo 11"). Titles and particles may be missing ("President Barack
  Obama" is grounded by "Barack Obama"); acronyms match their spelled-out names either way ("UN"
  and "United Nations", "U.S." and "United States"), but the text's acronym must be written in
  capitals ("Tiny Hill Estates" is not grounded by the word "the"). A name of several content
  words is also grounded when at least half of them occur and one of those is written as a name
  in the unit ("Ebenezer Scrooge" in a unit that says only "Scrooge"), so a full name the model
  knows from other units survives, while "United States Air Force" is not grounded by "states"
  and "force". Chinese and Japanese: the folded name, without spaces and marks, is a substring of
  the folded unit.
- `generic`: a Latin-script name without digits whose words the unit writes only in lower case,
  or capitalised only at the start of a sentence: a common noun, not a name ("fire" in "the fire
  spread"). A word with a capital anywhere counts as capitalised ("eBay", "iPhone", "pH"). A unit
  that writes no capitals at all ("i met john smith in paris") tells nothing, so nothing there
  is generic. A name the model wrote in lower case must be capitalised as a phrase ("paranormal
  activity" is not a name because the text has "Paranormal Military Squad"). Names of a concept
  type (`extraction.concept_types`: "machine learning" as a concept) are never judged: extract.py
  skips them. Chinese has no case and its common nouns can be entities (樵夫, the woodcutter), so
  none is called generic there.
- `clause`: a name holding sentence punctuation or a comma before three more words, or longer
  than a name gets (more than `MAX_NAME_WORDS` words), unless the unit writes it, title-cased, as
  it is ("Who Framed Roger Rabbit?", "Yahoo!", "Prince William, Duke of Cambridge", "United States
  Department of Health and Human Services"; up to `MAX_TITLE_WORDS` words). Chinese: punctuation
  inside the name, more than `MAX_HAN_CHARS` characters (`MAX_LONG_HAN_CHARS` for an institution
  name, 中华人民共和国国务院, or a title the text sets in 《》), or a clause particle (了 着 吗 呢 吧)
  that ends the name or that jieba, when installed, tags as a particle (猴王走了; not 吗啡, 酒吧,
  袁了凡).
- `value_type`: "date" for dates, years, decades and centuries ("1947", "March 3, 1947", "the
  1990s", "19th century", "1947年"), "number" for amounts ("1 million", "42%", "$3M"), else None.
  Only unambiguous values: a month alone ("May") is not a date, "3M" and 万里 are not amounts.
  extract.py uses it to type a name the model gave a placeholder type or one outside the
  configured list; a configured type the model chose is kept.

What fails is dropped and counted by the caller (extract.py), never silently.
"""
from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from dataclasses import dataclass, field

# Han and kana: names in these scripts are compared as substrings (no spaces between words).
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_WORD = re.compile(r"[^\W_]+")
_POSSESSIVE = re.compile(r"['’]s\b", re.IGNORECASE)
TITLE_MARKS = "《》〈〉「」『』"
_ENCLOSED = re.compile(r"^[《〈「『](.+)[》〉」』]$")
# Sentence punctuation, or a comma followed by a phrase of three words or more.
_LATIN_CLAUSE_PUNCTUATION = re.compile(r"[;!?]|,\s*\w+\s+\w+\s+\w+")
_HAN_CLAUSE_PUNCTUATION = re.compile(r"[，。；：！？、“”‘’（）《》〈〉「」『』,;:!?]")
_HAN_CLAUSE_PARTICLES = set("了着吗呢吧")
_NOT_CJK_NAME = re.compile(r"[\s·•・\-_.《》〈〉「」『』]")
# The last characters of Chinese institution names, which may be long (美国国家航空航天局).
_INSTITUTION_ENDINGS = ("委员会", "中心", "集团", "协会", "大学", "公司", "银行", "政府", "医院", "学会",
                        "院", "局", "部", "署", "厅", "社", "所", "馆", "军", "党", "团", "台", "校", "处")

MAX_NAME_WORDS = 6
MAX_TITLE_WORDS = 16
MAX_HAN_CHARS = 8
MAX_LONG_HAN_CHARS = 20
# A shared stem of at least this many letters before an inflection or a demonym ending.
_STEM = 4

# Endings, as unordered pairs, that make two words one. Inflections: plural, verb forms.
_INFLECTIONS = {frozenset(p) for p in (("", "s"), ("", "es"), ("y", "ies"), ("", "ed"), ("e", "ed"), ("", "d"),
                                       ("", "ing"), ("e", "ing"), ("", "er"), ("", "ers"), ("e", "er"))}
# Demonym and adjective endings of place names: Sweden/Swedish, Italy/Italian, China/Chinese.
_DEMONYMS = {frozenset(p) for p in (("", "n"), ("", "ns"), ("", "an"), ("", "ans"), ("", "ian"), ("", "ians"),
                                    ("a", "an"), ("a", "ans"), ("a", "ian"), ("a", "ians"), ("y", "ian"),
                                    ("y", "ians"), ("o", "an"), ("o", "ans"), ("", "ese"), ("a", "ese"),
                                    ("", "ish"), ("en", "ish"), ("ain", "ish"), ("and", "ish"), ("", "i"),
                                    ("", "y"))}
# Endings that change a word little enough to need a longer stem (German/Germany, not Bill/Billy).
_LONG_STEM_ENDINGS = {frozenset(("", "y")), frozenset(("", "i"))}

# Words that do not make a name: particles of multi-word names and titles before them.
PARTICLES = frozenset("the a an of and & de la le les du des di da del von van der den y e to for in on at by".split())
TITLES = frozenset("""mr mrs ms miss dr prof professor sir dame lord lady king queen prince princess
president general captain colonel major saint st pope emperor empress sheriff judge senator
governor mayor father mother brother sister uncle aunt old young little great""".split())

_MONTHS = ("january february march april may june july august september october november december "
           "jan feb mar apr jun jul aug sep sept oct nov dec").split()
_MONTH = r"(?:" + "|".join(_MONTHS) + r")\.?"
_ORDINAL = r"\d{1,2}(?:st|nd|rd|th)?"
_YEAR = r"(?:1[0-9]{3}|20[0-9]{2})"
_DATE_FORMS = [
    rf"{_YEAR}s?",                                   # 1947, 1990s
    rf"{_YEAR}\s*(?:-|–|to)\s*{_YEAR}",              # 1914-1918
    r"'?\d0s",                                       # '90s
    rf"{_ORDINAL}\s+centur(?:y|ies)(?:\s+(?:bc|ad|bce|ce))?",
    # a month with its day or year (a month alone may be a name: May, April)
    rf"(?:early|late|mid|mid-)?\s*{_MONTH}\s+{_ORDINAL}(?:,?\s+{_YEAR})?",   # March 3, 1947
    rf"(?:early|late|mid|mid-)?\s*{_MONTH},?\s+{_YEAR}",                       # March 1947
    rf"{_ORDINAL}\s+(?:of\s+)?{_MONTH},?(?:\s+{_YEAR})?",   # 3 March 1947
    r"\d{4}-\d{2}(?:-\d{2})?",                         # ISO
    r"\d{1,2}/\d{1,2}/\d{2,4}",
    rf"(?:spring|summer|autumn|fall|winter)\s+(?:of\s+)?{_YEAR}",
    r"[0-9〇零一二三四五六七八九十百千]+年(?:[0-9一二三四五六七八九十]+月)?(?:[0-9一二三四五六七八九十]+日)?",
    r"[0-9一二三四五六七八九十]+月(?:[0-9一二三四五六七八九十]+日)?",
]
_DATE = re.compile(r"^(?:" + "|".join(_DATE_FORMS) + r")$", re.IGNORECASE)
_NUMBER = re.compile(
    r"^(?:about\s+|over\s+|more than\s+|nearly\s+|some\s+)?"
    # an amount of money may carry a letter scale ("$3M", "€2bn"); without a currency sign
    # "3M" is as likely a name
    r"(?:[$€£¥]\s*\d[\d,.]*\s*(?:k|m|bn|thousand|million|billion|trillion)?"
    r"|\d[\d,.]*\s*(?:%|percent|per cent|thousand|million|billion|trillion|hundred)?)$"
    # Chinese amounts start with a numeral: 三千, 十万人, not 万里
    r"|^[0-9零〇一二两三四五六七八九十][0-9零〇一二两三四五六七八九十百千万亿]*(?:个|人|年|岁|里|丈|尺)?$",
    re.IGNORECASE)


def has_han(s: str) -> bool:
    """Whether `s` holds Han or kana: names in these scripts are compared as substrings."""
    return bool(_CJK.search(s))


# -- folding --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _t2s():
    try:
        import opencc
    except ImportError:  # a core dependency; without it traditional and simplified stay apart
        return None
    return opencc.OpenCC("t2s")


def _simplified(s: str) -> str:
    """Traditional Chinese characters as simplified ones; `s` unchanged if it changed length
    (offsets into the folded text must stay those of the text)."""
    converter = _t2s()
    if converter is None:
        return s
    out = converter.convert(s)
    return out if len(out) == len(s) else s


@functools.lru_cache(maxsize=1 << 16)
def fold_word(word: str) -> str:
    """A Latin-script word (or any run without Han) as compared: NFKC, accents removed, case folded."""
    if word.isascii():
        return word.casefold()
    s = unicodedata.normalize("NFKC", word)
    # Accents are combining marks after NFKD; kana's voicing marks are too, so CJK stays as it is.
    s = "".join(c if ord(c) >= 0x3000 else "".join(d for d in unicodedata.normalize("NFKD", c)
                                                    if not unicodedata.combining(d)) for c in s)
    return s.casefold()


def _fold_cjk(text: str) -> str:
    """`text` folded character by character (NFKC, case), then traditional -> simplified; the
    same length as `text`, so an offset into one is an offset into the other."""
    chars = []
    for c in text:
        f = unicodedata.normalize("NFKC", c).casefold() if not c.isascii() else c.casefold()
        chars.append(f if len(f) == 1 else c)
    return _simplified("".join(chars))


_LINE_HYPHEN = re.compile(r"([^\W\d_]{2,})-[ \t]*\r?\n[ \t]*([^\W\d_A-Z][^\W\d_]*)")
_INITIALS = re.compile(r"(?<![^\W\d_])((?:[^\W\d_]\.)+[^\W\d_]\.?)(?![^\W\d_])")


def _prepare(text: str) -> str:
    """`text` with words hyphenated across line breaks joined and abbreviation dots dropped
    ("U.S." -> "US"), padded with spaces to keep every offset."""
    def joined(m: re.Match[str]) -> str:
        word = m.group(1) + m.group(2)
        return word + " " * (len(m.group(0)) - len(word))

    text = _LINE_HYPHEN.sub(joined, text)
    return _INITIALS.sub(lambda m: m.group(1).replace(".", "") + " " * m.group(1).count("."), text)


def strip_title_marks(name: str) -> str:
    """《红楼梦》 -> 红楼梦: title marks around a name are punctuation, not part of it."""
    m = _ENCLOSED.match(name.strip())
    return m.group(1).strip() if m else name


def fold(name: str) -> str:
    """A name, or any text, as every comparison sees it (module docstring); whitespace collapsed."""
    # Names repeat across units and answers: cached. Whole texts (a passage prompt-tune checks
    # its example names against) would only fill the cache.
    return _fold_name(name) if len(name) <= 200 else _fold(name)


@functools.lru_cache(maxsize=1 << 16)
def _fold_name(name: str) -> str:
    return _fold(name)


def _fold(name: str) -> str:
    s = " ".join(_prepare(strip_title_marks(name)).split())
    if has_han(s):
        return _fold_cjk(s)
    return " ".join(fold_word(w) for w in s.split(" ")) if s else s


def same_name(a: str, b: str) -> bool:
    """Whether two names are one by their words, an acronym standing for words of the other
    ("UK" and "United Kingdom", "U.S. Army" and "United States Army"), particles aside."""
    def words(name: str) -> list[tuple[str, bool]]:
        originals = _WORD.findall(_POSSESSIVE.sub("", " ".join(_prepare(strip_title_marks(name)).split())))
        return [(fold_word(w), 2 <= len(w) <= 6 and w.isupper()) for w in originals
                if fold_word(w) not in PARTICLES]

    wa, wb = words(a), words(b)

    def match(i: int, j: int, x: list[tuple[str, bool]], y: list[tuple[str, bool]]) -> bool:
        if i == len(x) or j == len(y):
            return i == len(x) and j == len(y)
        if x[i][0] == y[j][0] and match(i + 1, j + 1, x, y):
            return True
        word, acronym = x[i]
        if acronym:
            for k in range(2, min(len(word), len(y) - j) + 1):
                if "".join(w[0] for w, _ in y[j:j + k]) == word and match(i + 1, j + k, x, y):
                    return True
        word, acronym = y[j]
        if acronym:
            for k in range(2, min(len(word), len(x) - i) + 1):
                if "".join(w[0] for w, _ in x[i:i + k]) == word and match(i + k, j + 1, x, y):
                    return True
        return False

    return bool(wa) and bool(wb) and match(0, 0, wa, wb)


def _endings(a: str, b: str) -> frozenset[str] | None:
    """The endings that tell `a` from `b` after their shared stem, or None if the stem is short."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    if n < _STEM:
        return None
    pair = frozenset((a[n:], b[n:]))
    if pair in _LONG_STEM_ENDINGS and n < _STEM + 1:
        return None
    return pair


# -- the unit -------------------------------------------------------------------------------------

# Where a sentence ends, in either script; a blank line or a list item too. A single line break
# inside a paragraph is no sentence end (hard-wrapped text); after a short line without final
# punctuation (a heading) it is, found in UnitText.of.
_SENTENCE_BREAK = re.compile(r"[.!?。！？；;]+[\"”’」』）)]*\s|[。！？；]+[”’」』）)]*|\n[ \t]*\n\s*"
                             r"|\n(?=[ \t]*(?:[-*•]|\d{1,3}[.)])[ \t])")
_HEADING_CHARS = 40
_LINE = re.compile(r"[^\n]*\n")


_ABBREVIATIONS = frozenset("mr mrs ms dr st prof jr sr vs etc no gen col capt lt sgt rev hon mt ft inc ltd co corp".split())


def _abbreviation(text: str, period: int) -> bool:
    """Whether the full stop at `period` ends an abbreviation or an initial ("Mr.", "J. Smith")."""
    if text[period] != ".":
        return False
    m = re.search(r"(\w+)$", text[max(0, period - 12):period])
    return bool(m) and (m.group(1).casefold() in _ABBREVIATIONS or (len(m.group(1)) == 1 and m.group(1).isupper()))


def _heading_breaks(text: str) -> list[int]:
    """Offsets after the line break of each short line without final punctuation (a heading,
    a title, a list item) that another line follows."""
    out = []
    for m in _LINE.finditer(text):
        line = m.group(0).strip()
        if line and len(line) < _HEADING_CHARS and not re.search(r"[.!?。！？；;:,，：\"”’)]$", line) \
                and m.end() < len(text):
            out.append(m.end())
    return out


@dataclass(slots=True)
class _Token:
    folded: str
    original: str
    sentence_start: bool
    sentence: int = 0  # index of its sentence in the unit
    capital: bool = False  # a capital letter anywhere ("Paris", "eBay", "NATO")


@dataclass
class UnitText:
    """One text unit, prepared once for checking all the names of its answers."""

    text: str
    tokens: list[_Token] = field(default_factory=list)
    words: dict[str, list[_Token]] = field(default_factory=dict)  # folded word -> its occurrences
    by_prefix: dict[str, set[str]] = field(default_factory=dict)
    initials: set[str] = field(default_factory=set)  # acronyms of capitalised word runs: "un"
    acronyms: set[str] = field(default_factory=set)  # words written in capitals: "nato", "us"
    lower: set[str] = field(default_factory=set)     # words written in lower case somewhere
    cased: bool = True               # whether the unit writes capitals at all
    folded: str = ""                 # the text folded (CJK: character by character, same length)
    compact: str = ""                # CJK text folded, without spaces and marks
    sentence_starts: list[int] = field(default_factory=list)  # character offsets
    _flat: str | None = None         # the text folded word by word, for `writes`

    def sentence_at(self, offset: int) -> int:
        return bisect.bisect_right(self.sentence_starts, offset) - 1

    @classmethod
    def of(cls, text: str) -> UnitText:
        # Built for every text unit (extraction checks its answers' names against it, the weak
        # edges look their sentences up in it): one pass over the words, the sentence of each
        # found by walking the sentence starts rather than a search per word.
        unit = cls(text)
        breaks = {m.end() for m in _SENTENCE_BREAK.finditer(text) if not _abbreviation(text, m.start())}
        if "\n" in text:
            breaks.update(_heading_breaks(text))
        starts = unit.sentence_starts = [0] + sorted(b for b in breaks if 0 < b < len(text))
        # Offsets are those of `text`: the possessive is blanked out, dots dropped with padding.
        cleaned = _POSSESSIVE.sub(lambda m: " " * len(m.group(0)), _prepare(text))
        tokens, words, initials = unit.tokens, unit.words, unit.initials
        run: list[str] = []
        sentence, previous = 0, -1
        next_start = starts[1] if len(starts) > 1 else len(text) + 1
        for m in _WORD.finditer(cleaned):
            position = m.start()
            while position >= next_start:
                sentence += 1
                next_start = starts[sentence + 1] if sentence + 1 < len(starts) else len(text) + 1
            word = m.group(0)
            folded = word.casefold() if word.isascii() else fold_word(word)
            capital = word != word.lower()
            token = _Token(folded, word, sentence != previous, sentence, capital)
            tokens.append(token)
            if folded in words:
                words[folded].append(token)
            else:
                words[folded] = [token]
            if not capital:
                unit.lower.add(folded)
            elif len(word) >= 2 and word.isupper():
                unit.acronyms.add(folded)
            previous = sentence
            # Acronyms: initials of runs of capitalised words, particles allowed inside
            # ("United Nations" -> "un", "Bank of America" -> "ba").
            if word[0].isupper():
                run.append(folded[0])
                if len(run) >= 2:
                    initials.add("".join(run))
                    for i in range(1, len(run) - 1):
                        initials.add("".join(run[i:]))
            elif folded not in PARTICLES:
                run = []
        for w in words:
            unit.by_prefix.setdefault(w[:_STEM], set()).add(w)
        starts_cased = [t.capital for t in tokens if t.sentence_start and t.original[0].isalpha()]
        unit.cased = any(t.capital and not t.sentence_start for t in tokens) or (
            bool(starts_cased) and 2 * sum(starts_cased) >= len(starts_cased))
        if has_han(text):
            unit.folded = _fold_cjk(text)
            unit.compact = _NOT_CJK_NAME.sub("", unit.folded)
        return unit

    def forms(self, word: str, proper: bool = False) -> list[str]:
        """The unit's words that are `word` or an inflection or demonym of it; for a `proper`
        name word, an inflection only of a word the unit writes in lower case ("Church" for
        "churches", not "Adam" for "Adams")."""
        if len(word) < _STEM:
            return [word] if word in self.words else []
        out = []
        for w in self.by_prefix.get(word[:_STEM], ()):
            if w == word:
                out.append(w)
                continue
            pair = _endings(word, w)
            if pair in _DEMONYMS or (pair in _INFLECTIONS and (not proper or w in self.lower)):
                out.append(w)
        return out

    def has_word(self, word: str, proper: bool = False) -> bool:
        return word in self.words or bool(self.forms(word, proper))

    def writes(self, name: str) -> bool:
        """Whether the unit holds `name` as it is (folded), not as part of a longer word."""
        if self._flat is None:
            self._flat = " ".join(fold_word(w) for w in _prepare(self.text).split())
        key = fold(name)
        return bool(key) and re.search(rf"(?<![^\W_]){re.escape(key)}(?![^\W_])", self._flat) is not None


@functools.lru_cache(maxsize=1 << 16)
def _name_words(name: str) -> tuple[tuple[str, bool], ...]:
    """(folded word, whether the name writes it capitalised) for each word of a name."""
    originals = _WORD.findall(_POSSESSIVE.sub("", " ".join(_prepare(strip_title_marks(name)).split())))
    return tuple((fold_word(w), w != w.lower()) for w in originals)


@functools.lru_cache(maxsize=1 << 16)
def _content_words(name: str) -> tuple[tuple[str, bool], ...]:
    words = _name_words(name)
    content = tuple(w for w in words if w[0] not in PARTICLES and w[0] not in TITLES)
    return content or tuple(w for w in words if w[0] not in PARTICLES) or words


def _acronym(name: str) -> str | None:
    """The letters of an all-capitals name of 2-6 letters ("UN", "U.S.", "NASA")."""
    letters = re.sub(r"[.\s&]", "", name)
    return letters.casefold() if 2 <= len(letters) <= 6 and letters.isalpha() and letters.isupper() else None


def _written_as_name(word: str, proper: bool, unit: UnitText) -> bool:
    """The unit capitalises `word` mid-sentence, or only ever writes it capitalised."""
    tokens = [t for form in unit.forms(word, proper) for t in unit.words[form]]
    upper = [t for t in tokens if t.capital]
    return any(not t.sentence_start for t in upper) or (bool(upper) and len(upper) == len(tokens))


def _cjk_key(name: str) -> str:
    return _NOT_CJK_NAME.sub("", fold(name))


def grounded(name: str, unit: UnitText) -> bool:
    """Whether `name` (as the model wrote it) occurs in the unit, tolerantly (module docstring)."""
    if has_han(name):
        key = _cjk_key(name)
        return bool(key) and key in (unit.compact or _NOT_CJK_NAME.sub("", _fold_cjk(unit.text)))
    words = _content_words(name)
    if not words:
        return False
    # Numbers are names' most exact part: "Apollo 12" is another mission than "Apollo 11".
    if any(any(c.isdigit() for c in w) and w not in unit.words for w, _ in words):
        return False
    found = [(w, proper) for w, proper in words if unit.has_word(w, proper)]
    if len(found) == len(words):
        return True
    # Part of a longer name ("Scrooge" for "Ebenezer Scrooge"): the part must be written as a
    # name in the text, not a common word the name happens to hold ("force" does not
    # ground "United States Air Force").
    if len(words) >= 2 and 2 * len(found) >= len(words) and any(_written_as_name(w, p, unit) for w, p in found):
        return True
    acronym = _acronym(name)
    if acronym and acronym in unit.initials:
        return True
    # The text writes, in capitals, the acronym of a name the model spelled out ("NATO").
    spelled = [w for w, _ in _name_words(name) if w not in PARTICLES]
    return len(spelled) >= 2 and "".join(w[0] for w in spelled) in unit.acronyms


def sentences_of(name: str, unit: UnitText) -> set[int]:
    """The sentences of the unit that mention `name`: for Chinese where it occurs as a substring;
    else where at least half its content words occur (all of a one-word name), as `grounded`."""
    if has_han(name):
        key = fold(name)
        key = _NOT_CJK_NAME.sub("", key)
        text = unit.folded or _fold_cjk(unit.text)
        if not key:
            return set()
        found, start = set(), text.find(key)
        while start >= 0:
            found.add(unit.sentence_at(start))
            start = text.find(key, start + 1)
        return found
    words = _content_words(name)
    per_word = [{t.sentence for form in unit.forms(w, p) for t in unit.words[form]} for w, p in words]
    need = len(words) if len(words) < 2 else (len(words) + 1) // 2
    counts: dict[int, int] = {}
    for sentences in per_word:
        for i in sentences:
            counts[i] = counts.get(i, 0) + 1
    return {i for i, n in counts.items() if n >= need}


def generic(name: str, unit: UnitText) -> bool:
    """Whether a Latin-script name is a common noun: the unit never capitalises its words
    mid-sentence (module docstring). Names with digits, Han or no occurrence are not judged."""
    if has_han(name) or any(c.isdigit() for c in name) or _acronym(name) or not unit.cased:
        return False
    words = _content_words(name)
    occurrences = [t for w, p in words for form in unit.forms(w, p) for t in unit.words[form]]
    if not occurrences:
        return False
    # A name the model wrote in lower case is judged as a phrase: "paranormal activity" is not
    # made a name by "Paranormal Military Squad". Its first word must be capitalised where the
    # next word follows it.
    phrase = len(words) >= 2 and not any(c.isupper() for c in name)
    follows = set(unit.forms(words[1][0])) if phrase else set()
    index = {id(t): i for i, t in enumerate(unit.tokens)} if phrase else {}
    first = set(unit.forms(words[0][0])) if phrase else set()
    for t in occurrences:
        if t.capital and (not t.sentence_start or (t.original.isupper() and len(t.original) > 1)
                          or not t.original[:1].isupper()):
            if not phrase:
                return False
            i = index[id(t)]
            if t.folded in first and i + 1 < len(unit.tokens) and unit.tokens[i + 1].folded in follows:
                return False
    # Only lower-case or sentence-initial occurrences: a common noun, unless every occurrence
    # opens a sentence and the model capitalised it (a name that happens to start sentences).
    return not (name[:1].isupper() and all(t.sentence_start for t in occurrences))


# Small words a title leaves in lower case ("Knight's Cross of the Iron Cross with Oak Leaves").
_TITLE_SMALL_WORDS = PARTICLES | frozenset("with from into over under as or nor but so up off per via than".split())


def _title_cased(name: str) -> bool:
    """Every word but the small ones starts with a capital or a digit ("Do They Know It's Christmas?")."""
    words = [w for w in re.findall(r"[^\W_][\w'’.-]*", name) if w.casefold() not in _TITLE_SMALL_WORDS]
    return bool(words) and all(w[0].isupper() or w[0].isdigit() for w in words)


@functools.lru_cache(maxsize=1)
def _jieba_tagger():
    try:
        import logging

        import jieba
        import jieba.posseg
    except ImportError:  # the lazy extra (and every embedded install) has it; else endings only
        return None
    jieba.setLogLevel(logging.WARNING)
    return jieba.posseg.dt


def _han_tags(compact: str) -> list[tuple[str, str]] | None:
    tagger = _jieba_tagger()
    return None if tagger is None else [(w.word, w.flag) for w in tagger.cut(compact)]


def clause(name: str, unit: UnitText | None = None) -> bool:
    """Whether a "name" is a clause or phrase rather than a name (module docstring); with the
    unit, a title-cased name the unit writes as it is, is a name."""
    if has_han(name):
        inner = strip_title_marks(name)
        compact = re.sub(r"\s", "", inner)
        if _HAN_CLAUSE_PUNCTUATION.search(compact):
            return True
        kana = bool(_KANA.search(compact))
        limit = MAX_HAN_CHARS
        tags = None
        if not kana and (len(compact) > MAX_HAN_CHARS or any(c in _HAN_CLAUSE_PARTICLES for c in compact)):
            tags = _han_tags(compact)
        long_ok = (kana or compact.endswith(_INSTITUTION_ENDINGS)
                   or (tags is not None and len(tags) == 1 and tags[0][1] in ("nr", "ns", "nt", "nz"))
                   or (unit is not None and any(f"{o}{compact}{c}" in unit.text for o, c in ("《》", "「」", "『』"))))
        if long_ok:
            limit = MAX_LONG_HAN_CHARS
        if len(compact) > limit:
            return True
        if kana:  # Japanese particles are no clause signs; its names hold の, が ...
            return False
        if tags is not None:  # a particle is one when jieba reads it as one: not in 吗啡, 酒吧, 袁了凡
            return any(w in _HAN_CLAUSE_PARTICLES and flag[:1] in ("u", "y") for w, flag in tags)
        return len(compact) > 1 and compact[-1] in _HAN_CLAUSE_PARTICLES
    words = _WORD.findall(name)
    if unit is not None and _title_cased(name) and len(words) <= MAX_TITLE_WORDS and unit.writes(name):
        return False
    return bool(_LATIN_CLAUSE_PUNCTUATION.search(name)) or len(words) > MAX_NAME_WORDS


def value_type(name: str) -> str | None:
    """"date", "number" or None for a name (module docstring)."""
    s = re.sub(r"^(?:the|in|on|since|by|until)\s+", "", " ".join(name.split()).strip(" .,"), flags=re.IGNORECASE)
    if not s:
        return None
    s = unicodedata.normalize("NFKC", s)
    if _DATE.match(s):
        return "date"
    if _NUMBER.match(s):
        return "number"
    return None
