"""Integration: index a tiny text with the real embedded 0.5B model, then ask it questions with
every query method, end to end."""
import asyncio

import pytest

from sensegraph.config import load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.query import Searcher

pytestmark = pytest.mark.embedded

TEXT = """Ada Lovelace worked with Charles Babbage in London on the Analytical Engine.
Babbage designed the engine; Lovelace wrote the first program for it and published her notes
in 1843 in a journal of the Royal Society. The Royal Society later honoured Babbage."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    (root / "input").mkdir()
    (root / "input" / "ada.txt").write_text(TEXT, encoding="utf-8")
    settings = load_settings(root, overrides={
        "local": {"size": "0.5b", "parallel": 2},
        "extraction": {"max_gleanings": 0, "max_tokens": 700},
        "reports": {"max_tokens": 900},
        "chunks": {"size": 200, "overlap": 20},
        "query": {"answer_max_tokens": 300, "map_max_tokens": 300, "drift_depth": 1, "drift_breadth": 1},
    })
    return settings, asyncio.run(run_index(settings, allow_partial=True))


def test_tiny_index_with_embedded_model(tiny):
    settings, result = tiny
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


QUESTIONS = {
    "global": "What is this text about?",
    "text": "What is this text about?",
    "local": "What did Ada Lovelace do?",
    "basic": "What did Ada Lovelace do?",
    "drift": "What did Ada Lovelace do?",
}


@pytest.mark.parametrize("method", list(QUESTIONS))
def test_every_query_method_answers_with_the_embedded_model(tiny, method):
    settings, _ = tiny

    async def ask():
        searcher = Searcher.open(settings)
        try:
            first = await searcher.query(QUESTIONS[method], method, level=0)
            again = await searcher.query(QUESTIONS[method], method, level=0)
            return first, again
        finally:
            await searcher.aclose()

    first, again = asyncio.run(ask())
    assert first.answer.strip() and first.method == method
    assert first.context.units > 0 and first.context.tokens > 0
    assert first.usage["calls"] + first.usage["cache_hits"] > 0
    # every citation left in the answer names a record that was in the context
    given = first.context.records()
    for kind, refs in first.citations.items():
        assert set(refs) <= set(given.get(kind, {})), (kind, refs)
    assert again.usage["calls"] == 0 and again.answer == first.answer  # the cache makes reruns free
