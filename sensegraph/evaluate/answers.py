"""Answer every question under each condition (paper section 3.2), with one answer prompt and
one context budget for all, keeping the answer, the context size and the usage.

A condition is written as:
    C0 .. C9     global search at that community level (paper's C0-C3); Cmax = the deepest
    C2+dyn       global search with dynamic community selection
    TS           the text-summarisation baseline (map-reduce over source text)
    SS           the semantic-search baseline (vector RAG over text units)
    Z100, Z500   lazy search with that relevance-test budget (Z<budget>; presets 100 / 500 / 1500)
    local, drift the other query methods
    NAME=SPEC@ROOT   SPEC run on another sensegraph project (its own settings and index), to
                     compare two configurations (models, chunking, prompts) on one question set
"""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

from ..config import Settings, load_settings
from ..llm.client import LLMError
from .store import Bar, EvalStore, no_bar

_LEVEL = re.compile(r"^[Cc](\d+|max)(\+dyn)?$")
_LAZY = re.compile(r"^[Zz](\d+)$")


@dataclass(frozen=True)
class Condition:
    label: str
    method: str  # global | text | basic | local | drift | lazy
    level: int | None = None  # global: community level; None with method global = deepest
    dynamic: bool = False
    root: str | None = None  # another project; None = the evaluation's project
    budget: int | None = None  # lazy: relevance tests of text units per question

    def describe(self) -> str:
        what = {"text": "TS (map-reduce over source text)", "basic": "SS (vector search over text units)",
                "local": "local search", "drift": "DRIFT search",
                "lazy": f"lazy search with a budget of {self.budget} relevance tests"}.get(self.method)
        if what is None:
            what = f"global search at level {self.level if self.level is not None else 'max'}" + \
                   (" with dynamic selection" if self.dynamic else "")
        return what + (f" on project {self.root}" if self.root else "")


def parse_condition(spec: str) -> Condition:
    """`C1`, `Cmax`, `C2+dyn`, `TS`, `SS`, `Z100`, `local`, `drift`, or `NAME=SPEC@ROOT`."""
    spec = spec.strip()
    label = None
    root = None
    if "=" in spec:
        label, spec = (s.strip() for s in spec.split("=", 1))
    if "@" in spec:
        spec, root = (s.strip() for s in spec.split("@", 1))
        if not label:
            raise ValueError(f"condition {spec}@{root}: name it, e.g. other={spec}@{root}")
    m = _LEVEL.match(spec)
    if m:
        level = None if m.group(1) == "max" else int(m.group(1))
        dyn = bool(m.group(2))
        cond = Condition(label or "", "global", level, dyn, root)
    elif (z := _LAZY.match(spec)) and int(z.group(1)) > 0:
        cond = Condition(label or f"Z{int(z.group(1))}", "lazy", root=root, budget=int(z.group(1)))
    elif spec.upper() in ("TS", "SS"):
        cond = Condition(label or spec.upper(), "text" if spec.upper() == "TS" else "basic", root=root)
    elif spec.lower() in ("local", "drift"):
        cond = Condition(label or spec.lower(), spec.lower(), root=root)
    else:
        raise ValueError(f"unknown condition {spec!r}: use C0..C9, Cmax, C2+dyn, TS, SS, Z100 (Z<budget>), local, drift, "
                         "or NAME=SPEC@PROJECT")
    if label is not None and not re.fullmatch(r"[\w.+-]+", label):
        raise ValueError(f"condition name {label!r}: use letters, digits, '.', '+', '-' or '_'")
    return cond


def resolve_labels(conditions: list[Condition], deepest: dict[str | None, int]) -> list[Condition]:
    """Fill in labels of level conditions (Cmax -> C<deepest level> of that condition's index)."""
    out = []
    for c in conditions:
        if c.method == "global" and c.level is None:
            c = Condition(c.label, c.method, deepest[c.root], c.dynamic, c.root)
        if not c.label:
            c = Condition(f"C{c.level}" + ("+dyn" if c.dynamic else ""), c.method, c.level, c.dynamic, c.root)
        if c in out:  # e.g. Cmax on an index whose deepest level is also asked for by number
            continue
        out.append(c)
    labels = [c.label for c in out]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:
        raise ValueError(f"two conditions are named {', '.join(sorted(dup))}; name them with NAME=SPEC")
    return out


def condition_settings(settings: Settings, cond: Condition, context_tokens: int | None) -> Settings:
    """The settings a condition runs with: its project's, with the shared context budget."""
    if cond.root is not None:
        return load_settings(cond.root, overrides={"query": {"context_tokens": context_tokens}} if context_tokens else None)
    if context_tokens:
        # model_copy keeps overrides the caller's settings were loaded with (e.g. a test's model size).
        return settings.model_copy(update={"query": settings.query.model_copy(update={"context_tokens": context_tokens})})
    return settings


def estimate_answer_calls(searcher, cond: Condition) -> int:
    """LLM calls one question costs under `cond` (exact for map-reduce methods, rough otherwise)."""
    s = searcher.settings
    if cond.method == "basic" or cond.method == "local":
        return 1
    if cond.method == "drift":
        return 2 + s.query.drift_depth * s.query.drift_breadth * 2
    if cond.method == "lazy":
        from ..query.lazy_search import estimate_calls

        return estimate_calls(s, cond.budget)
    try:
        from ..query.global_search import chunks, project_reports, shuffled

        idx = searcher.index
        if cond.method == "text":
            rows, kind = shuffled(idx.text_units, 0), "Sources"
        else:
            rows, kind = shuffled(project_reports(idx.reports, idx.communities, cond.level), 0), "Reports"
        maps = len(list(chunks(kind, rows, s.query_context_tokens())))
    except Exception:  # an estimate must never stop a run
        maps = 1
    rated = len(searcher.index.reports) if cond.dynamic else 0
    return maps + 1 + rated


def calls_per_question(settings: Settings, conditions: list[Condition],
                       context_tokens: int | None = None) -> dict[str, int]:
    """LLM calls one question costs under each condition (labels resolved), for estimates."""
    from ..query import Searcher

    searchers = {c.root: Searcher.open(condition_settings(settings, c, context_tokens), cache=False)
                 for c in conditions}
    resolved = resolve_labels(conditions, {r: s.index.max_level() for r, s in searchers.items()})
    return {c.label: estimate_answer_calls(searchers[c.root], c) for c in resolved}


async def run_answers(settings: Settings, store: EvalStore, conditions: list[Condition], *,
                      limit: int | None = None, context_tokens: int | None = None, parallel: int = 2,
                      cache: bool | None = None, bar: Bar = no_bar, dry_run: bool = False,
                      log=lambda m: None) -> dict[str, Any]:
    """Answer every stored question under every condition not answered yet. Returns the run
    summary (calls, tokens, failures, estimate); rows go to answers.jsonl as they finish."""
    from ..query import Searcher

    started = time.monotonic()
    questions = store.questions(limit)
    searchers: dict[str | None, Any] = {}
    for c in conditions:
        if c.root not in searchers:
            s = condition_settings(settings, c, context_tokens)
            searchers[c.root] = Searcher.open(s, cache=cache, log=lambda m: None)
    try:
        conditions = resolve_labels(conditions, {r: s.index.max_level() for r, s in searchers.items()})
        done = store.done("answers")
        todo = [(q, c) for c in conditions for q in questions if (q["id"], c.label) not in done]
        per_q = {c.label: estimate_answer_calls(searchers[c.root], c) for c in conditions}
        estimate = {"questions": len(questions), "conditions": [c.label for c in conditions],
                    "answers_total": len(questions) * len(conditions), "answers_to_do": len(todo),
                    "calls_per_question": per_q,
                    "llm_calls_estimate": sum(per_q[c.label] for _, c in todo)}
        if dry_run:
            return {"estimate": estimate, "conditions": conditions}
        log(f"answering {len(todo)} of {estimate['answers_total']} (question, condition) pairs, "
            f"≈{estimate['llm_calls_estimate']} LLM calls before cache hits")
        advance = bar("answers", len(todo))
        gate = asyncio.Semaphore(max(1, parallel))
        totals = {"calls": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 0}
        failures: list[str] = []

        async def one(q: dict[str, Any], c: Condition) -> None:
            searcher = searchers[c.root]
            row: dict[str, Any] = {"question_id": q["id"], "condition": c.label, "method": c.method,
                                   "level": c.level, "dynamic": c.dynamic, "project": c.root or "",
                                   "context_budget": searcher.settings.query_context_tokens(),
                                   **({"budget": c.budget} if c.budget is not None else {})}
            async with gate:
                try:
                    r = await searcher.query(q["question"], c.method, level=c.level, dynamic=c.dynamic,
                                             budget=c.budget)
                except (LLMError, ValueError) as exc:
                    failures.append(f"{q['id']} {c.label}: {exc}")
                    store.append("answers", {**row, "error": str(exc)})
                    advance()
                    return
            for k in totals:
                totals[k] += int(r.usage.get(k, 0) or 0)
            if r.failures:
                failures.append(f"{q['id']} {c.label}: {len(r.failures)} map calls failed")
            store.append("answers", {**row, "answer": r.answer, "context_tokens": r.context.tokens,
                                     "context_units": r.context.units, "usage": r.usage,
                                     "stats": r.stats, "failures": r.failures})
            advance()

        await asyncio.gather(*(one(q, c) for q, c in todo))
    finally:
        for s in searchers.values():
            await s.aclose()
    run = store.record_run("answers", started, totals, items=len(todo), failures=failures,
                           conditions=[c.label for c in conditions])
    return {"estimate": estimate, "run": run, "conditions": conditions}


def answered_conditions(store: EvalStore) -> list[str]:
    """Condition labels with stored answers, in the order they were first answered."""
    seen: dict[str, None] = {}
    for row in store.rows("answers"):
        seen.setdefault(row["condition"], None)
    return list(seen)
