"""Vector store: one parquet file per embedded table, searched exactly with numpy.

Why not LanceDB: an index a laptop builds holds thousands to tens of thousands of vectors, where
an exact dot product over a float32 matrix takes about a millisecond, needs no extra dependency
(LanceDB brings ~100 MB), and stays one atomic file next to the other tables. The files are
plain parquet (id, vector), so LanceDB, DuckDB or pandas can read them when an index outgrows this.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

VECTOR_DIR = "embeddings"


def vectors_path(output_dir: Path, name: str) -> Path:
    return Path(output_dir) / VECTOR_DIR / f"{name}.parquet"


def write_vectors(output_dir: Path, name: str, ids: list[str], vectors: np.ndarray, model: str = "") -> Path:
    """Write one vector table; `model` names the embedding model, so a query embedded by a
    different model is caught instead of silently compared with incomparable vectors."""
    path = vectors_path(output_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    vectors = np.asarray(vectors, dtype=np.float32)
    dim = vectors.shape[1] if vectors.ndim == 2 and len(vectors) else 0
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    column = pa.FixedSizeListArray.from_arrays(flat, dim) if dim else pa.array([], pa.list_(pa.float32()))
    table = pa.table({"id": pa.array(ids, pa.string()), "vector": column})
    table = table.replace_schema_metadata({b"sensegraph.model": model.encode(), b"sensegraph.dim": str(dim).encode()})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def vector_model(output_dir: Path, name: str) -> str | None:
    """The embedding model a stored vector table was made with ("" if unknown, None if absent)."""
    path = vectors_path(output_dir, name)
    if not path.exists():
        return None
    meta = pq.read_schema(path).metadata or {}
    return meta.get(b"sensegraph.model", b"").decode()


class VectorIndex:
    """Exact cosine search over L2-normalised vectors."""

    def __init__(self, ids: list[str], vectors: np.ndarray):
        self.ids = list(ids)
        self.vectors = np.asarray(vectors, dtype=np.float32)

    @classmethod
    def load(cls, output_dir: Path, name: str) -> "VectorIndex":
        table = pq.read_table(vectors_path(output_dir, name))
        ids = table.column("id").to_pylist()
        col = table.column("vector").combine_chunks()
        dim = col.type.list_size if hasattr(col.type, "list_size") else 0
        flat = col.flatten().to_numpy(zero_copy_only=False) if len(ids) else np.zeros(0, np.float32)
        return cls(ids, flat.reshape(len(ids), dim) if dim else np.zeros((0, 0), np.float32))

    @property
    def dim(self) -> int:
        return self.vectors.shape[1] if self.vectors.ndim == 2 else 0

    def search(self, query: np.ndarray, k: int = 10) -> list[tuple[str, float]]:
        if not self.ids:
            return []
        scores = self.vectors @ np.asarray(query, dtype=np.float32)
        k = min(k, len(self.ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top])]
        return [(self.ids[i], float(scores[i])) for i in top]
