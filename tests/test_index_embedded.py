"""Integration: index a tiny text with the real embedded 0.5B model, end to end."""
import asyncio

import pytest

from sensegraph.config import load_settings
from sensegraph.index.pipeline import run_index

pytestmark = pytest.mark.embedded

TEXT = """Ada Lovelace worked with Charles Babbage in London on the Analytical Engine.
Babbage designed the engine; Lovelace wrote the first program for it and published her notes
in 1843 in a journal of the Royal Society. The Royal Society later honoured Babbage."""


def test_tiny_index_with_embedded_model(tmp_path):
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "ada.txt").write_text(TEXT, encoding="utf-8")
    settings = load_settings(tmp_path, overrides={
        "local": {"size": "0.5b", "parallel": 2},
        "extraction": {"max_gleanings": 0, "max_tokens": 700},
        "reports": {"max_tokens": 900},
        "chunks": {"size": 200, "overlap": 20},
    })
    result = asyncio.run(run_index(settings, allow_partial=True))
    t = result.tables
    assert len(t["entities"]) >= 2
    titles = set(t["entities"]["title"])
    assert set(t["relationships"]["source"]) | set(t["relationships"]["target"]) <= titles
    for level, group in t["communities"].groupby("level"):
        members = [e for ids in group["entity_ids"] for e in ids]
        assert sorted(members) == sorted(t["entities"]["id"]), f"level {level} is not a complete partition"
    assert len(t["community_reports"]) == len(t["communities"])
    assert all(isinstance(x, str) and x for x in t["community_reports"]["title"])
    assert result.stats["llm"]["total"]["calls"] > 0
    # A rerun is served from the cache: zero new calls.
    again = asyncio.run(run_index(settings, allow_partial=True))
    assert again.stats["llm"]["total"]["calls"] == 0
