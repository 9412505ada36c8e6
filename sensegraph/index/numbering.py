"""Human-readable ids that stay put: an updated index keeps the numbers its rows had.

Rows that existed keep their number; new rows get numbers after the largest ever used (kept in
output/_work/numbers.json), so a number is never reused and an old citation never points at a
different record. The community report context quotes these numbers, so stable numbers are what
make an unchanged community's context, and its cached report, identical after an update.

A fresh index numbers rows 0..n-1 in their stable order instead; numbering stays stable from the
first `sensegraph update` on (numbers.json exists), also for later `sensegraph index` runs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..store.tables import has_table, read_table, write_json_atomic

WORK_DIR = "_work"
NUMBERS_FILE = "numbers.json"
NUMBERED = ("documents", "text_units", "entities", "relationships", "covariates", "communities")
PREVIOUS_TABLES = (*NUMBERED, "community_reports")


def stable_numbers(ids: list[str], previous: dict[str, int], floor: int = -1) -> list[int]:
    """Numbers for `ids` (in order): the previous number where there was one, else the next
    after the largest previous number (and `floor`)."""
    nxt = max([floor, *previous.values()]) + 1
    out = []
    for i in ids:
        if i in previous:
            out.append(previous[i])
        else:
            out.append(nxt)
            nxt += 1
    return out


class Numbering:
    """The numbers of the index in `out` as it was before this run, applied to the new tables."""

    def __init__(self, out: Path):
        self.out = out
        self.tables = {n: read_table(out, n) for n in PREVIOUS_TABLES if has_table(out, n)}
        path = out / WORK_DIR / NUMBERS_FILE
        self.floor: dict[str, int] = json.loads(path.read_text()) if path.exists() else {}

    @staticmethod
    def kept_in(out: Path) -> bool:
        """Whether the index in `out` has stable numbers (it has been updated)."""
        return (out / WORK_DIR / NUMBERS_FILE).exists()

    def numbers(self, table: str, key: str = "id", column: str = "human_readable_id") -> dict[str, int]:
        df = self.tables.get(table)
        if df is None or df.empty or column not in df:
            return {}
        return {str(k): int(v) for k, v in zip(df[key], df[column])}

    def df(self, table: str) -> pd.DataFrame:
        return self.tables.get(table, pd.DataFrame(columns=["id"]))

    def fingerprint(self) -> str:
        # A step input (index/steps.py). Only *whether* numbers are stable decides a step's
        # tables, not the numbers on disk: a step numbers only the tables it writes, from the
        # numbers those tables had, which are the ones it gave them last time (a step that
        # overwrites another's tables drops that step's mark). With unchanged inputs its output
        # is a fixed point of renumbering. Fingerprinting the numbers themselves made the first
        # `index` after an update rerun summarize and communities: their numbers, and the
        # communities' written after summarize, had changed since those steps started.
        return "stable numbers"

    @staticmethod
    def _key(table: str) -> tuple[str, str, str]:
        return (table, "id", "community") if table == "communities" else (table, "id", "human_readable_id")

    def renumber(self, df: pd.DataFrame, table: str) -> pd.DataFrame:
        if df.empty or "human_readable_id" not in df:
            return df
        df = df.copy()
        df["human_readable_id"] = stable_numbers([str(i) for i in df["id"]], self.numbers(table),
                                                 int(self.floor.get(table, -1)))
        return df

    def communities(self, comms: pd.DataFrame) -> pd.DataFrame:
        """Keep the number of every community whose membership (level + entities) is unchanged."""
        if comms.empty:
            return comms
        numbers = stable_numbers([str(i) for i in comms["id"]], self.numbers(*self._key("communities")),
                                 int(self.floor.get("communities", -1)))
        renum = {int(o): n for o, n in zip(comms["community"], numbers)}
        comms = comms.copy()
        comms["community"] = numbers
        comms["human_readable_id"] = numbers
        comms["parent"] = [renum.get(int(p), -1) for p in comms["parent"]]
        comms["children"] = [[renum[int(c)] for c in ch] for ch in comms["children"]]
        comms["title"] = [f"Community {n}" for n in numbers]
        return comms

    def save(self, tables: dict[str, pd.DataFrame]) -> None:
        """Remember the largest numbers ever given, so numbers of deleted rows are never reused."""
        floor = dict(self.floor)
        for name in NUMBERED:
            df = tables.get(name)
            table, key, col = self._key(name)
            if df is not None and not df.empty and col in df:
                floor[name] = max(int(floor.get(name, -1)), int(df[col].max()), *self.numbers(table, key, col).values())
        path = self.out / WORK_DIR / NUMBERS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, floor)
