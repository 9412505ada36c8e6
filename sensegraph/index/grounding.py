"""Paper step 2.2, checked in code: is an extracted name really a name, and is it in its text?

Small models invent names, copy the prompt's examples, and answer with common nouns ("city",
"gasoline"), clauses ("just three weeks shy of his 42nd birthday") or dates typed as anything.
Everything here is checked against the text unit the record came from, with no LLM:

- `grounded`: the name occurs in the unit. Tolerant to case, punctuation, possessives and
  inflection ("Swedish" for "Sweden", "churches" for "church": two words match when they share a
  prefix of at least 4 letters that leaves at most 3 letters of the longer one), to titles and
  particles ("President Barack Obama" is grounded by "Barack Obama"), and to acronyms ("UN" for
  "United Nations" and back). A name of several content words is also grounded when at least
  half of them occur and one of those is capitalised mid-sentence in the unit ("Ebenezer
  Scrooge" in a unit that says only "Scrooge"), so a full name the model knows from other units
  survives, while "United States Air Force" is not grounded by "states" and "force"; a name
  none of whose words occur is invented. Chinese: the
  name, without spaces, is a substring of the unit.
- `generic`: a Latin-script name without digits whose words occur in the unit only in lower
  case, or capitalised only at the start of a sentence: a common noun, not a name ("fire" in
  "the fire spread"). A name the text capitalises mid-sentence ("the Board") is kept; one the
  model wrote all in lower case must be capitalised as a phrase ("paranormal activity" is not
  a name because the text has "Paranormal Military Squad"). Chinese
  has no case, and its common nouns can be real entities (樵夫, the woodcutter), so none is
  called generic there.
- `clause`: a name holding sentence punctuation, or longer than a name gets (more than
  `MAX_NAME_WORDS` words; Chinese: more than `MAX_HAN_CHARS` characters, or a clause particle
  such as 了 or 着).
- `value_type`: "date" for dates, years, decades and centuries ("1947", "March 3, 1947",
  "the 1990s", "19th century", "1947年"), "number" for amounts ("1 million", "42%"), else None.
  Such an entity gets that type, whatever the model said, and never the summary step's
  "unknown".

What fails is dropped and counted by the caller (extract.py), never silently.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_WORD = re.compile(r"[^\W_]+")
_POSSESSIVE = re.compile(r"['’]s\b", re.IGNORECASE)
# Sentence punctuation, or a comma followed by a phrase of three words or more.
_LATIN_CLAUSE_PUNCTUATION = re.compile(r"[;!?]|,\s*\w+\s+\w+\s+\w+")
_HAN_CLAUSE_PUNCTUATION = re.compile(r"[，。；：！？、“”‘’（）《》,;:!?]")
_HAN_CLAUSE_PARTICLES = set("了着吗呢吧")
_NOT_HAN_NAME = re.compile(r"[\s·•・\-_.]")

MAX_NAME_WORDS = 6
MAX_HAN_CHARS = 8
# Inflection tolerance: shared prefix of at least this many letters...
_STEM = 4
# ...leaving at most this many letters of the longer word ("Swedish"/"Sweden", "hammering").
_SUFFIX = 3

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
    rf"(?:early|late|mid|mid-)?\s*{_MONTH}(?:\s+{_ORDINAL})?,?(?:\s+{_YEAR})?",  # March, March 3, 1947
    rf"{_ORDINAL}\s+(?:of\s+)?{_MONTH},?(?:\s+{_YEAR})?",   # 3 March 1947
    r"\d{4}-\d{2}(?:-\d{2})?",                         # ISO
    r"\d{1,2}/\d{1,2}/\d{2,4}",
    rf"(?:spring|summer|autumn|fall|winter)\s+(?:of\s+)?{_YEAR}",
    r"[0-9〇零一二三四五六七八九十百千]+年(?:[0-9一二三四五六七八九十]+月)?(?:[0-9一二三四五六七八九十]+日)?",
    r"[0-9一二三四五六七八九十]+月(?:[0-9一二三四五六七八九十]+日)?",
]
_DATE = re.compile(r"^(?:" + "|".join(_DATE_FORMS) + r")$", re.IGNORECASE)
_NUMBER = re.compile(
    r"^(?:about\s+|over\s+|more than\s+|nearly\s+|some\s+)?[$€£¥]?\s*\d[\d,.]*\s*"
    r"(?:%|percent|per cent|thousand|million|billion|trillion|hundred|k|m|bn)?$"
    r"|^[0-9零一二三四五六七八九十百千万亿]+(?:万|亿|千|百)?(?:个|人|年|岁|里|丈|尺)?$",
    re.IGNORECASE)


def has_han(s: str) -> bool:
    return bool(_HAN.search(s))


def _words(s: str) -> list[str]:
    return _WORD.findall(_POSSESSIVE.sub("", s).casefold())


def _same_word(a: str, b: str) -> bool:
    if a == b:
        return True
    if a[:_STEM] != b[:_STEM] or a.isdigit() or b.isdigit():
        return False
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n >= _STEM and max(len(a), len(b)) - n <= _SUFFIX


# Where a sentence ends, in either script (a line break too: titles and list items).
_SENTENCE_BREAK = re.compile(r"[.!?。！？；;]+[\"”’」』）)]*\s|[。！？；]+[”’」』）)]*|\n+")


_ABBREVIATIONS = frozenset("mr mrs ms dr st prof jr sr vs etc no gen col capt lt sgt rev hon mt ft inc ltd co corp".split())


def _abbreviation(text: str, period: int) -> bool:
    """Whether the full stop at `period` ends an abbreviation or an initial ("Mr.", "J. Smith")."""
    if text[period] != ".":
        return False
    m = re.search(r"(\w+)$", text[max(0, period - 12):period])
    return bool(m) and (m.group(1).casefold() in _ABBREVIATIONS or (len(m.group(1)) == 1 and m.group(1).isupper()))


@dataclass(slots=True)
class _Token:
    folded: str
    original: str
    sentence_start: bool
    sentence: int = 0  # index of its sentence in the unit


@dataclass
class UnitText:
    """One text unit, prepared once for checking all the names of its answers."""

    text: str
    tokens: list[_Token] = field(default_factory=list)
    words: dict[str, list[_Token]] = field(default_factory=dict)  # folded word -> its occurrences
    by_prefix: dict[str, set[str]] = field(default_factory=dict)
    initials: set[str] = field(default_factory=set)  # acronyms of capitalised word runs: "un"
    compact: str = ""                                # Han text without spaces
    sentence_starts: list[int] = field(default_factory=list)  # character offsets

    def sentence_at(self, offset: int) -> int:
        return bisect.bisect_right(self.sentence_starts, offset) - 1

    @classmethod
    def of(cls, text: str) -> UnitText:
        # Built for every text unit (extraction checks its answers' names against it, the weak
        # edges look their sentences up in it): one pass over the words, the sentence of each
        # found by walking the sentence starts rather than a search per word.
        unit = cls(text)
        starts = unit.sentence_starts = [0] + [m.end() for m in _SENTENCE_BREAK.finditer(text)
                                               if m.end() < len(text) and not _abbreviation(text, m.start())]
        # Offsets are those of `text`: the possessive is blanked out, not removed.
        cleaned = _POSSESSIVE.sub(lambda m: " " * len(m.group(0)), text)
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
            folded = word.casefold()
            token = _Token(folded, word, sentence != previous, sentence)
            tokens.append(token)
            if folded in words:
                words[folded].append(token)
            else:
                words[folded] = [token]
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
        if has_han(text):
            unit.compact = _NOT_HAN_NAME.sub("", text)
        return unit

    def forms(self, word: str) -> list[str]:
        """The unit's words that are `word` or an inflection of it."""
        if len(word) < _STEM:
            return [word] if word in self.words else []
        return [w for w in self.by_prefix.get(word[:_STEM], ()) if _same_word(word, w)]

    def has_word(self, word: str) -> bool:
        return word in self.words or bool(self.forms(word))


def _content_words(name: str) -> list[str]:
    words = _words(name)
    content = [w for w in words if w not in PARTICLES and w not in TITLES]
    return content or [w for w in words if w not in PARTICLES] or words


def _acronym(name: str) -> str | None:
    """The letters of an all-capitals name of 2-6 letters ("UN", "U.S.", "NASA")."""
    letters = re.sub(r"[.\s&]", "", name)
    return letters.casefold() if 2 <= len(letters) <= 6 and letters.isalpha() and letters.isupper() else None


def _written_as_name(word: str, unit: UnitText) -> bool:
    """The unit capitalises `word` mid-sentence, or only ever writes it capitalised."""
    tokens = [t for form in unit.forms(word) for t in unit.words[form]]
    upper = [t for t in tokens if t.original[:1].isupper()]
    return any(not t.sentence_start for t in upper) or (bool(upper) and len(upper) == len(tokens))


def grounded(name: str, unit: UnitText) -> bool:
    """Whether `name` (as the model wrote it) occurs in the unit, tolerantly (module docstring)."""
    if has_han(name):
        compact = _NOT_HAN_NAME.sub("", name)
        return bool(compact) and compact in (unit.compact or _NOT_HAN_NAME.sub("", unit.text))
    words = _content_words(name)
    if not words:
        return False
    found = [w for w in words if unit.has_word(w)]
    if len(found) == len(words):
        return True
    # Part of a longer name ("Scrooge" for "Ebenezer Scrooge"): the part must be written as a
    # name in the text, not a common word the name happens to hold ("force" does not
    # ground "United States Air Force").
    if len(words) >= 2 and 2 * len(found) >= len(words) and any(_written_as_name(w, unit) for w in found):
        return True
    acronym = _acronym(name)
    if acronym and acronym in unit.initials:
        return True
    # The text writes the acronym of a name the model spelled out ("NATO" for the full name).
    spelled = [w for w in _words(name) if w not in PARTICLES]
    return len(spelled) >= 2 and "".join(w[0] for w in spelled) in unit.words


def sentences_of(name: str, unit: UnitText) -> set[int]:
    """The sentences of the unit that mention `name`: for Chinese where it occurs as a substring;
    else where at least half its content words occur (all of a one-word name), as `grounded`."""
    if has_han(name):
        compact = _NOT_HAN_NAME.sub("", name)
        if not compact:
            return set()
        found, start = set(), unit.text.find(compact)
        while start >= 0:
            found.add(unit.sentence_at(start))
            start = unit.text.find(compact, start + 1)
        return found
    words = _content_words(name)
    per_word = [{t.sentence for form in unit.forms(w) for t in unit.words[form]} for w in words]
    need = len(words) if len(words) < 2 else (len(words) + 1) // 2
    counts: dict[int, int] = {}
    for sentences in per_word:
        for i in sentences:
            counts[i] = counts.get(i, 0) + 1
    return {i for i, n in counts.items() if n >= need}


def generic(name: str, unit: UnitText) -> bool:
    """Whether a Latin-script name is a common noun: the unit never capitalises its words
    mid-sentence (module docstring). Names with digits, Han or no occurrence are not judged."""
    if has_han(name) or any(c.isdigit() for c in name) or _acronym(name):
        return False
    words = _content_words(name)
    occurrences = [t for w in words for form in unit.forms(w) for t in unit.words[form]]
    if not occurrences:
        return False
    # A name the model wrote in lower case is judged as a phrase: "paranormal activity" is not
    # made a name by "Paranormal Military Squad". Its first word must be capitalised where the
    # next word follows it.
    phrase = len(words) >= 2 and not any(c.isupper() for c in name)
    follows = set(unit.forms(words[1])) if phrase else set()
    index = {id(t): i for i, t in enumerate(unit.tokens)} if phrase else {}
    for t in occurrences:
        if t.original[:1].isupper() and (not t.sentence_start or (t.original.isupper() and len(t.original) > 1)):
            if not phrase:
                return False
            i = index[id(t)]
            if t.folded in unit.forms(words[0]) and i + 1 < len(unit.tokens) and unit.tokens[i + 1].folded in follows:
                return False
    # Only lower-case or sentence-initial occurrences: a common noun, unless every occurrence
    # opens a sentence and the model capitalised it (a name that happens to start sentences).
    return not (name[:1].isupper() and all(t.sentence_start for t in occurrences))


def clause(name: str) -> bool:
    """Whether a "name" is a clause or phrase rather than a name (module docstring)."""
    if has_han(name):
        compact = re.sub(r"\s", "", name)
        return (bool(_HAN_CLAUSE_PUNCTUATION.search(compact)) or len(compact) > MAX_HAN_CHARS
                or any(c in _HAN_CLAUSE_PARTICLES for c in compact))
    return bool(_LATIN_CLAUSE_PUNCTUATION.search(name)) or len(_words(name)) > MAX_NAME_WORDS


def value_type(name: str) -> str | None:
    """"date", "number" or None for a name (module docstring)."""
    s = re.sub(r"^(?:the|in|on|since|by|until)\s+", "", " ".join(name.split()).strip(" .,"), flags=re.IGNORECASE)
    if not s:
        return None
    if _DATE.match(s):
        return "date"
    if _NUMBER.match(s):
        return "number"
    return None
