"""Embeddings of text units, entity descriptions (a lazy index's concepts: their titles) and
community reports (for local, DRIFT and basic search), stored as vector tables beside the parquet
tables."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from ..llm import LLMError
from ..store.vectors import VectorWriter
from .windows import window_of

# What is embedded for each table: the text a query should be compared with.
EMBEDDED_FIELDS: dict[str, Callable[[pd.Series], str]] = {
    "text_units": lambda r: r["text"],
    "entities": lambda r: f"{r['title']}: {r['description']}",
    "community_reports": lambda r: r["full_content"],
}


def concept_text(row: Any) -> str:
    """What a lazy index embeds for a concept: its title. Its description is only the first
    sentence the concept occurs in (cooccurrence.py), which says more about whatever else that
    sentence names ("actor: Bruce Leung ... is an actor who ...") than about the concept, and is
    7 times the tokens: 44 a concept against 6 on 2Wiki, where it made the concepts cost more to
    embed than the text units and walk recall no better (docs/performance.md)."""
    return str(row["title"])


def embedded_text(name: str, *, lazy: bool = False) -> Callable[[Any], str]:
    """The text embedded for a row of table `name` (a key of EMBEDDED_FIELDS) of a lazy or a
    standard index: the index and the query's fallback (query.data) must embed the same."""
    return concept_text if lazy and name == "entities" else EMBEDDED_FIELDS[name]


def _batches(df: pd.DataFrame, text_of: Callable[[Any], str], size: int) -> Iterator[tuple[int, list[str], list[str]]]:
    """(number, ids, texts) per batch of `size` rows, each batch's texts made when it is reached."""
    for number, start in enumerate(range(0, len(df), size)):
        part = df.iloc[start:start + size]
        yield number, part["id"].tolist(), [text_of(row) for row in part.to_dict("records")]


class EmbeddingRun:
    """The vector tables of one index run, each embedded from the moment its table is known:
    text units while the LLM extracts from them, entity descriptions while the community
    reports are written (a lazy index's concepts once its graph is built), the reports last. Embeddings go to their own servers (`embedding`),
    so a table embedded beside a chat step costs that step nothing, and the embed step waits
    only for what is left; embedding every table after the reports added its batches' start
    and end to the index's wall time (2.4 s of 107 on the podcast corpus at 300 ms).

    One window of a few batches per request slot (windows.py) serves every table, in the
    order they were added: the servers are kept busy while only the batches in progress are
    in memory, and each batch's vectors go to disk as they come (store.vectors.VectorWriter).
    A batch that fails after every retry leaves its rows out of the vector table and in the
    failed list, and the other batches go on: the pipeline names them. The embedder's cache
    means unchanged rows cost nothing on a rerun."""

    def __init__(self, embedder, output_dir: Path,
                 elsewhere: Callable[..., tuple[list[tuple[int, list[str], Any]], list[list[str]]]] | None = None):
        # `elsewhere(name, ids, texts, advance=...)`: a whole table's batches embedded elsewhere
        # (on a Ray cluster: ray_data.embed_on_ray), as (number, ids, vectors) per batch and
        # [number, *ids] per failed one; this process then only writes them.
        self.embedder, self.output_dir, self.elsewhere = embedder, Path(output_dir), elsewhere
        self.size = max(1, embedder.settings.batch_size)
        self.writers: dict[str, VectorWriter] = {}
        self.counts: dict[str, int] = {}
        self.failed: dict[str, list[list[str]]] = {}  # per table, per failed batch: [number, *ids]
        self.done = 0  # rows embedded or failed so far
        self.advance: Callable[[int], None] | None = None  # the progress bar, once there is one
        self._sources: deque[tuple[str, Iterator[tuple[int, list[str], list[str]]]]] = deque()
        self._more = asyncio.Event()
        self._closed = False
        self._elsewhere: list[asyncio.Future] = []  # the tables embedded elsewhere, one task each
        self.task = asyncio.ensure_future(self._run())  # cancelling it discards what was written

    def add(self, name: str, df: pd.DataFrame, *, lazy: bool = False) -> None:
        """Start embedding table `name` (a key of EMBEDDED_FIELDS) of a lazy or a standard index
        after the tables added before."""
        if name in self.writers:
            raise ValueError(f"{name} is already being embedded")
        if self._closed:
            raise RuntimeError("finish() was called: no table can be added")
        self.writers[name] = VectorWriter(self.output_dir, name, model=self.embedder.model)
        self.counts[name], self.failed[name] = 0, []
        if self.elsewhere is not None:
            text_of = embedded_text(name, lazy=lazy)
            self._elsewhere.append(asyncio.ensure_future(self._table_elsewhere(
                name, df["id"].astype(str).tolist(), [text_of(r) for r in df.to_dict("records")])))
            return
        self._sources.append((name, _batches(df, embedded_text(name, lazy=lazy), self.size)))
        self._more.set()

    async def _table_elsewhere(self, name: str, ids: list[str], texts: list[str]) -> None:
        loop = asyncio.get_running_loop()

        def advance(n: int) -> None:  # called from the worker thread: counted on this loop
            loop.call_soon_threadsafe(self._advance, n)
        batches, failed = await asyncio.to_thread(self.elsewhere, name, ids, texts, advance=advance)
        for number, batch_ids, vectors in batches:
            self.writers[name].add(number, batch_ids, vectors)
            self.counts[name] += len(batch_ids)
        self.failed[name].extend(failed)

    def _advance(self, n: int) -> None:
        self.done += n
        if self.advance:
            self.advance(n)

    async def finish(self) -> tuple[dict[str, int], list[str]]:
        """Wait for every table added; write them. Returns (rows embedded per table, failed rows
        as "table:id")."""
        self._closed = True
        self._more.set()
        await self.task
        for writer in self.writers.values():
            writer.close()
        # In table order: batch by batch, each batch's rows in order.
        lost = [f"{name}:{i}" for name in self.writers
                for batch in sorted(self.failed[name], key=lambda b: b[0]) for i in batch[1:]]
        return dict(self.counts), lost

    def _next(self) -> tuple[str, tuple[int, list[str], list[str]]] | None:
        while self._sources:
            name, batches = self._sources[0]
            job = next(batches, None)
            if job is not None:
                return name, job
            self._sources.popleft()
        return None

    async def _lane(self) -> None:
        while True:
            job = self._next()
            if job is None:
                if self._closed:
                    return
                self._more.clear()  # (no await since _next: no table can have come in between)
                await self._more.wait()
                continue
            name, (number, ids, texts) = job
            try:
                vectors = await self.embedder.embed(texts, kind="passage", step="embed")
            except LLMError:
                self.failed[name].append([number, *ids])
            else:
                self.writers[name].add(number, ids, vectors)
                self.counts[name] += len(ids)
            self._advance(len(texts))

    async def _run(self) -> None:
        lanes = [asyncio.ensure_future(self._lane()) for _ in range(window_of(self.embedder))]
        try:
            await asyncio.gather(*lanes)
            while self._elsewhere:  # (finish() has been called: no table comes any more)
                await self._elsewhere.pop(0)
        except BaseException:
            for task in [*lanes, *self._elsewhere]:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            for writer in self.writers.values():
                writer.discard()
            raise


async def embed_tables(tables: dict[str, pd.DataFrame], embedder, output_dir: Path,
                       advance: Callable[[int], None] | None = None,
                       run: EmbeddingRun | None = None) -> tuple[dict[str, int], list[str]]:
    """Embed every row of each table named in EMBEDDED_FIELDS (those `run` was already given
    are not added again); returns (rows embedded per table, failed rows as "table:id")."""
    run = run or EmbeddingRun(embedder, output_dir)
    for name in EMBEDDED_FIELDS:
        if tables.get(name) is not None and name not in run.writers:
            run.add(name, tables[name])
    if advance:
        advance(run.done)
        run.advance = advance
    try:
        return await run.finish()
    except BaseException:
        run.task.cancel()
        raise


def embedding_count(tables: dict[str, pd.DataFrame]) -> int:
    return sum(len(tables[n]) for n in EMBEDDED_FIELDS if tables.get(n) is not None)
