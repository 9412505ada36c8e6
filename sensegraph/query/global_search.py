"""Global search (paper section 2.6) and the text-summarisation baseline (TS, section 3).

Both are the same map-reduce: shuffle the units (community reports at one level, or source text
units), pack them into token-bounded chunks, *map* every chunk in parallel to key points scored
0-100, drop the points scored 0, sort the rest by score, pack them into the reduce context
until its budget is full, and *reduce* them into the answer. When no point scores above 0 the
answer says plainly that the data does not answer the question; nothing is invented.
"""
from __future__ import annotations

import random

import pandas as pd
from pydantic import BaseModel, Field

from ..tokens import count_tokens, truncate
from .answer import Query, QueryResult, each_batch, final_answer, no_answer, result
from .citations import MAX_IDS, normalise, parse
from .context import Context, Section, chunks
from .data import list_ids

MAX_POINTS = 5


class Point(BaseModel):
    description: str
    # The evidence as a list the schema enforces, rather than a citation the model may forget to
    # write: small models drop inline references, but fill a required field.
    ids: list[int] = Field(max_length=10)
    score: int


class MapAnswer(BaseModel):
    points: list[Point] = Field(max_length=MAX_POINTS)


def project_reports(reports: pd.DataFrame, communities: pd.DataFrame | None, level: int) -> pd.DataFrame:
    """The reports that describe the graph at `level`: those at the level, plus, for every branch
    of the hierarchy that ends above it, the branch's deepest report (the paper's projection), so
    each level covers every community once.

    Walks down from the roots and descends into a community's children only when every child
    can be covered (has a report, or children that all can): a missing report (a failed item
    in a partial index) is then covered by its parent's report instead of leaving a hole."""
    tree = communities if communities is not None and "children" in communities else reports
    level_of = {int(c): int(lvl) for c, lvl in zip(tree["community"].tolist(), tree["level"].tolist())}
    children = {int(c): [int(k) for k in list_ids(kids) if level_of.get(int(k), level + 1) <= level]
                for c, kids in zip(tree["community"].tolist(), tree["children"].tolist())}
    row_of = {int(c): i for i, c in enumerate(reports["community"].tolist())}
    have = {c for c in row_of if level_of.get(c, 0) <= level}
    memo: dict[int, bool] = {}

    def coverable(c: int) -> bool:
        if c not in memo:
            kids = children.get(c, [])
            memo[c] = c in have or (bool(kids) and all(coverable(k) for k in kids))
        return memo[c]

    chosen: list[int] = []

    def visit(c: int) -> None:
        kids = children.get(c, [])
        if kids and all(coverable(k) for k in kids):
            for k in kids:
                visit(k)
        elif c in have:
            chosen.append(c)
        else:  # neither this report nor all of the children's: cover what can be covered
            for k in kids:
                if coverable(k):
                    visit(k)

    parents = {int(k) for kids in tree["children"].tolist() for k in list_ids(kids)}
    for root in sorted(c for c in level_of if c not in parents):
        visit(root)
    return reports.iloc[sorted(row_of[c] for c in chosen)]


def shuffled(df: pd.DataFrame, seed: int) -> list[pd.Series]:
    rows = [row for _, row in df.iterrows()]
    random.Random(seed).shuffle(rows)
    return rows


def _with_reference(point: Point, kind: str, given: set[int]) -> str:
    """The point's text ending in one reference to the rows it rests on: ids from the `ids` field
    and from any reference written inline, kept only if they were in the batch."""
    inline = [ref for k, refs, _ in parse(point.description) if k == kind for ref in refs]
    text, _ = normalise(point.description, {})  # drops inline references; re-added below
    refs = [r for r in dict.fromkeys([*point.ids, *inline]) if r in given]
    if not refs:
        return text.strip()
    shown = ", ".join(map(str, refs[:MAX_IDS])) + (", +more" if len(refs) > MAX_IDS else "")
    return f"{text.strip()} [Data: {kind} ({shown})]"


async def _map(q: Query, batches: list[Section]) -> tuple[list[tuple[int, int, str]], list[str]]:
    """(score, batch number, description) of every point, and the batches that failed."""
    async def one(i: int, batch: Section) -> list[tuple[int, int, str]]:
        messages = q.render("query_map", context=batch.text())
        answer = await q.llm.structured(messages, MapAnswer, step="map", item=f"map batch {i + 1}",
                                        max_tokens=q.settings.query.map_max_tokens)
        given = {r["ref"] for r in batch.records}
        return [(max(0, min(100, p.score)), i, _with_reference(p, batch.kind, given))
                for p in answer.points if p.description.strip()]

    points, failed = [], []
    for i, outcome in enumerate(await each_batch(one(i, b) for i, b in enumerate(batches))):
        if outcome is None:
            failed.append(f"map batch {i + 1}")
        else:
            points.extend(outcome)
    return points, failed


def reduce_context(points: list[tuple[int, int, str]], budget: int, language: str) -> tuple[str, int]:
    """Points scored above 0, best first, as analyst reports until the budget is full."""
    # "Key point", not "Analyst": small models otherwise write about "Analyst 2" in the answer.
    label = "要点" if language == "zh" else "Key point"
    score_label = "重要性分数" if language == "zh" else "Importance Score"
    ranked = sorted((p for p in points if p[0] > 0), key=lambda p: (-p[0], p[1]))
    parts: list[str] = []
    used = 0
    for n, (score, _, text) in enumerate(ranked, 1):
        block = f"----{label} {n}----\n{score_label}: {score}\n{text}\n"
        cost = count_tokens(block)
        if used + cost > budget:
            if not parts:
                parts.append(truncate(block, budget))
            break
        parts.append(block)
        used += cost
    return "\n".join(parts), len(parts)


async def map_reduce(q: Query, method: str, kind: str, rows: list[pd.Series], stats: dict) -> QueryResult:
    batches = list(chunks(kind, rows, q.budget))
    context = Context(batches)
    points, failed = await _map(q, batches)
    positive = [p for p in points if p[0] > 0]
    text, kept = reduce_context(points, q.budget, q.language)
    stats.update({
        "context_units": context.units, "context_tokens": context.tokens, "map_calls": len(batches),
        "points": len(points), "points_scored_zero": len(points) - len(positive), "points_reduced": kept,
    })
    if failed:
        q.log(f"warning: {len(failed)} of {len(batches)} map calls failed after retries: {', '.join(failed)}")
    if not positive:
        stats["reduce_calls"] = 0
        answer = no_answer(q)
    else:
        stats["reduce_calls"] = 1
        answer = await final_answer(q, q.render("query_reduce", context=text), step="reduce")
    allowed = {kind: {r["ref"] for b in batches for r in b.records}}
    return result(q, method, answer, context, stats=stats, allowed=allowed, failures=failed)


async def global_search(q: Query, level: int | None = None, dynamic: bool = False) -> QueryResult:
    """Map-reduce over the community reports at `level` (default: settings.query.level). Raises
    MethodUnavailable on a lazy index, which has no reports."""
    q.index.require_reports("global")
    requested = q.settings.query.level if level is None else level
    deepest = q.index.max_level()
    used = min(requested, deepest)
    stats: dict = {"level": used, "requested_level": requested, "deepest_level": deepest}
    if requested > deepest:
        q.log(f"the index has levels 0-{deepest}; using level {used}")
    if dynamic:
        from .dynamic_selection import select_reports  # only --dynamic needs it

        reports, selection = await select_reports(q, used)
        stats["dynamic"] = selection
        if reports.empty:
            q.log("dynamic selection kept no report; answering from the whole level instead")
            reports = project_reports(q.index.reports, q.index.communities, used)
            selection["fallback"] = True
    else:
        reports = project_reports(q.index.reports, q.index.communities, used)
    stats["reports"] = len(reports)
    return await map_reduce(q, "global", "Reports", shuffled(reports, q.settings.query.seed), stats)


async def text_search(q: Query) -> QueryResult:
    """The paper's TS baseline: the same map-reduce over shuffled source text units."""
    units = q.index.text_units
    return await map_reduce(q, "text", "Sources", shuffled(units, q.settings.query.seed), {"text_units": len(units)})

