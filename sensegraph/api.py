"""The Python API: what `import sensegraph` users call."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from .config import Settings, load_settings
from .index.pipeline import IndexResult, run_index
from .query import REGISTRY, QueryResult, Searcher
from .store.tables import TABLES, has_table, read_table


def _settings(root: str | Path | Settings) -> Settings:
    return root if isinstance(root, Settings) else load_settings(root)


async def aindex(root: str | Path | Settings = ".", *, cache: bool | None = None,
                 allow_partial: bool = False) -> IndexResult:
    """Build (or resume) the index of the project at `root`."""
    return await run_index(_settings(root), cache=cache, allow_partial=allow_partial, log=lambda m: None)


def index(root: str | Path | Settings = ".", *, cache: bool | None = None, allow_partial: bool = False) -> IndexResult:
    return asyncio.run(aindex(root, cache=cache, allow_partial=allow_partial))


def load_index(root: str | Path | Settings = ".") -> dict[str, pd.DataFrame]:
    """The index tables of a project (or of an output folder written by Microsoft GraphRAG)."""
    if isinstance(root, (str, Path)) and has_table(Path(root), "entities"):
        output = Path(root)
    else:
        s = _settings(root)
        output = s.path(s.output_dir)
    return {name: read_table(output, name) for name in TABLES if has_table(output, name)}


async def asearch(question: str, method: str = "global", *, root: str | Path | Settings = ".",
                 index_dir: str | Path | None = None, level: int | None = None, dynamic: bool = False,
                 response_type: str | None = None, history: list[dict[str, str]] | None = None,
                 on_token: Callable[[str], None] | None = None, cache: bool | None = None,
                 budget: int | None = None) -> QueryResult:
    """Answer `question` over the index of the project at `root` (or the index folder
    `index_dir`, e.g. one written by Microsoft GraphRAG). `method` is one of
    `sensegraph.query.METHODS`: global, local, drift, basic, text, lazy. `history` holds earlier turns
    as {"role", "content"} dicts; `on_token` receives the final answer as it is generated; `budget`
    is the lazy method's number of relevance tests (default: lazy.budget)."""
    searcher = Searcher.open(_settings(root), index_dir, cache=cache)
    try:
        return await searcher.query(question, method, level=level, dynamic=dynamic, response_type=response_type,
                                    history=history, on_token=on_token, budget=budget)
    finally:
        await searcher.aclose()


def search(question: str, method: str = "global", **options: Any) -> QueryResult:
    """Synchronous `asearch`."""
    return asyncio.run(asearch(question, method, **options))


def _method(name: str):
    async def run_async(question: str, **options: Any) -> QueryResult:
        return await asearch(question, name, **options)

    def run(question: str, **options: Any) -> QueryResult:
        return asyncio.run(asearch(question, name, **options))

    run_async.__doc__ = run.__doc__ = (f"{name} search, {REGISTRY[name].summary}: "
                                       f"`asearch(question, {name!r}, ...)`; see asearch for the options.")
    run_async.__name__ = run_async.__qualname__ = f"a{name}_search"
    run.__name__ = run.__qualname__ = f"{name}_search"
    return run_async, run


# One pair per registered method: `global_search` / `aglobal_search`, `local_search`, ...
for _name in REGISTRY:
    globals()[f"a{_name}_search"], globals()[f"{_name}_search"] = _method(_name)
del _name
