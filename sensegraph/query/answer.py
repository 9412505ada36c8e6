"""What every query method shares: the request (`Query`), the result (`QueryResult`), the
answer prompt family and the final answer call (streamed when asked), and citation checking.

Methods build a context; this module turns "question + context" into a cited answer.
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pandas as pd
from pydantic import BaseModel, Field, create_model

from ..config import Settings
from ..language import detect_language
from ..llm.client import ChatClient, LLMError
from ..prompts import load_prompt, render, to_messages
from ..tokens import count_tokens, truncate
from .citations import normalise
from .context import KINDS, Context, record
from .data import GraphIndex

LANGUAGE_NAMES = {"en": "English", "zh": "Chinese (简体中文)", "ja": "Japanese (日本語)"}
NO_ANSWER = {
    "en": "I could not find information in the indexed documents that answers this question.",
    "zh": "在已索引的文档中没有找到能回答这个问题的信息。",
    "ja": "索引された文書の中に、この質問に答える情報は見つかりませんでした。",
}
HISTORY_SHARE = 0.15  # of the context budget, at most, for earlier turns of a conversation


T = TypeVar("T")


async def each_batch(calls: Iterable[Awaitable[T]]) -> list[T | None]:
    """The calls of several batches at once, in order; None for a batch whose call failed after
    every retry (the caller names it among the failures, so nothing is lost silently), and any
    other error raised."""
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, LLMError):
            raise outcome
    return [None if isinstance(o, LLMError) else o for o in outcomes]


@dataclass
class Query:
    """One question and everything needed to answer it."""

    question: str
    settings: Settings
    index: GraphIndex
    llm: ChatClient
    embedder: Any
    response_type: str = ""
    history: list[dict[str, str]] = field(default_factory=list)  # [{"role": "user"|"assistant", "content"}]
    on_token: Callable[[str], None] | None = None
    log: Callable[[str], None] = lambda m: None
    # LLM calls of the retrieval that failed after retries (e.g. the walk's fact filter): named in
    # the result's failures, so nothing is lost silently
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.response_type = self.response_type or self.settings.query.response_type
        # Answers follow the question's language, whatever the corpus language.
        self.language = detect_language([self.question])

    @property
    def budget(self) -> int:
        return self.settings.query_context_tokens()

    def prompt(self, name: str) -> str:
        return load_prompt(name, self.language, self.settings.root)

    def history_text(self) -> str:
        """Earlier turns, newest kept first when the history is longer than its share."""
        if not self.history:
            return ""
        lines: list[str] = []
        room = int(self.budget * HISTORY_SHARE)
        for turn in reversed(self.history):
            line = f"{turn.get('role', 'user')}: {turn.get('content', '')}".strip()
            cost = count_tokens(line) + 1
            if cost > room:
                if not lines:
                    lines.append(truncate(line, max(room, 0)))
                break
            lines.append(line)
            room -= cost
        title = "对话历史" if self.language == "zh" else "Conversation history"
        return f"{title}:\n" + "\n".join(reversed(lines)) + "\n\n"

    def search_text(self) -> str:
        """What is embedded to find records: the question, with the previous user turn for
        follow-up questions such as "and what about him?"."""
        earlier = [t["content"] for t in self.history if t.get("role") == "user"][-1:]
        return "\n".join(earlier + [self.question])

    def render(self, name: str, *, question: str | None = None, **values: Any) -> list[dict[str, str]]:
        """Prompt `name` as chat messages; `question` overrides the user's question (DRIFT asks
        follow-ups). Data values are substituted last so text in them is never re-expanded."""
        values = {"language": LANGUAGE_NAMES[self.language], "response_type": self.response_type,
                  "question": self.question if question is None else question,
                  "history": self.history_text(), **values}
        return to_messages(render(self.prompt(name), **values))


@dataclass
class QueryResult:
    """The one result type of every method."""

    question: str
    method: str
    answer: str
    context: Context
    citations: dict[str, list[int]] = field(default_factory=dict)  # kind -> cited ids
    invalid_citations: dict[str, list[int]] = field(default_factory=dict)  # ids cited but not given
    cited: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> cited records
    usage: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # method-specific: level, map calls, ...
    failures: list[str] = field(default_factory=list)  # items whose LLM call failed after retries

    @property
    def context_text(self) -> str:
        return self.context.text()

    @property
    def context_tables(self) -> dict[str, pd.DataFrame]:
        return self.context.tables()

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question, "method": self.method, "answer": self.answer,
            "citations": self.citations, "invalid_citations": self.invalid_citations, "cited": self.cited,
            "context": {"text": self.context_text, "tokens": self.context.tokens, "units": self.context.units,
                        "records": {k: list(v.values()) for k, v in self.context.records().items()}},
            "usage": self.usage, "stats": self.stats, "failures": self.failures,
        }


def valid_refs(index: GraphIndex) -> dict[str, set[int]]:
    """Every citable id in the index, per kind (a citation must name a real record)."""
    out: dict[str, set[int]] = {}
    for kind, table in KINDS.items():
        df = index.tables.get(table)
        if df is not None and len(df):
            col = "community" if kind == "Reports" else "human_readable_id"
            out[kind] = {int(v) for v in df[col].tolist()}
    return out


def cite(q: Query, text: str, allowed: dict[str, set[int]] | None = None) -> tuple[str, dict, dict, dict]:
    """Normalise the references in `text` against `allowed` (default: the whole index) and
    look up the cited records."""
    allowed = allowed if allowed is not None else valid_refs(q.index)
    new, found = normalise(text, allowed)
    cited: dict[str, list[dict[str, Any]]] = {}
    for kind, refs in found.cited.items():
        col = "community" if kind == "Reports" else "human_readable_id"
        rows = q.index.rows_by(KINDS[kind], col, refs)
        cited[kind] = [record(kind, row) for _, row in rows.iterrows()]
    return new, found.cited, found.invalid, cited


async def final_answer(q: Query, messages: list[dict[str, str]], *, step: str, item: str = "") -> str:
    """The call that writes the answer the user reads: streamed token by token when asked."""
    max_tokens = q.settings.query.answer_max_tokens
    if q.on_token is None:
        return await q.llm.complete(messages, step=step, item=item or "query", max_tokens=max_tokens)
    parts = []
    async for piece in q.llm.stream(messages, step=step, item=item or "query", max_tokens=max_tokens):
        parts.append(piece)
        q.on_token(piece)
    return "".join(parts)


def usage_of(llm: ChatClient, embedder: Any = None) -> dict[str, Any]:
    total = llm.usage.total()
    out: dict[str, Any] = {
        "calls": total.calls, "cache_hits": total.cache_hits, "requests": total.requests,
        "retries": total.retries, "prompt_tokens": total.prompt_tokens,
        "completion_tokens": total.completion_tokens, "cached_prompt_tokens": total.cached_prompt_tokens,
        "steps": {name: {"calls": s.calls, "cache_hits": s.cache_hits, "prompt_tokens": s.prompt_tokens,
                         "completion_tokens": s.completion_tokens, "cached_prompt_tokens": s.cached_prompt_tokens}
                  for name, s in sorted(llm.usage.steps.items())},
    }
    if total.budget_skipped:  # not sent because chat.budget_* was used up: say so, not "failed"
        out["budget_skipped"] = list(total.budget_skipped)
    # map/reduce counts as the paper reports them: answers used, whether fresh or from the cache
    for step in ("map", "reduce"):
        st = llm.usage.steps.get(step)
        out[f"{step}_calls"] = (st.calls + st.cache_hits) if st else 0
    if llm.usage.price_prompt or llm.usage.price_completion:
        out["cost"] = round(llm.usage.cost(), 6)
    if embedder is not None:
        e = embedder.usage.total()
        out["embedding_calls"] = e.calls
    return out


def result(q: Query, method: str, answer: str, context: Context, *, stats: dict[str, Any] | None = None,
           allowed: dict[str, set[int]] | None = None, failures: list[str] | None = None) -> QueryResult:
    text, cited_ids, invalid, cited = cite(q, answer, allowed)
    return QueryResult(
        question=q.question, method=method, answer=text.strip(), context=context, citations=cited_ids,
        invalid_citations=invalid, cited=cited, usage=usage_of(q.llm, q.embedder), stats=stats or {},
        failures=[*(failures or []), *q.failures],
    )


class Picks(BaseModel):
    relevant: list[int]


@functools.lru_cache(maxsize=64)
def picks_schema(most: int) -> type[BaseModel]:
    """The numbers a model chose among those it was shown, at most `most` of them (maxItems):
    lazy search's relevant passages, the walk's recognised facts."""
    return create_model("Picks", relevant=(list[int], Field(max_length=most)), __base__=Picks)


def no_answer(q: Query) -> str:
    """The plain answer when the index holds nothing that answers the question. It goes through
    `on_token` like any answer, so a streaming caller shows it instead of nothing."""
    answer = NO_ANSWER[q.language]
    if q.on_token:
        q.on_token(answer)
    return answer

