"""DRIFT search: global priming, local follow-ups, one reduce.

1. Prime (HyDE): the model writes a hypothetical answer; question + hypothetical answer are
   embedded and the most similar community reports are retrieved.
2. From those reports: a first answer, and follow-up questions each scored 0-100.
3. For `drift_depth` rounds, the `drift_breadth` best-scored open follow-ups are answered with a
   local-search context; each answer may propose new scored follow-ups. Follow-ups are chosen
   by score — Microsoft's implementation computes the scores and then picks at random.
4. The intermediate answers, ranked by score, are reduced into the final answer with the same
   reduce prompt as global search.
"""
from __future__ import annotations

import asyncio

import pandas as pd
from pydantic import BaseModel, Field

from ..llm.client import LLMError
from .answer import Query, QueryResult, final_answer, no_answer, result
from .context import Context, pack
from .global_search import reduce_context
from .local_search import allowed_refs, local_context


class FollowUp(BaseModel):
    question: str
    score: int


class Intermediate(BaseModel):
    answer: str
    score: int
    follow_ups: list[FollowUp] = Field(max_length=5)


class Primer(Intermediate):
    # At least one follow-up: without it DRIFT is only a HyDE lookup (the 1.5B model returned
    # an empty list when it was allowed to).
    follow_ups: list[FollowUp] = Field(min_length=1, max_length=5)


def _clamp(score: int) -> int:
    return max(0, min(100, score))


async def _prime(q: Query) -> Context:
    hypothetical = await q.llm.complete(q.render("drift_hyde"), step="hyde", item="drift primer", max_tokens=200)
    vectors = await q.index.vectors("community_reports", q.embedder, q.log)
    query_vector = (await q.embedder.embed([f"{q.search_text()}\n{hypothetical}"], kind="query", step="embed"))[0]
    ranked = vectors.search(query_vector, k=len(vectors.ids))
    rows = q.index.rows_by("community_reports", "id", [i for i, _ in ranked])
    chosen = distinct_reports(rows, q.settings.query.drift_primer_reports)
    return Context([pack("Reports", chosen, q.budget)])


def distinct_reports(rows: pd.DataFrame, k: int) -> list[pd.Series]:
    """The first `k` reports of `rows` (best first) that describe different communities.

    A branch that ends early is carried down as copies holding its report verbatim, so a top-k
    of the report vectors can be one report several times; a copy is recognised by its text
    (Microsoft's tables mark no copies). Of identical reports the shallowest is kept: the
    community the report was written for."""
    groups: dict[str, list[pd.Series]] = {}
    for _, row in rows.iterrows():
        content = row.get("full_content")
        key = content.strip() if isinstance(content, str) and content.strip() else f"id:{row['id']}"
        if key in groups or len(groups) < k:
            groups.setdefault(key, []).append(row)
    return [min(group, key=lambda r: (int(r["level"]), int(r["community"]))) for group in groups.values()]


async def drift_search(q: Query) -> QueryResult:
    q.index.require_reports("drift")  # its primer reads reports: a lazy index has none
    s = q.settings.query
    primer_context = await _prime(q)
    sections = list(primer_context.sections)
    failures: list[str] = []
    answers: list[tuple[int, int, str]] = []  # (score, order, text) of every intermediate answer
    rounds: list[list[dict]] = []
    open_questions: dict[str, int] = {}  # follow-up question -> best score seen
    asked: set[str] = {q.question.strip().lower()}

    def propose(follow_ups: list[FollowUp]) -> None:
        for f in follow_ups:
            text = f.question.strip()
            if text and text.lower() not in asked:
                open_questions[text] = max(open_questions.get(text, 0), _clamp(f.score))

    try:
        primer = await q.llm.structured(q.render("drift_primer", context=primer_context.text()), Primer,
                                        step="drift_primer", item="drift primer", max_tokens=s.map_max_tokens)
        answers.append((_clamp(primer.score), 0, primer.answer.strip()))
        propose(primer.follow_ups)
    except LLMError:
        failures.append("drift primer")

    async def follow(question: str) -> tuple[Intermediate, Context]:
        context = await local_context(q, question)
        messages = q.render("drift_followup", context=context.text(), global_question=q.question,
                            question=question)
        reply = await q.llm.structured(messages, Intermediate, step="drift_followup", item=question[:80],
                                       max_tokens=s.map_max_tokens)
        return reply, context

    for _ in range(s.drift_depth):
        chosen = sorted(open_questions.items(), key=lambda kv: -kv[1])[:s.drift_breadth]
        if not chosen:
            break
        for text, _ in chosen:
            del open_questions[text]
            asked.add(text.lower())
        outcomes = await asyncio.gather(*(follow(text) for text, _ in chosen), return_exceptions=True)
        record = []
        for (text, score), outcome in zip(chosen, outcomes):
            if isinstance(outcome, LLMError):
                failures.append(f"follow-up {text[:80]}")
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            reply, context = outcome
            sections.extend(context.sections)
            answers.append((_clamp(reply.score), len(answers), f"{text}\n{reply.answer.strip()}"))
            propose(reply.follow_ups)
            record.append({"question": text, "score": score, "answer_score": _clamp(reply.score)})
        rounds.append(record)

    context = Context(sections)
    text, kept = reduce_context(answers, q.budget, q.language)
    stats = {"context_units": context.units, "context_tokens": context.tokens,
             "primer_reports": len(primer_context.sections[0]) if primer_context.sections else 0,
             "follow_ups": rounds, "follow_ups_answered": sum(len(r) for r in rounds),
             "intermediate_answers": len(answers), "answers_reduced": kept}
    if not any(score > 0 for score, _, _ in answers):
        answer = no_answer(q)
    else:
        answer = await final_answer(q, q.render("query_reduce", context=text), step="reduce")
    return result(q, "drift", answer, context, stats=stats, allowed=allowed_refs(context), failures=failures)

