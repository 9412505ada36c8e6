"""Paper step 2.5: communities -> community reports, written bottom-up.

Communities are written deepest first, a window of them at a time (windows.py), because a
higher community may be composed from its sub-communities' reports:

- leaf community: its edges by descending combined degree, each preceded by its source and
  target entity (once) and their claims, until the token budget is full;
- higher community: if all its elements fit, exactly as a leaf; otherwise the sub-communities
  with the largest element context are replaced by their (shorter) reports, one at a time,
  until the whole fits (Microsoft summarises every level from raw elements, their #1907);
- carried-down communities (copies of a branch that ended early, see communities.py) reuse
  the report of the community they copy, at no cost.

A report that fails after the client's retries is returned in the failure list and gets no
row; its parent is then built from that child's raw elements. Each answer is checked against
its context in code (report_checks.py): findings that cite nothing valid, restate bookkeeping or
hold numbers the context does not support are dropped, so are such sentences of the summary, the
rating is capped by the community's size (its entities and extracted relationships: co-occurrence
edges do not count) with an explanation that says so in the report's language, and the counts go
to the caller's `counts`.
"""
from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pydantic import BaseModel

from ..config import Settings
from ..llm import ChatClient, LLMError
from ..prompts import load_prompt, render, to_messages
from ..store.tables import content_id
from ..tokens import count_tokens, truncate, within
from . import report_checks
from .windows import run_windowed, window_of

COLUMNS = [
    "id", "human_readable_id", "community", "level", "parent", "children", "title", "summary",
    "full_content", "rank", "rating_explanation", "findings", "full_content_json", "period", "size",
    "context_tokens", "used_sub_reports", "carried",
]

STEP = "community_reports"  # the usage step name is the pipeline step name
MAX_FINDINGS = 10


class Finding(BaseModel):
    summary: str
    explanation: str


class Report(BaseModel):
    title: str
    summary: str
    rating: float
    rating_explanation: str
    findings: list[Finding]


# -- context ----------------------------------------------------------------------------------

ENTITY_HEADER = "-----Entities-----\nid,entity,type,description,degree"
CLAIM_HEADER = "-----Claims-----\nid,entity,object,type,status,period,description"
RELATIONSHIP_HEADER = "-----Relationships-----\nid,source,target,description,combined_degree"
REPORT_HEADER = "-----Sub-community reports-----"


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _row(*values: Any) -> str:
    buf = io.StringIO()
    # One record per line: descriptions lose their line breaks, commas are quoted.
    csv.writer(buf, lineterminator="").writerow(
        [re.sub(r"\s+", " ", "" if _missing(v) else str(v)).strip() for v in values])
    return buf.getvalue()


@dataclass
class _Piece:
    text: str
    tokens: int


def _piece(text: str) -> _Piece:
    # +1 for the line break that joins it to the next line.
    return _Piece(text, count_tokens(text) + 1)


class _Pieces(dict):
    """Rendered rows by key, each rendered and counted when a community first needs it. Counting
    every row of the graph up front held the step's first request back (1.4 s on the podcast
    corpus with long descriptions); counted on demand, the cost is spread among requests in
    flight, and each row is still counted once."""

    def __init__(self, render: Callable[[Any], str], sources: dict[str, Any]):
        super().__init__()
        self._render, self._sources = render, sources

    def __missing__(self, key: str) -> _Piece:
        piece = self[key] = _piece(self._render(self._sources[key]))
        return piece

    def __contains__(self, key: object) -> bool:
        return key in self._sources


@dataclass
class _Elements:
    """Rendered rows of the whole graph, each counted once, looked up per community."""

    entity: dict[str, _Piece]                   # by title
    entity_rank: dict[str, tuple[int, int]]     # title -> (-degree, human_readable_id)
    claims: dict[str, list[_Piece]]             # by subject title
    edge: dict[str, _Piece]                     # by relationship id
    edge_ends: dict[str, tuple[str, str]]
    edge_rank: dict[str, tuple[float, int]]     # id -> (-combined_degree, human_readable_id)
    title_of: dict[str, str]                    # entity id -> title
    header_tokens: dict[str, int] = field(default_factory=dict)
    weak: set[str] = field(default_factory=set)  # ids of co-occurrence edges (cooccurrence_edges.py)

    def edge_source(self, rid: str) -> tuple:
        """(human_readable_id, source, target, description, combined_degree) of a relationship."""
        return self.edge._sources[rid]


def _elements(entities: pd.DataFrame, relationships: pd.DataFrame,
              covariates: pd.DataFrame | None) -> _Elements:
    ent_rows, ent_rank, title_of = {}, {}, {}
    for row in entities.itertuples(index=False):
        title = str(row.title)
        degree = int(getattr(row, "degree", 0) or 0)
        ent_rows[title] = (row.human_readable_id, title, getattr(row, "type", ""), row.description, degree)
        ent_rank[title] = (-degree, int(row.human_readable_id))
        title_of[str(row.id)] = title
    claims: dict[str, list[_Piece]] = {}
    if covariates is not None and not covariates.empty:
        for row in covariates.sort_values("human_readable_id", kind="stable").itertuples(index=False):
            start, end = getattr(row, "start_date", None), getattr(row, "end_date", None)
            period = " - ".join(str(d) for d in (start, end) if not _missing(d) and str(d) not in ("", "NONE"))
            claims.setdefault(str(row.subject_id), []).append(_piece(_row(
                row.human_readable_id, row.subject_id, getattr(row, "object_id", ""),
                getattr(row, "type", ""), getattr(row, "status", ""), period, row.description)))
    edge_rows, ends, edge_rank = {}, {}, {}
    for row in relationships.itertuples(index=False):
        rid = str(row.id)
        cd = getattr(row, "combined_degree", 0)
        cd = 0.0 if cd is None or (isinstance(cd, float) and math.isnan(cd)) else float(cd)
        edge_rows[rid] = (row.human_readable_id, row.source, row.target, row.description,
                          int(cd) if cd.is_integer() else cd)
        ends[rid] = (str(row.source), str(row.target))
        edge_rank[rid] = (-cd, int(row.human_readable_id))
    headers = {h: count_tokens(h) + 1 for h in (ENTITY_HEADER, CLAIM_HEADER, RELATIONSHIP_HEADER, REPORT_HEADER)}
    weak = set(relationships.loc[relationships["co_occurrence"].eq(True), "id"].astype(str)) \
        if "co_occurrence" in relationships else set()
    return _Elements(_Pieces(lambda v: _row(*v), ent_rows), ent_rank, claims, _Pieces(lambda v: _row(*v), edge_rows),
                     ends, edge_rank, title_of, headers, weak)


@dataclass
class _Packed:
    entities: list[_Piece] = field(default_factory=list)
    claims: list[_Piece] = field(default_factory=list)
    edges: list[_Piece] = field(default_factory=list)
    complete: bool = True  # every element offered was included

    def text(self) -> str:
        parts = []
        for header, rows in ((ENTITY_HEADER, self.entities), (CLAIM_HEADER, self.claims),
                             (RELATIONSHIP_HEADER, self.edges)):
            if rows:
                parts.append(header + "\n" + "\n".join(p.text for p in rows))
        return "\n\n".join(parts)


def _pack(el: _Elements, titles: list[str], edge_ids: list[str], budget: int) -> _Packed:
    """The leaf procedure: edges (given by descending combined degree), each with its endpoints,
    their claims and the edge, until the budget is full; then member entities no edge brought in.

    Claims support their entity but must not crowd out the graph: one entity's claims take at
    most a quarter of the budget, and a claim that does not fit is left out without ending the
    packing (Scrooge alone has 3,000 tokens of claims in the Christmas Carol index)."""
    out = _Packed()
    seen: set[str] = set()
    present: set[str] = set()  # tables that already have their header
    used = 0
    claim_cap = budget // 4

    def header(h: str) -> int:
        return 0 if h in present else el.header_tokens[h]

    def add_entities(new: list[str]) -> None:
        nonlocal used
        for t in new:
            used += el.entity[t].tokens + header(ENTITY_HEADER)
            seen.add(t)
            out.entities.append(el.entity[t])
            present.add(ENTITY_HEADER)

    def add_claims(new: list[str]) -> None:
        nonlocal used
        for t in new:
            spent = 0
            for p in el.claims.get(t, []):
                cost = p.tokens + header(CLAIM_HEADER)
                if spent + cost > claim_cap or used + cost > budget:
                    out.complete = False
                    break
                used += cost
                spent += cost
                out.claims.append(p)
                present.add(CLAIM_HEADER)

    for rid in edge_ids:
        s, t = el.edge_ends[rid]
        new = [x for x in dict.fromkeys((s, t)) if x not in seen and x in el.entity]
        cost = (sum(el.entity[x].tokens for x in new) + (header(ENTITY_HEADER) if new else 0)
                + el.edge[rid].tokens + header(RELATIONSHIP_HEADER))
        if used + cost > budget:
            out.complete = False
            break
        add_entities(new)
        used += el.edge[rid].tokens + header(RELATIONSHIP_HEADER)
        out.edges.append(el.edge[rid])
        present.add(RELATIONSHIP_HEADER)
        add_claims(new)
    else:
        for t in sorted((t for t in titles if t not in seen), key=el.entity_rank.__getitem__):
            if used + el.entity[t].tokens + header(ENTITY_HEADER) > budget:
                out.complete = False
                break
            add_entities([t])
            add_claims([t])

    if not out.entities and (edge_ids or titles):
        # Not even the first element fits: give its entity, cut to the budget, rather than nothing.
        first = el.edge_ends[edge_ids[0]][0] if edge_ids else min(titles, key=el.entity_rank.__getitem__)
        if first in el.entity:
            room = budget - el.header_tokens[ENTITY_HEADER] - 1
            out.entities.append(_Piece(truncate(el.entity[first].text, max(0, room)), room))
        out.complete = False
    return out


def _report_text(number: int, report: Report) -> str:
    lines = [f"## Report {number}: {report.title}", report.summary.strip()]
    lines += [f"- {f.summary.strip()}: {f.explanation.strip()}" for f in report.findings]
    return "\n".join(lines)


@dataclass
class _Community:
    number: int
    id: str
    level: int
    parent: int
    children: list[int]
    titles: list[str]
    edge_ids: list[str]
    size: int
    carried: bool

    def raw_tokens(self, el: _Elements) -> int:
        """Size of all its element rows (entities, their claims, internal edges), no headers."""
        return (sum(el.entity[t].tokens + sum(p.tokens for p in el.claims.get(t, [])) for t in self.titles)
                + sum(el.edge[r].tokens for r in self.edge_ids))


# From this many characters (~2,500 tokens) a context is counted in a worker thread: tiktoken
# lets go of the interpreter while it encodes, so the event loop goes on reading the answers
# of the requests in flight instead of standing still for milliseconds per report.
LONG_CONTEXT_CHARS = 10_000


async def _fitted(text: str, budget: int) -> tuple[str, int]:
    """`text` cut to `budget` tokens, and its size in tokens."""
    return await asyncio.to_thread(within, text, budget) if len(text) >= LONG_CONTEXT_CHARS else within(text, budget)


def _context(c: _Community, el: _Elements, communities: dict[int, _Community],
             reports: dict[int, Report], budget: int, packed: _Packed | None = None) -> tuple[str, bool]:
    """The context for one community and whether sub-community reports were used. `packed` is
    its own elements packed to the budget, if the caller already has it. Line counts are
    estimates (tokens can merge across line breaks): `_fitted` cuts the rare excess."""
    if packed is None:
        packed = _pack(el, c.titles, c.edge_ids, budget)
    if packed.complete:
        # Does not read `reports`: write_reports relies on this to start such a community
        # without waiting for its sub-communities.
        return packed.text(), False
    # Sub-communities with a report (copies of this community are not sub-communities).
    subs = [communities[n] for n in c.children if n in reports and not communities[n].carried]
    if not subs:
        return packed.text(), False

    # +2: reports are separated by a blank line.
    report_piece = {s.number: _Piece(t, count_tokens(t) + 2)
                    for s in subs for t in [_report_text(s.number, reports[s.number])]}
    # Largest element context first; a report that is no shorter than its elements saves nothing.
    sizes = {s.number: s.raw_tokens(el) for s in subs}
    order = sorted((s for s in subs if report_piece[s.number].tokens < sizes[s.number]),
                   key=lambda s: (-sizes[s.number], s.number))
    if not order:
        return packed.text(), False

    # Replace sub-communities one at a time until the rest fits. A cheap lower bound on the
    # remaining elements' size skips the exact packing until it can possibly succeed.
    lower = c.raw_tokens(el)
    replaced: list[_Community] = []
    report_tokens = el.header_tokens[REPORT_HEADER]
    for sub in order:
        replaced.append(sub)
        lower -= sizes[sub.number]
        report_tokens += report_piece[sub.number].tokens
        if report_tokens > budget:
            break
        if report_tokens + lower > budget:
            continue
        titles, edge_ids = _remaining(c, replaced)
        if _pack(el, titles, edge_ids, budget - report_tokens).complete:
            break

    # If even the reports overflow, keep the highest-rated ones (ties: larger sub-community).
    kept, used = [], el.header_tokens[REPORT_HEADER]
    for sub in sorted(replaced, key=lambda s: (-reports[s.number].rating, -sizes[s.number], s.number)):
        if used + report_piece[sub.number].tokens <= budget:
            kept.append(sub)
            used += report_piece[sub.number].tokens
    kept_set = {s.number for s in kept}
    kept = [s for s in replaced if s.number in kept_set]  # present largest first
    # Sub-communities whose report did not fit are left out entirely; their elements would
    # not fit either (a report is shorter than the elements it replaces).
    titles, edge_ids = _remaining(c, replaced)
    rest = _pack(el, titles, edge_ids, max(0, budget - used)) if used < budget else _Packed()
    parts = [REPORT_HEADER + "\n" + "\n\n".join(report_piece[s.number].text for s in kept)] if kept else []
    if rest.entities or rest.edges:
        parts.append(rest.text())
    return "\n\n".join(parts), bool(kept)


def _remaining(c: _Community, replaced: list[_Community]) -> tuple[list[str], list[str]]:
    """Elements of `c` not told by the replaced sub-communities' reports: the entities of the
    other sub-communities and every edge not inside one replaced sub-community (edges between
    sub-communities are exactly what their reports cannot say)."""
    covered = {t for s in replaced for t in s.titles}
    inside = {r for s in replaced for r in s.edge_ids}
    return [t for t in c.titles if t not in covered], [r for r in c.edge_ids if r not in inside]


# -- reports ----------------------------------------------------------------------------------

def _markdown(report: Report) -> str:
    parts = [f"# {report.title}", report.summary]
    for f in report.findings:
        parts += [f"## {f.summary}", f.explanation]
    return "\n\n".join(parts)


def _clean(report: Report) -> Report:
    rating = report.rating if math.isfinite(report.rating) else 0.0
    return Report(
        title=report.title.strip(), summary=report.summary.strip(),
        rating=min(10.0, max(0.0, rating)), rating_explanation=report.rating_explanation.strip(),
        findings=[Finding(summary=f.summary.strip(), explanation=f.explanation.strip())
                  for f in report.findings[:MAX_FINDINGS]],
    )


CAPPED_EXPLANATION = {
    "en": "Rated {rating} (the model gave {model}): the community has {entities} and {relationships}, too few to be "
          "central to the collection.",
    "zh": "评分为{rating}（模型给出{model}）：该社区只有{entities}个实体和{relationships}条关系，规模太小，不足以成为整个数据集的核心。",
}


def capped_explanation(rating: float, model: float, entities: int, relationships: int, language: str) -> str:
    """The explanation of a rating the size cap lowered: the model's own explanation argues for
    the rating it gave, which the report no longer has."""
    if language not in CAPPED_EXPLANATION:
        language = "en"
    if language == "en":
        ents = f"{entities} {'entity' if entities == 1 else 'entities'}"
        rels = f"{relationships} {'relationship' if relationships == 1 else 'relationships'}"
    else:
        ents, rels = str(entities), str(relationships)
    return CAPPED_EXPLANATION[language].format(rating=f"{rating:g}", model=f"{model:g}", entities=ents,
                                               relationships=rels)


def _checked(report: Report, context: str, c: _Community, el: _Elements, counts: Counter[str], language: str) -> Report:
    # Only extracted relationships make a community bigger: a weak co-occurrence edge says two
    # names share a sentence, not that they are related.
    extracted = sum(r not in el.weak for r in c.edge_ids)
    checked = report_checks.check_report(
        report.summary, report.rating, [(f.summary, f.explanation) for f in report.findings], context,
        entities=len(c.titles), relationships=extracted, counts=counts)
    explanation = capped_explanation(checked.rating, report.rating, len(c.titles), extracted, language) \
        if checked.capped else report.rating_explanation
    return Report(title=report.title, summary=checked.summary, rating=checked.rating,
                  rating_explanation=explanation,
                  findings=[Finding(summary=s, explanation=e) for s, e in checked.findings])


def _row_of(c: _Community, report: Report, context_tokens: int, used_sub: bool, today: str) -> dict[str, Any]:
    content_json = json.dumps(report.model_dump(), ensure_ascii=False, indent=2)
    return {
        "id": content_id("community_report", c.id, content_json),
        "human_readable_id": c.number,
        "community": c.number,
        "level": c.level,
        "parent": c.parent,
        "children": list(c.children),
        "title": report.title,
        "summary": report.summary,
        "full_content": _markdown(report),
        "rank": report.rating,
        "rating_explanation": report.rating_explanation,
        "findings": [f.model_dump() for f in report.findings],
        "full_content_json": content_json,
        "period": today,
        "size": c.size,
        "context_tokens": context_tokens,
        "used_sub_reports": used_sub,
        "carried": c.carried,
    }


SINGLE_ENTITY_EXPLANATION = {
    "en": "A single entity with no relationships or claims in the graph; its report is its description.",
    "zh": "图中没有任何关系或主张的单个实体；其报告即该实体的描述。",
}


def _isolated_entity(c: _Community, el: _Elements, comms: dict[int, _Community]) -> bool:
    """A community of one entity with no relationships, claims or sub-communities of its own."""
    own_children = [n for n in c.children if n in comms and not comms[n].carried]
    return len(c.titles) == 1 and not c.edge_ids and not own_children and not el.claims.get(c.titles[0])


def _single_entity_report(title: str, description: str, human_readable_id: object, language: str) -> Report:
    """Such a community has nothing to summarise beyond its entity, so no LLM call is spent on
    it (text corpora yield many isolated entities; Microsoft drops them, we keep them covered)."""
    explanation = SINGLE_ENTITY_EXPLANATION.get(language, SINGLE_ENTITY_EXPLANATION["en"])
    return Report(title=title, summary=description, rating=1.0, rating_explanation=explanation,
                  findings=[Finding(summary=title,
                                    explanation=f"{description} [Data: Entities ({human_readable_id})]")])


ELEMENTARY_EXPLANATION = {
    "en": "A small or only loosely linked community, written from its elements without a model call: a report "
          "could only restate them (reports.llm_min_entities, reports.elementary_roots).",
    "zh": "小社区或仅松散关联的社区，直接由其元素写成，未调用模型：模型的报告只能复述这些元素（reports.llm_min_entities、reports.elementary_roots）。",
}
_AND = {"en": " and ", "zh": "与"}


def _elementary(c: _Community, el: _Elements, comms: dict[int, _Community], min_entities: int,
                roots: bool = True) -> bool:
    """A community with no sub-community or claim of its own that has fewer than `min_entities`
    entities, or no extracted relationship at all (entities that one sentence merely names
    together: co-occurrence edges only); a root one only if `roots`. An LLM report of it can
    only restate its rows; below the root its parent's report reads them too (as rows, or as
    this report when the parent must be composed)."""
    own_children = [n for n in c.children if n in comms and not comms[n].carried]
    if (c.parent < 0 and not roots) or own_children or any(el.claims.get(t) for t in c.titles):
        return False
    return len(c.titles) < min_entities or all(r in el.weak for r in c.edge_ids)


def _elementary_report(c: _Community, el: _Elements, entity_info: dict[str, tuple[str, object]],
                       language: str) -> Report:
    """The report of an elementary community, from its rows: its relationships say what the
    community is about, each entity and relationship is a finding citing its row."""
    findings = [Finding(summary=t, explanation=f"{entity_info[t][0]} [Data: Entities ({entity_info[t][1]})]")
                for t in c.titles]
    related = []
    for rid in c.edge_ids:
        hid, source, target, description, _ = el.edge_source(rid)
        findings.append(Finding(summary=f"{source} – {target}",
                                explanation=f"{description} [Data: Relationships ({hid})]"))
        if rid not in el.weak:
            related.append(str(description))
    summary = " ".join(related) if related else " ".join(entity_info[t][0] for t in c.titles)
    return Report(title=_AND.get(language, _AND["en"]).join(c.titles), summary=summary,
                  rating=max(1.0, report_checks.rating_cap(len(c.titles), len(related)) - 1.0),
                  rating_explanation=ELEMENTARY_EXPLANATION.get(language, ELEMENTARY_EXPLANATION["en"]),
                  findings=findings[:MAX_FINDINGS])


def _communities(communities: pd.DataFrame, el: _Elements) -> dict[int, _Community]:
    out = {}
    carried = communities["carried"] if "carried" in communities else [False] * len(communities)
    for row, is_carried in zip(communities.itertuples(index=False), carried):
        titles = list(dict.fromkeys(el.title_of[e] for e in row.entity_ids if e in el.title_of))
        titles = [t for t in titles if t in el.entity]
        edges = sorted((r for r in row.relationship_ids if r in el.edge), key=el.edge_rank.__getitem__)
        n = int(row.community)
        out[n] = _Community(
            number=n, id=str(row.id), level=int(row.level), parent=int(row.parent),
            children=[int(x) for x in row.children], titles=titles, edge_ids=edges,
            size=int(getattr(row, "size", len(titles))), carried=bool(is_carried),
        )
    return out


def _bottom_up(comms: dict[int, _Community]) -> list[_Community]:
    """The communities to write (not carried copies), deepest level first, then by number, and
    in any case each after its own sub-communities (communities.py puts a sub-community one level
    down, so the first rule already gives the second; this does not rely on it)."""
    order: list[_Community] = []
    placed: set[int] = set()

    def place(c: _Community) -> None:
        if c.number in placed:
            return
        placed.add(c.number)
        for n in c.children:
            if n in comms and not comms[n].carried:
                place(comms[n])
        order.append(c)

    for c in sorted(comms.values(), key=lambda c: (-c.level, c.number)):
        if not c.carried:
            place(c)
    return order


@dataclass
class Writer:
    """What writing any one community's report reads: the graph's rendered rows, the communities,
    the prompt and the budget. write_reports makes one; a Ray Data worker makes its own from the
    same tables (ray_data.reports_on_ray) and writes the communities of its partitions with it."""

    el: _Elements
    comms: dict[int, _Community]
    settings: Settings
    language: str
    template: str
    today: str
    checks: Counter[str] = field(default_factory=report_checks.new_counts)

    @property
    def budget(self) -> int:
        return self.settings.report_input_tokens()

    async def write(self, c: _Community, reports: dict[int, Report], llm: ChatClient,
                    packed: _Packed | None = None) -> tuple[Report, dict] | None:
        """Community `c`'s report and table row, `reports` holding those of its sub-communities
        written so far; None when the call failed after the client's retries. `packed`: its own
        elements packed to the budget (self.packed), if the caller has them already."""
        el, comms, settings, language = self.el, self.comms, self.settings, self.language
        budget = self.budget
        packed = packed or self.packed(c)
        report = None
        if _isolated_entity(c, el, comms):
            report = _single_entity_report(c.titles[0], *self.entity_info(c.titles[0]), language)
        elif _elementary(c, el, comms, settings.reports.llm_min_entities, settings.reports.elementary_roots):
            report = _elementary_report(c, el, {t: self.entity_info(t) for t in c.titles}, language)
        if report is not None:
            return report, _row_of(c, report, 0, False, self.today)
        context, used_sub = _context(c, el, comms, reports, budget, packed)
        context, context_tokens = await _fitted(context, budget)
        messages = to_messages(render(self.template, input_text=context))
        try:
            report = await llm.structured(messages, Report, step=STEP, item=str(c.number),
                                          max_tokens=settings.reports.max_tokens)
        except LLMError:
            return None  # the client recorded it in usage too
        report = _checked(_clean(report), context, c, el, self.checks, language)
        return report, _row_of(c, report, context_tokens, used_sub, self.today)

    def entity_info(self, title: str) -> tuple[str, object]:
        """(description, human_readable_id) of an entity."""
        hid, _, _, description, _ = self.el.entity._sources[title]
        return str(description), hid

    def packed(self, c: _Community) -> _Packed:
        """`c`'s own elements packed to the budget: when they do not all fit (`complete`), its
        context may read its sub-communities' reports, and it must wait for them."""
        return _pack(self.el, c.titles, c.edge_ids, self.budget)


def writer(communities: pd.DataFrame, entities: pd.DataFrame, relationships: pd.DataFrame,
           covariates: pd.DataFrame | None, *, settings: Settings, language: str, today: str | None = None) -> Writer:
    """The Writer of these tables' reports."""
    el = _elements(entities, relationships, covariates)
    return Writer(el, _communities(communities, el), settings, language,
                  load_prompt("community_report", language, settings.root), today or dt.date.today().isoformat())


def levels_bottom_up(w: Writer) -> list[list[_Community]]:
    """The communities to write, level by level, deepest first: every community's sub-communities
    are one level down (communities.py), so a level reads only reports of the levels before it."""
    order = _bottom_up(w.comms)
    return [[c for c in order if c.level == level] for level in sorted({c.level for c in order}, reverse=True)]


async def write_reports(
    communities: pd.DataFrame,
    entities: pd.DataFrame,
    relationships: pd.DataFrame,
    covariates: pd.DataFrame | None,
    llm: ChatClient,
    *,
    settings: Settings,
    language: str,
    advance: Callable[[int], None] | None = None,
    counts: dict[str, int] | None = None,
    elsewhere: Callable[..., tuple[dict[int, tuple[Report, dict] | None], dict[str, int]]] | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Write one report per community, deepest level first. Returns the community_reports table
    and the communities (numbers, as strings) whose report failed, carried copies included.
    `counts` is given what the checks of the answers dropped (report_checks.COUNTS).
    `elsewhere(numbers, reports, today=..., advance=...)`: Writer.write's result for each
    community of one level, computed elsewhere (on a Ray cluster: ray_data.reports_on_ray), and
    its checks' counts; this process then makes no report call itself."""
    if counts is not None:
        counts.update(report_checks.new_counts())  # zeros, for a table with no community
    if communities.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS}), []
    w = writer(communities, entities, relationships, covariates, settings=settings, language=language)
    comms = w.comms
    reports: dict[int, Report] = {}
    rows: dict[int, dict[str, Any]] = {}
    failed: list[int] = []

    def keep(c: _Community, done: tuple[Report, dict] | None) -> None:
        if done is None:
            failed.append(c.number)
        else:
            reports[c.number], rows[c.number] = done

    if elsewhere is not None:
        # Level by level, each level one dataset: its communities read only reports written
        # in the levels before (the prompts are those of the run below).
        for level in levels_bottom_up(w):
            subs = {n: reports[n] for c in level for n in c.children if n in reports}
            done, checks = await asyncio.to_thread(elsewhere, [c.number for c in level], subs, today=w.today,
                                                   advance=advance)
            for c in level:
                keep(c, done.get(c.number))
            w.checks.update(checks)
    else:
        await _write_here(w, reports, keep, llm, advance)

    # Copies reuse the report of the community they copy (their nearest non-carried ancestor).
    for c in sorted((c for c in comms.values() if c.carried), key=lambda c: (c.level, c.number)):
        origin = c.parent
        while origin in comms and comms[origin].carried:
            origin = comms[origin].parent
        if origin in rows:
            src = rows[origin]
            row = _row_of(c, reports[origin], src["context_tokens"], src["used_sub_reports"], w.today)
            rows[c.number] = row
        else:
            failed.append(c.number)
        if advance:
            advance(1)

    table = pd.DataFrame([rows[n] for n in sorted(rows)], columns=COLUMNS)
    if counts is not None:
        counts.update(w.checks)
    return table, [str(n) for n in sorted(failed)]


async def _write_here(w: Writer, reports: dict[int, Report], keep: Callable[[_Community, Any], None],
                      llm: ChatClient, advance: Callable[[int], None] | None) -> None:
    """Every report written by this process, bottom-up by dependency, not level by level: a
    community starts as soon as the reports it may read exist. One whose own elements fit the
    budget reads none (see _context), so it starts as soon as it enters the window; only the
    others wait for their sub-communities. The prompts are exactly those of a level-by-level run,
    but no level waits for the slowest report of the level below, which keeps the client's
    concurrency busy to the end."""
    finished = {n: asyncio.Event() for n, c in w.comms.items() if not c.carried}

    async def write(c: _Community) -> None:
        try:
            packed = w.packed(c)
            if not packed.complete:
                for n in c.children:
                    if n in finished:
                        await finished[n].wait()
            keep(c, await w.write(c, reports, llm, packed))
            if advance:
                advance(1)
        finally:
            finished[c.number].set()

    # A window of communities in progress, not all of them (each holds its packed elements and
    # context): in an order where every community comes after its sub-communities, a community
    # that waits for its sub-communities only waits for ones that entered the window before it,
    # and those only for earlier ones still, down to ones that wait for nothing.
    await run_windowed(_bottom_up(w.comms), write, window=window_of(llm), done=lambda _, __: None)
