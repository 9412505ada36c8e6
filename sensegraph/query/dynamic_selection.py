"""Dynamic community selection for global search (`--dynamic`).

Instead of mapping every report at a level, rate reports for relevance to the question from the
root down, descend only into the children of relevant reports, and map-reduce over the deepest
relevant report of each branch. Rating is one short call per report, much cheaper than a map
call over the same text, and irrelevant branches are never opened.
"""
from __future__ import annotations

import asyncio

import pandas as pd
from pydantic import BaseModel

from ..llm.client import LLMError
from ..tokens import truncate
from .answer import Query
from .data import list_ids

REPORT_TOKENS = 1200  # of each report shown to the rater: title, summary and the first findings


class Rating(BaseModel):
    reason: str
    rating: int


async def _rate(q: Query, row: pd.Series) -> int:
    report = truncate(str(row.get("full_content") or row.get("summary") or ""), REPORT_TOKENS)
    messages = q.render("dynamic_rate", report=report)
    answer = await q.llm.structured(messages, Rating, step="rate", item=f"report {int(row['community'])}",
                                    max_tokens=150)
    return max(0, min(5, answer.rating))


async def _inherit(threshold: int) -> int:
    return threshold


async def select_reports(q: Query, max_level: int) -> tuple[pd.DataFrame, dict]:
    """The reports to map, and what the selection did (rated, kept, per level)."""
    reports = q.index.reports
    by_community = {int(c): i for i, c in enumerate(reports["community"].tolist())}
    children = {int(c): [int(k) for k in list_ids(kids)]
                for c, kids in zip(reports["community"].tolist(), reports["children"].tolist())}
    threshold = q.settings.query.dynamic_threshold
    queue = [int(c) for c, lvl in zip(reports["community"].tolist(), reports["level"].tolist()) if lvl == 0]
    relevant: set[int] = set()
    rated = 0
    failed: list[str] = []
    per_level: list[dict] = []
    level = 0
    while queue and level <= max_level:
        rows = [reports.iloc[by_community[c]] for c in queue]
        # A community carried unchanged from the level above has its parent's report text: it
        # inherits the parent's verdict (it is only in the queue because the parent was relevant).
        carried = [bool(r.get("carried", False)) and level > 0 for r in rows]
        outcomes = await asyncio.gather(*(_inherit(threshold) if c else _rate(q, r) for r, c in zip(rows, carried)),
                                        return_exceptions=True)
        rated += len(rows) - sum(carried)
        now = []
        for c, outcome in zip(queue, outcomes):
            if isinstance(outcome, LLMError):
                failed.append(f"report {c}")
                now.append(c)  # unrated is kept: better to map a report than lose it silently
            elif isinstance(outcome, BaseException):
                raise outcome
            elif outcome >= threshold:
                now.append(c)
        per_level.append({"level": level, "rated": len(rows) - sum(carried), "relevant": len(now)})
        relevant.update(now)
        # Nothing relevant yet: the root summaries may be too coarse, so look one level down.
        parents = now if (now or relevant) else queue
        queue = [k for c in parents for k in children.get(c, []) if k in by_community]
        level += 1
    # The deepest relevant report of each branch: a parent whose child is relevant is replaced.
    keep = [c for c in relevant if not any(k in relevant for k in children.get(c, []))]
    selected = reports.iloc[sorted(by_community[c] for c in keep)]
    if failed:
        q.log(f"warning: rating failed for {len(failed)} reports ({', '.join(failed)}); they are kept")
    return selected, {"rated": rated, "relevant": len(relevant), "kept": len(selected),
                      "per_level": per_level, "rating_failures": failed}
