"""A column of texts (the corpus: documents' and text units' `text`) built as it is read, in
Arrow chunks, with the pandas column a list of the same strings would give.

pandas 3 keeps strings in Arrow buffers, so a table made from a list of Python strings holds the
text twice until the list is dropped: the list, and its Arrow copy. Built a chunk at a time,
only one chunk of Python strings is alive beside the Arrow text, whatever the corpus size.
With a pandas that keeps strings as Python objects, the list is the column and nothing is
copied, so the strings are simply kept.
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

CHUNK_ROWS = 1024


def _inferred() -> object:
    """The dtype pandas gives a column of strings built from a list (the tables' contract)."""
    return pd.Series(["x"]).dtype


class TextColumn:
    def __init__(self) -> None:
        dtype = _inferred()
        self._arrow = isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow"
        self._dtype = dtype
        self._pending: list[str] = []
        self._chunks: list[pa.Array] = []
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def append(self, text: str) -> None:
        self._pending.append(text)
        self._length += 1
        if self._arrow and len(self._pending) >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._chunks.append(pa.array(self._pending, type=pa.large_string()))
            self._pending = []

    def series(self) -> pd.Series:
        """The column, as pd.Series(list of the texts) would be (object dtype when empty, as a
        table of no rows has)."""
        if not self._length:
            return pd.Series([], dtype=object)
        if not self._arrow:
            return pd.Series(self._pending, dtype=self._dtype)
        self._flush()
        chunks, self._chunks = self._chunks, []
        return pd.Series(pa.chunked_array(chunks, type=pa.large_string()), dtype=self._dtype)
