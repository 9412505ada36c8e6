"""Graph-walk retrieval for local questions: personalised PageRank over entities and text units.

A one-hop neighbourhood answers "What does X do?" but not "Who is the father of the director of
film X?": that needs the unit about X *and* the unit about its director, which shares no word
with the question. Following HippoRAG (Gutiérrez et al. 2024; HippoRAG 2, 2025) and
fast-graphrag, the walk goes through the graph the index already holds:

1. Graph: one node per entity and one per text unit. A relationship joins its two entities
   (with its weight, divided by the median weight so a typical relationship weighs like a
   mention); an entity joins every text unit it was extracted from (weight 1). Edges go both
   ways; each node's out-edges are normalised to sum to 1. Built once per opened index.
2. Seeds (the restart vector): the entities named in the question (weight 1) and the entities
   nearest to it by embedding (weight scaled into (0, 1] between the best candidate and the
   first one left out), each divided by the square root of the number of text units it occurs
   in (node specificity, after HippoRAG: an entity in every unit says little about which unit
   is wanted), together
   summing to 1; plus the `query.walk_seed_units` text units nearest to the question, scaled
   the same way and together summing to `query.walk_unit_weight` (HippoRAG 2 puts dense passage
   scores into the restart vector), so the walk keeps what vector search finds and adds what
   lies a hop or two away. Normalising each group makes the balance one setting whatever the
   index's entity frequencies. With `query.walk_confident_seeds` (the default) each group's
   share is then scaled by how far its best match stands out from the rest of its group (in
   standard deviations): an entity match that barely beats the crowd, the usual case for a
   question whose names are not in the index, seeds weakly beside a passage that clearly
   matches, and the reverse. (A name the question states counts as a sure match.) On the
   6,119-passage 2Wiki corpus this lifted recall@10 from 0.78 to 0.89 in both halves of the
   questions; dense seeding of every passage, synonym edges between near-identical concept
   vectors and NPMI edge weights were measured too and did not pay (docs/performance.md).
   A third group, `query.walk_fact_weight` (0 = off): HippoRAG 2's query-to-fact linking, with
   sentences as the facts (a lazy index has no relationship to embed). The sentences of the
   `query.walk_fact_units` nearest units that name two or more of their unit's entities (a fact
   links two) are embedded, through the cache, and the entities named in the `TOP_FACTS` that
   match the question best seed the walk with that share: "the director of film X" matches "X
   is a film directed by Y", and Y, named nowhere in the question, seeds the hop to Y's own
   passage. It paid only once such names were concepts (document titles, concepts.py): on the
   6,119-passage corpus recall@5 0.830 -> 0.845 and @10 0.935 -> 0.955, in both halves.
   With `query.walk_fact_filter`, HippoRAG 2's recognition filter: the chat model reads those
   facts and only the ones it says help answer the question seed (none kept: no fact seeds).
3. Walk: personalised PageRank, continuing with probability `query.walk_damping` and restarting
   at the seeds otherwise (a node without edges restarts too), by power iteration over the edge
   arrays: O(edges) numpy work per iteration, no graph library.
4. Rank: text units and entities by their walk score.

Works on any index with entities and text units: the standard one, the lazy one (concepts and
their co-occurrence), and Microsoft GraphRAG's tables.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..llm.client import LLMError
from .answer import Query, picks_schema
from .data import GraphIndex, list_ids
from .names import named_entities, named_in
from .passages import sentences

MAX_ITERATIONS = 100
# Node specificity: an entity's restart weight is divided by (its text units) ** this. HippoRAG's
# 1/n made a book's main character (24 units) weigh less than any one-unit name the embedding
# happened to match; 1/sqrt(n) keeps generic entities down and the main ones in (and measured
# as well or better on 2WikiMultihopQA: docs/performance.md).
SPECIFICITY = 0.5
TOLERANCE = 1e-9  # L1 change of the score vector at which the iteration has converged
# Query-to-fact linking (query.walk_fact_weight): the best-matching sentences that seed; the
# longest sentence embedded (a longer one is cut: a fact is a sentence, not a paragraph); the
# entities a sentence must name to stand for a fact (one name alone: 0.760 against 0.785 at 5).
TOP_FACTS = 5
FACT_TOKENS = 80
MIN_FACT_NAMES = 2
# The recognition filter's answer: a JSON list of at most TOP_FACTS small numbers.
FILTER_TOKENS = 40


@dataclass
class WalkGraph:
    """Entities (nodes 0..E-1) and text units (nodes E..E+U-1) with transition probabilities."""

    entity_ids: list[str]
    unit_ids: list[str]
    source: np.ndarray  # node each edge leaves
    target: np.ndarray  # node it reaches
    probability: np.ndarray  # transition probability of the edge (sums to 1 per source node)
    units_per_entity: np.ndarray  # for node specificity
    dangling: np.ndarray  # nodes without edges (their mass restarts)
    unit_entities: list[list[int]]  # per text unit, the entity nodes extracted from it

    @property
    def size(self) -> int:
        return len(self.entity_ids) + len(self.unit_ids)

    @property
    def edges(self) -> int:
        return len(self.source)


def build_graph(index: GraphIndex) -> WalkGraph:
    """The walk graph of an index (see the module docstring, step 1)."""
    entities, units, rels = index.entities, index.text_units, index.relationships
    entity_ids = entities["id"].tolist()
    unit_ids = units["id"].tolist()
    n_entities = len(entity_ids)
    node_of_title = {str(t): i for i, t in enumerate(entities["title"].tolist())}
    node_of_unit = {u: n_entities + i for i, u in enumerate(unit_ids)}

    a: list[int] = []
    b: list[int] = []
    w: list[float] = []
    if len(rels):
        weights = rels["weight"].astype(float).fillna(1.0).clip(lower=0).to_numpy() if "weight" in rels \
            else np.ones(len(rels))
        positive = weights[weights > 0]
        scale = float(np.median(positive)) if len(positive) else 1.0
        for s, t, weight in zip(rels["source"].tolist(), rels["target"].tolist(), weights.tolist()):
            i, j = node_of_title.get(str(s)), node_of_title.get(str(t))
            if i is not None and j is not None and i != j and weight > 0:
                a.append(i)
                b.append(j)
                w.append(weight / scale)
    counts = np.zeros(n_entities)
    unit_entities: list[list[int]] = [[] for _ in unit_ids]
    for i, cell in enumerate(entities["text_unit_ids"].tolist() if "text_unit_ids" in entities else []):
        for unit in dict.fromkeys(list_ids(cell)):  # a unit listed twice is one mention
            node = node_of_unit.get(unit)
            if node is not None:
                a.append(i)
                b.append(node)
                w.append(1.0)
                counts[i] += 1
                unit_entities[node - n_entities].append(i)

    size = n_entities + len(unit_ids)
    source = np.array(a + b, dtype=np.int64)  # both directions
    target = np.array(b + a, dtype=np.int64)
    weight = np.array(w + w, dtype=np.float64)
    out = np.bincount(source, weights=weight, minlength=size)
    probability = weight / out[source] if len(source) else weight
    return WalkGraph(entity_ids, unit_ids, source, target, probability, counts, np.flatnonzero(out == 0),
                     unit_entities)


def graph_of(index: GraphIndex) -> WalkGraph:
    """The index's walk graph, built on first use and kept with the opened index."""
    graph = index.__dict__.get("_walk_graph")
    if graph is None:
        graph = index.__dict__["_walk_graph"] = build_graph(index)
    return graph


def pagerank(graph: WalkGraph, restart: np.ndarray, damping: float) -> np.ndarray:
    """Personalised PageRank scores (summing to 1) for the restart vector `restart`."""
    total = float(restart.sum())
    if total <= 0:
        return np.zeros(graph.size)
    restart = restart / total
    scores = restart.copy()
    for _ in range(MAX_ITERATIONS):
        spread = np.bincount(graph.target, weights=scores[graph.source] * graph.probability, minlength=graph.size)
        stuck = float(scores[graph.dangling].sum()) if len(graph.dangling) else 0.0
        new = (1 - damping) * restart + damping * (spread + stuck * restart)
        change = float(np.abs(new - scores).sum())
        scores = new
        if change < TOLERANCE:
            break
    return scores


def _similarity(ids: list[str], vectors, query_vector) -> np.ndarray:
    """Cosine similarity of each of `ids` to the query (-1 where a row has no vector)."""
    row = {x: i for i, x in enumerate(ids)}
    out = np.full(len(ids), -1.0)
    keep = [i for i, x in enumerate(vectors.ids) if x in row]
    if keep:
        out[[row[vectors.ids[i]] for i in keep]] = (vectors.vectors @ np.asarray(query_vector, np.float32))[keep]
    return out


def _scaled(similarity: np.ndarray, k: int) -> dict[int, float]:
    """The `k` most similar rows, weighted into (0, 1]: 1 for the best, falling linearly to just
    above 0 at the first row left out (embedding similarities are compressed, e5's mostly within a
    few hundredths, so the raw values would make every candidate alike)."""
    if k <= 0 or not len(similarity):
        return {}
    order = np.argsort(-similarity, kind="stable")
    top = order[:k]
    best = float(similarity[top[0]])
    floor = float(similarity[order[k]]) if len(order) > k else float(similarity[top[-1]]) - 1e-6
    span = max(best - floor, 1e-9)
    return {int(i): max((float(similarity[i]) - floor) / span, 1e-3) for i in top}


def _standing_out(similarity: np.ndarray) -> float:
    """How far the best match stands out from the rest, in standard deviations of all the
    similarities (at least a small floor, so a group is never silenced): e5's similarities are
    compressed, so the raw best value says little, its distance from the crowd a lot."""
    valid = similarity[similarity > -1]
    if len(valid) < 2:
        return 1.0
    spread = float(valid.std())
    return max(float(valid.max() - valid.mean()) / spread, 0.1) if spread > 0 else 1.0


@dataclass
class Walk:
    """The walk's result: entity and unit ids best first, with their scores and the seeds."""

    entities: list[tuple[str, float]]
    units: list[tuple[str, float]]
    named: list[str]
    seeds: dict[str, float]

    def entity_ids(self, k: int | None = None) -> list[str]:
        return [e for e, _ in self.entities[:k]]

    def unit_ids(self, k: int | None = None) -> list[str]:
        return [u for u, _ in self.units[:k]]


async def walk(q: Query, text: str) -> Walk:
    """Seed the walk from `text` (the question, with any conversation), walk, and rank."""
    s = q.settings.query
    graph = graph_of(q.index)
    n_entities = len(graph.entity_ids)
    if not n_entities:  # no graph to walk: local search has nothing to say (basic search would)
        return Walk([], [], [], {})
    restart = np.zeros(graph.size)
    named = named_entities(q.index.entities, text)
    query_vector = (await q.embedder.embed([text], kind="query", step="embed"))[0]

    similarity = _similarity(graph.entity_ids, await q.index.vectors("entities", q.embedder, q.log), query_vector)
    entity_weight = _scaled(similarity, s.top_entities)
    row = {e: i for i, e in enumerate(graph.entity_ids)}
    for e in named:
        entity_weight[row[e]] = 1.0
    for i, weight in entity_weight.items():
        restart[i] = weight / max(float(graph.units_per_entity[i]), 1.0) ** SPECIFICITY
    # The entities' share of the restart is 1, the units' walk_unit_weight; with confident seeds
    # each share is scaled by how far the group's best match stands out (a name the question
    # states counts as a sure match).
    entity_share = 1.0 if named or not s.walk_confident_seeds else _standing_out(similarity)
    if restart.sum() > 0:
        restart *= entity_share / restart.sum()

    unit_similarity = None
    if (s.walk_unit_weight > 0 or s.walk_fact_weight > 0) and graph.unit_ids:
        vectors = await q.index.vectors("text_units", q.embedder, q.log)
        unit_similarity = _similarity(graph.unit_ids, vectors, query_vector)
    if s.walk_unit_weight > 0 and unit_similarity is not None:
        unit_share = s.walk_unit_weight * (_standing_out(unit_similarity) if s.walk_confident_seeds else 1.0)
        nearest = _scaled(unit_similarity, s.walk_seed_units)
        total = sum(nearest.values())
        for i, weight in nearest.items():
            restart[n_entities + i] = unit_share * weight / total

    if s.walk_fact_weight > 0 and unit_similarity is not None:
        facts = await _fact_seeds(q, text, graph, unit_similarity, query_vector)
        total = sum(facts.values())
        for i, weight in facts.items():
            restart[i] += s.walk_fact_weight * weight / total

    scores = pagerank(graph, restart, s.walk_damping)
    seeds = {graph.entity_ids[i] if i < n_entities else graph.unit_ids[i - n_entities]: float(restart[i])
             for i in np.flatnonzero(restart)}
    entity_order = np.argsort(-scores[:n_entities], kind="stable")
    unit_order = np.argsort(-scores[n_entities:], kind="stable")
    return Walk(entities=[(graph.entity_ids[i], float(scores[i])) for i in entity_order if scores[i] > 0],
                units=[(graph.unit_ids[i], float(scores[n_entities + i])) for i in unit_order
                       if scores[n_entities + i] > 0],
                named=named, seeds=seeds)


async def _fact_seeds(q: Query, text: str, graph: WalkGraph, unit_similarity: np.ndarray,
                      query_vector) -> dict[int, float]:
    """Entity nodes named in the sentences, of the `query.walk_fact_units` units nearest to the
    question, that match it best (HippoRAG 2's query-to-fact linking, a sentence naming a unit's
    entities standing for a fact): each weighted by its best sentence's scaled similarity and its
    node specificity. Sentences are embedded as passages, through the cache."""
    order = np.argsort(-unit_similarity, kind="stable")[:q.settings.query.walk_fact_units]
    texts, titles = q.index.text_units["text"], q.index.entities["title"]  # rows in node order
    facts: list[tuple[str, list[int]]] = []
    for u in order:
        if unit_similarity[u] <= -1:  # no vector
            continue
        nodes = graph.unit_entities[u]
        names = [str(titles.iat[i]) for i in nodes]
        for sentence in sentences(str(texts.iat[u]), FACT_TOKENS):
            named = [nodes[k] for k in named_in(names, sentence)]
            if len(named) >= MIN_FACT_NAMES:
                facts.append((sentence.strip(), named))
    if not facts:
        return {}
    vectors = await q.embedder.embed([text for text, _ in facts], kind="passage", step="embed")
    weights = _scaled(vectors @ np.asarray(query_vector, np.float32), TOP_FACTS)
    if q.settings.query.walk_fact_filter:
        weights = await _recognised(q, text, [f for f, _ in facts], weights)
    seeds: dict[int, float] = {}
    for f, weight in weights.items():
        for i in facts[f][1]:
            seeds[i] = max(seeds.get(i, 0.0), weight / max(float(graph.units_per_entity[i]), 1.0) ** SPECIFICITY)
    return seeds


async def _recognised(q: Query, text: str, facts: list[str], weights: dict[int, float]) -> dict[int, float]:
    """The facts of `weights` (index into `facts` -> weight) that the chat model says help answer
    `text`: HippoRAG 2's recognition filter, shown best match first. A call that fails after its
    retries keeps them all (the walk as without the filter) and is named among the failures."""
    shown = sorted(weights, key=lambda f: -weights[f])
    numbered = "\n".join(f"{n}. {facts[f]}" for n, f in enumerate(shown, 1))
    messages = q.render("walk_facts", question=text, facts=numbered, most=len(shown))
    try:
        reply = await q.llm.structured(messages, picks_schema(len(shown)), step="recognition",
                                       item="facts of the question", max_tokens=FILTER_TOKENS)
    except LLMError as e:
        q.failures.append(f"recognition filter of the walk's facts ({e}): facts left unfiltered")
        return weights
    kept = {shown[n - 1] for n in reply.relevant if 1 <= n <= len(shown)}
    return {f: w for f, w in weights.items() if f in kept}
