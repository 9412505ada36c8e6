"""Checks on a community report's answer, in code, against the context the model was given.

Small models write findings that cite nothing, copy the context's bookkeeping ("Degree of
connection: 3"), add outside knowledge ("ASCAP ... has over 1 million members") and rate a
two-entity community 9. Each finding of an LLM-written report goes through these checks, in this
order; a dropped finding is counted once, under the first check it fails:

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
   and explanation (digits, with thousands separators, decimals, ordinals, `1 million`, `3万`,
   `one million`) and every month name must occur in the context's text (descriptions, titles,
   claims, sub-community reports: not the id and degree columns, so a degree is not support).
   The context's numbers include those written in words (`three`, `a million`, `一九四七`,
   `二十`), the months of its ISO dates, and how many rows each of its tables has (a finding may
   count them). A finding with one unsupported number or month is dropped. Limitation: a number
   is checked, not the statement around it: "founded in 1947" passes when the context only says
   someone joined in 1947.
4. unknown names (`findings_unknown_names`, flagged, never dropped: small models paraphrase):
   runs of two or more capitalised words ("Bank of America"), and for Chinese the names the
   model sets in 《》「」『』“” marks, that are not in the context, neither whole nor every word.
   Chinese names without such marks are not detected (there is no segmenter in the base
   install).

A report whose findings are all dropped keeps its title and summary with no findings
(`reports_without_findings`): the report is never lost. Citations in the report's summary are
rewritten the same way, never dropped.

The rating is capped by the community's size, counted as min(entities, internal relationships
+ 1) so that a community with few edges counts as small however many entities it holds: a
rating of 8 or more claims the community is central to the collection, which a handful of
entities rarely is. Capped ratings are counted (`ratings_capped`):

    size      1    2    3-4    5-9    10+
    cap       2    3     5      7     10
"""
from __future__ import annotations

import csv
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..query.citations import citation_text

COUNTS = (
    "reports_checked", "findings_written", "findings_kept", "findings_bookkeeping", "findings_uncited",
    "findings_unsupported", "findings_unknown_names", "citations_invalid", "reports_without_findings",
    "ratings_capped",
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
_SECTION_LINE = re.compile(r"^-{3,}\s*(.+?)\s*-{3,}$")
_REPORT_LINE = re.compile(r"^## Report (\d+):\s?(.*)$")


@dataclass
class Context:
    """What a community's context holds, as the model saw it."""

    ids: dict[str, set[int]] = field(default_factory=lambda: {k: set() for k in KINDS})
    evidence: str = ""                       # its text without the id and degree columns
    numbers: set[float] = field(default_factory=set)
    months: set[int] = field(default_factory=set)
    words: set[str] = field(default_factory=set)
    folded: str = ""                         # evidence, case-folded, whitespace collapsed


def read_context(context: str) -> Context:
    out = Context()
    texts: list[str] = []
    rows: Counter[str] = Counter()
    kind, header = None, None
    for line in context.splitlines():
        if m := _SECTION_LINE.match(line.strip()):
            kind, header = _SECTIONS.get(m.group(1).lower()), None
            continue
        if not line.strip() or kind is None:
            if kind == "Reports":
                texts.append(line)
            continue
        if kind == "Reports":
            if m := _REPORT_LINE.match(line):
                out.ids["Reports"].add(int(m.group(1)))
                rows["Reports"] += 1
                line = m.group(2)
            # What a sub-community report cites was checked against that community's context.
            for k, refs, _ in parse_citations(line):
                if k in out.ids:
                    out.ids[k].update(refs)
            texts.append(rewrite_citations(line, {}).text)  # its citations are no evidence
            continue
        cells = next(csv.reader([line]), [])
        if header is None:
            header = [c.strip().lower() for c in cells]
            continue
        if cells and cells[0].strip().isdigit():
            out.ids[kind].add(int(cells[0]))
        rows[kind] += 1
        texts.append(" , ".join(c for c, name in zip(cells, header + [""] * len(cells))
                                if name not in _NOT_EVIDENCE))
    out.evidence = "\n".join(texts)
    out.numbers = _context_numbers(out.evidence) | {float(n) for n in rows.values()}
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
           "百": 1e2, "千": 1e3, "万": 1e4, "百万": 1e6, "千万": 1e7, "亿": 1e8}
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<dec>\d+))?"
    r"(?:st|nd|rd|th|s)?"
    r"(?:\s*(?:%|percent|per\s+cent))?"
    r"(?:\s+(?P<scale>hundred|thousand|million|billion|trillion)\b|\s*(?P<cjk>百万|千万|万|亿|千))?"
    r"(?![A-Za-z0-9_])", re.IGNORECASE)
_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_UNITS.update({w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())})
_UNITS["dozen"] = 12
_WORD_NUMBER = re.compile(
    r"\b(?P<a>a|an|" + "|".join(_UNITS) + r")(?:-(?P<b>" + "|".join(list(_UNITS)[1:10]) + r"))?"
    r"(?:\s+(?P<scale>hundred|thousand|million|billion|trillion))?\b", re.IGNORECASE)
_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
              "八": 8, "九": 9}
_CN_NUMBER = re.compile("[零〇一二两三四五六七八九十百千万亿]+")
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")
_MONTH_IN_FINDING = re.compile(
    r"\b(?:(?P<m>January|February|March|April|June|July|August|September|October|November|December)"
    r"|(?P<may>May)(?=\s+\d)|(?<=\d\s)(?P<may2>May))\b")


def _value(m: re.Match[str]) -> float:
    v = float(m.group("int").replace(",", "") + ("." + m.group("dec") if m.group("dec") else ""))
    scale = m.group("scale") or m.group("cjk")
    return round(v * _SCALES[scale.lower()] if scale else v, 6)


def finding_numbers(text: str) -> list[tuple[str, float]]:
    """(as written, value) of the numbers of a finding: digits, and number words with a scale
    ("one million"); bare number words are too common in prose ("one of") to check."""
    text = unicodedata.normalize("NFKC", text)
    out = [(m.group(0).strip(), _value(m)) for m in _NUMBER.finditer(text)]
    for m in _WORD_NUMBER.finditer(text):
        if m.group("scale"):
            out.append((m.group(0), _word_value(m)))
    return out


def _word_value(m: re.Match[str]) -> float:
    a = m.group("a").lower()
    v = 1.0 if a in ("a", "an") else float(_UNITS[a] + (_UNITS[m.group("b").lower()] if m.group("b") else 0))
    return round(v * (_SCALES[m.group("scale").lower()] if m.group("scale") else 1), 6)


def _chinese_value(run: str) -> list[float]:
    if all(ch in _CN_DIGITS for ch in run):  # read digit by digit: 一九四七 = 1947
        return [float("".join(str(_CN_DIGITS[ch]) for ch in run))]
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
    return [float(total + section + num)]


def _context_numbers(text: str) -> set[float]:
    text = unicodedata.normalize("NFKC", text)
    found = {_value(m) for m in _NUMBER.finditer(text)}
    found |= {_word_value(m) for m in _WORD_NUMBER.finditer(text) if m.group("a").lower() not in ("a", "an")
              or m.group("scale")}
    found |= {v for run in _CN_NUMBER.findall(text) for v in _chinese_value(run)}
    # every digit run too, so "the 1990s" or "3-4" is supported by its parts however written
    found |= {float(d) for d in re.findall(r"\d+", text)}
    return found


# A word starting with a month's first three letters ("mar" also for "Mars": the check only
# ever lets more through), one pass over the context instead of one per month.
_MONTH_START = re.compile(r"\b(" + "|".join(sorted({m[:3] for m in MONTHS})) + ")")


def _context_months(text: str) -> set[int]:
    folded = text.lower()
    starts = set(_MONTH_START.findall(folded))
    months = {i + 1 for i, name in enumerate(MONTHS) if name[:3] in starts}
    months |= {int(m) for m in re.findall(r"\b\d{4}[-/.](\d{1,2})(?:[-/.]\d{1,2})?\b", text) if 1 <= int(m) <= 12}
    months |= {int(m) for m in re.findall(r"(\d{1,2})\s*月", unicodedata.normalize("NFKC", text)) if 1 <= int(m) <= 12}
    return months


_RECORD_MENTION = re.compile(r"\b(?:reports?|entit(?:y|ies)|relationships?|claims?)\s*#?\s*\d+", re.IGNORECASE)


def unsupported(text: str, ctx: Context) -> list[str]:
    """The numbers and months of `text` that its context does not hold ("Report 12" names a
    record, it states no number)."""
    text = _RECORD_MENTION.sub(" ", _without_citations(text))
    out = [written for written, v in finding_numbers(text) if v not in ctx.numbers]
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


@dataclass
class Checked:
    summary: str
    rating: float
    findings: list[tuple[str, str]]


def check_report(summary: str, rating: float, findings: Sequence[tuple[str, str]], context: str, *,
                 entities: int, relationships: int, counts: Counter[str]) -> Checked:
    """One LLM-written report of a community with `entities` entities and `relationships`
    internal relationships, checked against the `context` it was written from."""
    ctx = read_context(context)
    counts["reports_checked"] += 1
    head = rewrite_citations(summary, ctx.ids)
    counts["citations_invalid"] += head.invalid
    kept = check_findings(findings, ctx, counts)
    if not kept:
        counts["reports_without_findings"] += 1
    rating, capped = cap_rating(rating, entities, relationships)
    counts["ratings_capped"] += capped
    return Checked(head.text, rating, kept)
