"""Question generation (paper section 3.1): K personas -> N tasks each -> M questions per
(persona, task) that need an understanding of the whole corpus rather than one fact.

Calls: 1 (personas) + K (tasks) + K*N (questions), each a small structured answer. A model that
returns too many items is cut to the count asked for; one that returns too few is asked once
more for the rest, and a remaining shortfall is reported, never hidden.
"""
from __future__ import annotations

import csv
import functools
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, create_model

from ..language import detect_language
from ..llm.client import ChatClient, LLMError
from ..prompts import load_prompt, render, to_messages
from .store import Bar, no_bar


class Persona(BaseModel):
    name: str
    description: str


class Task(BaseModel):
    description: str


@functools.lru_cache(maxsize=64)
def _list_model(item: type, count: int, field: str) -> type[BaseModel]:
    # maxItems in the JSON schema keeps a small model from listing forever; it is not enforced on
    # validation, so a server without schema support that lists too many is cut, not retried.
    return create_model(f"{field.title()}List{count}",
                        **{field: (list[item], Field(json_schema_extra={"maxItems": count}))})


def estimate_question_calls(k: int, n: int, m: int) -> int:
    return 1 + k + k * n


async def _ask_list(llm: ChatClient, prompt: str, item_type: type, field: str, count: int, *,
                    step: str, item: str, language: str, root: str | None, values: dict[str, Any],
                    max_tokens: int) -> list:
    """`count` items from prompt `prompt`; one follow-up call for a shortfall."""
    got: list = []
    for attempt in range(2):
        need = count - len(got)
        avoid = "\n".join(f"- {_text(x)}" for x in got) or "-"
        messages = to_messages(render(load_prompt(prompt, language, root), count=need, avoid=avoid, **values))
        reply = await llm.structured(messages, _list_model(item_type, need, field), step=step,
                                     item=item if not attempt else f"{item} (more)", max_tokens=max_tokens)
        seen = {_text(x).casefold() for x in got}
        for x in getattr(reply, field):
            if _text(x).strip() and _text(x).casefold() not in seen:
                got.append(x)
                seen.add(_text(x).casefold())
        if len(got) >= count:
            return got[:count]
    return got


def _text(x: Any) -> str:
    if isinstance(x, Persona):
        return f"{x.name}: {x.description}"
    if isinstance(x, Task):
        return x.description
    return str(x)


async def generate_questions(llm: ChatClient, description: str, *, k: int = 5, n: int = 5, m: int = 5,
                             language: str | None = None, root: str | None = None,
                             bar: Bar = no_bar) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows {id, persona, task, question} (ids p1t2q3: persona 1, task 2, question 3) and the
    list of shortfalls/failures (empty when all K*N*M questions were written)."""
    import asyncio

    language = language or detect_language([description])
    problems: list[str] = []
    advance = bar("questions", 1 + k + k * n)
    values = {"description": description}
    try:
        personas = await _ask_list(llm, "eval_personas", Persona, "personas", k, step="eval_questions",
                                   item="personas", language=language, root=root, values=values, max_tokens=120 * k + 100)
    except LLMError as exc:
        return [], [str(exc)]
    advance()
    if len(personas) < k:
        problems.append(f"asked for {k} personas, got {len(personas)}")

    async def tasks_of(i: int, p: Persona) -> list[Task]:
        try:
            return await _ask_list(llm, "eval_tasks", Task, "tasks", n, step="eval_questions", item=f"tasks of p{i + 1}",
                                   language=language, root=root, max_tokens=80 * n + 100,
                                   values={**values, "persona": _text(p)})
        except LLMError as exc:
            problems.append(str(exc))
            return []
        finally:
            advance()

    tasks = await asyncio.gather(*(tasks_of(i, p) for i, p in enumerate(personas)))

    async def questions_of(i: int, j: int, p: Persona, t: Task) -> list[dict[str, Any]]:
        try:
            qs = await _ask_list(llm, "eval_questions", str, "questions", m, step="eval_questions",
                                 item=f"questions of p{i + 1}t{j + 1}", language=language, root=root,
                                 max_tokens=60 * m + 100, values={**values, "persona": _text(p), "task": t.description})
        except LLMError as exc:
            problems.append(str(exc))
            return []
        finally:
            advance()
        if len(qs) < m:
            problems.append(f"p{i + 1}t{j + 1}: asked for {m} questions, got {len(qs)}")
        return [{"id": f"p{i + 1}t{j + 1}q{x + 1}", "persona": _text(p), "task": t.description, "question": q.strip()}
                for x, q in enumerate(qs)]

    jobs = []
    for i, (p, ts) in enumerate(zip(personas, tasks)):
        if len(ts) < n:
            problems.append(f"p{i + 1}: asked for {n} tasks, got {len(ts)}")
            advance(n - len(ts))
        jobs += [questions_of(i, j, p, t) for j, t in enumerate(ts)]
    if len(personas) < k:
        advance((k - len(personas)) * (1 + n))
    rows = [row for batch in await asyncio.gather(*jobs) for row in batch]
    return rows, problems


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """Questions from a CSV (column question, question_text or text; optional id/question_id,
    persona, task) or a JSONL file (the same fields), in file order."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8-sig")
        records = json.loads(text) if path.suffix.lower() == ".json" else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        with path.open(encoding="utf-8-sig", newline="") as f:
            records = list(csv.DictReader(f))
    rows = []
    for i, r in enumerate(records):
        r = r if isinstance(r, dict) else {"question": r}
        q = next((r[c] for c in ("question", "question_text", "text") if r.get(c)), None)
        if not q:
            raise ValueError(f"{path}: record {i + 1} has no question (columns: question, question_text or text)")
        qid = r.get("id") or r.get("question_id") or f"q{i + 1}"
        rows.append({"id": str(qid), "persona": r.get("persona", ""), "task": r.get("task", ""),
                     "question": str(q).strip()})
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: question ids are not unique")
    return rows


def corpus_description(settings) -> str:
    """A fallback description from the index's root-level report titles and summaries (no LLM
    call), for users who do not write one."""
    import pandas as pd

    path = settings.path(settings.output_dir) / "community_reports.parquet"
    if not path.exists():
        raise FileNotFoundError("give --description (no index to describe the corpus from)")
    reports = pd.read_parquet(path, columns=["level", "title", "summary", "rank"])
    top = reports[reports["level"] == reports["level"].min()].sort_values("rank", ascending=False).head(8)
    lines = [f"- {r.title}: {str(r.summary)[:300]}" for r in top.itertuples()]
    return "A collection of documents whose main topics are:\n" + "\n".join(lines)
