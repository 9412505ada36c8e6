"""Step 1 of indexing: read the input folder into the `documents` table.

One document per .txt/.md file, per CSV row, per JSON object (a file holding one object or a
list of them) and per JSONL line. Unreadable files (empty, binary, unknown encoding) are skipped
with a warning that names them; a folder that yields no documents at all is an error, because
indexing nothing would only hide the mistake.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config import Settings
from ..store.tables import content_id
from ..store.text_column import TextColumn

logger = logging.getLogger(__name__)

COLUMNS = ["id", "human_readable_id", "title", "text", "text_unit_ids", "creation_date", "raw_data", "path"]
_TEXT_TYPES = {"txt", "md"}


class InputError(ValueError):
    """The input folder or one of its files cannot be turned into documents."""


def _log_warning(message: str) -> None:
    logger.warning(message)


def load_documents(settings: Settings, warn: Callable[[str], None] = _log_warning) -> pd.DataFrame:
    """Read every supported file under `input.dir` (recursively) into the documents table.

    Columns: id, human_readable_id, title, text, text_unit_ids (empty lists; the text-unit step
    fills them), creation_date (file mtime, ISO 8601 UTC), raw_data (dict of the configured
    `input.metadata_fields`, or None), path (source file relative to the input folder).
    Rows are ordered by path, then by position inside the file; human_readable_id is 0..n-1 in
    that order. id = content_id(title, text), so it is stable across runs and two files with
    the same text keep distinct ids.
    """
    cfg = settings.input
    folder = settings.path(cfg.dir)
    types = sorted({t.lower().lstrip(".") for t in cfg.file_types})
    wanted = ", ".join(f".{t}" for t in types)
    hint = f"put {'/'.join('.' + t for t in types)} files in {folder} (or set input.dir in settings.yaml)"
    if not folder.is_dir():
        raise InputError(f"input folder {folder} does not exist; {hint}")

    files, ignored = _list_files(folder, set(types))
    table = _Columns()
    for path in files:
        rel = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        text = _decode(data, rel, cfg.encoding, warn)
        if text is None:
            continue
        kind = path.suffix.lower().lstrip(".")
        created = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc).isoformat(timespec="seconds")
        if kind in _TEXT_TYPES:
            records: list[dict[str, Any]] = [{"title": rel, "text": text, "raw_data": None, "source": rel}]
        else:
            records = list(_records(kind, text, rel, settings, warn))
            if not records:
                warn(f"skipped {rel}: it holds no records with text")
        for rec in records:
            table.add(rec, rel, created)

    if not len(table):
        seen = f"found no {wanted} files" if not files else f"none of the {len(files)} {wanted} file(s) had usable text"
        other = f" ({ignored} file(s) of other types were ignored; input.file_types is {types})" if ignored else ""
        raise InputError(f"no documents in {folder}: {seen}{other}; {hint}")
    return table.frame(warn)


def _list_files(folder: Path, types: set[str]) -> tuple[list[Path], int]:
    """Supported files, sorted by relative path; hidden files and folders (.git, .DS_Store) skipped."""
    files, ignored = [], 0
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if p.suffix.lower().lstrip(".") in types:
            files.append(p)
        else:
            ignored += 1
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix()), ignored


def _decode(data: bytes, rel: str, encoding: str, warn: Callable[[str], None]) -> str | None:
    """The file's text, or None (after a warning) if it is empty, binary or undecodable."""
    if not data.strip():
        warn(f"skipped {rel}: the file is empty")
        return None
    if encoding.lower() != "auto":
        try:
            text = data.decode(encoding)
        except LookupError:
            raise InputError(f"input.encoding: unknown encoding {encoding!r} (try auto, utf-8, gb18030)") from None
        except UnicodeDecodeError as exc:
            warn(f"skipped {rel}: not valid {encoding} (byte {exc.start}); fix input.encoding or set it to auto")
            return None
        text = text.removeprefix("\ufeff")
        if "\x00" in text[:65536] and not any(w in encoding.lower() for w in ("16", "32")):
            warn(f"skipped {rel}: binary file (contains NUL bytes)")
            return None
    else:
        text = _detect(data, rel, warn)
        if text is None:
            return None
    if not text.strip():
        warn(f"skipped {rel}: the file holds only whitespace")
        return None
    return text


def _detect(data: bytes, rel: str, warn: Callable[[str], None]) -> str | None:
    # UTF-16 announces itself with a BOM; it is full of NUL bytes, so test it before the binary check.
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            pass
    if b"\x00" in data[:65536]:
        warn(f"skipped {rel}: binary file (contains NUL bytes)")
        return None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        text = data.decode("gb18030")
    except UnicodeDecodeError:
        text = None
    # GB18030 accepts many byte pairs, so Latin-1 or binary data can "decode" into nonsense;
    # accept the result only if it reads like Chinese.
    if text is not None and _looks_chinese(text):
        return text
    warn(f"skipped {rel}: not UTF-8 or GB18030 text (binary, or another encoding: "
         "convert it to UTF-8 or set input.encoding, e.g. latin-1)")
    return None


def _looks_chinese(text: str) -> bool:
    """True if the non-ASCII characters are nearly all in GB2312, the common simplified set.

    Real Chinese text decoded from GB18030 passes easily (99.9% on 西游记); Latin-1 or cp1252
    text misread as GB18030 turns into rare extension-area characters and fails.
    """
    non_ascii = [c for c in text if ord(c) > 127]
    if not non_ascii:
        return True
    common = 0
    for c in non_ascii:
        try:
            c.encode("gb2312")
            common += 1
        except UnicodeEncodeError:
            pass
    return common / len(non_ascii) >= 0.9


def _records(kind: str, text: str, rel: str, settings: Settings, warn: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """Documents from one structured file: CSV rows, a JSON object or list, JSONL lines."""
    cfg = settings.input
    if kind == "csv":
        # A transcript in one cell easily passes the csv module's default 128 KiB field limit.
        csv.field_size_limit(2**31 - 1)
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        if cfg.text_field not in header:
            raise InputError(
                f"{rel}: no '{cfg.text_field}' column (columns: {', '.join(header) or 'none'}); "
                "set input.text_field in settings.yaml to the column that holds the text"
            )
        _warn_missing_metadata(rel, header, cfg.metadata_fields, warn)
        objects: Iterator[tuple[str, Any]] = ((f"{i}", row) for i, row in enumerate(reader, start=1))
    elif kind == "json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{rel}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        if isinstance(value, dict):
            objects = iter([("", value)])
        elif isinstance(value, list):
            objects = ((f"{i}", v) for i, v in enumerate(value, start=1))
        else:
            raise InputError(f"{rel}: expected a JSON object or a list of objects, got {type(value).__name__}")
    elif kind == "jsonl":
        objects = _jsonl(text, rel)
    else:  # a type named in input.file_types that we cannot read
        raise InputError(f"input.file_types: .{kind} is not supported (use txt, md, csv, json, jsonl)")

    skipped = 0
    for where, obj in objects:
        label = f"{rel}#{where}" if where else rel
        if not isinstance(obj, dict):
            raise InputError(f"{label}: expected a JSON object with a '{cfg.text_field}' field, got {type(obj).__name__}")
        if cfg.text_field not in obj:
            raise InputError(
                f"{label}: no '{cfg.text_field}' field (fields: {', '.join(map(str, obj)) or 'none'}); "
                "set input.text_field in settings.yaml to the field that holds the text"
            )
        body = _as_text(obj[cfg.text_field])
        if not body.strip():
            skipped += 1
            continue
        title = _as_text(obj.get(cfg.title_field)) if cfg.title_field else ""
        meta = {f: obj.get(f) for f in cfg.metadata_fields}
        if kind != "csv":
            _warn_missing_metadata(label, list(obj), cfg.metadata_fields, warn)
        # Parquet cannot store an empty struct, and Microsoft writes None when there is no metadata.
        yield {"title": title.strip() or label, "text": body, "raw_data": meta or None, "source": label}
    if skipped:
        warn(f"{rel}: skipped {skipped} record(s) with empty '{cfg.text_field}'")


def _jsonl(text: str, rel: str) -> Iterator[tuple[str, Any]]:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{n}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{rel}: invalid JSON on line {n}: {exc.msg}") from None


def _warn_missing_metadata(label: str, present: list[str], fields: list[str], warn: Callable[[str], None]) -> None:
    missing = [f for f in fields if f not in present]
    if missing:
        warn(f"{label}: metadata field(s) {', '.join(missing)} not found (input.metadata_fields); stored as null")


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _uniform_metadata(raw_data: list[dict[str, Any] | None]) -> None:
    """Make each metadata field parquet-safe: one scalar type per field across all documents.

    JSON files can hold 2020 in one record and "2020" in the next, or nested objects; parquet
    needs one type per field, so such fields are stored as text (JSON for nested values).
    """
    types: dict[str, set[type]] = {}
    for meta in raw_data:
        for key, value in (meta or {}).items():
            if value is not None:
                types.setdefault(key, set()).add(type(value))
    mixed = {k for k, ts in types.items() if len(ts) > 1 or not ts <= {str, int, float, bool}}
    if not mixed:
        return
    for meta in raw_data:
        if meta:
            for key in mixed & meta.keys():
                if meta[key] is not None:
                    meta[key] = _as_text(meta[key])


class _Columns:
    """The documents table as it is read: one list per column and the texts in Arrow chunks
    (store/text_column.py), each document's id made as it comes. A dict per document, and every
    text kept as a Python string until the end, held the corpus text twice beside its table."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts = TextColumn()
        self.raw_data: list[dict[str, Any] | None] = []
        self.paths: list[str] = []
        self.created: list[str] = []
        self._used: set[str] = set()
        self._first_with_text: dict[bytes, str] = {}  # a digest of the text, not the text
        self._repeats: list[str] = []  # warnings, given after the reading's own

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, record: dict[str, Any], path: str, created: str) -> None:
        title, text, where = record["title"], record["text"], record["source"]
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        earlier = self._first_with_text.setdefault(digest, where)
        if earlier != where:
            self._repeats.append(f"{where} has the same text as {earlier}; both are kept as separate documents")
        doc_id = content_id(title, text)
        # Same title and same text (e.g. a row repeated in a CSV): the ids must still differ,
        # and must still be stable, so number the repeats in their (sorted) order.
        k = 1
        while doc_id in self._used:
            k += 1
            doc_id = content_id(title, text, str(k))
        self._used.add(doc_id)
        self.ids.append(doc_id)
        self.titles.append(title)
        self.texts.append(text)
        self.raw_data.append(record["raw_data"])
        self.paths.append(path)
        self.created.append(created)

    def frame(self, warn: Callable[[str], None]) -> pd.DataFrame:
        for message in self._repeats:
            warn(message)
        _uniform_metadata(self.raw_data)
        n = len(self.ids)
        return pd.DataFrame({
            "id": pd.Series(self.ids),
            "human_readable_id": np.arange(n, dtype=np.int64),
            "title": pd.Series(self.titles),
            "text": self.texts.series(),
            "text_unit_ids": pd.Series([[] for _ in range(n)], dtype=object),
            "creation_date": pd.Series(self.created),
            "raw_data": pd.Series(self.raw_data, dtype=object),
            "path": pd.Series(self.paths),
        }, columns=COLUMNS)
