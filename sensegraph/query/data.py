"""The index as the query methods see it: tables, lookups by id and title, vector search, and
whether it is a lazy index (no community reports: `require_reports` refuses the methods that read them).

Works on an index written by sensegraph or by Microsoft GraphRAG 3.x (same table names and
columns). Vectors come from `output/embeddings/` when they were made by the configured embedding
model; otherwise they are computed with it (the embedding cache makes that a one-time cost) and
written back if the folder is writable — a shared, read-only index stays untouched.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..index.embed import embedded_text
from ..store.tables import TABLES, has_table, read_table
from ..store.vectors import VectorIndex, vector_model, vectors_path, write_vectors

REQUIRED = ("entities", "relationships", "communities", "community_reports", "text_units")
# Steps (stats.json) that only a lazy index runs, and those only a standard one runs.
LAZY_STEPS = ("concepts", "concept_graph")
STANDARD_STEPS = ("extract", "summarize")


class IndexNotFound(FileNotFoundError):
    pass


class MethodUnavailable(ValueError):
    """A query method this index cannot answer with (global or DRIFT search on a lazy index,
    which has no community reports); the message says which method to use instead."""


def writable(folder: Path) -> bool:
    """Whether vectors may be written into `folder`. os.access alone is not enough: for root it
    is True even on a folder marked read-only (r-x), so a shared index would be written to;
    a folder without any write bit is taken as read-only by intent."""
    return os.access(folder, os.W_OK) and bool(os.stat(folder).st_mode & 0o222)


def list_ids(value: Any) -> list:
    """A list-of-ids cell as a Python list (parquet gives numpy arrays, missing gives NaN)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    return list(value)


@dataclass
class GraphIndex:
    """Read-only view of one index folder."""

    output_dir: Path
    tables: dict[str, pd.DataFrame]
    _vectors: dict[str, VectorIndex] = field(default_factory=dict)

    @classmethod
    def load(cls, output_dir: str | Path) -> "GraphIndex":
        output_dir = Path(output_dir)
        missing = [t for t in REQUIRED if not has_table(output_dir, t)]
        if missing:
            hint = ("run `sensegraph index` first" if not has_table(output_dir, "documents")
                    else "the index is incomplete; rerun `sensegraph index` to finish it")
            raise IndexNotFound(f"no complete index in {output_dir} (missing {', '.join(missing)}): {hint}")
        tables = {name: read_table(output_dir, name) for name in TABLES if has_table(output_dir, name)}
        for name, df in tables.items():
            tables[name] = df.reset_index(drop=True)
        return cls(output_dir, tables)

    # -- lookups ------------------------------------------------------------------------------
    @property
    def entities(self) -> pd.DataFrame:
        return self.tables["entities"]

    @property
    def relationships(self) -> pd.DataFrame:
        return self.tables["relationships"]

    @property
    def reports(self) -> pd.DataFrame:
        return self.tables["community_reports"]

    @property
    def communities(self) -> pd.DataFrame:
        return self.tables["communities"]

    @property
    def text_units(self) -> pd.DataFrame:
        return self.tables["text_units"]

    @property
    def claims(self) -> pd.DataFrame:
        df = self.tables.get("covariates")
        return df if df is not None else pd.DataFrame(columns=["id", "human_readable_id", "subject_id"])

    def max_level(self) -> int:
        return int(self.reports["level"].max()) if len(self.reports) else 0

    @property
    def lazy(self) -> bool:
        """A lazy index (index_method: lazy): concepts and communities, no community report. The
        steps that built it (stats.json) tell it from a standard index whose reports all failed;
        without them (a copied index), communities without any report mean lazy."""
        if len(self.reports):
            return False
        if "_lazy" not in self.__dict__:
            try:
                steps = json.loads((self.output_dir / "stats.json").read_text(encoding="utf-8")).get("steps")
            except (OSError, ValueError, AttributeError):
                steps = None
            ran = set(steps) if isinstance(steps, (dict, list)) else set()
            self.__dict__["_lazy"] = bool(ran & set(LAZY_STEPS)) or (
                not ran & set(STANDARD_STEPS) and len(self.communities) > 0)
        return self.__dict__["_lazy"]

    def require_reports(self, method: str) -> None:
        """Raise MethodUnavailable if `method`, which answers from community reports, is asked of a
        lazy index (it would find nothing to read and answer that nothing was found)."""
        if self.lazy:
            raise MethodUnavailable(
                f"{method} search reads community reports, and this is a lazy index, which has none: ask with "
                "method lazy (relevance tests of its text units, then claims: `sensegraph query ... --method "
                "lazy`) or basic (vector search over the text units), or write the reports with `sensegraph "
                "index --method standard` (it reuses the text units and embeddings)")

    def entity_rows(self, ids: list[str]) -> pd.DataFrame:
        by_id = self._index("entities", "id")
        return self.entities.iloc[[by_id[i] for i in ids if i in by_id]]

    def rows_by(self, table: str, column: str, values: list) -> pd.DataFrame:
        idx = self._index(table, column)
        return self.tables[table].iloc[[idx[v] for v in values if v in idx]]

    def _index(self, table: str, column: str) -> dict[Any, int]:
        key = f"_by_{table}_{column}"
        if key not in self.__dict__:
            df = self.tables.get(table)
            self.__dict__[key] = {} if df is None else {v: i for i, v in enumerate(df[column].tolist())}
        return self.__dict__[key]

    # -- vectors ------------------------------------------------------------------------------
    async def vectors(self, name: str, embedder, log: Callable[[str], None] = lambda m: None) -> VectorIndex:
        """Vector index of `name` (text_units, entities or community_reports) under `embedder`'s model."""
        if name in self._vectors:
            return self._vectors[name]
        df = self.tables[name]
        stored = vector_model(self.output_dir, name)
        index: VectorIndex | None = None
        if stored is not None and embedder.reads(stored):
            index = VectorIndex.load(self.output_dir, name)
            # vectors of another size or of other rows (an older index) are not usable
            if set(index.ids) != set(df["id"]) or (index.dim and embedder.settings.provider == "local"
                                                    and index.dim != embedder.dim):
                index = None
        if index is None:
            # A lazy index embeds its concepts as it is built; one built before it did (or whose
            # concept vectors are of another model) has them embedded here, once.
            what = ("concepts of this lazy index" if name == "entities" and self.lazy
                    else name.replace("_", " "))
            log(f"embedding {len(df)} {what} with {embedder.model or 'the embedding model'} "
                f"(once: the vectors are cached)")
            text_of = embedded_text(name, lazy=self.lazy)
            texts = [str(text_of(row)) for _, row in df.iterrows()]
            batch = max(1, embedder.settings.batch_size)
            parts = []
            step = max(batch, -(-len(texts) // 10))  # a progress line every tenth of a long job
            t0 = time.monotonic()
            for i in range(0, len(texts), batch):
                parts.append(await embedder.embed(texts[i:i + batch], kind="passage", step="embed"))
                done = min(i + batch, len(texts))
                if len(texts) > 10 * batch and done < len(texts) and done // step > i // step:
                    rate = done / max(time.monotonic() - t0, 1e-9)
                    log(f"  embedded {done:,} of {len(texts):,} {what} "
                        f"(about {(len(texts) - done) / rate:.0f} s left)")
            matrix = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
            index = VectorIndex(df["id"].tolist(), matrix)
            if writable(self.output_dir):
                write_vectors(self.output_dir, name, index.ids, matrix, model=embedder.model)
        self._vectors[name] = index
        return index

    def has_vectors(self, name: str) -> bool:
        return vectors_path(self.output_dir, name).exists()
