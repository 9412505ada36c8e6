"""Local search: questions about specific entities, answered from their neighbourhood.

Embed the question, find the best-matching entities (an entity named in the question comes
first whatever the embedding says), then gather their community reports, the entities
themselves, their relationships (those between two matched entities first), their claims and
the source text units they were extracted from. One token budget is split between source text
(`text_unit_share`), community reports (`community_share`) and the graph records (the rest);
a part that does not fill its share hands the remainder to the source text.
"""
from __future__ import annotations

import unicodedata

import pandas as pd

from .answer import Query, QueryResult, final_answer, no_answer, result
from .context import Context, pack
from .data import list_ids
from .global_search import project_reports


def _joined(char: str) -> bool:
    """Whether `char` is of a script whose words run into their neighbours: Han and kana have no
    spaces, and Korean attaches particles to the noun (서울에), so a name there is any substring."""
    return ("\u3040" <= char <= "\u30ff" or "\u3400" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af"
            or "\uf900" <= char <= "\ufaff")


def _fold(text: str) -> str:
    # NFKC makes full-width letters (ＡＩ, common in Chinese text) plain; casefold ignores case.
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _bounded(text: str, at: int, edge: str) -> bool:
    """Whether a name whose first or last character is `edge` may end next to `text[at]`.
    A Latin name must not run on into another Latin letter or digit ("AI" is not in "said");
    a Han name has no spaces around it, so any neighbour will do (as may a Han neighbour of a
    Latin name: "AI" in "AI技术")."""
    if at < 0 or at >= len(text) or _joined(edge) or not edge.isalnum():
        return True
    return not text[at].isalnum() or _joined(text[at])


def _occurs(name: str, text: str) -> bool:
    """Whether the whole of `name` occurs in `text` (both as returned by `_fold`)."""
    start = text.find(name)
    while start != -1:
        end = start + len(name)
        if _bounded(text, start - 1, name[0]) and _bounded(text, end, name[-1]):
            return True
        start = text.find(name, start + 1)
    return False


def named_entities(entities: pd.DataFrame, text: str) -> list[str]:
    """Ids of the entities whose name occurs in `text` as a whole name, longest names first."""
    folded = _fold(text)
    named = []
    for eid, title in zip(entities["id"].tolist(), entities["title"].tolist()):
        name = _fold(str(title))
        if len(name) >= 2 and _occurs(name, folded):
            named.append((len(name), eid))
    return [eid for _, eid in sorted(named, reverse=True)]  # "Alex Mercer" before "Alex"


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


def _relationships(q: Query, titles: list[str]) -> list[pd.Series]:
    rels = q.index.relationships
    if rels.empty:
        return []
    wanted = set(titles)
    src, tgt = rels["source"].isin(wanted), rels["target"].isin(wanted)
    weight_col = "combined_degree" if "combined_degree" in rels else "weight"
    inside = rels[src & tgt].sort_values([weight_col, "weight"], ascending=False)
    # Relationships leaving the matched set: the better connected neighbours first.
    outside = rels[src ^ tgt].sort_values([weight_col, "weight"], ascending=False)
    return [r for _, r in inside.iterrows()] + [r for _, r in outside.iterrows()]


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
    entity_ids = await match_entities(q, text)
    entity_rows = q.index.entity_rows(entity_ids)
    titles = entity_rows["title"].tolist()

    reports = pack("Reports", _reports(q, entity_ids), int(budget * s.community_share), truncate_first=True)
    graph_budget = int(budget * (1 - s.text_unit_share - s.community_share))
    entities = pack("Entities", (r for _, r in entity_rows.iterrows()), graph_budget)
    graph_budget -= entities.tokens
    relationship_rows = _relationships(q, titles)
    relationships = pack("Relationships", relationship_rows, graph_budget, truncate_first=False)
    graph_budget -= relationships.tokens
    claims_df = q.index.claims
    claim_rows = [r for _, r in claims_df[claims_df["subject_id"].isin(titles)].iterrows()] if len(claims_df) else []
    claims = pack("Claims", claim_rows, graph_budget, truncate_first=False)

    spent = reports.tokens + entities.tokens + relationships.tokens + claims.tokens
    used_relationships = relationship_rows[:len(relationships)]
    sources = pack("Sources", _text_units(q, entity_rows, used_relationships), budget - spent)
    return Context([reports, entities, relationships, claims, sources])


def allowed_refs(context: Context) -> dict[str, set[int]]:
    return {kind: set(refs) for kind, refs in context.records().items()}


async def local_search(q: Query) -> QueryResult:
    context = await local_context(q, q.search_text())
    if context.units:
        answer = await final_answer(q, q.render("query_answer", context=context.text()), step="answer")
    else:  # nothing matched (e.g. an index without entities): say so rather than ask about nothing
        answer = no_answer(q)
    stats = {"context_units": context.units, "context_tokens": context.tokens,
             "sections": {s.kind: {"rows": len(s), "tokens": s.tokens} for s in context.sections}}
    return result(q, "local", answer, context, stats=stats, allowed=allowed_refs(context))
