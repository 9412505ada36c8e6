"""Query methods over an index (paper section 2.6 plus the baselines of section 3).

    searcher = Searcher.open(settings)            # loads the tables once
    result = await searcher.query("What are the main themes?", method="global", level=1)
    print(result.answer, result.citations, result.usage)

Methods: global (map-reduce over community reports at a level; `dynamic=True` for dynamic
community selection), local (entity neighbourhood), drift (global priming + local follow-ups),
basic (vector RAG over text units, the SS baseline), text (map-reduce over text units, the
TS baseline) and lazy (relevance tests of text units under a budget, then claims; needs no
community report). Every method returns a `QueryResult`. Global and DRIFT search on a lazy index,
which has no community report, raise MethodUnavailable (a ValueError) naming the methods to use.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from ..llm import open_cache, open_chat, open_embedder
from ..llm.usage import Usage
from .answer import Query, QueryResult
from .basic_search import basic_search
from .data import GraphIndex, IndexNotFound, MethodUnavailable
from .drift_search import drift_search
from .global_search import global_search, text_search
from .lazy_search import lazy_search
from .local_search import local_search


@dataclass(frozen=True)
class Method:
    """One query method: the function that answers, and the options it takes beyond the question."""

    run: Callable[..., Awaitable[QueryResult]]
    summary: str
    by_level: bool = False  # takes `level` and `dynamic` (a community level to answer from)
    by_budget: bool = False  # takes `budget` (relevance tests of text units)


# The one list of query methods: the CLI, the Python API and the server take their names from here.
REGISTRY: dict[str, Method] = {
    "global": Method(global_search, "map-reduce over the community reports of one level", by_level=True),
    "local": Method(local_search, "the neighbourhood of the entities the question names"),
    "drift": Method(drift_search, "global priming, then local follow-up questions"),
    "basic": Method(basic_search, "vector search over source text (the SS baseline)"),
    "text": Method(text_search, "map-reduce over all source text (the TS baseline)"),
    "lazy": Method(lazy_search, "relevance tests of text units under a budget, then claims (no reports needed)",
                   by_budget=True),
}
METHODS: tuple[str, ...] = tuple(REGISTRY)


def method_named(name: str) -> Method:
    if name not in REGISTRY:
        raise ValueError(f"unknown query method {name!r}; choose one of {', '.join(METHODS)}")
    return REGISTRY[name]


class Searcher:
    """An index opened for questions: tables, vectors, cache and embedder are loaded once and
    shared by every query; each query gets its own usage counters.

    Use one Searcher within one event loop (its HTTP clients belong to the loop they first ran
    on): a long-lived server keeps its loop; one-off callers open a Searcher per `asyncio.run`."""

    def __init__(self, settings: Settings, index: GraphIndex, *, cache: bool | None = None,
                 log: Callable[[str], None] = lambda m: None):
        self.settings = settings
        self.index = index
        self.log = log
        self.cache = open_cache(settings, cache)
        self.embedder = open_embedder(settings, cache=self.cache)

    @classmethod
    def open(cls, settings: Settings, index_dir: str | Path | None = None, **kwargs) -> "Searcher":
        folder = Path(index_dir) if index_dir else settings.path(settings.output_dir)
        return cls(settings, GraphIndex.load(folder), **kwargs)

    async def query(
        self,
        question: str,
        method: str = "global",
        *,
        level: int | None = None,
        dynamic: bool = False,
        budget: int | None = None,
        response_type: str | None = None,
        history: list[dict[str, str]] | None = None,
        on_token: Callable[[str], None] | None = None,
    ) -> QueryResult:
        chosen = method_named(method)
        if not question or not question.strip():
            raise ValueError("the question is empty")
        if dynamic and not chosen.by_level:
            raise ValueError("dynamic community selection applies to global search only")
        if budget is not None and not chosen.by_budget:
            raise ValueError("a relevance-test budget applies to lazy search only")
        chat = self.settings.chat
        llm = open_chat(self.settings, cache=self.cache,
                        usage=Usage(chat.price_per_1k_prompt, chat.price_per_1k_completion))
        self.embedder.usage = Usage()
        q = Query(question.strip(), self.settings, self.index, llm, self.embedder,
                  response_type=response_type or "", history=list(history or []), on_token=on_token, log=self.log)
        # `level` is ignored by the other methods (local search reads its reports at query.level).
        options: dict = {"level": level, "dynamic": dynamic} if chosen.by_level else {}
        if chosen.by_budget:
            options["budget"] = budget  # None: lazy.budget
        try:
            return await chosen.run(q, **options)
        finally:
            await llm.aclose()

    async def aclose(self) -> None:
        await self.embedder.aclose()


__all__ = ["Searcher", "QueryResult", "METHODS", "REGISTRY", "Method", "method_named", "GraphIndex", "IndexNotFound",
           "MethodUnavailable"]
