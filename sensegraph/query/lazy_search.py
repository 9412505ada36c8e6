"""Lazy search (`--method lazy`): no community report is needed; the LLM is spent at query time,
under a budget of relevance tests of text units (the shape of Microsoft Research's LazyGraphRAG).

LazyGraphRAG's code was never published; its blog post (Nov 2024) is the only description, so
the steps below follow its outline and the details are choices made here:

1. Refine: one structured call (prompt `lazy_subqueries`) splits the question into at most
   `lazy.subqueries` subqueries plus an expanded query, in the question's language. If the call
   fails, the question is its own only subquery (the failure is reported).
2. Match: the question, the expanded query and the subqueries are embedded with the index's
   embedder; a text unit's score is its best cosine similarity to any of them. A community (at
   any level) is ranked by its best unit (then by the mean of its top units). The units of a
   community are its `text_unit_ids`, or, where an index leaves those empty, the text units of
   its entities; units in no community form one extra root community (number -1).
3. Test, breadth-first per level and best-first within it (the blog's iterative deepening):
   the root communities are visited in rank order and the `lazy.units_per_community` best
   untested units of each are tested. A level ends when `lazy.barren_communities` communities
   in a row yield no relevant unit (or its communities run out); the next level is the
   sub-communities of the communities that yielded relevant units, ranked again (a relevant
   community without sub-communities comes back as itself, to test its next-best units). The
   search ends when the budget of unit tests is spent or no relevant community is left. The
   budget counts units, never calls, and is never exceeded. Up to `barren_communities - run`
   communities are tested at once, which keeps the result that of one-at-a-time visits while
   the chat tester packs their units into few calls.
   Testers: `chat` asks the chat model yes/no per unit (+ the subqueries it bears on), several
   units per call (prompt `lazy_relevance`), each unit shown as its best passage: the window of
   consecutive sentences, up to `lazy.snippet_tokens`, that best matches the question, the
   expansion and the subqueries (BM25 over the index's units, no model: query/passages.py), so a
   test costs a tenth of a 1,200-token unit; `embedding` makes no call: a unit is relevant when
   its similarity to some subquery is within `lazy.embedding_margin` of that subquery's best
   unit in the index (or at least `lazy.embedding_threshold`, when set). `auto` picks chat for
   a hosted model and embedding for the embedded one, whose 2-core speed cannot afford a call
   per few units. Which tester answers better is for bench/ to measure.
4. Claims: the relevant units, grouped by the community they were found in (groups with more
   relevant units first), each cut to its best windows grown into their neighbours (up to
   `lazy.claim_tokens`: the tested window and the unit's other matches, with the context around
   them), are packed into token-bounded batches; one call per batch (prompt
   `lazy_claims`) extracts claims, each with the `human_readable_id` of the units it rests on
   (a claim citing no unit of its batch is dropped and counted). Claims are ranked round-robin
   over the groups (each group's best claim first), so a broad question hears from every
   relevant community, packed under `settings.query_context_tokens()` and reduced into the
   answer with global search's reduce prompt (`query_reduce`); citations are `Sources` ids
   checked like every method's. The answer addresses the user's question, not the expanded
   query (the blog answers the expanded one): a small model's rewrite can drift.
Not done: the blog also refines subqueries with matching concepts of the concept graph; that
changes nothing measurable here yet and is left out.
"""
from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..config import Settings
from ..llm.client import LLMError
from ..tokens import count_tokens, truncate
from .answer import Query, QueryResult, each_batch, final_answer, no_answer, result
from .citations import MAX_IDS, normalise
from .context import Context, Section, chunks, pack
from .data import list_ids
from .passages import passage, terms, vocabulary

MAX_SUBQUERIES = 8  # LazySettings.subqueries allows at most this many
MAX_BATCH = 24  # units per relevance-test call: the verdict list's maxItems
MAX_CLAIMS = 10
MAX_SOURCES = 5
ORPHANS = -1  # the community number of the units no community holds


class Subqueries(BaseModel):
    subqueries: list[str] = Field(max_length=MAX_SUBQUERIES)
    expanded_query: str


class Verdict(BaseModel):
    id: int
    relevant: bool
    subqueries: list[int] = Field(max_length=MAX_SUBQUERIES)


class Verdicts(BaseModel):
    verdicts: list[Verdict] = Field(max_length=MAX_BATCH)


class Claim(BaseModel):
    claim: str
    sources: list[int] = Field(max_length=MAX_SOURCES)
    subquery: int
    score: int


class Claims(BaseModel):
    claims: list[Claim] = Field(max_length=MAX_CLAIMS)


# -- 1. subqueries -------------------------------------------------------------------------------
@dataclass
class Plan:
    subqueries: list[str]
    expanded: str = ""
    passages: dict[int, int] = field(default_factory=dict)  # unit row -> tokens of the passage tested
    _weights: dict[str, float] | None = field(default=None, init=False, repr=False)

    def numbered(self) -> str:
        return "\n".join(f"{n}. {s}" for n, s in enumerate(self.subqueries, 1))

    def weights(self, q: Query) -> dict[str, float]:
        """The lexical query passages are chosen by: the question, the expansion, the subqueries."""
        if self._weights is None:
            self._weights = vocabulary(q.index).weights([q.search_text(), self.expanded, *self.subqueries])
        return self._weights


def passage_rows(q: Query, plan: Plan, rows: list[int], cap: int, window: int | None = None,
                 windows: int | None = 1) -> list[pd.Series]:
    """The units at `rows` with their text cut to their best passage (ids and all else kept, so
    verdicts and claims still name the unit)."""
    units = q.index.text_units
    weights = plan.weights(q)
    out = []
    for r in rows:
        row = units.iloc[r].copy()
        text = row.get("text")
        row["text"] = passage(text if isinstance(text, str) else "", weights, cap, window, windows)
        out.append(row)
    return out


async def plan_question(q: Query, failures: list[str]) -> Plan:
    count = q.settings.lazy.subqueries
    try:
        reply = await q.llm.structured(q.render("lazy_subqueries", count=count), Subqueries, step="subqueries",
                                       item="subqueries", max_tokens=120 + 80 * count)
    except LLMError:
        failures.append("subqueries")
        q.log("warning: the subquery call failed after retries; searching with the question alone")
        return Plan([q.question])
    subs = list(dict.fromkeys(" ".join(s.split()) for s in reply.subqueries if s and s.strip()))[:count]
    return Plan(subs or [q.question], " ".join(reply.expanded_query.split()))


# -- 2. ranking ----------------------------------------------------------------------------------
@dataclass
class Ranking:
    score: np.ndarray  # per text-unit row: best similarity to the question, expansion or a subquery
    per_subquery: np.ndarray  # rows x subqueries


async def rank_units(q: Query, plan: Plan) -> Ranking:
    units = q.index.text_units
    texts = [q.search_text(), *([plan.expanded] if plan.expanded else []), *plan.subqueries]
    vectors = await q.index.vectors("text_units", q.embedder, q.log)
    queries = np.asarray(await q.embedder.embed(texts, kind="query", step="embed"), dtype=np.float32)
    sims = np.full((len(units), len(texts)), -1.0, dtype=np.float32)  # a unit without a vector ranks last
    if vectors.ids and vectors.dim:
        row_of = {uid: i for i, uid in enumerate(units["id"].tolist())}
        rows = [(row_of[uid], n) for n, uid in enumerate(vectors.ids) if uid in row_of]
        if rows:
            targets, sources = zip(*rows)
            sims[list(targets)] = vectors.vectors[list(sources)] @ queries.T
    return Ranking(sims.max(axis=1) if len(texts) else np.zeros(len(units)), sims[:, len(texts) - len(plan.subqueries):])


@dataclass
class Node:
    """One community as the search sees it: its units (row positions) best first."""

    number: int
    level: int
    children: list[int]
    units: list[int]
    rank: tuple[float, float] = (0.0, 0.0)


def community_tree(q: Query, ranking: Ranking, k: int) -> tuple[dict[int, Node], list[int]]:
    """Every community with its ranked units, and the root communities."""
    units = q.index.text_units
    row_of = {uid: i for i, uid in enumerate(units["id"].tolist())}
    entities = q.index.tables.get("entities")
    entity_units = ({} if entities is None or entities.empty else
                    dict(zip(entities["id"].tolist(), entities["text_unit_ids"].tolist())))
    score = ranking.score
    comms = q.index.communities
    numbers = {int(c) for c in comms["community"].tolist()} if len(comms) else set()
    nodes: dict[int, Node] = {}
    roots: list[int] = []
    for _, row in comms.iterrows():
        ids = list_ids(row.get("text_unit_ids"))
        if not ids:  # e.g. the synthetic or an older index: the units of the member entities
            ids = [u for e in list_ids(row.get("entity_ids")) for u in list_ids(entity_units.get(e))]
        rows = sorted({row_of[u] for u in ids if u in row_of}, key=lambda r: (-score[r], r))
        n = int(row["community"])
        children = [int(c) for c in list_ids(row.get("children")) if int(c) in numbers]
        nodes[n] = Node(n, int(row["level"]), children, rows, _rank(score, rows, k))
        parent = row.get("parent")
        if parent is None or (isinstance(parent, float) and math.isnan(parent)) or int(parent) not in numbers:
            roots.append(n)
    covered = {r for n in roots for r in nodes[n].units}
    orphans = sorted((r for r in range(len(units)) if r not in covered), key=lambda r: (-score[r], r))
    if orphans:
        nodes[ORPHANS] = Node(ORPHANS, 0, [], orphans, _rank(score, orphans, k))
        roots.append(ORPHANS)
    return nodes, roots


def _rank(score: np.ndarray, rows: list[int], k: int) -> tuple[float, float]:
    if not rows:
        return (-math.inf, -math.inf)
    top = [float(score[r]) for r in rows[:k]]
    return (top[0], sum(top) / len(top))


def ranked(nodes: list[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: (-n.rank[0], -n.rank[1], n.number))


# -- 3. relevance tests --------------------------------------------------------------------------
@dataclass
class Test:
    row: int
    community: int
    level: int
    relevant: bool | None  # None: the test call failed after retries
    subqueries: list[int]
    order: int


Wave = list[tuple[Node, list[int]]]
Tester = Callable[[Query, Plan, Ranking, Wave, list[str]], Awaitable[dict[int, tuple[bool | None, list[int]]]]]


def tester_name(settings: Settings) -> str:
    """The tester `lazy.tester` names; auto = chat for a hosted model, embedding for the embedded one."""
    chosen = settings.lazy.tester
    if chosen == "auto":
        return "embedding" if settings.chat.provider == "local" else "chat"
    return chosen


async def embedding_tester(q: Query, plan: Plan, ranking: Ranking, wave: Wave,
                           failures: list[str]) -> dict[int, tuple[bool | None, list[int]]]:
    """No LLM call: relevant to subquery j when the unit's similarity to j stands out from the
    corpus's (lazy.embedding_z standard deviations above the mean over every unit), is within
    lazy.embedding_margin of j's best unit, or reaches lazy.embedding_threshold."""
    s = q.settings.lazy
    sims = ranking.per_subquery
    best = sims.max(axis=0) if len(sims) else np.zeros(0)
    cut = sims.mean(axis=0) + s.embedding_z * sims.std(axis=0) if len(sims) else np.zeros(0)
    out: dict[int, tuple[bool | None, list[int]]] = {}
    for _, rows in wave:
        for r in rows:
            near = [j + 1 for j in range(sims.shape[1])
                    if sims[r, j] >= best[j] - s.embedding_margin
                    or (s.embedding_z > 0 and sims[r, j] >= cut[j])
                    or (s.embedding_threshold > 0 and sims[r, j] >= s.embedding_threshold)]
            out[r] = (bool(near), near)
    return out


async def chat_tester(q: Query, plan: Plan, ranking: Ranking, wave: Wave,
                      failures: list[str]) -> dict[int, tuple[bool | None, list[int]]]:
    """The chat model's yes/no per unit, read through its best passage (lazy.snippet_tokens);
    the wave's units packed into as few calls as fit."""
    units = q.index.text_units
    rows = [r for _, part in wave for r in part]
    shown = passage_rows(q, plan, rows, q.settings.lazy.snippet_tokens)
    plan.passages.update((r, count_tokens(row["text"])) for r, row in zip(rows, shown))
    batches: list[tuple[Section, list[int]]] = []
    start = 0
    for section in chunks("Sources", shown, _batch_budget(q, plan)):
        part = rows[start:start + len(section)]
        start += len(section)
        for i in range(0, len(part), MAX_BATCH):  # the verdict list holds at most MAX_BATCH
            sub = Section("Sources", section.lines[i:i + MAX_BATCH], section.records[i:i + MAX_BATCH])
            batches.append((sub, part[i:i + MAX_BATCH]))
    n_subs = len(plan.subqueries)

    async def one(section: Section, part: list[int]) -> dict[int, tuple[bool | None, list[int]]]:
        messages = q.render("lazy_relevance", subqueries=plan.numbered(), context=section.text())
        refs = [int(units.iloc[r]["human_readable_id"]) for r in part]
        reply = await q.llm.structured(messages, Verdicts, step="relevance",
                                       item=f"relevance of units {_span(refs)}",
                                       max_tokens=min(q.settings.lazy.test_max_tokens, 40 + 30 * len(part)))
        row_of = dict(zip(refs, part))
        got: dict[int, tuple[bool | None, list[int]]] = {}
        for v in reply.verdicts:
            if v.id in row_of and row_of[v.id] not in got:  # the first verdict on a unit counts
                subs = [j for j in dict.fromkeys(v.subqueries) if 1 <= j <= n_subs]
                got[row_of[v.id]] = (bool(v.relevant), subs if v.relevant else [])
        return got

    out: dict[int, tuple[bool | None, list[int]]] = {}
    for (_, part), outcome in zip(batches, await each_batch(one(s, p) for s, p in batches)):
        if outcome is None:
            refs = [int(units.iloc[r]["human_readable_id"]) for r in part]
            failures.append(f"relevance of units {_span(refs)}")
            out.update({r: (None, []) for r in part})
        else:
            out.update(outcome)  # a unit the model gave no verdict on stays out: see relevance_search
    return out


def _batch_budget(q: Query, plan: Plan) -> int:
    # The instructions, question and subqueries sit beside the units in one prompt.
    return max(300, q.budget - count_tokens(q.question) - count_tokens(plan.numbered()) - 50)


def _span(refs: list[int]) -> str:
    return ", ".join(map(str, refs[:6])) + (f" (+{len(refs) - 6})" if len(refs) > 6 else "")


TESTERS: dict[str, Tester] = {"chat": chat_tester, "embedding": embedding_tester}


@dataclass
class Search:
    tests: dict[int, Test] = field(default_factory=dict)  # row -> its test, in test order
    visits: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = "no relevant community left"
    no_verdict: int = 0

    @property
    def used(self) -> int:
        return len(self.tests)

    def relevant(self) -> list[Test]:
        return [t for t in self.tests.values() if t.relevant]


async def relevance_search(q: Query, plan: Plan, ranking: Ranking, nodes: dict[int, Node], roots: list[int],
                           budget: int, tester: Tester, failures: list[str]) -> Search:
    """Test units under `budget` (a count of units), breadth-first per level, deepening into
    the communities that yielded relevant units (see the module docstring)."""
    s = q.settings.lazy
    k, z = s.units_per_community, s.barren_communities
    search = Search()
    frontier = ranked([nodes[n] for n in roots])
    while frontier and search.used < budget:
        found: list[Node] = []
        barren = 0
        i = 0
        while i < len(frontier) and search.used < budget and barren < z:
            # The next communities with untested units, as many as could all be barren before
            # the level ends: testing them together gives what one-at-a-time visits would.
            wave: Wave = []
            taken: set[int] = set()
            while i < len(frontier) and len(wave) < z - barren and search.used + len(taken) < budget:
                node = frontier[i]
                i += 1
                room = budget - search.used - len(taken)
                rows = [r for r in node.units if r not in search.tests and r not in taken][:min(k, room)]
                if rows:  # a community whose units were all tested has nothing new to say
                    wave.append((node, rows))
                    taken.update(rows)
            if not wave:
                break
            verdicts = await tester(q, plan, ranking, wave, failures)
            for node, rows in wave:
                hits = 0
                for r in rows:
                    if r not in verdicts:
                        # Tested (the budget is spent) but the model skipped it: not relevant,
                        # and counted apart, so a model that skips units shows in the stats.
                        search.no_verdict += 1
                    relevant, subs = verdicts.get(r, (False, []))
                    search.tests[r] = Test(r, node.number, node.level, relevant, subs, len(search.tests))
                    hits += bool(relevant)
                search.visits.append({"community": node.number, "level": node.level, "tested": len(rows),
                                      "relevant": hits})
                if hits:
                    found.append(node)
                    barren = 0
                else:
                    barren += 1
        if search.used >= budget:
            search.stopped = "budget spent"
            break
        deeper: dict[int, Node] = {}
        for node in found:
            kids = [nodes[c] for c in node.children if c in nodes]
            for kid in kids or [node]:  # a relevant leaf: its next-best units
                deeper.setdefault(kid.number, kid)
        frontier = ranked(list(deeper.values()))
    return search


# -- 4. claims and the answer --------------------------------------------------------------------
@dataclass
class Found:
    text: str
    sources: list[int]  # human_readable_ids of text units
    subquery: int
    score: int
    community: int
    order: int


def grounded(claim: str, cited: str, share: float) -> bool:
    """Whether `claim` says something its cited passages say: not a question, and at least
    `share` of its terms (passages.terms: words, or character pairs for Chinese) occur in them.
    A small model's "claims" that restate the question or a subquery fail this; a paraphrase of
    the passage passes, since it reuses the passage's names and words."""
    if claim.rstrip().endswith(("?", "？")):
        return False
    if share <= 0:
        return True
    words = set(terms(claim))
    if not words:
        return False
    return len(words & set(terms(cited))) >= share * len(words)


async def extract_claims(q: Query, plan: Plan, search: Search, ranking: Ranking,
                         failures: list[str]) -> tuple[list[Found], list[Section], dict[str, int]]:
    """Claims from the relevant units, grouped by the community they were found in, each unit
    read through its best passages (lazy.claim_tokens, in windows of lazy.snippet_tokens)."""
    units = q.index.text_units
    groups: dict[int, list[Test]] = {}
    for t in search.relevant():
        groups.setdefault(t.community, []).append(t)
    order = sorted(groups, key=lambda c: (-len(groups[c]), groups[c][0].order))
    rows = [t.row for c in order for t in sorted(groups[c], key=lambda t: (-ranking.score[t.row], t.order))]
    community_of = {int(units.iloc[t.row]["human_readable_id"]): t.community for t in search.relevant()}
    lazy = q.settings.lazy
    # As many windows as fit: a unit can bear on two subqueries in two places.
    shown = passage_rows(q, plan, rows, lazy.claim_tokens, lazy.snippet_tokens, windows=None)
    batches = list(chunks("Sources", shown, _batch_budget(q, plan)))
    n_subs = len(plan.subqueries)
    counts = {"claims_dropped": 0, "claims_ungrounded": 0}

    async def one(i: int, section: Section) -> list[Found]:
        messages = q.render("lazy_claims", subqueries=plan.numbered(), context=section.text())
        reply = await q.llm.structured(messages, Claims, step="claims", item=f"claims batch {i + 1}",
                                       max_tokens=q.settings.lazy.claims_max_tokens)
        given = [r["ref"] for r in section.records]
        out = []
        for c in reply.claims:
            text, _ = normalise(c.claim, {})  # an inline reference is dropped; `sources` says it
            text = " ".join(text.split())
            sources = [s for s in dict.fromkeys(c.sources) if s in given]
            if not sources and len(given) == 1:
                sources = given  # one passage: nothing else it can rest on
            if not text or not sources:
                counts["claims_dropped"] += 1  # a claim that names no passage of its batch is unchecked
                continue
            cited = " ".join(r.get("text") or "" for r in section.records if r["ref"] in sources)
            if not grounded(text, cited, lazy.claim_grounding):
                counts["claims_dropped"] += 1
                counts["claims_ungrounded"] += 1
                continue
            out.append(Found(text, sources, c.subquery if 1 <= c.subquery <= n_subs else 0,
                             max(0, min(100, c.score)), community_of.get(sources[0], ORPHANS), 0))
        return out

    found: list[Found] = []
    for i, outcome in enumerate(await each_batch(one(i, b) for i, b in enumerate(batches))):
        if outcome is None:
            failures.append(f"claims batch {i + 1}")
        else:
            found.extend(outcome)
    for n, f in enumerate(found):
        f.order = n
    counts["claim_calls"] = len(batches)
    return found, batches, counts


def rank_claims(claims: list[Found], search: Search) -> list[Found]:
    """Claims scored above 0, round-robin over their communities: communities with more relevant
    units first, within one community the best-scored claims first."""
    relevant = search.relevant()
    size = {c: sum(t.community == c for t in relevant) for c in {t.community for t in relevant}}
    first = {}
    for t in relevant:
        first.setdefault(t.community, t.order)
    groups: dict[int, list[Found]] = {}
    for c in claims:
        if c.score > 0:
            groups.setdefault(c.community, []).append(c)
    order = sorted(groups, key=lambda c: (-size.get(c, 0), first.get(c, math.inf), c))
    queues = [sorted(groups[c], key=lambda f: (-f.score, f.order)) for c in order]
    out: list[Found] = []
    depth = 0
    while any(depth < len(qu) for qu in queues):
        out.extend(qu[depth] for qu in queues if depth < len(qu))
        depth += 1
    return out


def claims_context(claims: list[Found], budget: int, language: str) -> tuple[str, list[Found]]:
    """The ranked claims as the reduce prompt's key points, in order, until the budget is full."""
    label = "要点" if language == "zh" else "Key point"
    score_label = "重要性分数" if language == "zh" else "Importance Score"
    parts: list[str] = []
    kept: list[Found] = []
    used = 0
    for n, c in enumerate(claims, 1):
        shown = ", ".join(map(str, c.sources[:MAX_IDS])) + (", +more" if len(c.sources) > MAX_IDS else "")
        block = f"----{label} {n}----\n{score_label}: {c.score}\n{c.text} [Data: Sources ({shown})]\n"
        cost = count_tokens(block)
        if used + cost > budget:
            if not parts:
                parts.append(truncate(block, budget))
                kept.append(c)
            break
        parts.append(block)
        kept.append(c)
        used += cost
    return "\n".join(parts), kept


async def retrieve(q: Query, budget: int, failures: list[str]) -> tuple[Plan, Ranking, Search]:
    """Steps 1-3, the retrieval: subqueries, ranked units and communities, relevance tests under
    `budget`. `search.relevant()` are the units found relevant (bench/multihop_recall.py
    measures them against gold passages)."""
    plan = await plan_question(q, failures)
    ranking = await rank_units(q, plan)
    nodes, roots = community_tree(q, ranking, q.settings.lazy.units_per_community)
    search = await relevance_search(q, plan, ranking, nodes, roots, budget, TESTERS[tester_name(q.settings)],
                                    failures)
    return plan, ranking, search


async def lazy_search(q: Query, budget: int | None = None) -> QueryResult:
    """Answer from the text units found relevant under `budget` relevance tests (default lazy.budget)."""
    s = q.settings.lazy
    budget = s.budget if budget is None else int(budget)
    if budget < 1:
        raise ValueError(f"the lazy search budget must be at least 1 (got {budget})")
    failures: list[str] = []
    plan, ranking, search = await retrieve(q, budget, failures)
    name = tester_name(q.settings)
    claims, batches, counts = await extract_claims(q, plan, search, ranking, failures)
    text, kept = claims_context(rank_claims(claims, search), q.budget, q.language)
    claim_failures = [f for f in failures if f.startswith("claims batch")]
    fallback: Section | None = None
    if kept:
        answer = await final_answer(q, q.render("query_reduce", context=text), step="reduce")
    elif search.relevant() and (counts["claims_dropped"] or claim_failures):
        # Relevant units were found but no claim survived (a model that names no source, or
        # failed calls): answer from the units themselves rather than lose what was found.
        fallback = pack("Sources", (r for b in batches for r in _rows(q, b)), q.budget)
        answer = await final_answer(q, q.render("query_answer", context=fallback.text()), step="answer")
    else:  # nothing relevant was found, or nothing relevant was said: say so, invent nothing
        answer = no_answer(q)
    context = Context(batches)
    units = q.index.text_units
    relevant = search.relevant()
    levels = sorted({v["level"] for v in search.visits})
    stats: dict[str, Any] = {
        "budget": budget, "tester": name, "snippet_tokens": s.snippet_tokens, "claim_tokens": s.claim_tokens,
        "tests_used": search.used, "relevant_units": len(relevant),
        "no_verdict": search.no_verdict, "failed_tests": sum(t.relevant is None for t in search.tests.values()),
        "communities_visited": len({v["community"] for v in search.visits}),
        "relevant_communities": len({t.community for t in relevant}),
        "levels_reached": levels, "deepest_level": levels[-1] if levels else None, "stopped": search.stopped,
        "subqueries": plan.subqueries, "expanded_query": plan.expanded,
        "claims": len(claims), "claims_dropped": counts["claims_dropped"],
        "claims_ungrounded": counts["claims_ungrounded"], "claims_reduced": len(kept),
        "claim_calls": counts["claim_calls"], "reduce_calls": 1 if kept else 0,
        "answered_from": "claims" if kept else "sources" if fallback is not None else "nothing",
        "context_units": context.units, "context_tokens": context.tokens,
        "tested": [{"unit": int(units.iloc[t.row]["human_readable_id"]), "id": units.iloc[t.row]["id"],
                    "community": t.community, "level": t.level, "relevant": t.relevant,
                    "subqueries": t.subqueries, "similarity": round(float(ranking.score[t.row]), 4),
                    **({"passage_tokens": plan.passages[t.row]} if t.row in plan.passages else {})}
                   for t in search.tests.values()],
        "visits": search.visits,
        "claims_used": [{"claim": c.text, "sources": c.sources, "subquery": c.subquery, "score": c.score,
                         "community": c.community} for c in kept],
    }
    if failures:
        q.log(f"warning: {len(failures)} lazy search calls failed after retries: {', '.join(failures)}")
    allowed = {"Sources": {ref for c in kept for ref in c.sources} if fallback is None
               else {r["ref"] for r in fallback.records}}
    return result(q, "lazy", answer, context, stats=stats, allowed=allowed, failures=failures)


def _rows(q: Query, section: Section) -> list[pd.Series]:
    return [r for _, r in q.index.rows_by("text_units", "id", [rec["id"] for rec in section.records]).iterrows()]


def estimate_calls(settings: Settings, budget: int | None = None) -> int:
    """Rough chat calls of one lazy question: subqueries, tests (chat tester: a wave of
    communities per call), claims (about one call per few relevant units) and the reduce."""
    s = settings.lazy
    budget = s.budget if budget is None else budget
    tests = 0 if tester_name(settings) == "embedding" else math.ceil(budget / (s.units_per_community * s.barren_communities))
    return 1 + tests + max(1, math.ceil(budget / 20)) + 1


__all__ = ["lazy_search", "estimate_calls", "tester_name", "relevance_search", "community_tree", "Plan"]
