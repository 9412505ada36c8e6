"""Checks on a community report's answer, in code, against the context the model was given.

Small models write findings that cite nothing, copy the context's bookkeeping ("Degree of
connection: 3"), add outside knowledge ("ASCAP ... has over 1 million members") and rate a
two-entity community 9; strong models derive figures from the context ("a 50% increase" for a
fleet that grew from 200 to 300 ships), and a correct report must lose nothing. Each finding of
an LLM-written report goes through these checks, in this order; a dropped finding is counted
once, under the first check it fails:

1. bookkeeping (`findings_bookkeeping`): its summary, or at least half the sentences of its
   explanation, restate the context's bookkeeping: degrees and combined degrees with a number,
   `id 12`, `human_readable_id`, the table headers (`-----Entities-----`, `id,entity,type`), or a
   citation of "Degrees (4, 3)". Conservative: "its degree of influence" (no number) passes, and
   one such sentence in a longer explanation is tolerated.
2. citations (`findings_uncited`): references are read in the variants small models write
   (`[Data: Entities (5, 7); Relationships (23, +more)]`, no "Data:", `Entities(5,7)`, singular
   kinds, `(Entity 5)`, Chinese brackets, kind names and commas) and rewritten in the prompt's
   form. An id that is not in the context (its tables' id column, the sub-community report
   numbers, or an id a sub-community report shown there cites) is removed from the text and
   counted (`citations_invalid`); a finding left with no valid citation is dropped.
3. unsupported numbers and dates (`findings_unsupported`): every number in the finding's summary
   and explanation (digits, with thousands separators, decimals, ordinals, `1.5 million`, `$2bn`,
   `3万`, `one million`; bare number words are too common in prose to check) is checked by value
   against the context's text (descriptions, titles, claims, sub-community reports: not the id
   and degree columns, so a degree is no support). The context's values are those it states, in
   digits, words (`three`, `a million`) or Chinese numerals (`一九四七`, `二十`), however scaled
   (`1.5 million` = `1,500,000` = `150万`); a range's first end takes the second's scale and
   percent sign (`3-4 million`, `10-15%`). The month and day of a date are no values (its year
   is), and neither are the row counts of the tables. A number is supported when
   - the context states its value, to the precision written (`1.5 million` for 1,487,000; `15`
     is not 15 million);
   - it is a bound or an estimate (over, more than, nearly, about, some, under, `超过`, `近`, `约`,
     `左右` ...) and a context figure of its kind lies in what it stands for (a quantity, not a
     year; for a duration a stated duration; for a percentage a percentage). A bound reaches one
     step from its number, the step being the place of its last non-zero digit, five times that
     for a 5, at most half the number (20: 10, 25: 5, 4,000: 1,000): over N (and `N多`) is N to
     N + step, nearly N is N - step / 2 to N, under N is N - step to N, about N is within 10%
     ("over 4,000 people" for 4,200, "over 20 years" for 27, "nearly 30 years" for 27);
   - a percentage: the change between two quantities or percentages stated about one subject,
     up or down, or the share of one in the other, or a context ratio, equal to it at the
     precision written ("a 50% increase" from 200 to 300 ships, "67%" for 10 of 15); "N
     percentage points": the difference of two such percentages; "N-fold", "N times more": the
     ratio of two such quantities. The subject of a figure is whom its line is about: a table
     row is about the entities it names (entity, source, target, object), so an entity's
     description, relationships and claims are about it; a sub-community report is about
     itself. (Any two figures of the context would derive nearly every duration from a context
     rich in years.);
   - a duration ("N years", "N-year", "aged N", "N decades", `N年`, `N岁`): the difference of two
     years stated about one subject, exactly (N decades: within five years), or within its
     bound ("over 20 years" for 1990 and 2012, "nearly 30 years" for 1985 and 2012);
   - a century ("the 19th century", "20th-century", `19世纪`): a context year in it (1800-1900
     for the 19th); a decade ("the 1990s", `90年代`): a context year in it ("the 1800s": in that
     century);
   - a range ("between 1990 and 2000", "3-4 million", `300万至400万`): both ends are supported, or
     it rounds a context figure: round tens of years at most a century apart around a context
     year, or any other figure inside a range whose top is at most twice its bottom;
   - a ratio ("1 in 4", "1 out of 4"): a context ratio ("one in four", "3 of the 5", "a quarter",
     `三分之一`) or percentage of the same value, within 2%; its two numbers occurring apart is
     no support ("1 in 100" for a context with a 1 and a 100);
   - a count of a record kind ("5 entities", "2 relationships", `3个实体`): as many rows of that
     table in the context;
   - an ISO date (`1947-03-01`) or a day of a month (`1 June`, `6月1日`): a context date with that
     day; a month name or `N月`: one of the context's months (named, or of its dates).
   A bare integer from 1000 to 2100 is read as a year: it must be stated ("around 1950": within
   five years of a context year), and nothing is derived from it but durations, centuries and
   decades. A finding with one unsupported number or month is dropped. Limitations: a number is
   checked, not the statement around it ("founded in 1947" passes when the context only says
   someone joined in 1947), and a derived figure passes when any two figures about one subject
   give it, whatever they measure and whichever way a change goes ("a 25% rise" for a fall from
   40 to 30); a figure derived across subjects ("X was founded in 1985", "Y joined in 2010", no
   row naming both) is dropped.
4. unknown names (`findings_unknown_names`, flagged, never dropped: small models paraphrase):
   runs of two or more capitalised words ("Bank of America"), and for Chinese the names the
   model sets in 《》「」『』“” marks, that are not in the context, neither whole nor every word.
   Chinese names without such marks are not detected (there is no segmenter in the base
   install).

A report whose findings are all dropped keeps its title and summary with no findings
(`reports_without_findings`): the report is never lost. Citations in the report's summary are
rewritten the same way, never dropped, and its sentences are checked like a finding's numbers: a
sentence with an unsupported number or month is removed and counted
(`summary_sentences_unsupported`); when every sentence would go, the summary is kept whole and its
sentences only counted.

The rating is capped by the community's size, counted as min(entities, internal relationships
+ 1) so that a community with few edges counts as small however many entities it holds (the
caller counts extracted relationships only, not co-occurrence edges): a rating of 8 or more claims
the community is central to the collection, which a handful of entities rarely is. Capped
ratings are counted (`ratings_capped`), and the caller replaces the model's explanation, which
argues for the rating it gave:

    size      1    2    3-4    5-9    10+
    cap       2    3     5      7     10
"""
from __future__ import annotations

import bisect
import csv
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..query.citations import citation_text

COUNTS = (
    "reports_checked", "findings_written", "findings_kept", "findings_bookkeeping", "findings_uncited",
    "findings_unsupported", "findings_unknown_names", "citations_invalid", "reports_without_findings",
    "summary_sentences_unsupported", "ratings_capped",
)
KINDS = ("Entities", "Relationships", "Claims", "Reports")

# (size at most, cap), size = min(entities, relationships + 1); larger sizes are not capped.
RATING_CAPS = ((1, 2.0), (2, 3.0), (4, 5.0), (9, 7.0))


def new_counts() -> Counter[str]:
    return Counter({name: 0 for name in COUNTS})


def rating_cap(entities: int, relationships: int) -> float:
    size = min(entities, relationships + 1)
    return next((cap for most, cap in RATING_CAPS if size <= most), 10.0)


def cap_rating(rating: float, entities: int, relationships: int) -> tuple[float, bool]:
    """The rating bounded by the community's size; and whether it was lowered."""
    cap = rating_cap(entities, relationships)
    return (cap, True) if rating > cap else (rating, False)


# -- the context ------------------------------------------------------------------------------

# Section names of the context (community_reports.py) -> the citation kind of their id column.
_SECTIONS = {"entities": "Entities", "relationships": "Relationships", "claims": "Claims",
             "sub-community reports": "Reports"}
_NOT_EVIDENCE = {"id", "degree", "combined_degree"}  # bookkeeping columns support no statement
_SUBJECTS = {"entity", "source", "target", "object"}  # the columns that say whom a row is about
_SECTION_LINE = re.compile(r"^-{3,}\s*(.+?)\s*-{3,}$")
_REPORT_LINE = re.compile(r"^## Report (\d+):\s?(.*)$")


@dataclass
class Context:
    """What a community's context holds, as the model saw it."""

    ids: dict[str, set[int]] = field(default_factory=lambda: {k: set() for k in KINDS})
    evidence: str = ""                       # its text without the id and degree columns, NFKC
    numbers: set[float] = field(default_factory=set)  # every value its evidence states
    months: set[int] = field(default_factory=set)
    words: set[str] = field(default_factory=set)
    folded: str = ""                         # evidence, case-folded, whitespace collapsed
    figures: _Figures = field(default_factory=lambda: _Figures())  # its numbers by what they support


def read_context(context: str) -> Context:
    out = Context()
    texts: list[str] = []
    about: list[frozenset[str]] = []  # per line of texts, whom it is about (see _context_figures)
    rows: Counter[str] = Counter()
    kind, header, report = None, None, frozenset()
    for line in context.splitlines():
        if m := _SECTION_LINE.match(line.strip()):
            kind, header = _SECTIONS.get(m.group(1).lower()), None
            continue
        if not line.strip() or kind is None:
            if kind == "Reports":
                texts.append(line)
                about.append(report)
            continue
        if kind == "Reports":
            if m := _REPORT_LINE.match(line):
                out.ids["Reports"].add(int(m.group(1)))
                rows["Reports"] += 1
                line = m.group(2)
                report = frozenset({f"#report {m.group(1)}"})
            # What a sub-community report cites was checked against that community's context.
            for k, refs, _ in parse_citations(line):
                if k in out.ids:
                    out.ids[k].update(refs)
            # its citations are no evidence
            texts.append(unicodedata.normalize("NFKC", rewrite_citations(line, {}).text))
            about.append(report)
            continue
        cells = next(csv.reader([line]), [])
        if header is None:
            header = [c.strip().lower() for c in cells]
            continue
        if cells and cells[0].strip().isdigit():
            out.ids[kind].add(int(cells[0]))
        rows[kind] += 1
        named = zip(cells, header + [""] * len(cells))
        texts.append(unicodedata.normalize("NFKC", " , ".join(c for c, name in named if name not in _NOT_EVIDENCE)))
        about.append(frozenset(_fold(c) for c, name in zip(cells, header) if name in _SUBJECTS
                               and c.strip() and c.strip().upper() != "NONE") or frozenset({f"#row {len(texts)}"}))
    out.evidence = "\n".join(texts)
    out.figures = _context_figures(out.evidence, rows, about)
    out.numbers = set(out.figures.stated)
    out.months = _context_months(out.evidence)
    out.folded = _fold(out.evidence)
    out.words = set(re.findall(r"\w+", out.folded))
    return out


# -- citations --------------------------------------------------------------------------------

_ALIASES = {
    "entity": "Entities", "entities": "Entities", "实体": "Entities",
    "relationship": "Relationships", "relationships": "Relationships", "relation": "Relationships",
    "relations": "Relationships", "关系": "Relationships",
    "claim": "Claims", "claims": "Claims", "covariate": "Claims", "covariates": "Claims", "声明": "Claims",
    "主张": "Claims",
    "report": "Reports", "reports": "Reports", "community": "Reports", "communities": "Reports",
    "community report": "Reports", "community reports": "Reports", "sub-community report": "Reports",
    "sub-community reports": "Reports", "subcommunity reports": "Reports", "报告": "Reports",
    "社区报告": "Reports", "子社区报告": "Reports",
    # not records of a report's context: always invalid, so removed and counted
    "source": "Sources", "sources": "Sources", "text unit": "Sources", "text units": "Sources",
    "来源": "Sources", "原文": "Sources",
}
_DEGREE_KIND = re.compile(r"^(?:combined[\s_-]*)?degrees?$|^度数$|^(?:组合|综合)?度$", re.IGNORECASE)
_CONNECTORS = {"and", "or", "&", "data", "和", "及", "与", "以及"}
_KNOWN = "|".join(r"[\s_-]*".join(re.escape(w) for w in re.split(r"[ -]", a))
                  for a in sorted(_ALIASES, key=len, reverse=True))
_IDS = r"\d+(?:\s*[,，、]\s*\d+)*(?:\s*[,，、]?\s*\+\s*more)?"
_PREFIX = r"(?:(?:Data|数据)\s*[:：]\s*)"
# a kind is at most four words ("and sub-community reports"), which keeps the search linear
_PART = re.compile(r"(?P<kind>[A-Za-z\u4e00-\u9fff][A-Za-z\u4e00-\u9fff_-]{0,30}"
                   r"(?:\s+[A-Za-z\u4e00-\u9fff_-]{1,30}){0,3}?)\s*"
                   r"(?:[(（](?P<paren>[^()（）]*)[)）]|[:：]?\s*(?P<bare>\d[\d\s,，、]*(?:\+\s*more)?))")
_BARE_PART = rf"(?:{_KNOWN})\s*[(（]\s*{_IDS}\s*[)）]"
_CITATION = re.compile(
    r"(?P<square>[\[【](?P<sq>[^\[\]【】]*)[\]】])"
    r"|(?P<round>[(（]\s*(?P<rd>(?:[^()（）]|[(（][^()（）]*[)）])*)[)）])"
    rf"|(?P<plain>(?<![A-Za-z]){_PREFIX}?{_BARE_PART}(?:\s*[;；,，]\s*{_BARE_PART})*)",
    re.IGNORECASE)


def _kind(word: str) -> tuple[str | None, bool]:
    """(citation kind or None, whether the word was only that kind, maybe after a connector)."""
    w = re.sub(r"\s+", " ", word.replace("_", " ")).strip().lower()
    tokens = w.split(" ")
    for start in range(len(tokens)):
        tail = " ".join(tokens[start:])
        hit = _ALIASES.get(tail) or _ALIASES.get(tail.replace(" ", "-")) or \
            ("_degree" if _DEGREE_KIND.match(tail) else None)
        if hit is None and re.fullmatch(r"[\u4e00-\u9fff]+", tail):
            stripped = re.sub(r"^(?:以及|和|及|与)", "", tail)
            hit = _ALIASES.get(stripped) or ("_degree" if _DEGREE_KIND.match(stripped) else None)
        if hit:
            return hit, all(t in _CONNECTORS for t in tokens[:start])
    return None, False


def _parts(body: str) -> tuple[list[tuple[str, list[int], bool]], bool]:
    """The (kind, ids, +more) parts of a citation's body, kind None for an unknown one; and
    whether the body holds nothing but known parts."""
    parts, pure, last = [], True, 0
    for m in _PART.finditer(body):
        ids_text = m.group("paren") if m.group("paren") is not None else m.group("bare")
        if not re.fullmatch(r"[\d\s,，、;；+]*(?:more|等|更多)?[\d\s,，、;；+]*", ids_text, re.IGNORECASE) \
                or not re.search(r"\d", ids_text):
            continue
        kind, only = _kind(m.group("kind"))
        pure = pure and kind is not None and only and not re.search(r"\w", body[last:m.start()])
        last = m.end()
        parts.append((kind, [int(n) for n in re.findall(r"\d+", ids_text)],
                      bool(re.search(r"more|等|更多", ids_text, re.IGNORECASE))))
    pure = pure and bool(parts) and not re.search(r"\w", body[last:])
    return parts, pure


def parse_citations(text: str) -> list[tuple[str | None, list[int], bool]]:
    """Every (kind, ids, had_more) reference in `text`, in order; kind None when unknown."""
    out: list[tuple[str | None, list[int], bool]] = []
    for m in _CITATION.finditer(text):
        group, body, citation = _citation_body(m)
        if citation:
            out += _parts(body)[0]
        elif body:
            out += parse_citations(body)
    return out


def _citation_body(m: re.Match[str]) -> tuple[str, str, bool]:
    """The group of a match holding its body, the body (without "Data:"), and whether the
    match is a citation (else ordinary brackets, whose body may still hold citations)."""
    if m.group("plain") is not None:
        body = m.group("plain")
        prefixed = re.match(rf"\s*{_PREFIX}", body, re.IGNORECASE)
        return "plain", body[prefixed.end():] if prefixed else body, True
    group = "sq" if m.group("square") is not None else "rd"
    body = m.group(group)
    if prefixed := re.match(rf"\s*{_PREFIX}", body, re.IGNORECASE):
        return group, body[prefixed.end():], True
    parts, pure = _parts(body)
    if group == "sq":  # "[Entities (5)]": a known kind is enough
        return group, body, pure or any(k is not None and k != "_degree" for k, _, _ in parts)
    return group, body, pure  # "(Entity 5)", not "(born 1947)" nor "(see Entities (5))"


@dataclass
class Rewritten:
    text: str
    valid: int = 0             # valid ids cited
    invalid: int = 0           # ids removed
    bookkeeping: bool = False  # cites the degree columns ("[Data: Degrees (4, 3)]")


def rewrite_citations(text: str, valid: dict[str, set[int]]) -> Rewritten:
    """`text` with every reference in the prompt's form, keeping only ids in `valid`."""
    out = Rewritten(text)

    def one(m: re.Match[str]) -> str:
        group, body, citation = _citation_body(m)
        if not citation:
            inner = rewrite_citations(body, valid)
            out.valid += inner.valid
            out.invalid += inner.invalid
            out.bookkeeping |= inner.bookkeeping
            whole, at = m.group(0), m.start()
            return whole[:m.start(group) - at] + inner.text + whole[m.end(group) - at:]
        kept: dict[str, list[int]] = {}
        more: set[str] = set()
        # "[Data: Degrees (4, 3)]" cites the bookkeeping as if it were data; "(degree: 3)" in a
        # sentence is only removed
        explicit = group != "rd" or body != m.group("rd")
        for kind, refs, had_more in _parts(body)[0]:
            out.bookkeeping |= kind == "_degree" and explicit
            for ref in refs:
                if kind in valid and ref in valid[kind]:
                    if ref not in kept.setdefault(kind, []):
                        kept[kind].append(ref)
                        out.valid += 1
                else:
                    out.invalid += 1
            if had_more and kind in valid:
                more.add(kind)
        return citation_text(kept, KINDS, more)

    new = _CITATION.sub(one, text)
    new = re.sub(r"(\[Data: [^\[\]]*\])\]+", r"\1", new)  # "[Data: Entities (2)]]"
    # a removed reference can leave a space before punctuation, or two spaces, behind
    new = re.sub(r"[ \t]+([.,;:!?。，；：、])", r"\1", new)
    out.text = re.sub(r"[ \t]{2,}", " ", new).strip()
    return out


def _without_citations(text: str) -> str:
    return re.sub(r"\[Data: [^\[\]]*\]", " ", text)


# -- bookkeeping ------------------------------------------------------------------------------

_BOOKKEEPING = re.compile(
    r"combined[\s_-]*degrees?"
    r"|\bdegrees?(?:\s+of\s+(?:connections?|connectivity|centrality))?"
    r"\s*(?:[:=：]|is|was|of|equals?|equal\s+to|为|是)?\s*\d"
    r"|\bhuman[\s_-]*readable[\s_-]*ids?\b"
    r"|(?<![\w-])id\s*(?:[:#=：]|number|no\.?)?\s*\d"
    r"|-{3,}\s*(?:entities|relationships|claims|sub-community\s+reports)\s*-{3,}"
    r"|\bid\s*,\s*(?:entity|source)\s*,"
    r"|(?:度数|连接度|节点度|组合度|综合度|联合度)\s*(?:[:：]|为|是|达到)?\s*\d",
    re.IGNORECASE)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？；;])\s*", text) if re.search(r"\w", s)]


def is_bookkeeping(summary: str, explanation: str) -> bool:
    if _BOOKKEEPING.search(_without_citations(summary)):
        return True
    sentences = _sentences(_without_citations(explanation))
    hits = sum(bool(_BOOKKEEPING.search(s)) for s in sentences)
    return hits > 0 and 2 * hits >= len(sentences)


# -- numbers and dates ------------------------------------------------------------------------

_SCALES = {"hundred": 1e2, "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12,
           "百": 1e2, "千": 1e3, "万": 1e4, "百万": 1e6, "千万": 1e7, "亿": 1e8,
           "k": 1e3, "m": 1e6, "mn": 1e6, "b": 1e9, "bn": 1e9}
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<dec>\d+))?"
    r"(?P<suffix>st|nd|rd|th|['’]s|s)?"
    r"(?P<pct>\s*(?:%|percent\b|per\s+cent\b))?"
    r"(?:\s+(?P<scale>hundred|thousand|million|billion|trillion)\b|\s*(?P<cjk>百万|千万|万|亿|千)"
    r"|(?P<abbr>bn|mn|[kmb]))?"
    r"(?![A-Za-z0-9_])", re.IGNORECASE)
_CURRENCY = "$€£¥"
_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_UNITS.update({w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())})
_UNITS["dozen"] = 12
# (longest first; a lookbehind rather than \b at the start lets the search skip ahead faster)
_WORD_NUMBER = re.compile(
    r"(?<![A-Za-z])(?P<a>" + "|".join(sorted(_UNITS, key=len, reverse=True)) + r")"
    r"(?:-(?P<b>" + "|".join(list(_UNITS)[1:10]) + r"))?"
    r"(?:\s+(?P<scale>hundred|thousand|million|billion|trillion))?(?![A-Za-z])", re.IGNORECASE)
_A_SCALE = re.compile(r"\ban?\s+(?P<scale>hundred|thousand|million|billion|trillion)\b", re.IGNORECASE)
_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
              "八": 8, "九": 9}
_CN_NUMBER = re.compile("[零〇一二两三四五六七八九十百千万亿]+")
_CN_FRACTION = re.compile(r"(?P<den>[零〇一二两三四五六七八九十百千万亿]+|\d+)分之(?P<num>[零〇一二两三四五六七八九十百千万亿]+|\d+(?:\.\d+)?)")
_FRACTION_WORD = re.compile(r"half|third|quarter", re.IGNORECASE)  # a cheap test before the costly search
_WORD_FRACTIONS = re.compile(r"\b(?:(?P<half>half)|(?:a|one)\s+(?P<third>third)|(?:a|one)\s+(?P<quarter>quarter)"
                             r"|two[\s-]+(?P<thirds>thirds)|three[\s-]+(?P<quarters>quarters))\b", re.IGNORECASE)
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")
_MONTH_NAME = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_MONTH_IN_FINDING = re.compile(
    r"\b(?:(?P<m>January|February|March|April|June|July|August|September|October|November|December)"
    r"|(?P<may>May)(?=\s+\d)|(?<=\d\s)(?P<may2>May))\b")

# A word starting with a month's first three letters ("mar" also for "Mars": the check only
# ever lets more through), one pass over the context instead of one per month.
_MONTH_START = re.compile(r"\b(" + "|".join(sorted({m[:3] for m in MONTHS})) + ")")
# a cheap test before the search for days of a month
_MONTH_START_CASED = re.compile(r"\b(?:" + "|".join(sorted({m[:3].title() for m in MONTHS})) + ")")


def _context_months(text: str) -> set[int]:
    folded = text.lower()
    starts = set(_MONTH_START.findall(folded))
    months = {i + 1 for i, name in enumerate(MONTHS) if name[:3] in starts}
    months |= {int(m) for m in re.findall(r"\b\d{4}[-/.](\d{1,2})(?:[-/.]\d{1,2})?\b", text) if 1 <= int(m) <= 12}
    months |= {int(m) for m in re.findall(r"(\d{1,2})\s*月", unicodedata.normalize("NFKC", text)) if 1 <= int(m) <= 12}
    return months


# (what must not come before a date is checked in code: a lookbehind first makes the search slow)
_ISO_DATE = re.compile(r"(?P<y>\d{4})(?P<sep>[-/.])(?P<m>\d{1,2})(?:(?P=sep)(?P<d>\d{1,2}))?(?![\d.,]\d|\d)")
_MONTH_DAY = re.compile(rf"(?P<m>{_MONTH_NAME})\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?(?![\d,.]\d|\d)")
_DAY_MONTH = re.compile(rf"(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m>{_MONTH_NAME})\b")
_CN_MONTH_DAY = re.compile(r"(?P<m>\d{1,2})\s*月(?:\s*(?P<d>\d{1,2})\s*[日号])?")
YEARS = (1000, 2100)  # a bare integer in this range is read as a year

# The words that make a number a bound or an estimate, before it ("over 20 years", "近30年") or
# after it ("20+ years", "20多年", "30年左右").
_QUALIFIER_BEFORE = re.compile(
    r"(?:\b(?P<en>(?:just\s+|well\s+)?(?:over|more\s+than|above|upwards\s+of|in\s+excess\s+of|at\s+least|nearly"
    r"|almost|close\s+to|about|around|approximately|approx\.|roughly|some|circa|under|less\s+than|fewer\s+than|below"
    r"|at\s+most|up\s+to|within))\s+(?:(?:a|an|the)\s+)?|(?P<tilde>~)\s*|(?P<zh>将近|接近|近乎|近|大约|约|超过|逾|不到|不足)\s*)$",
    re.IGNORECASE)
_QUALIFIERS = {
    "over": "over", "more than": "over", "above": "over", "upwards of": "over", "in excess of": "over",
    "at least": "over", "well over": "over", "just over": "over", "超过": "over", "逾": "over",
    "nearly": "nearly", "almost": "nearly", "close to": "nearly", "just under": "nearly", "将近": "nearly",
    "接近": "nearly", "近乎": "nearly", "近": "nearly",
    "about": "about", "around": "about", "approximately": "about", "approx.": "about", "roughly": "about",
    "some": "about", "circa": "about", "~": "about", "大约": "about", "约": "about",
    "under": "under", "less than": "under", "fewer than": "under", "below": "under", "at most": "under",
    "up to": "under", "within": "under", "不到": "under", "不足": "under",
}
_QUALIFIER_AFTER = re.compile(r"\s*(?:(?P<over>\+|-?\s*plus\b|\s+or\s+more\b|以上)|(?P<more>多|余)|(?P<about>左右)"
                              r"|(?P<under>以下|以内))", re.IGNORECASE)
_DURATION = re.compile(r"(?P<plus>\s*\+|\s*-?\s*plus)?\s*-?\s*(?:(?P<years>years?|yrs?)|(?P<decades>decades?))\b"
                       r"|\s*(?P<more>多|余)?\s*(?:个)?\s*(?:年(?!代|级|度|份)|岁)(?P<after>左右|以上|多)?", re.IGNORECASE)
_AGE = re.compile(r"\b(?:aged|age\s+of|at\s+age)\s+$", re.IGNORECASE)
_CENTURY = re.compile(r"(?:\s*(?:,|and|or|to|through|-|–|—)\s*(?:(?:early|late|mid)[\s-]+)?\d{1,2}(?:st|nd|rd|th))*"
                      r"\s*-?\s*centur(?:y|ies)\b"
                      r"|\s*世纪", re.IGNORECASE)
_CN_DECADE = re.compile(r"\s*年代")
_POINTS = re.compile(r"\s*percentage\s+points?\b|\s*个百分点", re.IGNORECASE)
_MULTIPLE = re.compile(r"\s*-?\s*fold\b|\s+times\s+(?:more|larger|bigger|higher|greater|as|the|faster|longer|over)\b"
                       r"|\s*倍", re.IGNORECASE)
_COUNT_KINDS = {"entit": "Entities", "relation": "Relationships", "claim": "Claims", "communit": "Reports",
                "report": "Reports", "sub-communit": "Reports", "subcommunit": "Reports",
                "实体": "Entities", "关系": "Relationships", "声明": "Claims", "主张": "Claims", "社区": "Reports",
                "报告": "Reports"}
_COUNT = re.compile(r"\s+(?:[A-Za-z-]+\s+)?(?P<en>entit(?:y|ies)|relationships?|relations|claims?"
                    r"|(?:sub-?)?communit(?:y|ies)|(?:sub-community\s+)?reports?)\b"
                    r"|\s*(?:个|条|项|份)\s*(?P<zh>实体|关系|声明|主张|社区|报告)", re.IGNORECASE)
_RANGE = re.compile(r"\s*年?\s*(?:-|–|—|~|至|到)\s*|\s+to\s+|\s+and\s+")
_RATIO = re.compile(r"\s+(?:in|out\s+of)(?:\s+(?:every|each))?\s+", re.IGNORECASE)
_CONTEXT_RATIO = re.compile(r"\s+(?:in|out\s+of|of)(?:\s+(?:every|each|the|its|their|all))?\s+", re.IGNORECASE)
_TIME_UNIT = re.compile(r"\s*-?\s*(?:years?|months?|weeks?|days?|hours?|minutes?|decades?|年|个月|天)", re.IGNORECASE)


@dataclass
class _Num:
    """A number as written: its place in the text, its value and the precision it is written to."""

    start: int
    end: int
    value: float
    unit: float              # 1 for "15", 0.1 for "1.5", 100,000 for "1.5 million"
    percent: bool = False
    factor: float = 1.0      # its scale ("million": 1e6)
    suffix: str = ""         # "th" of "19th", "s" of "1990s"
    year: bool = False       # a bare integer in YEARS
    word: str = ""           # written in words: the words


def _digit_numbers(text: str) -> list[_Num]:
    out = []
    for m in _NUMBER.finditer(text):
        abbr = m.group("abbr")
        if abbr and len(abbr) == 1 and (m.start() == 0 or text[m.start() - 1] not in _CURRENCY):
            continue  # "3M", "5k" without a currency: a name, not a number
        digits, dec = m.group("int"), m.group("dec")
        scale = m.group("scale") or m.group("cjk") or abbr
        factor = _SCALES[scale.lower()] if scale else 1.0
        value = float(digits.replace(",", "") + ("." + dec if dec else ""))
        unit = 10.0 ** -len(dec) if dec else 1.0
        # "1.5 million", "2 million": to a tenth of the scale at least
        unit = factor * min(unit, 0.1) if factor >= 1e3 else unit * factor if dec else 1.0
        suffix = (m.group("suffix") or "").lower().replace("’", "'")
        pct = bool(m.group("pct"))
        year = not (dec or scale or pct or suffix or "," in digits) and YEARS[0] <= value <= YEARS[1]
        out.append(_Num(m.start(), m.end(), round(value * factor, 6), unit, pct, factor, suffix, year))
    return out


def _word_numbers(text: str, *, scaled_only: bool) -> list[_Num]:
    """Numbers in words; a finding's bare number words are too common in prose ("one of") to check."""
    out = []
    for m in (*_WORD_NUMBER.finditer(text), *_A_SCALE.finditer(text)):
        if scaled_only and not m.group("scale"):
            continue
        a = m.group("a").lower() if m.re is _WORD_NUMBER else "a"
        v = 1.0 if a == "a" else float(_UNITS[a] + (_UNITS[m.group("b").lower()] if m.group("b") else 0))
        factor = _SCALES[m.group("scale").lower()] if m.group("scale") else 1.0
        out.append(_Num(m.start(), m.end(), round(v * factor, 6), factor * 0.1 if factor >= 1e3 else 1.0, factor=factor,
                        word=m.group(0).lower()))
    return out


def _chinese_value(run: str) -> float:
    if all(ch in _CN_DIGITS for ch in run):  # read digit by digit: 一九四七 = 1947
        return float("".join(str(_CN_DIGITS[ch]) for ch in run))
    total, section, num = 0, 0, 0
    for ch in run:
        if ch in _CN_DIGITS:
            num = _CN_DIGITS[ch]
        elif ch in "十百千":
            section += (num or 1) * {"十": 10, "百": 100, "千": 1000}[ch]
            num = 0
        else:  # 万, 亿
            big = 10**4 if ch == "万" else 10**8
            total = (total + section + num) * big
            section, num = 0, 0
    return float(total + section + num)


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with the spans blanked (same length, so positions stay)."""
    chars = list(text)
    for start, end in spans:
        chars[start:end] = " " * (end - start)
    return "".join(chars)


_Span = tuple[int, int]


def _dates(text: str) -> tuple[list[tuple[_Span, str, tuple[int, int, int | None]]],
                               list[tuple[_Span, str, tuple[int, int]]], list[tuple[_Span, str, int]]]:
    """ISO dates (year, month, day or None), days of a month (month, day) and Chinese months, each
    with the span that holds its numbers and as written: parts of a date are no quantities, so
    the caller checks them as dates and blanks them."""
    dates, days, months = [], [], []
    for m in _ISO_DATE.finditer(text):
        if m.start() and text[m.start() - 1] in "0123456789.,":
            continue
        month, day = int(m.group("m")), int(m.group("d")) if m.group("d") else None
        if 1 <= month <= 12 and (day is None or 1 <= day <= 31) and YEARS[0] <= int(m.group("y")) <= YEARS[1]:
            if m.group("sep") == "." and day is None:
                continue  # "2010.12" is rather a decimal
            dates.append((m.span(), m.group(0), (int(m.group("y")), month, day)))
    rest = _masked(text, [span for span, _, _ in dates]) if dates else text
    if _MONTH_START_CASED.search(rest):
        for m in (*_MONTH_DAY.finditer(rest), *_DAY_MONTH.finditer(rest)):
            if m.re is _DAY_MONTH and m.start() and rest[m.start() - 1] in "0123456789.,":
                continue
            if 1 <= int(m.group("d")) <= 31:
                days.append((m.span("d"), m.group(0), (MONTHS.index(m.group("m").lower()) + 1, int(m.group("d")))))
    if "月" in rest:
        for m in _CN_MONTH_DAY.finditer(rest):
            if (m.start() and rest[m.start() - 1] in "0123456789.") or not 1 <= int(m.group("m")) <= 12:
                continue
            if m.group("d") and 1 <= int(m.group("d")) <= 31:
                days.append((m.span(), m.group(0), (int(m.group("m")), int(m.group("d")))))
            else:
                months.append((m.span(), m.group(0), int(m.group("m"))))
    return dates, days, months


def _date_spans(dates: list, days: list, months: list) -> list[_Span]:
    return [span for found in (dates, days, months) for span, _, _ in found]


def _two_digit_end(a: _Num, b: _Num, text: str) -> _Num:
    """"1990-95": the end of a year range written with two digits after a dash."""
    if (a.year and b.unit == 1 and b.value < 100 and not (b.suffix or b.percent or b.word) and a.value % 100 < b.value
            and re.fullmatch(r"\s*[-–—]\s*", text[a.end:b.start])):
        year = a.value - a.value % 100 + b.value
        return _Num(b.start, b.end, year, 1.0, year=True)
    return b


def _linked(a: _Num, b: _Num) -> tuple[_Num, _Num]:
    """The two ends of a range, the first given the second's scale and percent sign when it has
    none: "3-4 million" is 3 million to 4 million, "10-15%" 10% to 15%."""
    if b.factor > 1 and a.factor == 1 and not a.word and a.value < b.value / b.factor:
        a = _Num(a.start, a.end, round(a.value * b.factor, 6), b.unit if a.unit == 1 else a.unit * b.factor,
                 a.percent, b.factor, a.suffix)
    if b.percent and not a.percent:
        a = _Num(a.start, a.end, a.value, a.unit, True, a.factor, a.suffix)
    return a, b


def _bisect_any(values: list[float], lo: float, hi: float) -> bool:
    i = bisect.bisect_left(values, lo - 1e-9)
    return i < len(values) and values[i] <= hi + 1e-9


@dataclass
class _Figures:
    """The numbers of a context, by what they can support."""

    stated: list[float] = field(default_factory=list)      # every value stated, sorted
    quantities: list[float] = field(default_factory=list)  # positive, not years, dates or percentages
    percents: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)   # in years: "for 25 years", "a ten-year contract"
    ratios: list[float] = field(default_factory=list)      # "1 in 4", "三分之一", and every percentage / 100
    years: list[float] = field(default_factory=list)
    decades: set[float] = field(default_factory=set)
    centuries: set[float] = field(default_factory=set)
    dates: set[tuple[int, int, int | None]] = field(default_factory=set)
    days: set[tuple[int, int]] = field(default_factory=set)
    rows: Counter[str] = field(default_factory=Counter)
    # What figures are derived from: those stated about one subject (see _context_figures).
    groups: list[_Group] = field(default_factory=list)


@dataclass
class _Group:
    """The figures stated about one subject, sorted."""

    years: list[float]
    quantities: list[float]
    percents: list[float]
    pool: list[float]  # quantities and percentages


def _context_figures(text: str, rows: Counter[str], about: list[frozenset[str]]) -> _Figures:
    """The figures of the evidence `text` (NFKC), whose lines are each about the subjects in
    `about`: a table row about the entities it names (its entity, source, target or object), a
    line of a sub-community report about that report. A figure is derived (a change, a share, a
    difference of years) from two figures stated about one subject, not from any two figures of
    the context: a context rich in years would otherwise support every "over N years"."""
    fig = _Figures(rows=rows)
    stated: set[float] = set()
    quantities: set[float] = set()
    percents: set[float] = set()
    ratios: set[float] = set()
    years: set[float] = set()
    durations: set[float] = set()
    starts = [0]
    for line in text.split("\n")[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    groups: dict[str, tuple[set[float], set[float], set[float]]] = {}

    def add(at: int, which: int, value: float) -> None:
        """Note `value` among the years (0), quantities (1) or percentages (2) of the subjects of
        the line at `at`."""
        line = bisect.bisect_right(starts, at) - 1
        for subject in about[line] if line < len(about) else ():
            groups.setdefault(subject, (set(), set(), set()))[which].add(value)

    dates, days, months = _dates(text)
    for (at, _), _, (y, m, d) in dates:
        fig.dates.add((y, m, d))
        years.add(float(y))
        stated.add(float(y))
        add(at, 0, float(y))
    fig.days = {d for _, _, d in days}
    text = _masked(text, _date_spans(dates, days, months))
    numbers = sorted(_digit_numbers(text) + _word_numbers(text, scaled_only=False), key=lambda n: n.start)
    for i, n in enumerate(numbers):
        if i + 1 < len(numbers):
            b = _two_digit_end(n, numbers[i + 1], text)
            between = text[n.end:b.start]
            if _RANGE.fullmatch(between) and n.value < b.value:
                n, numbers[i + 1] = _linked(n, b)
            elif _CONTEXT_RATIO.fullmatch(between) and 0 < n.value < b.value and not b.year and not n.percent:
                ratios.add(n.value / b.value)
        stated.add(n.value)
        if n.suffix in ("st", "nd", "rd", "th") and _CENTURY.match(text, n.end):
            fig.centuries.add(n.value)
        elif n.suffix in ("s", "'s") and n.value % 10 == 0:
            fig.decades.add(n.value)
        elif n.percent:
            percents.add(n.value)
            add(n.start, 2, n.value)
        elif n.year:
            years.add(n.value)
            add(n.start, 0, n.value)
        elif n.value > 0 and n.word not in ("one", "a", "an"):  # "one of": no quantity to derive from
            quantities.add(n.value)
            add(n.start, 1, n.value)
            if m := _DURATION.match(text, n.end):
                durations.add(n.value * (10 if m.group("decades") else 1))
    for m in _CN_FRACTION.finditer(text):
        den, num = (float(g) if g[0].isdigit() else _chinese_value(g) for g in (m.group("den"), m.group("num")))
        if den == 100:
            percents.add(num)
            stated.add(num)
            add(m.start(), 2, num)
        elif den > 0:
            ratios.add(num / den)
    text = _masked(text, [m.span() for m in _CN_FRACTION.finditer(text)])
    for m in _CN_NUMBER.finditer(text):
        v = _chinese_value(m.group(0))
        stated.add(v)
        after = text[m.end():m.end() + 2]
        if after == "世纪":
            fig.centuries.add(v)
        elif after == "年代":
            fig.decades.add(v)
        elif YEARS[0] <= v <= YEARS[1] and (after.startswith("年") or all(ch in _CN_DIGITS for ch in m.group(0))):
            years.add(v)
            add(m.start(), 0, v)
        elif v > 0 and m.group(0) != "一":
            quantities.add(v)
            add(m.start(), 1, v)
            if after[:1] in ("年", "岁") and v < YEARS[0]:
                durations.add(v)
    for m in _WORD_FRACTIONS.finditer(text) if _FRACTION_WORD.search(text) else ():
        ratios.add({"half": 0.5, "third": 1 / 3, "quarter": 0.25, "thirds": 2 / 3, "quarters": 0.75}[m.lastgroup])
    ratios |= {p / 100 for p in percents}
    fig.stated, fig.quantities, fig.percents = sorted(stated), sorted(quantities), sorted(percents)
    fig.ratios, fig.years, fig.durations = sorted(ratios), sorted(years), sorted(durations)
    # one group per distinct set of figures, and none that holds fewer than two
    distinct = {(frozenset(y), frozenset(q), frozenset(p)) for y, q, p in groups.values()
                if len(y) + len(q) + len(p) > 1}
    fig.groups = [_Group(sorted(y), sorted(q), sorted(p), sorted(q | p)) for y, q, p in distinct]
    return fig


def _step(n: float) -> float:
    """How far a bound reaches from a number: the place of its last non-zero digit, five times
    that when the digit is a 5 (20: 10, 25: 5, 4,000: 1,000, 1.5 million: 500,000), at most
    half the number. "Over 20" is read as 20 to 30, "over 25" as 25 to 30."""
    if n <= 0:
        return 0.0
    place = 10.0 ** 12
    while place > 1e-6 and (round(n / place) == 0 or abs(n / place - round(n / place)) > 1e-6):
        place /= 10
    step = 5 * place if round(n / place) % 5 == 0 else place
    return min(step, n / 2)


def _interval(qualifier: str | None, n: float, slack: float) -> tuple[float, float]:
    """The values that `n` with its qualifier stands for; `slack` is the rounding of an exact figure."""
    step = _step(n)
    if qualifier in ("over", "more"):  # "over 20", "20多": twenty-something
        return n, n + max(step, slack)
    if qualifier == "nearly":
        return n - max(step / 2, slack), n
    if qualifier == "about":
        return n - max(0.1 * n, slack), n + max(0.1 * n, slack)
    if qualifier == "under":
        return n - max(step, slack), n
    return n - slack, n + slack


def _pairs(values: list[float], test: Callable[[float], tuple[float, float]]) -> bool:
    """Whether some other value lies in test(a) for a value a."""
    for a in values:
        lo, hi = test(a)
        i = bisect.bisect_left(values, lo - 1e-9)
        while i < len(values) and values[i] <= hi + 1e-9:
            if values[i] != a:
                return True
            i += 1
    return False


def _derived_percent(pool: list[float], lo: float, hi: float) -> bool:
    """A percentage change (b - a) / a, either way, or a share a / b of two figures of `pool`."""
    if lo <= 0:
        return False
    return (_pairs(pool, lambda a: (a * (1 + lo / 100), a * (1 + hi / 100)))              # a rise
            or (lo < 100 and _pairs(pool, lambda a: (a * (1 - min(hi, 100) / 100), a * (1 - lo / 100))))  # a fall
            or _pairs(pool, lambda b: (b * lo / 100, min(b * hi / 100, b))))              # a share a / b


@dataclass
class _Item:
    """A figure of a finding to check: a number or range with what it is a number of."""

    kind: str                 # number, percent, points, duration, century, decade, multiple, count, ratio
    written: str
    nums: list[_Num]
    qualifier: str | None = None
    of: str = ""              # the record kind a count counts


def _qualifier(text: str, start: int, end: int) -> str | None:
    if m := _QUALIFIER_BEFORE.search(text[max(0, start - 30):start]):
        word = re.sub(r"\s+", " ", (m.group("en") or m.group("tilde") or m.group("zh")).lower())
        return _QUALIFIERS.get(word, _QUALIFIERS.get(word.split(" ", 1)[-1]))
    if m := _QUALIFIER_AFTER.match(text, end):
        return m.lastgroup
    return None


def _figure_kind(n: _Num, text: str) -> tuple[str, str, str | None]:
    """(what the number counts, the record kind of a count, a qualifier written after it)."""
    after = text[n.end:n.end + 60]
    if (n.suffix in ("st", "nd", "rd", "th") and _CENTURY.match(after)) or after.lstrip().startswith("世纪"):
        return "century", "", None
    if (n.suffix in ("s", "'s") and n.value % 10 == 0 and not n.percent) or _CN_DECADE.match(after):
        return "decade", "", None
    if n.percent:
        return "percent", "", None
    if _POINTS.match(after):
        return "points", "", None
    if n.value < 150 and _AGE.search(text[max(0, n.start - 12):n.start]):
        return "duration", "", None  # "aged 34", "at the age of 34": a difference of years
    if n.value < YEARS[0] and (m := _DURATION.match(after)):
        after_q = ("over" if m.group("plus") or m.group("after") == "以上"
                   else "more" if m.group("more") or m.group("after") == "多"
                   else "about" if m.group("after") == "左右" else None)
        return ("decades" if m.group("decades") else "duration"), "", after_q
    if _MULTIPLE.match(after):
        return "multiple", "", None
    if m := _COUNT.match(after):
        word = (m.group("en") or m.group("zh")).lower()
        return "count", next(v for k, v in _COUNT_KINDS.items() if word.startswith(k)), None
    return "number", "", None


def _items(text: str) -> tuple[list[_Item], list[tuple[str, Callable[["Context"], bool]]]]:
    """The figures of a finding's text; and its date parts, each with its check."""
    dates, days, months = _dates(text)
    date_checks: list[tuple[int, str, Callable[[Context], bool]]] = []
    for (at, _), written, (y, mo, d) in dates:
        date_checks.append((at, written, lambda c, y=y, mo=mo, d=d: any(
            (cy, cm) == (y, mo) and (d is None or cd == d) for cy, cm, cd in c.figures.dates)))
    for (at, _), written, (mo, d) in days:
        date_checks.append((at, written.strip(), lambda c, mo=mo, d=d: (mo, d) in c.figures.days))
    for (at, _), written, mo in months:
        date_checks.append((at, written.strip(), lambda c, mo=mo: mo in c.months))
    text = _masked(text, _date_spans(dates, days, months))
    numbers = sorted(_digit_numbers(text) + _word_numbers(text, scaled_only=True), key=lambda n: n.start)
    items: list[_Item] = []
    i = 0
    while i < len(numbers):
        a = numbers[i]
        if i + 1 < len(numbers):
            b = _two_digit_end(a, numbers[i + 1], text)
            between = text[a.end:b.start]
            if (_RATIO.fullmatch(between) and not a.percent and not b.percent and not b.year and 0 < a.value <= b.value
                    and not _TIME_UNIT.match(text, b.end)):
                items.append(_Item("ratio", text[a.start:b.end].strip(), [a, b], _qualifier(text, a.start, b.end)))
                i += 2
                continue
            conn = _RANGE.fullmatch(between)
            word = conn.group(0).strip().lower() if conn else ""
            if (conn and a.value < b.value and not a.suffix and not b.suffix and a.year == b.year
                    and (word != "and" or re.search(r"\bbetween\s+$", text[max(0, a.start - 12):a.start], re.I))):
                a, b = _linked(a, b)
                kind, of, _ = _figure_kind(b, text)
                items.append(_Item(kind, text[a.start:b.end].strip(), [a, b], _qualifier(text, a.start, b.end), of))
                i += 2
                continue
        kind, of, after = _figure_kind(a, text)
        written = text[a.start:a.end].strip()
        items.append(_Item(kind, written, [a], _qualifier(text, a.start, a.end) or after, of))
        i += 1
    return items, [(w, check) for _, w, check in sorted(date_checks, key=lambda t: t[0])]


def _derived(kind: str, lo: float, hi: float, fig: _Figures, *, estimate: bool, of: str = "") -> bool:
    """Whether the context gives a figure of this kind in [lo, hi] by a rule of the module
    docstring; `estimate`: the figure is a bound or an estimate, which a stated quantity in the
    interval supports too ("over 4,000 people" for 4,200; "over 20 years" for "for 25 years")."""
    if kind == "count":
        return lo - 1e-9 <= fig.rows.get(of, 0) <= hi + 1e-9
    if kind in ("duration", "decades"):
        return (estimate and _bisect_any(fig.durations, lo, hi)) or any(
            _pairs(g.years, lambda y: (y + lo, y + hi)) for g in fig.groups)
    if kind == "percent":
        return ((estimate and _bisect_any(fig.percents, lo, hi))
                or _bisect_any(fig.ratios, lo / 100, hi / 100)
                or any(_derived_percent(g.pool, lo, hi) for g in fig.groups))
    if kind == "points":
        return any(_pairs(g.percents, lambda p: (p + lo, p + hi)) for g in fig.groups)
    if kind == "multiple":
        return any(_pairs(g.quantities, lambda a: (a * lo, a * hi)) for g in fig.groups)
    return estimate and _bisect_any(fig.quantities, lo, hi)


def _supported(item: _Item, ctx: Context) -> bool:
    fig = ctx.figures
    if item.kind == "ratio":
        r = item.nums[0].value / item.nums[1].value
        lo, hi = _interval(item.qualifier, r, 0.02 * r)
        return _bisect_any(fig.ratios, lo, hi)
    if len(item.nums) == 2:
        return _supported_range(item, ctx)
    return _supported_one(item.kind, item.nums[0], item.qualifier, fig, item.of)


def _supported_one(kind: str, n: _Num, qualifier: str | None, fig: _Figures, of: str = "") -> bool:
    if kind == "century":
        return n.value in fig.centuries or _bisect_any(fig.years, 100 * (n.value - 1), 100 * n.value) or any(
            100 * (n.value - 1) <= d < 100 * n.value for d in fig.decades)
    if kind == "decade":
        v = n.value
        if v in fig.decades:
            return True
        if v >= YEARS[0]:  # "the 1990s"; "the 1800s" may be the century
            return _bisect_any(fig.years, v, v + (99 if v % 100 == 0 else 9))
        return any(v <= y % 100 <= v + 9 for y in fig.years)  # "the '90s", "90年代"
    value, unit = n.value, n.unit
    if _bisect_any(fig.stated, value - unit / 2, value + unit / 2):
        return True  # stated, to the precision written
    if n.year:  # "around 1950": within five years of a context year; no other bound of a year is an estimate
        return qualifier == "about" and _bisect_any(fig.years, value - 5, value + 5)
    if kind == "decades":  # "3 decades": 25 to 35 years
        value, slack = 10 * value, 5.0
    else:
        slack = unit / 2
    lo, hi = _interval(qualifier, value, slack)
    return _derived(kind, lo, hi, fig, estimate=qualifier is not None, of=of)


def _supported_range(item: _Item, ctx: Context) -> bool:
    """Both ends supported; or a range that rounds a context figure: years from one round ten to
    another at most a century apart around a context year ("between 1990 and 2000"), or any other
    figure within a range whose top is at most twice its bottom ("3-4 million" for 3.5 million)."""
    a, b = item.nums
    fig = ctx.figures
    if all(_supported_one(item.kind, n, None, fig, item.of) for n in (a, b)):
        return True
    if item.kind in ("count", "century", "decade"):
        return False
    if a.year:
        return a.value % 10 == 0 and b.value % 10 == 0 and b.value - a.value <= 100 and \
            _bisect_any(fig.years, a.value, b.value)
    scale = 10 if item.kind == "decades" else 1
    return 0 < a.value and b.value <= 2 * a.value and \
        _derived(item.kind, a.value * scale, b.value * scale, fig, estimate=True, of=item.of)


_RECORD_MENTION = re.compile(r"\b(?:reports?|entit(?:y|ies)|relationships?|claims?)\s*#?\s*\d+", re.IGNORECASE)


def unsupported(text: str, ctx: Context) -> list[str]:
    """The numbers, dates and months of `text` that its context neither states nor derives by
    the rules of the module docstring ("Report 12" names a record, it states no number)."""
    text = unicodedata.normalize("NFKC", _RECORD_MENTION.sub(" ", _without_citations(text)))
    items, dates = _items(text)
    out = [item.written for item in items if not _supported(item, ctx)]
    out += [written for written, check in dates if not check(ctx)]
    for m in _MONTH_IN_FINDING.finditer(text):
        name = next(g for g in m.groups() if g)
        if MONTHS.index(name.lower()) + 1 not in ctx.months:
            out.append(name)
    return out


# -- names ------------------------------------------------------------------------------------

_CAP = r"[A-Z][A-Za-z'’&-]*\.?"
_PARTICLES = {"of", "the", "de", "del", "da", "di", "du", "des", "la", "le", "van", "von", "der", "den", "y",
              "and", "for", "&"}
_NAME = re.compile(rf"\b{_CAP}(?:[ \t]+(?:(?:{'|'.join(sorted(_PARTICLES))})[ \t]+)*{_CAP})+")
_MARKED = re.compile(r"[《「『“]([^《》「」『』“”]{2,20})[》」』”]")
_LEADING = {"the", "a", "an", "this", "these", "those", "that", "in", "on", "at", "by", "for", "from", "with",
            "as", "both", "its", "his", "her", "their", "our", "while", "although", "however", "when", "after",
            "before", "during", "since", "despite", "according", "through", "and", "but", "or", "if", "also",
            "another", "each", "every", "all", "some", "many", "several", "under", "over", "between", "among"}
_TITLES = {"mr", "mrs", "ms", "miss", "dr", "prof", "sir", "lord", "lady", "agent", "captain", "general",
           "president", "king", "queen", "saint", "st"}


def _fold(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).replace("’", "'")).casefold()


def _candidates(text: str) -> list[str]:
    """Runs of two or more capitalised words, split where a sentence ends ("Scrooge. The Ghost"),
    without leading sentence words ("The", "In") or a possessive."""
    out = []
    for m in _NAME.finditer(text):
        runs, run = [], []
        for word in m.group(0).split():
            run.append(word)
            if word.endswith(".") and len(word) > 3 and word[:-1].lower() not in _TITLES:
                runs.append(run)
                run = []
        runs.append(run)
        for words in runs:
            while words and (words[0].lower().strip(".") in _LEADING or words[0].lower() in _PARTICLES):
                words.pop(0)
            while words and words[-1].lower() in _PARTICLES:
                words.pop()
            if sum(w[0].isupper() for w in words) >= 2:
                out.append(re.sub(r"(?:'s|’s|')$", "", " ".join(words).rstrip(".")))
    return out


def _title_case(text: str) -> bool:
    """A headline ("Central Setting and Catalyst"): its capitals are no names."""
    words = [w for w in re.findall(r"[A-Za-z][A-Za-z'’-]*", text) if len(w) > 3]
    return len(words) >= 2 and sum(w[0].isupper() for w in words) >= 0.6 * len(words)


def unknown_names(text: str, ctx: Context) -> list[str]:
    """Names in `text` that its context holds neither whole nor word by word."""
    text = _without_citations(text)
    out = []
    for name in _candidates(text):
        if _fold(name) in ctx.folded:
            continue
        significant = [w for w in re.findall(r"\w+", _fold(name))
                       if len(w) > 1 and w not in _LEADING and w not in _TITLES and w not in _PARTICLES]
        if significant and all(w in ctx.words for w in significant):
            continue
        out.append(name)
    out += [n for n in _MARKED.findall(text)
            if re.search(r"[\u4e00-\u9fff]", n) and _fold(n) not in ctx.folded]
    return out


# -- a report ---------------------------------------------------------------------------------

def check_findings(findings: Iterable[tuple[str, str]], ctx: Context,
                   counts: Counter[str]) -> list[tuple[str, str]]:
    """The (summary, explanation) findings that pass, their citations rewritten; `counts`
    gets one increment per dropped finding, under the first check it fails."""
    kept = []
    for summary, explanation in findings:
        counts["findings_written"] += 1
        s, e = rewrite_citations(summary, ctx.ids), rewrite_citations(explanation, ctx.ids)
        counts["citations_invalid"] += s.invalid + e.invalid
        if s.bookkeeping or e.bookkeeping or is_bookkeeping(summary, explanation):
            counts["findings_bookkeeping"] += 1
        elif not (s.valid or e.valid):
            counts["findings_uncited"] += 1
        elif unsupported(s.text, ctx) or unsupported(e.text, ctx):
            counts["findings_unsupported"] += 1
        else:
            if (not _title_case(s.text) and unknown_names(s.text, ctx)) or unknown_names(e.text, ctx):
                counts["findings_unknown_names"] += 1
            kept.append((s.text, e.text))
    counts["findings_kept"] += len(kept)
    return kept


# A full stop after these is no sentence end ("Dr. Smith", "e.g. three").
_ABBREVIATIONS = _TITLES | {"e.g", "i.e", "etc", "vs", "no", "nos", "approx", "inc", "ltd", "co", "corp", "jr", "sr",
                            "jan", "feb", "mar", "apr", "aug", "sept", "oct", "nov", "dec", "fig", "vol", "ca"}
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)|[。！？]+[”’」』）)]*")
_FOLLOWING_CITATION = re.compile(r"\s*\[Data: [^\[\]]*\]")


def summary_sentences(text: str) -> list[str]:
    """The sentences of a report's summary, each with the whitespace after it and a citation set
    after its full stop, so that joining them gives the text back."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.end() <= start:
            continue
        if m.group(0)[0] == "." and (word := re.search(r"([A-Za-z]+(?:\.[A-Za-z]+)*)$", text[start:m.start()])):
            last = word.group(1).split(".")[-1]
            if (len(last) == 1 and last.isupper()) or word.group(1).lower() in _ABBREVIATIONS:
                continue  # "U.S.", "Dr."
        end = m.end()
        while c := _FOLLOWING_CITATION.match(text, end):
            end = c.end()
        rest = text[end:].lstrip()
        if rest and rest[0].islower():
            continue  # "approx. three": no sentence begins in lower case
        end = len(text) - len(rest)
        out.append(text[start:end])
        start = end
    if text[start:].strip() or not out:
        out.append(text[start:])
    else:
        out[-1] += text[start:]
    return out


def check_summary(summary: str, ctx: Context, counts: Counter[str]) -> str:
    """The summary without its sentences that hold a number, date or month the context does
    not support; each such sentence counted. A summary all of whose sentences fail is kept whole
    (a report is never left without one), its sentences only counted."""
    sentences = summary_sentences(summary)
    bad = {i for i, s in enumerate(sentences) if unsupported(s, ctx)}
    counts["summary_sentences_unsupported"] += len(bad)
    if not bad or len(bad) == len(sentences):
        return summary
    return "".join(s for i, s in enumerate(sentences) if i not in bad).strip()


@dataclass
class Checked:
    summary: str
    rating: float
    findings: list[tuple[str, str]]
    capped: bool = False  # the rating was lowered to the cap


def check_report(summary: str, rating: float, findings: Sequence[tuple[str, str]], context: str, *,
                 entities: int, relationships: int, counts: Counter[str]) -> Checked:
    """One LLM-written report of a community with `entities` entities and `relationships`
    extracted internal relationships, checked against the `context` it was written from."""
    ctx = read_context(context)
    counts["reports_checked"] += 1
    head = rewrite_citations(summary, ctx.ids)
    counts["citations_invalid"] += head.invalid
    kept = check_findings(findings, ctx, counts)
    if not kept:
        counts["reports_without_findings"] += 1
    rating, capped = cap_rating(rating, entities, relationships)
    counts["ratings_capped"] += capped
    return Checked(check_summary(head.text, ctx, counts), rating, kept, capped)
