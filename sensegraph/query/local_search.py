"""Local search: questions about specific entities, answered from their neighbourhood.

Find the entities and text units the question is about, then gather their community reports,
the entities themselves, their relationships (those between two matched entities first), their
claims and the source text units. One token budget is split between source text
(`text_unit_share`), community reports (`community_share`) and the graph records (the rest);
a part that does not fill its share hands the remainder to the source text.

Two retrievals (`query.local_retrieval`):
- walk (default): a personalised PageRank from the entities the question names or resembles and
  the units nearest to it, over the graph of entities and text units (query/graph_walk.py);
  entities and units come in walk order, so a unit two hops away (the director of the film the
  question names) can make the context. Measured on 2WikiMultihopQA: bench/multihop_recall.py.
- neighbourhood: embed the question, take the best-matching entities and the units they were
  extracted from, one hop (what Microsoft GraphRAG's local search does).
Either way an entity named in the question comes first whatever the embedding or walk says.
"""
from __future__ import annotations

import pandas as pd

from .answer import Query, QueryResult, final_answer, no_answer, result
from .context import Context, pack
from .data import list_ids
from .global_search import project_reports
from .graph_walk import walk
from .names import named_entities


async def match_entities(q: Query, text: str) -> list[str]:
    """Entity ids most relevant to `text`, best first."""
    top = q.settings.query.top_entities
    # Names that occur in the question are what the user asks about.
    named = named_entities(q.index.entities, text)
    vectors = await q.index.vectors("entities", q.embedder, q.log)
    query_vector = (await q.embedder.embed([text], kind="query", step="embed"))[0]
    similar = [eid for eid, _ in vectors.search(query_vector, k=top + len(named))]
    out: list[str] = []
    for eid in named + similar:
        if eid not in out:
            out.append(eid)
    return out[:top]


def _relationships(q: Query, titles: list[str], walked: dict[str, float] | None = None) -> pd.DataFrame:
    """Relationships of the matched entities, in packing order: those between two of them
    first, then those leaving the set; within each, by the walk score of their ends when there
    was a walk (`walked`: title -> score), else the better connected first. A table, so that
    packing turns into rows only the few that fit (a hub entity has thousands)."""
    rels = q.index.relationships
    if rels.empty:
        return rels
    wanted = set(titles)
    src, tgt = rels["source"].isin(wanted), rels["target"].isin(wanted)
    rels = rels.assign(_walk=rels["source"].map(walked).fillna(0) + rels["target"].map(walked).fillna(0)
                       if walked else 0.0)
    weight_col = "combined_degree" if "combined_degree" in rels else "weight"
    order = ["_walk", weight_col, "weight"]
    inside = rels[src & tgt].sort_values(order, ascending=False, kind="stable")
    outside = rels[src ^ tgt].sort_values(order, ascending=False, kind="stable")
    return pd.concat([inside, outside]).drop(columns="_walk")


def _reports(q: Query, entity_ids: list[str]) -> list[pd.Series]:
    """The reports of the communities holding the matched entities (at the query level, so one
    per entity), the ones holding the most matched entities first."""
    level = min(q.settings.query.level, q.index.max_level())
    reports = project_reports(q.index.reports, q.index.communities, level)
    members = dict(zip(q.index.communities["community"].tolist(), q.index.communities["entity_ids"].tolist()))
    wanted = set(entity_ids)
    scored = []
    for _, row in reports.iterrows():
        hits = len(wanted.intersection(list_ids(members.get(row["community"]))))
        if hits:
            scored.append((hits, float(row.get("rank") or 0), row))
    scored.sort(key=lambda t: (-t[0], -t[1]))
    return [row for _, _, row in scored]


def _text_units(q: Query, entity_rows: pd.DataFrame, relationship_rows: list[pd.Series]) -> list[pd.Series]:
    """Text units of the matched entities in entity order; within one entity, the units that
    also carry the most of the selected relationships first."""
    rel_units: dict[str, int] = {}
    for r in relationship_rows:
        for unit in list_ids(r.get("text_unit_ids")):
            rel_units[unit] = rel_units.get(unit, 0) + 1
    order: list[str] = []
    for _, entity in entity_rows.iterrows():
        units = sorted(list_ids(entity.get("text_unit_ids")), key=lambda u: -rel_units.get(u, 0))
        order.extend(u for u in units if u not in order)
    rows = q.index.rows_by("text_units", "id", order)
    return [r for _, r in rows.iterrows()]


async def local_context(q: Query, text: str) -> Context:
    """The context for `text` under the local budget and shares."""
    s = q.settings.query
    budget = q.budget
    unit_order: list[str] | None = None
    walked: dict[str, float] | None = None
    if s.local_retrieval == "walk":
        path = await walk(q, text)
        entity_ids = list(dict.fromkeys(path.named + path.entity_ids()))[:s.top_entities]
        unit_order = path.unit_ids()
        title_of = dict(zip(q.index.entities["id"].tolist(), q.index.entities["title"].tolist()))
        walked = {str(title_of[e]): score for e, score in path.entities}
    else:
        entity_ids = await match_entities(q, text)
    entity_rows = q.index.entity_rows(entity_ids)
    titles = entity_rows["title"].tolist()

    reports = pack("Reports", _reports(q, entity_ids), int(budget * s.community_share), truncate_first=True)
    graph_budget = int(budget * (1 - s.text_unit_share - s.community_share))
    entities = pack("Entities", (r for _, r in entity_rows.iterrows()), graph_budget)
    graph_budget -= entities.tokens
    ordered = _relationships(q, titles, walked)
    relationships = pack("Relationships", (r for _, r in ordered.iterrows()), graph_budget, truncate_first=False)
    graph_budget -= relationships.tokens
    claims_df = q.index.claims
    claim_rows = [r for _, r in claims_df[claims_df["subject_id"].isin(titles)].iterrows()] if len(claims_df) else []
    claims = pack("Claims", claim_rows, graph_budget, truncate_first=False)

    spent = reports.tokens + entities.tokens + relationships.tokens + claims.tokens
    used_relationships = [r for _, r in ordered.head(len(relationships)).iterrows()]
    units = (_text_units(q, entity_rows, used_relationships) if unit_order is None
             else (r for _, r in q.index.rows_by("text_units", "id", unit_order).iterrows()))  # lazily: few fit
    sources = pack("Sources", units, budget - spent)
    return Context([reports, entities, relationships, claims, sources])


def allowed_refs(context: Context) -> dict[str, set[int]]:
    return {kind: set(refs) for kind, refs in context.records().items()}


async def local_search(q: Query) -> QueryResult:
    context = await local_context(q, q.search_text())
    if context.units:
        answer = await final_answer(q, q.render("query_answer", context=context.text()), step="answer")
    else:  # nothing matched (e.g. an index without entities): say so rather than ask about nothing
        answer = no_answer(q)
    stats = {"retrieval": q.settings.query.local_retrieval, "context_units": context.units, "context_tokens": context.tokens,
             "sections": {s.kind: {"rows": len(s), "tokens": s.tokens} for s in context.sections}}
    return result(q, "local", answer, context, stats=stats, allowed=allowed_refs(context))
