"""Embeddings of text units, entity descriptions and community reports (for local, DRIFT and
basic search), stored as vector tables beside the parquet tables."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..llm import LLMError
from ..store.vectors import VectorWriter
from .windows import run_windowed, window_of

# What is embedded for each table: the text a query should be compared with.
EMBEDDED_FIELDS: dict[str, Callable[[pd.Series], str]] = {
    "text_units": lambda r: r["text"],
    "entities": lambda r: f"{r['title']}: {r['description']}",
    "community_reports": lambda r: r["full_content"],
}


def _batches(df: pd.DataFrame, text_of: Callable[[Any], str], size: int) -> Iterator[tuple[int, list[str], list[str]]]:
    """(number, ids, texts) per batch of `size` rows, each batch's texts made when it is reached."""
    for number, start in enumerate(range(0, len(df), size)):
        part = df.iloc[start:start + size]
        yield number, part["id"].tolist(), [text_of(row) for row in part.to_dict("records")]


async def embed_tables(tables: dict[str, pd.DataFrame], embedder, output_dir: Path,
                       advance: Callable[[int], None] | None = None) -> tuple[dict[str, int], list[str]]:
    """Embed every row of each table named in EMBEDDED_FIELDS; returns (rows embedded per table,
    failed rows as "table:id"). A batch that fails after every retry leaves its rows out of the
    vector table and in the failed list, and the other batches go on: the pipeline names them.
    The embedder's cache means unchanged rows cost nothing on a rerun.

    The batches of all tables go through one window of a few batches per request slot
    (windows.py): the embedder's servers are kept busy, while only the batches in progress are
    in memory, and each batch's vectors go to disk as they come (store.vectors.VectorWriter)."""
    names = [n for n in EMBEDDED_FIELDS if tables.get(n) is not None]
    size = max(1, embedder.settings.batch_size)
    writers = {n: VectorWriter(output_dir, n, model=embedder.model) for n in names}
    counts = dict.fromkeys(names, 0)
    failed: dict[str, list[list[str]]] = {n: [] for n in names}  # per table, per failed batch
    jobs = ((name, *batch) for name in names for batch in _batches(tables[name], EMBEDDED_FIELDS[name], size))

    async def one(job: tuple[str, int, list[str], list[str]]) -> tuple[str, int, list[str], np.ndarray | None]:
        name, number, ids, texts = job
        try:
            return name, number, ids, await embedder.embed(texts, kind="passage", step="embed")
        except LLMError:
            return name, number, ids, None
        finally:
            if advance:
                advance(len(texts))

    def finished(_: int, result: tuple[str, int, list[str], np.ndarray | None]) -> None:
        name, number, ids, vectors = result
        if vectors is None:
            failed[name].append([number, *ids])
        else:
            writers[name].add(number, ids, vectors)
            counts[name] += len(ids)

    try:
        await run_windowed(jobs, one, window=window_of(embedder), done=finished)
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    for name in names:
        writers[name].close()
    # In table order: batch by batch, each batch's rows in order.
    lost = [f"{name}:{i}" for name in names for batch in sorted(failed[name], key=lambda b: b[0]) for i in batch[1:]]
    return counts, lost


def prefetch_text_units(units: pd.DataFrame, embedder) -> asyncio.Task | None:
    """Start embedding the text units in the background while the LLM extracts from them; the
    vectors land in the cache, so the embed step later finds them there. Text units are the
    only table known before extraction, and usually the largest one to embed. A failure here
    is ignored: the embed step retries those units and reports what still fails. A window of
    batches (windows.py) keeps the embedder busy without holding every batch at once."""
    if embedder.cache is None or units.empty:
        return None
    batch = max(1, embedder.settings.batch_size)

    async def one(job: tuple[int, list[str], list[str]]) -> None:
        try:
            await embedder.embed(job[2], kind="passage", step="embed")
        except LLMError:
            pass

    async def run() -> None:
        await run_windowed(_batches(units, EMBEDDED_FIELDS["text_units"], batch), one,
                           window=window_of(embedder), done=lambda _, __: None)

    return asyncio.create_task(run())


def embedding_count(tables: dict[str, pd.DataFrame]) -> int:
    return sum(len(tables[n]) for n in EMBEDDED_FIELDS if tables.get(n) is not None)
