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


# Vectors and ids never repeat: a dictionary only costs memory and time while writing.
def _vector_table(ids: list[str], vectors: np.ndarray, model: str) -> pa.Table:
    vectors = np.asarray(vectors, dtype=np.float32)
    dim = vectors.shape[1] if vectors.ndim == 2 and len(vectors) else 0
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    column = pa.FixedSizeListArray.from_arrays(flat, dim) if dim else pa.array([], pa.list_(pa.float32()))
    table = pa.table({"id": pa.array(ids, pa.string()), "vector": column})
    return table.replace_schema_metadata({b"sensegraph.model": model.encode(), b"sensegraph.dim": str(dim).encode()})


def _temporary(path: Path) -> str:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    os.close(fd)
    return tmp


def write_vectors(output_dir: Path, name: str, ids: list[str], vectors: np.ndarray, model: str = "") -> Path:
    """Write one vector table; `model` names the embedding model, so a query embedded by a
    different model is caught instead of silently compared with incomparable vectors."""
    path = vectors_path(output_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = _vector_table(ids, vectors, model)
    tmp = _temporary(path)
    try:
        pq.write_table(table, tmp, use_dictionary=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


class VectorWriter:
    """One vector table written batch by batch, the batches arriving in any order: each goes
    to a temporary file as it comes, so only one batch is in memory, and `close()` writes the
    table in batch-number order (the same file `write_vectors` writes for all rows at once,
    in row groups of up to ROW_GROUP rows) and renames it over the old one."""

    ROW_GROUP = 8192

    def __init__(self, output_dir: Path, name: str, model: str = ""):
        self.output_dir, self.name, self.model = Path(output_dir), name, model
        self.path = vectors_path(output_dir, name)
        self._spill: str | None = None
        self._writer: pq.ParquetWriter | None = None
        self._groups: dict[int, int] = {}  # batch number -> row group of the spill file

    def add(self, number: int, ids: list[str], vectors: np.ndarray) -> None:
        if not len(ids):
            return
        table = _vector_table(ids, vectors, self.model)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._spill = _temporary(self.path)
            self._writer = pq.ParquetWriter(self._spill, table.schema, use_dictionary=False, compression="none")
        elif not table.schema.equals(self._writer.schema, check_metadata=True):
            raise ValueError(f"{self.name}: a batch of vectors of another size ({table.schema.metadata})")
        self._writer.write_table(table, row_group_size=len(ids))
        self._groups[number] = len(self._groups)

    def close(self) -> Path:
        """Write the table (an empty one if no batch came) and remove the temporary file."""
        if self._writer is None:
            return write_vectors(self.output_dir, self.name, [], np.zeros((0, 0), np.float32), model=self.model)
        self._writer.close()
        tmp = _temporary(self.path)
        try:
            spill = pq.ParquetFile(self._spill)
            with pq.ParquetWriter(tmp, spill.schema_arrow, use_dictionary=False) as out:
                pending: list[pa.Table] = []
                for number in sorted(self._groups):
                    pending.append(spill.read_row_group(self._groups[number]))
                    if sum(len(t) for t in pending) >= self.ROW_GROUP:
                        out.write_table(pa.concat_tables(pending))
                        pending = []
                if pending:
                    out.write_table(pa.concat_tables(pending))
            os.replace(tmp, self.path)
        finally:
            for leftover in (tmp, self._spill):
                if leftover and os.path.exists(leftover):
                    os.remove(leftover)
        return self.path

    def discard(self) -> None:
        """Remove the temporary file without writing the table (a run that stopped)."""
        if self._writer is not None:
            self._writer.close()
        if self._spill and os.path.exists(self._spill):
            os.remove(self._spill)


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
