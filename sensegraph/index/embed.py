"""Embeddings of text units, entity descriptions and community reports (for local, DRIFT and
basic search), stored as vector tables beside the parquet tables."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ..llm import LLMError
from ..store.vectors import write_vectors

# What is embedded for each table: the text a query should be compared with.
EMBEDDED_FIELDS: dict[str, Callable[[pd.Series], str]] = {
    "text_units": lambda r: r["text"],
    "entities": lambda r: f"{r['title']}: {r['description']}",
    "community_reports": lambda r: r["full_content"],
}


async def embed_tables(tables: dict[str, pd.DataFrame], embedder, output_dir: Path,
                       advance: Callable[[int], None] | None = None) -> tuple[dict[str, int], list[str]]:
    """Embed every row of each table named in EMBEDDED_FIELDS; returns (rows embedded per table,
    failed rows as "table:id"). A batch that fails after every retry leaves its rows out of the
    vector table and in the failed list, and the other batches go on: the pipeline names them.
    The embedder's cache means unchanged rows cost nothing on a rerun."""
    jobs: list[tuple[str, list[str], list[str]]] = []  # (table, ids, texts) per batch
    for name, text_of in EMBEDDED_FIELDS.items():
        df = tables.get(name)
        if df is None:
            continue
        texts = [text_of(row) for _, row in df.iterrows()]
        ids = df["id"].tolist()
        batch = max(1, embedder.settings.batch_size)
        jobs += [(name, ids[i:i + batch], texts[i:i + batch]) for i in range(0, len(texts), batch)]

    async def one(ids: list[str], texts: list[str]) -> np.ndarray | None:
        try:
            return await embedder.embed(texts, kind="passage", step="embed")
        except LLMError:
            return None
        finally:
            if advance:
                advance(len(texts))

    # All batches of all tables at once: the embedder's own concurrency limit paces them, so a
    # remote endpoint is kept busy instead of answering one batch at a time.
    results = await asyncio.gather(*(one(ids, texts) for _, ids, texts in jobs))
    counts: dict[str, int] = {}
    failed: list[str] = []
    for name in EMBEDDED_FIELDS:
        if tables.get(name) is None:
            continue
        kept: list[str] = []
        vectors = []
        for (table, ids, _), v in zip(jobs, results):
            if table != name:
                continue
            if v is None:
                failed.extend(f"{name}:{i}" for i in ids)
            else:
                kept.extend(ids)
                vectors.append(v)
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)
        write_vectors(output_dir, name, kept, matrix, model=embedder.model)
        counts[name] = len(kept)
    return counts, failed


def prefetch_text_units(units: pd.DataFrame, embedder) -> asyncio.Task | None:
    """Start embedding the text units in the background while the LLM extracts from them; the
    vectors land in the cache, so the embed step later finds them there. Text units are the
    only table known before extraction, and usually the largest one to embed. A failure here
    is ignored: the embed step retries those units and reports what still fails."""
    if embedder.cache is None or units.empty:
        return None
    texts = [EMBEDDED_FIELDS["text_units"](row) for _, row in units.iterrows()]
    batch = max(1, embedder.settings.batch_size)

    async def run() -> None:
        async def one(part: list[str]) -> None:
            try:
                await embedder.embed(part, kind="passage", step="embed")
            except LLMError:
                pass
        await asyncio.gather(*(one(texts[i:i + batch]) for i in range(0, len(texts), batch)))

    return asyncio.create_task(run())


def embedding_count(tables: dict[str, pd.DataFrame]) -> int:
    return sum(len(tables[n]) for n in EMBEDDED_FIELDS if tables.get(n) is not None)
