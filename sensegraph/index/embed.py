"""Embeddings of text units, entity descriptions and community reports (for local, DRIFT and
basic search), stored as vector tables beside the parquet tables."""
from __future__ import annotations

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
    counts: dict[str, int] = {}
    failed: list[str] = []
    for name, text_of in EMBEDDED_FIELDS.items():
        df = tables.get(name)
        if df is None:
            continue
        texts = [text_of(row) for _, row in df.iterrows()]
        ids = df["id"].tolist()
        kept: list[str] = []
        vectors = []
        batch = max(1, embedder.settings.batch_size)
        for start in range(0, len(texts), batch):
            part = texts[start:start + batch]
            try:
                vectors.append(await embedder.embed(part, kind="passage", step="embed"))
                kept.extend(ids[start:start + batch])
            except LLMError:
                failed.extend(f"{name}:{i}" for i in ids[start:start + batch])
            if advance:
                advance(len(part))
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)
        write_vectors(output_dir, name, kept, matrix)
        counts[name] = len(kept)
    return counts, failed


def embedding_count(tables: dict[str, pd.DataFrame]) -> int:
    return sum(len(tables[n]) for n in EMBEDDED_FIELDS if tables.get(n) is not None)
