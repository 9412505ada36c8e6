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
3. Test under the budget, which is spent: each subquery gets an equal share of `budget` unit
   tests and spends it best-first over the communities (the blog's iterative deepening). A
   subquery visits the community whose best untested unit is nearest to it, first among those
   that earned it (a community that yielded relevant units, or a sub-community of one), then
   among those not visited yet, then among those visited in vain (their next units wait until
   nothing better is left), and tests its `lazy.units_per_community` best untested units. A
   relevant community's sub-communities are visited next; a relevant leaf comes back for its
   next units. Visits of every subquery are tested together in waves of up to MAX_BATCH units
   (one call each), a community visited once per wave by a subquery. The search ends when the
   budget is spent or every unit was tested: a visit in vain never ends it, so a larger budget
   always sees more of the corpus. The budget counts units, never calls, and is never exceeded.
   After each wave, a subquery that has found nothing while others have is refined: embedded
   again with the concepts of the units found relevant (`lazy.refine_concepts` of them, ranked
   by their NPMI with the concepts the question names, then by rarity), which is how the second
   hop of "the father of the director of film X" is found once the director is.
   Units linked to what was found are tested next (`lazy.follow_links` of them per relevant
   wave, pseudo-community LINKED): personalised PageRank from the relevant units over the graph
   walk's concept-unit graph (query/graph_walk.py), which reaches the second hop's unit when it
   shares a concept with the first hop but resembles no subquery.
   Testers: `chat` (the default, for every model) asks the chat model, each unit shown as its
   best passage: the window of consecutive sentences, up to `lazy.snippet_tokens`, that best
   matches the question, the expansion and the subqueries (BM25 over the index's units, no
   model: query/passages.py), so a test costs a tenth of a 1,200-token unit. How it is asked is
   `lazy.test_format`: `scores` rates each unit 0-3 (prompt `lazy_relevance`;
   `lazy.relevance_threshold` and up is relevant) as LazyGraphRAG does, the default for a strong
   model; `pick` lists the units that help (prompt `lazy_pick`), the default for a small model,
   which rates nearly everything relevant; `yesno` asks one unit per call for one token and
   reads P(yes) from its log-probabilities (ChatClient.choose); `answers` has the model answer
   the subqueries and keeps the units whose answer is found in them (its answers then refine the
   subqueries still unanswered). Up to `lazy.units_per_call` units per call. The embedding
   prior (`lazy.embedding_prior`, on for a small model) counts a unit relevant whatever the
   model said when its similarity stands `lazy.prior_z` standard deviations above the corpus's
   mean: a small model turns down half of the obvious units (docs/performance.md, "the
   relevance tester"). `embedding` makes no call: a unit is relevant when its similarity to
   some subquery stands out from the corpus's. Otherwise the embedding score only orders the
   tests.
4. Claims: the relevant units, grouped by the community they were found in (groups with more
   relevant units first; a group is never split across calls unless it alone is larger than
   one), each cut to its best windows grown into their neighbours (up to `lazy.claim_tokens`),
   are packed into token-bounded batches; one call per batch (prompt `lazy_claims`) extracts up
   to `lazy.claims_per_unit` claims per unit it reads, each with the `human_readable_id` of the
   units it rests on (a claim citing no unit of its batch is dropped and counted). A claim must
   share `lazy.claim_grounding` of its own terms (those not in the question or a subquery) with
   its passages and contradict none of them (a number they do not hold, or a negation that
   governs what their matching sentence states, or the reverse: `contradicted`); repeats are
   merged. Claims are ranked round-robin over the groups (each
   group's best claim first), so a broad question hears from every relevant community, packed
   under `settings.query_context_tokens()` and reduced into the answer with global search's
   reduce prompt (`query_reduce`); citations are `Sources` ids checked like every method's. The
   answer addresses the user's question, not the expanded query (the blog answers the expanded
   one): a small model's rewrite can drift.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field, create_model

from ..config import Settings
from ..llm.client import LLMError
from ..tokens import count_tokens, truncate
from .answer import Query, QueryResult, each_batch, final_answer, no_answer, picks_schema, result
from .citations import MAX_IDS, normalise
from .context import Context, Section, chunks, header, pack, row_values
from .data import list_ids
from ..index.grounding import fold
from .graph_walk import graph_of, pagerank
from .passages import CJK, passage, sentences, terms, vocabulary

MAX_SUBQUERIES = 8  # LazySettings.subqueries allows at most this many
MAX_BATCH = 24  # units per relevance-test call: the verdict list's maxItems
MAX_SOURCES = 5
CLAIM_TOKENS = 70  # generated tokens one claim with its fields takes, about
ORPHANS = -1  # the community number of the units no community holds
LINKED = -2  # the pseudo-community of the units linked to those found relevant (lazy.follow_links)


class Subqueries(BaseModel):
    subqueries: list[str] = Field(max_length=MAX_SUBQUERIES)
    expanded_query: str


class Rating(BaseModel):
    id: int
    score: int  # 0-3 (clamped on read): 2 and up is relevant by default (lazy.relevance_threshold)


class Ratings(BaseModel):
    ratings: list[Rating] = Field(max_length=MAX_BATCH)


class Answer(BaseModel):
    subquery: int
    answer: str  # words copied from the passage: checked against it in code
    id: int


class Answers(BaseModel):
    answers: list[Answer]


@functools.lru_cache(maxsize=64)
def answers_schema(most: int) -> type[BaseModel]:
    """The answers of one test call, at most `most` of them (its maxItems)."""
    return create_model("Answers", answers=(list[Answer], Field(max_length=most)), __base__=Answers)


class Claim(BaseModel):
    claim: str
    sources: list[int] = Field(max_length=MAX_SOURCES)
    subquery: int
    score: int


class Claims(BaseModel):
    claims: list[Claim]


@functools.lru_cache(maxsize=64)
def claims_schema(most: int) -> type[BaseModel]:
    """The claims answer for a batch that may give `most` claims (its maxItems): the cap scales
    with the batch's units (lazy.claims_per_unit each) instead of one fixed number per call."""
    return create_model("Claims", claims=(list[Claim], Field(max_length=most)), __base__=Claims)


# -- 1. subqueries -------------------------------------------------------------------------------
@dataclass
class Plan:
    subqueries: list[str]
    expanded: str = ""
    passages: dict[int, int] = field(default_factory=dict)  # unit row -> tokens of the passage tested
    yes: dict[int, float] = field(default_factory=dict)  # unit row -> the yes-no tester's P(yes)
    refined: dict[int, list[str]] = field(default_factory=dict)  # subquery (1-based) -> concepts added
    # the answers tester's checked answers: subquery (1-based) -> [(answer, unit row)]
    answers: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    by_answers: bool = False  # the answers tester: a subquery counts as found when it has an answer
    _weights: dict[str, float] | None = field(default=None, init=False, repr=False)

    def numbered(self) -> str:
        """The subqueries as the prompts show them: a refined one with the concepts it was
        refined with, as it is embedded, so a tester judging the second hop ("the director's
        nationality") knows whom the first hop found."""
        return "\n".join(f"{n}. {s}" + (f" ({', '.join(self.refined[n])})" if self.refined.get(n) else "")
                         for n, s in enumerate(self.subqueries, 1))

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
    ordered: bool = False  # units are in the order to test them (the linked units), not by similarity


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
    subqueries: list[int]  # the subquery the unit was chosen for (1-based), when relevant
    order: int
    score: int = 0  # the tester's 0-3
    vouched: bool = False  # relevant by the embedding prior (lazy.embedding_prior), not by the model


Wave = list[tuple[Node, list[int]]]
# A tester gives each tested row (relevant, score 0-3); a row it gave no verdict on is missing.
Verdict = tuple[bool | None, int]
Tester = Callable[[Query, Plan, Ranking, Wave, list[str]], Awaitable[dict[int, Verdict]]]


def tester_name(settings: Settings) -> str:
    """The tester `lazy.tester` names; auto = the chat model, whichever it is (docs/performance.md
    has the measurement that chose it)."""
    chosen = settings.lazy.tester
    return "chat" if chosen == "auto" else chosen


async def embedding_tester(q: Query, plan: Plan, ranking: Ranking, wave: Wave,
                           failures: list[str]) -> dict[int, Verdict]:
    """No LLM call: relevant when the unit's similarity to some subquery stands out from the
    corpus's (lazy.embedding_z standard deviations above the mean over every unit), is within
    lazy.embedding_margin of that subquery's best unit, or reaches lazy.embedding_threshold."""
    s = q.settings.lazy
    sims = ranking.per_subquery
    best = sims.max(axis=0) if len(sims) else np.zeros(0)
    cut = sims.mean(axis=0) + s.embedding_z * sims.std(axis=0) if len(sims) else np.zeros(0)
    out: dict[int, Verdict] = {}
    for _, rows in wave:
        for r in rows:
            near = any(sims[r, j] >= best[j] - s.embedding_margin
                       or (s.embedding_z > 0 and sims[r, j] >= cut[j])
                       or (s.embedding_threshold > 0 and sims[r, j] >= s.embedding_threshold)
                       for j in range(sims.shape[1]))
            out[r] = (near, 3 if near else 0)
    return out


async def chat_tester(q: Query, plan: Plan, ranking: Ranking, wave: Wave,
                      failures: list[str]) -> dict[int, Verdict]:
    """The chat model's 0-3 per unit, read through its best passage (lazy.snippet_tokens); the
    wave's units packed into as few calls as fit (at most MAX_BATCH each). The answer is a short
    list of {id, score}, or with Settings.lazy_test_format "pick" of the ids that help: a verdict
    costs a few generated tokens, so a call of 24 units is mostly its prompt, which a small local
    model reads several times faster than it writes."""
    units = q.index.text_units
    rows = [r for _, part in wave for r in part]
    shown = passage_rows(q, plan, rows, q.settings.lazy.snippet_tokens)
    plan.passages.update((r, count_tokens(row["text"])) for r, row in zip(rows, shown))
    batches: list[tuple[Section, list[int]]] = []
    per_call = min(MAX_BATCH, q.settings.lazy.units_per_call)
    start = 0
    for section in chunks("Sources", shown, _batch_budget(q, plan)):
        part = rows[start:start + len(section)]
        start += len(section)
        for i in range(0, len(part), per_call):  # the rating list holds at most MAX_BATCH
            sub = Section("Sources", section.lines[i:i + per_call], section.records[i:i + per_call])
            batches.append((sub, part[i:i + per_call]))
    threshold = q.settings.lazy.relevance_threshold
    form = q.settings.lazy_test_format()[0]
    pick = form == "pick"
    if form == "yesno":
        return await _yesno(q, plan, rows, shown, failures)

    async def one(section: Section, part: list[int]) -> dict[int, Verdict]:
        refs = [int(units.iloc[r]["human_readable_id"]) for r in part]
        row_of = dict(zip(refs, part))
        got: dict[int, Verdict] = {}
        if form == "answers":
            return await _answers(q, plan, section, part, refs, row_of)
        if pick:
            most = min(len(part), max(2, math.ceil(len(part) / 4)))
            messages = q.render("lazy_pick", subqueries=plan.numbered(), context=section.text(), most=most)
            reply = await q.llm.structured(messages, picks_schema(most), step="relevance",
                                           item=f"relevance of units {_span(refs)}",
                                           max_tokens=min(q.settings.lazy.test_max_tokens, 30 + 6 * most))
            chosen = [row_of[ref] for ref in dict.fromkeys(reply.relevant) if ref in row_of]
            # a unit not chosen was read and judged: 0; the first chosen scores 3, the others 2
            scores = {r: 0 for r in part} | {r: 3 if n == 0 else 2 for n, r in enumerate(chosen)}
            return {r: (score >= threshold, score) for r, score in scores.items()}
        messages = q.render("lazy_relevance", subqueries=plan.numbered(), context=section.text())
        reply = await q.llm.structured(messages, Ratings, step="relevance",
                                       item=f"relevance of units {_span(refs)}",
                                       max_tokens=min(q.settings.lazy.test_max_tokens, 40 + 14 * len(part)))
        for rating in reply.ratings:
            if rating.id in row_of and row_of[rating.id] not in got:  # the first rating of a unit counts
                score = max(0, min(3, int(rating.score)))
                got[row_of[rating.id]] = (score >= threshold, score)
        return got

    out: dict[int, Verdict] = {}
    for (_, part), outcome in zip(batches, await each_batch(one(s, p) for s, p in batches)):
        if outcome is None:
            refs = [int(units.iloc[r]["human_readable_id"]) for r in part]
            failures.append(f"relevance of units {_span(refs)}")
            out.update({r: (None, 0) for r in part})
        else:
            out.update(outcome)  # a unit the model gave no verdict on stays out: see relevance_search
    return out


async def _answers(q: Query, plan: Plan, section: Section, part: list[int], refs: list[int],
                   row_of: dict[int, int]) -> dict[int, Verdict]:
    """The model answers the subqueries from the call's passages, each answer copied from the
    passage it names; a unit is relevant when an answer of it is found in its passage (checked
    here, folded: grounding.fold), so a small model's guess that a passage helps, which it cannot
    back with the passage's own words, does not count. The answers found also refine the
    subqueries still unanswered (refiner): "the director's nationality" with the director's name."""
    n_subs = len(plan.subqueries)
    most = min(2 * len(part), max(2, n_subs + math.ceil(len(part) / 4)))
    messages = q.render("lazy_answers", subqueries=plan.numbered(), context=section.text(), most=most)
    reply = await q.llm.structured(messages, answers_schema(most), step="relevance",
                                   item=f"relevance of units {_span(refs)}",
                                   max_tokens=min(q.settings.lazy.test_max_tokens, 40 + 30 * most))
    text_of = {ref: fold(str(rec.get("text") or "")) for ref, rec in zip(refs, section.records)}
    asked = fold(" ".join([q.question, *plan.subqueries]))
    scores = {r: 0 for r in part}
    for a in reply.answers:
        said = fold(a.answer).strip(" .,;:!?\"'")
        if a.id not in row_of or len(said) < 2 or said not in text_of[a.id] or said in asked:
            continue  # not this call's passage, not in its words, or the question's own words back
        r = row_of[a.id]
        scores[r] = 3
        j = a.subquery if 1 <= a.subquery <= n_subs else 0
        if j:
            plan.answers.setdefault(j, []).append((a.answer.strip(), r))
    return {r: (score >= 2, score) for r, score in scores.items()}


def verdict_of(p: float, cut: float) -> Verdict:
    """A yes-probability as a verdict: relevant at `cut` or more; its 0-3 score for ordering
    claims (0.75 and up 3, then 2, 1 and 0 by quarters)."""
    return p >= cut, min(3, int(p * 4))


async def _yesno(q: Query, plan: Plan, rows: list[int], shown: list[pd.Series],
                 failures: list[str]) -> dict[int, Verdict]:
    """One call per unit (prompt `lazy_yesno`), one generated token: the model's probability of
    "yes" (ChatClient.choose). The question and subqueries open every prompt, so a server that
    caches prompt prefixes (llama.cpp does, per slot) reads only the passage anew; a small model
    judges one passage far better than it picks among twenty (docs/performance.md)."""
    units = q.index.text_units
    cut = q.settings.lazy.yes_threshold
    refs = [int(units.iloc[r]["human_readable_id"]) for r in rows]

    async def one(ref: int, row: pd.Series) -> dict[str, float]:
        messages = q.render("lazy_yesno", subqueries=plan.numbered(), passage=str(row["text"]))
        return await q.llm.choose(messages, ("yes", "no"), step="relevance", item=f"relevance of unit {ref}")

    out: dict[int, Verdict] = {}
    for r, ref, probs in zip(rows, refs, await each_batch(one(ref, row) for ref, row in zip(refs, shown))):
        if probs is None:  # failed after retries: named, and no verdict
            failures.append(f"relevance of unit {ref}")
            out[r] = (None, 0)
        elif probs:
            plan.yes[r] = probs["yes"]
            out[r] = verdict_of(probs["yes"], cut)
        # else: an answer that is neither yes nor no: no verdict (relevance_search counts it)
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
    stopped: str = "every unit tested"
    no_verdict: int = 0
    budgets: list[int] = field(default_factory=list)   # per subquery
    spent: list[int] = field(default_factory=list)     # tests made for each subquery
    refined: dict[int, list[str]] = field(default_factory=dict)  # subquery -> concepts added

    @property
    def used(self) -> int:
        return len(self.tests)

    def relevant(self) -> list[Test]:
        return [t for t in self.tests.values() if t.relevant]


# The order in which the search visits communities, per subquery (best-first within a tier):
FOLLOW = 3     # the units the concept graph links most strongly to those found relevant
DEEPEN = 2     # a community that yielded relevant units, or a sub-community of one
UNVISITED = 1  # not visited yet
BARREN = 0     # visited, nothing relevant found: its next units wait until nothing better is left


@dataclass
class _Frontier:
    """The communities one subquery may visit next, each with its tier (above); a community's
    priority is its tier, then the similarity of its best untested unit to the subquery."""

    column: int                      # the subquery's column of Ranking.per_subquery
    tier: dict[int, int] = field(default_factory=dict)
    # per community: its units by similarity to the subquery, and how many of them are behind
    # (tested or taken): a visit reads on from there instead of sorting again
    _order: dict[int, list[int]] = field(default_factory=dict)
    _next: dict[int, int] = field(default_factory=dict)

    def resort(self) -> None:
        """Forget the orders: the subquery's similarities changed."""
        self._order.clear()
        self._next.clear()

    def forget(self, n: int) -> None:
        """Forget community n's order: its units changed (the linked units after a wave)."""
        self._order.pop(n, None)
        self._next.pop(n, None)

    def _untested(self, n: int, nodes: dict[int, Node], sims: np.ndarray, done: Callable[[int], bool]) -> list[int]:
        order = self._order.get(n)
        if order is None:
            order = self._order[n] = (list(nodes[n].units) if nodes[n].ordered else
                                      sorted(nodes[n].units, key=lambda r: (-float(sims[r, self.column]), r)))
        i = self._next.get(n, 0)
        while i < len(order) and done(order[i]):
            i += 1
        self._next[n] = i
        return order[i:]

    def best(self, nodes: dict[int, Node], sims: np.ndarray, tested: dict[int, Test],
             taken: set[int], skip: set[int]) -> tuple[int, list[int]] | None:
        """The community to visit next (not one of `skip`) and its untested units best first, or None."""
        def done(r: int) -> bool:
            return r in tested or r in taken

        choice, key = None, None
        for n, tier in self.tier.items():
            if n in skip:
                continue
            rows = self._untested(n, nodes, sims, done)
            if not rows:
                continue
            k = (tier, float(sims[rows[0], self.column]), -n)
            if key is None or k > key:
                choice, key = n, k
        if choice is None:
            return None
        return choice, [r for r in self._untested(choice, nodes, sims, done) if not done(r)]


def standing_out(ranking: Ranking) -> np.ndarray:
    """Each unit's best similarity (to the question, the expansion or a subquery) in standard
    deviations above the corpus's mean: the embedding prior. On the 6,119-passage 2Wiki corpus
    the first-hop passage of nearly every question stands 5-10 above, and the best passage for
    a question the corpus cannot answer ("the boiling point of liquid nitrogen") at most 5.3; a
    corpus of n units cannot exceed sqrt(n - 1), so a small one vouches for nothing."""
    score = ranking.score
    valid = score[score > -1]
    if len(valid) < 2 or float(valid.std()) <= 0:
        return np.zeros(len(score))
    return (score - float(valid.mean())) / float(valid.std())


def _split(budget: int, parts: int) -> list[int]:
    """`budget` in `parts` shares that differ by at most one (the first ones larger)."""
    return [budget // parts + (1 if i < budget % parts else 0) for i in range(parts)]


async def relevance_search(q: Query, plan: Plan, ranking: Ranking, nodes: dict[int, Node], roots: list[int],
                           budget: int, tester: Tester, failures: list[str],
                           refine: Callable[[Search], Awaitable[bool]] | None = None) -> Search:
    """Test units under `budget` (a count of units; see the module docstring): each subquery
    spends its share, best-first over the communities, deepening into those that yield relevant
    units, until the share is spent or every unit was tested (every subquery can reach every
    unit from the roots, so no share goes unused while units are left). After each wave
    `refine` may change the subqueries' similarities (it returns whether it did)."""
    k = q.settings.lazy.units_per_community
    n_subs = max(1, ranking.per_subquery.shape[1])
    sims = ranking.per_subquery if ranking.per_subquery.shape[1] else ranking.score[:, None]
    search = Search(budgets=_split(budget, n_subs), spent=[0] * n_subs)
    frontiers = [_Frontier(j, {n: UNVISITED for n in roots}) for j in range(n_subs)]
    step = max(MAX_BATCH, budget // 10)  # a progress line every tenth of a large budget
    reported = 0
    linked_from = 0  # relevant units the linked units were last computed from
    prior_z = q.settings.lazy.prior_z if tester is not embedding_tester and q.settings.lazy_prior()[0] == "on" else 0.0
    while search.used < budget:
        # One wave: the subqueries with budget left visit their best community in turn until a
        # call's worth of units is chosen; the wave is tested at once.
        wave: Wave = []
        chooser: list[int] = []  # the subquery each visit of the wave is for
        taken: set[int] = set()
        share = {j: search.budgets[j] - search.spent[j] for j in range(n_subs)}
        # a community is visited once per wave by a subquery: what its test says decides the next
        visited: list[set[int]] = [set() for _ in range(n_subs)]
        while len(taken) < MAX_BATCH:
            progressed = False
            for j in range(n_subs):
                room = min(k, share[j], MAX_BATCH - len(taken))
                if room <= 0:
                    continue
                pick = frontiers[j].best(nodes, sims, search.tests, taken, visited[j])
                if pick is None:
                    continue
                n, rows = pick
                visited[j].add(n)
                wave.append((nodes[n], rows[:room]))
                chooser.append(j)
                taken.update(rows[:room])
                share[j] -= len(rows[:room])
                progressed = True
            if not progressed:
                break
        if not wave:
            break  # every unit tested
        verdicts = await tester(q, plan, ranking, wave, failures)
        stands_out = standing_out(ranking) if prior_z else None
        for (node, rows), j in zip(wave, chooser):
            hits = 0
            for r in rows:
                if r not in verdicts:
                    # Tested (the budget is spent) but the model skipped it: not relevant,
                    # and counted apart, so a model that skips units shows in the stats.
                    search.no_verdict += 1
                relevant, score = verdicts.get(r, (False, 0))
                vouched = bool(stands_out is not None and relevant is False and stands_out[r] >= prior_z)
                if vouched:
                    relevant, score = True, 2
                search.tests[r] = Test(r, node.number, node.level, relevant, [j + 1] if relevant else [],
                                       len(search.tests), score, vouched)
                hits += bool(relevant)
            search.spent[j] += len(rows)
            search.visits.append({"community": node.number, "level": node.level, "tested": len(rows),
                                  "relevant": hits, "subquery": j + 1})
            tier = frontiers[j].tier
            if hits:
                # deepen: the sub-communities of a relevant community, or a relevant leaf's next units
                kids = [c for c in node.children if c in nodes]
                for c in kids:
                    tier[c] = DEEPEN
                tier[node.number] = BARREN if kids else DEEPEN
            else:
                tier[node.number] = BARREN
        if refine is not None and await refine(search):
            sims = ranking.per_subquery
            for frontier in frontiers:
                frontier.resort()
        follow = q.settings.lazy.follow_links
        found = len(search.relevant())
        if follow and found > linked_from:
            # What was found leads on: the untested units its concepts link to are tested next
            # (the second hop of "the director of film X", whose own passage shares no word with
            # the question but the director's name with the film's).
            linked_from = found
            rows = linked_units(q, search, follow)
            nodes[LINKED] = Node(LINKED, 0, [], rows, ordered=True)
            for frontier in frontiers:
                frontier.forget(LINKED)
                frontier.tier[LINKED] = FOLLOW
        if budget >= 2 * step and search.used - reported >= step and search.used < budget:
            reported = search.used
            q.log(f"lazy search: {search.used} of {budget} units tested, {len(search.relevant())} relevant")
    search.stopped = "budget spent" if search.used >= budget else "every unit tested"
    return search


# -- 3b. units linked to what was found, and subqueries refined with its concepts --------------
def linked_units(q: Query, search: Search, most: int) -> list[int]:
    """The `most` untested units the concept graph links most strongly to the units found
    relevant: personalised PageRank over the graph walk's graph (query/graph_walk.py: concepts
    and units, a unit joined to its concepts), restarting at the relevant units, each weighted
    by its score. A concept in few units passes its share to those few, so a name the found
    passage shares with one other passage leads there, and "film" leads nowhere in particular."""
    graph = graph_of(q.index)
    base = len(graph.entity_ids)
    restart = np.zeros(graph.size)
    for t in search.relevant():
        restart[base + t.row] = 1.0 + t.score
    if not base or restart.sum() <= 0:
        return []
    scores = pagerank(graph, restart, q.settings.query.walk_damping)[base:]
    order = np.argsort(-scores, kind="stable")
    return [int(r) for r in order if scores[r] > 0 and int(r) not in search.tests][:most]



@dataclass
class Concepts:
    """The index's concepts (entities) per text-unit row, and how each pairs with others."""

    of_unit: dict[int, list[int]]   # unit row -> entity rows
    titles: list[str]
    frequency: list[int]
    npmi: dict[tuple[int, int], float]  # entity row pair (low, high) -> NPMI (or 0 without the column)


def concepts_of(index) -> Concepts:
    """Built once per index and kept on it (as the vocabulary is)."""
    key = "_lazy_concepts"
    if key in index.__dict__:
        return index.__dict__[key]
    units = index.text_units
    entities = index.tables.get("entities")
    row_of = {uid: i for i, uid in enumerate(units["id"].tolist())}
    of_unit: dict[int, list[int]] = {}
    titles: list[str] = []
    frequency: list[int] = []
    npmi: dict[tuple[int, int], float] = {}
    if entities is not None and not entities.empty:
        titles = [str(t) for t in entities["title"].tolist()]
        for e, ids in enumerate(entities["text_unit_ids"].tolist()):
            rows = [row_of[u] for u in list_ids(ids) if u in row_of]
            frequency.append(len(rows))
            for r in rows:
                of_unit.setdefault(r, []).append(e)
        rels = index.tables.get("relationships")
        if rels is not None and not rels.empty:
            e_of = {t: i for i, t in enumerate(titles)}
            values = rels["npmi"].tolist() if "npmi" in rels else [0.0] * len(rels)
            for a, b, v in zip(rels["source"].tolist(), rels["target"].tolist(), values):
                if a in e_of and b in e_of:
                    pair = tuple(sorted((e_of[a], e_of[b])))
                    npmi[pair] = max(npmi.get(pair, -1.0), float(v) if v == v else 0.0)  # type: ignore[index]
    index.__dict__[key] = Concepts(of_unit, titles, frequency, npmi)
    return index.__dict__[key]


def refinement(q: Query, plan: Plan, search: Search, j: int, most: int) -> list[str]:
    """Concepts to add to subquery j: those of the units found relevant so far that neither the
    question nor the subquery names, ranked by how strongly they co-occur with the concepts the
    question names (NPMI of the concept graph), then by rarity. "Who is the father of the
    director?" refined with "Gia Coppola", found in the film's passage, finds her own."""
    concepts = concepts_of(q.index)
    relevant = [t.row for t in search.relevant()]
    if not relevant or not concepts.titles:
        return []
    said = (q.question + " " + plan.subqueries[j] + " " + plan.expanded).casefold()
    asked = {i for i, t in enumerate(concepts.titles) if t.casefold() in said}
    seen: dict[int, int] = {}
    for r in relevant:
        for e in concepts.of_unit.get(r, []):
            if e not in asked and concepts.titles[e].casefold() not in said:
                seen[e] = seen.get(e, 0) + 1

    def strength(e: int) -> float:
        return max((concepts.npmi.get((min(e, a), max(e, a)), 0.0) for a in asked), default=0.0)

    ranked_concepts = sorted(seen, key=lambda e: (-strength(e), -seen[e], concepts.frequency[e], concepts.titles[e]))
    # The answers other subqueries found come first: "the director" is whom they named.
    answers = [a for k, found in sorted(plan.answers.items()) if k != j + 1 for a, _ in found
               if fold(a) not in fold(said)]
    return list(dict.fromkeys(answers + [concepts.titles[e] for e in ranked_concepts]))[:most]


def refiner(q: Query, plan: Plan, ranking: Ranking) -> Callable[[Search], Awaitable[bool]]:
    """After a wave: each subquery that has found nothing relevant yet, while others have, is
    embedded again with the concepts of what they found (lazy.refine_concepts of them), once per
    growth of what was found; its column of the ranking changes, so its next visits change."""
    most = q.settings.lazy.refine_concepts
    used: dict[int, int] = {}  # subquery -> relevant units it was last refined with

    async def refine(search: Search) -> bool:
        if most <= 0:
            return False
        found = len(search.relevant())
        texts, columns = [], []
        for j in range(len(plan.subqueries)):
            done = (j + 1 in plan.answers) if plan.by_answers else any(t.subqueries == [j + 1]
                                                                       for t in search.relevant())
            if done or used.get(j, 0) >= found:
                continue
            added = refinement(q, plan, search, j, most)
            used[j] = found
            if added and added != search.refined.get(j + 1):
                search.refined[j + 1] = plan.refined[j + 1] = added
                texts.append(f"{plan.subqueries[j]} ({', '.join(added)})")
                columns.append(j)
        if not texts:
            return False
        vectors = await q.index.vectors("text_units", q.embedder, q.log)
        queries = np.asarray(await q.embedder.embed(texts, kind="query", step="embed"), dtype=np.float32)
        row_of = {uid: i for i, uid in enumerate(q.index.text_units["id"].tolist())}
        rows = [(row_of[uid], n) for n, uid in enumerate(vectors.ids) if uid in row_of]
        if not rows:
            return False
        targets, sources = zip(*rows)
        for column, vector in zip(columns, queries):
            # the refined text holds the subquery itself: its similarities replace the old ones
            sims = np.full(len(row_of), -1.0, dtype=np.float32)
            sims[list(targets)] = vectors.vectors[list(sources)] @ vector
            ranking.per_subquery[:, column] = sims
        ranking.score = np.maximum(ranking.score, ranking.per_subquery.max(axis=1))
        return True

    return refine


# -- 4. claims and the answer --------------------------------------------------------------------
@dataclass
class Found:
    text: str
    sources: list[int]  # human_readable_ids of text units
    subquery: int
    score: int
    community: int
    order: int


def grounded(claim: str, cited: str, share: float, asked: str = "") -> bool:
    """Whether `claim` says something its cited passages say: not a question, and at least
    `share` of its own terms (passages.terms: words, or character pairs for Chinese) occur in
    them. Its own terms are those not in `asked` (the question and subqueries): "Tech leaders
    emphasize cloud infrastructure" is framed in the question's words and says "cloud
    infrastructure", which the passage must hold; counted with the framing it failed, and a
    name the question gave ("Fortunella was directed by Federico Fellini") made an invented
    answer half grounded. A claim all in the question's words ("The Central Lower Peninsula of
    Michigan is located in Michigan") is judged by all of them. A small model's "claims" that
    restate a subquery fail; a paraphrase of the passage passes, since it reuses the passage's
    names and words."""
    if claim.rstrip().endswith(("?", "？")):
        return False
    if share <= 0:
        return True
    words = set(terms(claim))
    words = (words - set(terms(asked))) or words
    if not words:
        return False
    return len(words & set(terms(cited))) >= share * len(words)


_NEGATION = re.compile(r"\b(?:not|no|never|none|neither|nor|without|cannot)\b|n[’']t\b|[不没未无非否别]", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_CLAUSE_END = re.compile(r"[,;:.!?，；：。！？、]|\bbut\b", re.IGNORECASE)
_CJK_CHAR = re.compile(f"[{CJK}]")
# Chinese function characters that say nothing of what a negation governs
_CJK_FUNCTION = frozenset("的了是在和有也就都而及与着过")


def _units(text: str) -> set[str]:
    """What a negation's reach is compared by: terms, and single characters for Chinese (its
    character pairs rarely survive a rephrasing: 没有拜师 against 拜菩提祖师为师)."""
    return (set(terms(_CJK_CHAR.sub(" ", text)))
            | {c for c in _CJK_CHAR.findall(text) if c not in _CJK_FUNCTION and not _NEGATION.match(c)})


def _negated(text: str) -> tuple[set[str], set[str]]:
    """The units each negation of `text` governs (from it to the end of its clause), and the
    units outside every negation's reach."""
    inside: list[str] = []
    outside: list[str] = []
    at = 0
    for m in _NEGATION.finditer(text):
        if m.start() < at:
            continue
        outside.append(text[at:m.start()])
        end = _CLAUSE_END.search(text, m.end())
        at = end.start() if end else len(text)
        inside.append(text[m.end():at])
    outside.append(text[at:])
    return _units(" ".join(inside)), _units(" ".join(outside))


def contradicted(claim: str, cited: str) -> str:
    """Why a claim says other than its passages, or "" (no model; bench/claim_checks.py
    measures the rule): a number the passages do not hold ("born in 1932" from "born in 1923"), or a
    negation that governs what the other side states plainly: the claim denies what the
    passages' matching sentence says ("did not direct Palo Verde" against "directed Palo
    Verde"), or says what the sentence denies ("was married to Ann Lee" against "never married
    Ann Lee"). The matching sentence is the cited sentence sharing the most terms with the
    claim; a negation elsewhere in the passages, or in another clause of that sentence ("4G
    would be out there, but not universal"), does not count."""
    numbers = {n.replace(",", "") for n in _NUMBER.findall(cited)}
    if any(n.replace(",", "") not in numbers for n in _NUMBER.findall(claim)):
        return "number"
    words = set(terms(claim))
    best, overlap = "", 0
    for sentence in sentences(cited, 10_000):
        shared = len(words & set(terms(sentence)))
        if shared > overlap:
            best, overlap = sentence, shared
    if overlap >= 2:
        denied, said = _negated(claim)
        denied_there, said_there = _negated(best)
        if denied & said_there or denied_there & said:
            return "negation"
    return ""


def claim_batches(q: Query, plan: Plan, search: Search, ranking: Ranking) -> tuple[list[Section], dict[int, int]]:
    """The relevant units as claim batches: grouped by the community they were found in (larger
    groups first), each unit through its best passages (lazy.claim_tokens), a group never split
    across batches unless it alone is larger than one; and each unit's community."""
    units = q.index.text_units
    groups: dict[int, list[Test]] = {}
    for t in search.relevant():
        groups.setdefault(t.community, []).append(t)
    order = sorted(groups, key=lambda c: (-len(groups[c]), groups[c][0].order))
    lazy = q.settings.lazy
    budget = _batch_budget(q, plan)
    base = count_tokens(header("Sources")) + 1
    batches: list[Section] = []
    current: list[pd.Series] = []
    used = base
    for c in order:
        rows = [t.row for t in sorted(groups[c], key=lambda t: (-t.score, -ranking.score[t.row], t.order))]
        # As many windows as fit: a unit can bear on two subqueries in two places.
        shown = passage_rows(q, plan, rows, lazy.claim_tokens, lazy.snippet_tokens, windows=None)
        cost = sum(count_tokens("|".join(row_values("Sources", r))) + 1 for r in shown)
        if current and used + cost > budget:  # the group starts a batch of its own
            batches.extend(chunks("Sources", current, budget))
            current, used = [], base
        current.extend(shown)
        used += cost
    if current:
        batches.extend(chunks("Sources", current, budget))
    community_of = {int(units.iloc[t.row]["human_readable_id"]): t.community for t in search.relevant()}
    return batches, community_of


async def extract_claims(q: Query, plan: Plan, search: Search, ranking: Ranking,
                         failures: list[str]) -> tuple[list[Found], list[Section], dict[str, int]]:
    """Claims from the relevant units (claim_batches), as many per batch as its units warrant
    (lazy.claims_per_unit each), every claim checked against the passages it cites."""
    lazy = q.settings.lazy
    batches, community_of = claim_batches(q, plan, search, ranking)
    n_subs = len(plan.subqueries)
    counts = {"claims_dropped": 0, "claims_ungrounded": 0, "claims_contradicted": 0}
    # the claims' framing: the user's question and the subqueries (not the model's expansion,
    # which may guess at the answer)
    asked = " ".join([q.question, *plan.subqueries])

    async def one(i: int, section: Section) -> list[Found]:
        most = max(1, lazy.claims_per_unit * len(section))
        messages = q.render("lazy_claims", subqueries=plan.numbered(), context=section.text(), most=most)
        reply = await q.llm.structured(messages, claims_schema(most), step="claims", item=f"claims batch {i + 1}",
                                       max_tokens=min(lazy.claims_max_tokens, 100 + CLAIM_TOKENS * most))
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
            if not grounded(text, cited, lazy.claim_grounding, asked):
                counts["claims_dropped"] += 1
                counts["claims_ungrounded"] += 1
                continue
            if contradicted(text, cited):
                counts["claims_dropped"] += 1
                counts["claims_contradicted"] += 1
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
    # the same claim from two batches (or twice in one) is one claim, with both its sources
    unique: dict[str, Found] = {}
    for f in found:
        key = " ".join(terms(f.text))
        if key in unique:
            kept = unique[key]
            kept.sources = list(dict.fromkeys(kept.sources + f.sources))
            kept.score = max(kept.score, f.score)
            counts["claims_dropped"] += 1
        else:
            unique[key] = f
    found = list(unique.values())
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
    plan.by_answers = tester_name(q.settings) == "chat" and q.settings.lazy_test_format()[0] == "answers"
    ranking = await rank_units(q, plan)
    nodes, roots = community_tree(q, ranking, q.settings.lazy.units_per_community)
    search = await relevance_search(q, plan, ranking, nodes, roots, budget, TESTERS[tester_name(q.settings)],
                                    failures, refine=refiner(q, plan, ranking))
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
        fallback = pack("Sources", (r for b in batches for r in _rows(q, b)), _batch_budget(q, plan))
        answer = await final_answer(q, q.render("query_answer", context=fallback.text()), step="answer")
    else:  # nothing relevant was found, or nothing relevant was said: say so, invent nothing
        answer = no_answer(q)
    context = Context(batches)
    units = q.index.text_units
    relevant = search.relevant()
    levels = sorted({v["level"] for v in search.visits})
    stats: dict[str, Any] = {
        "budget": budget, "tester": name,
        "test_format": q.settings.lazy_test_format()[0] if name == "chat" else None, "snippet_tokens": s.snippet_tokens, "claim_tokens": s.claim_tokens,
        "tests_used": search.used, "relevant_units": len(relevant),
        "embedding_prior": q.settings.lazy_prior()[0] if name == "chat" else None,
        "vouched_units": sum(t.vouched for t in relevant),
        "no_verdict": search.no_verdict, "failed_tests": sum(t.relevant is None for t in search.tests.values()),
        "communities_visited": len({v["community"] for v in search.visits}),
        "relevant_communities": len({t.community for t in relevant}),
        "levels_reached": levels, "deepest_level": levels[-1] if levels else None, "stopped": search.stopped,
        "subqueries": plan.subqueries, "expanded_query": plan.expanded,
        "budget_per_subquery": search.budgets, "tests_per_subquery": search.spent, "refined": search.refined,
        "claims": len(claims), "claims_dropped": counts["claims_dropped"],
        "claims_ungrounded": counts["claims_ungrounded"], "claims_contradicted": counts["claims_contradicted"],
        "claims_reduced": len(kept),
        "claim_calls": counts["claim_calls"], "reduce_calls": 1 if kept else 0,
        "answered_from": "claims" if kept else "sources" if fallback is not None else "nothing",
        "context_units": context.units, "context_tokens": context.tokens,
        "tested": [{"unit": int(units.iloc[t.row]["human_readable_id"]), "id": units.iloc[t.row]["id"],
                    "community": t.community, "level": t.level, "relevant": t.relevant, "score": t.score,
                    "subqueries": t.subqueries, "similarity": round(float(ranking.score[t.row]), 4),
                    **({"vouched": True} if t.vouched else {}),
                    **({"passage_tokens": plan.passages[t.row]} if t.row in plan.passages else {}),
                    **({"p_yes": round(plan.yes[t.row], 4)} if t.row in plan.yes else {})}
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
    """Rough chat calls of one lazy question: subqueries, tests (chat tester: a wave of up to
    MAX_BATCH units per call, the whole budget spent), claims (about one call per few relevant
    units) and the reduce."""
    s = settings.lazy
    budget = s.budget if budget is None else budget
    tests = 0 if tester_name(settings) == "embedding" else math.ceil(budget / MAX_BATCH)
    return 1 + tests + max(1, math.ceil(budget / 20)) + 1


__all__ = ["lazy_search", "estimate_calls", "tester_name", "relevance_search", "community_tree", "Plan"]
