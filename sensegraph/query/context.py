"""Context packing shared by every query method.

All methods hand the model the same kind of data: tables named Reports, Entities, Relationships,
Claims and Sources, one record per row, `|`-separated, the first column being the record's
human-readable id that answers cite (`[Data: Reports (3, 17)]`). The methods differ only in which
records they choose and in what order (the paper's experimental setup); this module turns
chosen records into token-bounded text and keeps the records behind it, so a result can show
exactly what the model saw.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..tokens import count_tokens, truncate

# The name a section carries in the prompt and in citations -> the index table behind it.
KINDS = {
    "Reports": "community_reports",
    "Entities": "entities",
    "Relationships": "relationships",
    "Claims": "covariates",
    "Sources": "text_units",
}
COLUMNS = {
    "Reports": ["id", "title", "rating", "content"],
    "Entities": ["id", "entity", "type", "description", "mentions"],
    "Relationships": ["id", "source", "target", "description", "weight"],
    "Claims": ["id", "entity", "object", "type", "status", "description"],
    "Sources": ["id", "text"],
}


def jsonable(value: Any) -> Any:
    """Parquet cell -> JSON-friendly value (numpy arrays and scalars, NaN, nested records)."""
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def citation_id(kind: str, row: pd.Series) -> int:
    """Reports are cited by community number (stable across the explorer and the
    communities table); every other record by its human_readable_id."""
    return int(row["community"] if kind == "Reports" else row["human_readable_id"])


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).replace("|", "/").strip()


def row_values(kind: str, row: pd.Series) -> list[str]:
    """One record as the cells of its context table (see COLUMNS)."""
    get = row.get
    if kind == "Reports":
        values = [get("title"), get("rank"), get("full_content") or get("summary")]
    elif kind == "Entities":
        values = [get("title"), get("type"), get("description"), get("frequency")]
    elif kind == "Relationships":
        values = [get("source"), get("target"), get("description"), get("weight")]
    elif kind == "Claims":
        values = [get("subject_id"), get("object_id"), get("type"), get("status"), get("description")]
    elif kind == "Sources":
        values = [get("text")]
    else:
        raise ValueError(f"unknown context kind {kind!r}")
    return [str(citation_id(kind, row))] + [_text(v) for v in values]


def header(kind: str) -> str:
    return f"-----{kind}-----\n" + "|".join(COLUMNS[kind])


@dataclass
class Section:
    """One packed table: its rows as text and the index records behind them."""

    kind: str
    lines: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0

    def text(self) -> str:
        return header(self.kind) + "\n" + "\n".join(self.lines) if self.lines else ""

    def __len__(self) -> int:
        return len(self.lines)


def record(kind: str, row: pd.Series) -> dict[str, Any]:
    out = {"kind": kind, "ref": citation_id(kind, row)}
    out.update({k: jsonable(v) for k, v in row.items()})
    return out


def pack(kind: str, rows: Iterable[pd.Series], budget: int, *, truncate_first: bool = True) -> Section:
    """As many rows as fit in `budget` tokens, in the given order. A first row too large for the
    budget alone is cut to fit rather than dropped, so one huge record cannot empty a context."""
    section = Section(kind)
    used = count_tokens(header(kind)) + 1
    for row in rows:
        line = "|".join(row_values(kind, row))
        cost = count_tokens(line) + 1
        if used + cost > budget:
            if section.lines or not truncate_first or budget - used < 50:
                break
            line = truncate(line, budget - used - 1)
            cost = count_tokens(line) + 1
        section.lines.append(line)
        section.records.append(record(kind, row))
        used += cost
    section.tokens = used if section.lines else 0
    return section


def chunks(kind: str, rows: Iterable[pd.Series], budget: int) -> Iterator[Section]:
    """Consecutive token-bounded sections covering every row (the map step's batches)."""
    section = Section(kind)
    base = count_tokens(header(kind)) + 1
    used = base
    for row in rows:
        line = "|".join(row_values(kind, row))
        cost = count_tokens(line) + 1
        if section.lines and used + cost > budget:
            section.tokens = used
            yield section
            section, used = Section(kind), base
        if base + cost > budget:  # a single record larger than a chunk is cut to fit
            line = truncate(line, budget - base - 1)
            cost = count_tokens(line) + 1
        section.lines.append(line)
        section.records.append(record(kind, row))
        used += cost
    if section.lines:
        section.tokens = used
        yield section


@dataclass
class Context:
    """What one model call is given: sections in order."""

    sections: list[Section] = field(default_factory=list)

    def text(self) -> str:
        return "\n\n".join(s.text() for s in self.sections if s.lines)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sections)

    @property
    def units(self) -> int:
        return sum(len(s) for s in self.sections)

    def records(self) -> dict[str, dict[int, dict[str, Any]]]:
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for s in self.sections:
            for r in s.records:
                out.setdefault(s.kind, {})[r["ref"]] = r
        return out

    def tables(self) -> dict[str, pd.DataFrame]:
        """The records given to the model, one DataFrame per kind."""
        out: dict[str, list[dict[str, Any]]] = {}
        for s in self.sections:
            out.setdefault(s.kind, []).extend(s.records)
        return {kind: pd.DataFrame(rows) for kind, rows in out.items()}
