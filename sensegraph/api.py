"""The Python API: what `import sensegraph` users call."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd

from .config import Settings, load_settings
from .index.pipeline import IndexResult, run_index
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
