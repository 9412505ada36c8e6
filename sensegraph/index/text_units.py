"""Step 2 of indexing (paper 2.1): documents -> text units.

Each document is cut into windows of `size` cl100k tokens that overlap by `overlap` tokens
(paper: 600/100). Windows are cut on the *bytes* of token boundaries, never by decoding token
slices: a Chinese character often spans two or three tokens, and decoding half of it would
produce replacement characters or drop it. An edge that falls inside a UTF-8 character is moved
back to the start of that character, so every unit is an exact substring of its document and
consecutive units together cover every character.

Each document is encoded once; unit texts are re-counted so `n_tokens` is the true count.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import pandas as pd

from ..store.tables import content_id
from ..store.text_column import TextColumn
from ..tokens import encode, encoding

COLUMNS = ["id", "human_readable_id", "text", "n_tokens", "document_id", "document_ids", "chunk_index"]


@lru_cache(maxsize=1)
def _token_byte_lengths() -> np.ndarray:
    """Byte length of every token id (0 for unused ids), so offsets are one cumsum away."""
    enc = encoding()
    lengths = np.zeros(enc.n_vocab, dtype=np.int64)
    for t in range(enc.n_vocab):
        try:
            lengths[t] = len(enc.decode_single_token_bytes(t))
        except KeyError:
            pass
    return lengths


def _byte_offsets(tokens: list[int]) -> np.ndarray:
    """offsets[i] = byte position where token i starts; offsets[len(tokens)] = total bytes."""
    lengths = _token_byte_lengths()
    ids = np.asarray(tokens, dtype=np.int64)
    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    if len(tokens):
        np.cumsum(lengths[ids], out=offsets[1:])
    return offsets


def _char_start(data: bytes, pos: int) -> int:
    """Move `pos` back to the first byte of the UTF-8 character it falls in."""
    while 0 < pos < len(data) and (data[pos] & 0xC0) == 0x80:
        pos -= 1
    return pos


def split_text(text: str, *, size: int, overlap: int) -> list[tuple[int, str, int]]:
    """Cut one text into windows; returns (start character offset, unit text, n_tokens) tuples.

    Every unit has at most `size` tokens (unless one character alone needs more, which only
    happens with tiny sizes); consecutive units share about `overlap` tokens.
    """
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"need size >= 1 and 0 <= overlap < size (got size={size}, overlap={overlap})")
    tokens = encode(text)
    if not tokens:
        return []
    data = text.encode("utf-8")
    offsets = _byte_offsets(tokens)
    assert offsets[-1] == len(data), "token bytes must add up to the text's bytes"
    n = len(tokens)
    units: list[tuple[int, str, int]] = []
    start = 0
    char_pos, byte_pos = 0, 0  # the character offset of byte_pos, advanced unit by unit
    while True:
        end = min(start + size, n)
        while True:
            lo = _char_start(data, int(offsets[start]))
            hi = _char_start(data, int(offsets[end]))
            if hi <= lo:  # the window lies inside one character: take the whole character
                end += 1
                continue
            piece = data[lo:hi].decode("utf-8")
            count = len(encode(piece))
            # Re-encoding a slice can differ from the window by a token at its edges; shrink
            # rather than exceed the size the user asked for.
            if count > size and end - start > 1:
                end -= 1
                continue
            break
        char_pos += len(data[byte_pos:lo].decode("utf-8"))
        byte_pos = lo
        units.append((char_pos, piece, count))
        if end >= n:
            return units
        start = max(end - overlap, start + 1)


def make_text_units(documents: pd.DataFrame, *, size: int, overlap: int) -> pd.DataFrame:
    """Cut every document into text units; returns the text_units table.

    Columns: id, human_readable_id, text, n_tokens, document_id, document_ids ([document_id],
    as Microsoft GraphRAG 2.x wrote it) and chunk_index (position inside the document).
    Documents are taken in human_readable_id order (or row order without it); human_readable_id
    of units is 0..n-1 in (document, position) order. id = content_id(document id, text), so
    ids are stable across runs.

    The documents table is not modified: call `link_documents(documents, units)` to get a copy
    whose `text_unit_ids` lists each document's units. Keeping the two apart lets this function
    stay a pure documents -> text units step.
    """
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"need size >= 1 and 0 <= overlap < size (got size={size}, overlap={overlap})")
    docs = documents.sort_values("human_readable_id", kind="stable") if "human_readable_id" in documents else documents
    # One list per column, not one dict per unit, and the texts in Arrow chunks as they are cut
    # (store/text_column.py): the dicts and a list of every unit's text beside its Arrow copy
    # were a transient peak that grew with the corpus.
    ids: list[str] = []
    texts = TextColumn()
    n_tokens: list[int] = []
    doc_ids: list[str] = []
    chunk_index: list[int] = []
    for doc_id, pieces in _split_all(docs, size=size, overlap=overlap):
        used: set[str] = set()
        for index, (_, piece, count) in enumerate(pieces):
            unit_id = content_id(doc_id, piece)
            if unit_id in used:  # a passage repeated verbatim in one document
                unit_id = content_id(doc_id, piece, str(index))
            used.add(unit_id)
            ids.append(unit_id)
            texts.append(piece)
            n_tokens.append(count)
            doc_ids.append(doc_id)
            chunk_index.append(index)
    return pd.DataFrame({
        "id": _strings(ids),
        "human_readable_id": np.arange(len(ids), dtype=np.int64),
        "text": texts.series(),
        "n_tokens": np.asarray(n_tokens, dtype=np.int64),
        "document_id": _strings(doc_ids),
        "document_ids": pd.Series([[d] for d in doc_ids], dtype=object),
        "chunk_index": np.asarray(chunk_index, dtype=np.int64),
    }, columns=COLUMNS)


# Documents cut at once, in two threads: tiktoken lets go of the interpreter while it encodes,
# which is most of the cutting, so a second core halves the step's share of the time before the
# first extraction call. Taken a few at a time, so only those documents' units wait in memory.
SPLIT_THREADS = 2
SPLIT_AHEAD = 4


def _split_all(docs: pd.DataFrame, *, size: int, overlap: int) -> Iterator[tuple[str, list[tuple[int, str, int]]]]:
    """(document id, its units as split_text gives them) for every document, in order."""
    def split(text: object) -> list[tuple[int, str, int]]:
        return split_text(str(text or ""), size=size, overlap=overlap)

    pairs = zip(docs["id"], docs["text"])
    with ThreadPoolExecutor(SPLIT_THREADS) as pool:
        ahead: deque[tuple[str, Future]] = deque()
        for doc_id, text in pairs:
            ahead.append((doc_id, pool.submit(split, text)))
            if len(ahead) >= SPLIT_AHEAD:
                doc, future = ahead.popleft()
                yield doc, future.result()
        while ahead:
            doc, future = ahead.popleft()
            yield doc, future.result()


def _strings(values: list[str]) -> pd.Series:
    """A column as a table built from rows would have it (object dtype when there are none)."""
    return pd.Series(values) if values else pd.Series([], dtype=object)


def link_documents(documents: pd.DataFrame, units: pd.DataFrame) -> pd.DataFrame:
    """A copy of `documents` whose text_unit_ids lists each document's units in position order."""
    ordered = units.sort_values("human_readable_id", kind="stable")
    by_doc: dict[str, list[str]] = {}
    for unit_id, doc_id in zip(ordered["id"], ordered["document_id"]):
        by_doc.setdefault(doc_id, []).append(unit_id)
    out = documents.copy()
    out["text_unit_ids"] = [by_doc.get(d, []) for d in out["id"]]
    return out
