"""Table schemas and crash-safe parquet I/O for the index folder.

Table names and the columns listed in `TABLES` are those of Microsoft GraphRAG 3.x, so tools
written for its output read ours. Steps may add columns; they never rename or drop these.

Every write goes to a temporary file in the same folder, is fsynced, then renamed over the
target with `os.replace` (atomic on POSIX and Windows). A crash or an exception midway leaves
the previous table untouched and no partial file behind, which is what makes resuming safe.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# Required columns per table, in Microsoft GraphRAG 3.x order (checked against a real index in
# tests/test_tables.py).
TABLES: dict[str, list[str]] = {
    "documents": ["id", "human_readable_id", "title", "text", "text_unit_ids", "creation_date", "raw_data"],
    "text_units": [
        "id", "human_readable_id", "text", "n_tokens", "document_id",
        "entity_ids", "relationship_ids", "covariate_ids",
    ],
    "entities": [
        "id", "human_readable_id", "title", "type", "description", "text_unit_ids", "frequency", "degree",
    ],
    "relationships": [
        "id", "human_readable_id", "source", "target", "description", "weight", "combined_degree",
        "text_unit_ids",
    ],
    "communities": [
        "id", "human_readable_id", "community", "level", "parent", "children", "title",
        "entity_ids", "relationship_ids", "text_unit_ids", "period", "size",
    ],
    "community_reports": [
        "id", "human_readable_id", "community", "level", "parent", "children", "title", "summary",
        "full_content", "rank", "rating_explanation", "findings", "full_content_json", "period", "size",
    ],
    "covariates": [
        "id", "human_readable_id", "covariate_type", "type", "description", "subject_id", "object_id",
        "status", "start_date", "end_date", "source_text", "text_unit_id",
    ],
}

# ASCII "unit separator": a control character that does not occur in prose, so joining parts
# with it keeps ("ab", "c") and ("a", "bc") apart.
_SEPARATOR = "\x1f"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class TableError(ValueError):
    """A table is missing, or lacks the columns other steps and tools rely on."""


def content_id(*parts: str) -> str:
    """A stable id: sha256 hex of the parts joined by U+001F. Same content, same id, every run."""
    return hashlib.sha256(_SEPARATOR.join(parts).encode("utf-8")).hexdigest()


def table_path(output_dir: Path | str, name: str) -> Path:
    if not _SAFE_NAME.match(name):
        raise TableError(f"invalid table name {name!r}: use letters, digits, '_', '-' and '.'")
    return Path(output_dir) / f"{name}.parquet"


def has_table(output_dir: Path | str, name: str) -> bool:
    return table_path(output_dir, name).is_file()


def _missing_columns(df: pd.DataFrame, name: str) -> list[str]:
    return [c for c in TABLES.get(name, []) if c not in df.columns]


def _to_arrow(df: pd.DataFrame) -> pa.Table:
    table = pa.Table.from_pandas(df, preserve_index=False)
    # A list column whose lists are all empty is inferred as list<null>; id lists are strings,
    # so give readers (ours and Microsoft's) the type they expect.
    fields = []
    changed = False
    for field in table.schema:
        if pa.types.is_list(field.type) and pa.types.is_null(field.type.value_type):
            fields.append(field.with_type(pa.list_(pa.string())))
            changed = True
        else:
            fields.append(field)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata)) if changed else table


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not possible (nor needed) on Windows.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Any) -> None:
    """Call write(binary_file) on a temp file beside `path`, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def write_table(df: pd.DataFrame, output_dir: Path | str, name: str) -> Path:
    """Write `df` to `<output_dir>/<name>.parquet` atomically and return the path.

    For the tables in `TABLES` the required columns must be present (extra columns are kept).
    Other names (checkpoints, side tables) are written without a column check.
    """
    path = table_path(output_dir, name)
    missing = _missing_columns(df, name)
    if missing:
        raise TableError(
            f"cannot write the {name} table: missing column(s) {', '.join(missing)} "
            f"(required: {', '.join(TABLES[name])})"
        )
    table = _to_arrow(df)
    _write_atomic(path, lambda fh: pq.write_table(table, fh))
    return path


def read_table(output_dir: Path | str, name: str) -> pd.DataFrame:
    """Read a table written by `write_table` (or by Microsoft GraphRAG).

    List and struct columns come back as plain Python lists and dicts (pandas alone would give
    numpy arrays), so what was written is what is read.
    """
    return _to_pandas(_read_arrow(output_dir, name))


def read_parts(output_dirs: list[Path], name: str) -> pd.DataFrame:
    """Table `name` written in parts, one in each of `output_dirs`, read as one table in their
    order: joined as Arrow and converted once (a conversion per part cost the Ray Data driver
    a quarter of its CPU). A part whose columns are all empty (null-typed) takes the others' types."""
    tables = [_read_arrow(d, name) for d in output_dirs]
    if not tables:
        raise TableError(f"no part of the {name} table to read")
    return _to_pandas(pa.concat_tables(tables, promote_options="permissive"))


def _read_arrow(output_dir: Path | str, name: str) -> pa.Table:
    path = table_path(output_dir, name)
    if not path.is_file():
        raise TableError(f"no {name} table in {Path(output_dir)}; run `sensegraph index` first")
    return pq.read_table(path)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    df = table.to_pandas()
    for field in table.schema:
        t = field.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t):
            df[field.name] = pd.Series(table.column(field.name).to_pylist(), index=df.index, dtype=object)
    return df


def write_json_atomic(path: Path | str, obj: Any) -> Path:
    """Write `obj` as indented UTF-8 JSON, atomically (used for stats.json and similar)."""
    path = Path(path)
    data = json.dumps(obj, indent=2, ensure_ascii=False, default=str).encode("utf-8") + b"\n"
    _write_atomic(path, lambda fh: fh.write(data))
    return path
