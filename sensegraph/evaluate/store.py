"""The evaluation folder: one JSONL file per step, appended to as items finish.

Appending one line per finished item (flushed at once) is what makes every step resumable: an
interrupted run loses at most the items in flight, and those come back free from the LLM cache.
A row with an "error" field records a failure; it is retried by the next run, and a later row
for the same key wins.

A judgement is keyed by the unordered pair of conditions: rows are read with the pair in
canonical order (`canonical_pair`), so `-c SS,C0` finds what `-c C0,SS` judged, and rows an
older version stored under the other order are read as the same comparisons.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..config import Settings

EVAL_DIR = "evaluation"
FILES = {
    "questions": "questions.jsonl",
    "answers": "answers.jsonl",
    "judgements": "judgements.jsonl",
    "claims": "claims.jsonl",
    "runs": "runs.jsonl",
}
KEYS: dict[str, tuple[str, ...]] = {
    "questions": ("id",),
    "answers": ("question_id", "condition"),
    "judgements": ("question_id", "a", "b", "criterion", "repeat"),
    "claims": ("question_id", "condition"),
}


class EvalStore:
    """`<root>/evaluation/<name>/`: questions, answers, judgements, claims, runs, report."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @classmethod
    def for_project(cls, settings: Settings, name: str = "default") -> "EvalStore":
        return cls(settings.path(EVAL_DIR) / name)

    def path(self, kind: str) -> Path:
        return self.folder / FILES[kind]

    @property
    def figures(self) -> Path:
        return self.folder / "figures"

    def rows(self, kind: str) -> list[dict[str, Any]]:
        """Every stored row, in file order; a half-written last line (a crash) is skipped."""
        path = self.path(kind)
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return [canonical_judgement(r) for r in out] if kind == "judgements" else out

    def done(self, kind: str) -> dict[tuple, dict[str, Any]]:
        """The latest successful row per key (rows with an error are not done)."""
        latest: dict[tuple, dict[str, Any]] = {}
        for row in self.rows(kind):
            latest[key_of(kind, row)] = row
        return {k: r for k, r in latest.items() if not r.get("error")}

    def errors(self, kind: str) -> list[dict[str, Any]]:
        """Items whose latest row is a failure (they will be retried by the next run)."""
        latest: dict[tuple, dict[str, Any]] = {}
        for row in self.rows(kind):
            latest[key_of(kind, row)] = row
        return [r for r in latest.values() if r.get("error")]

    def append(self, kind: str, row: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.path(kind).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            f.flush()

    def write_all(self, kind: str, rows: Iterable[dict[str, Any]]) -> None:
        """Replace a file whole (questions are written once, as a set)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path(kind).with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(self.path(kind))

    def questions(self, limit: int | None = None) -> list[dict[str, Any]]:
        qs = self.rows("questions")
        if not qs:
            raise FileNotFoundError(f"no questions in {self.path('questions')}; run `sensegraph eval questions` first")
        return qs[:limit] if limit else qs

    def record_run(self, step: str, started: float, usage: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """One line per command run: what it cost, so the report can total calls and tokens."""
        row = {"step": step, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "seconds": round(time.monotonic() - started, 2), **usage, **extra}
        self.append("runs", row)
        return row


def canonical_pair(a: str, b: str) -> tuple[str, str]:
    """The order a pair of conditions is stored and judged in, whatever order they were named in."""
    return (a, b) if a <= b else (b, a)


def canonical_judgement(row: dict[str, Any]) -> dict[str, Any]:
    """A judgement row with its pair in canonical order. `a` and `b` swap, and with them what is
    relative to `a` (its score, whether it was shown first); `first`, `winner` (names) and
    `verdict` (a position) mean the same either way."""
    a, b = row.get("a"), row.get("b")
    if not isinstance(a, str) or not isinstance(b, str) or (a, b) == canonical_pair(a, b):
        return row
    out = {**row, "a": b, "b": a}
    if "a_first" in row:
        out["a_first"] = not row["a_first"]
    if row.get("score_a") is not None:
        out["score_a"] = 1.0 - row["score_a"]
    return out


def key_of(kind: str, row: dict[str, Any]) -> tuple:
    return tuple(row.get(k) for k in KEYS[kind])


def usage_totals(usage) -> dict[str, Any]:
    """A Usage object's totals as plain numbers (what a run row keeps)."""
    t = usage.total()
    return {"calls": t.calls, "cache_hits": t.cache_hits, "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens, "cached_prompt_tokens": t.cached_prompt_tokens,
            "retries": t.retries}


Bar = Callable[[str, int], Callable[..., None]]


def no_bar(description: str, total: int) -> Callable[..., None]:
    return lambda n=1: None
