"""What the server holds for its lifetime: the index (loaded once), its browsable records, and
the searcher that answers questions (opened on the first question, so browsing never starts a
model), plus the one way every endpoint runs a query with its tokens streamed."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request

from ..config import Settings
from ..query import METHODS, GraphIndex, QueryResult
from .records import Explorer

log = logging.getLogger("sensegraph.server")
KEEPALIVE_SECONDS = 10.0  # an SSE comment while the map step runs, so proxies keep the stream open


class Answers(Protocol):
    """What the server needs of a searcher (sensegraph.query.Searcher, or a stand-in in tests)."""

    async def query(self, question: str, method: str = "global", **kwargs: Any) -> QueryResult: ...


@dataclass
class ServerState:
    settings: Settings | None
    index: GraphIndex
    explorer: Explorer
    searcher: Answers | None = None
    max_concurrent_queries: int = 4
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _slots: asyncio.Semaphore | None = None
    _owned: bool = False  # True when the server opened the searcher and must close it

    @property
    def default_method(self) -> str:
        """The method of a question that names none: global search (the paper's), except on a
        lazy index, which has no reports for it to read: lazy search there (basic search, over
        the same text units, where this version has no lazy method)."""
        if self.explorer.lazy:
            return "lazy" if "lazy" in METHODS else "basic"
        return "global"

    async def get_searcher(self) -> Answers:
        async with self._lock:
            if self.searcher is None:
                if self.settings is None:
                    raise ValueError("this server was started without settings, so it cannot answer questions")
                from ..query import Searcher  # opens the cache and embedder: only when a question comes

                self.searcher = Searcher(self.settings, self.index, log=log.info)
                self._owned = True
            return self.searcher

    async def query(self, question: str, method: str, **kwargs: Any) -> QueryResult:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent_queries)
        searcher = await self.get_searcher()
        # A few questions at a time: each one fans out into many model calls already.
        async with self._slots:
            return await searcher.query(question, method, **kwargs)

    async def stream(self, question: str, method: str, **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        """("token", text) while the answer is written, then ("result", QueryResult) or
        ("error", exception); ("ping", None) when nothing happened for a while. Leaving the
        loop early (the client went away) cancels the query."""
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def work() -> None:
            try:
                result = await self.query(question, method, on_token=lambda t: queue.put_nowait(("token", t)),
                                          **kwargs)
                queue.put_nowait(("result", result))
            except Exception as exc:  # reported to the client as an event, not as a broken stream
                queue.put_nowait(("error", exc))

        task = asyncio.create_task(work())
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_SECONDS)
                except asyncio.TimeoutError:
                    yield "ping", None
                    continue
                yield kind, value
                if kind in ("result", "error"):
                    return
        finally:
            if not task.done():
                task.cancel()

    async def aclose(self) -> None:
        if self._owned and self.searcher is not None and hasattr(self.searcher, "aclose"):
            await self.searcher.aclose()  # type: ignore[union-attr]


def state_of(request: Request) -> ServerState:
    return request.app.state.sg
