"""Querying an index written by Microsoft GraphRAG 3.x (../shared/data/msgraphrag-christmas-carol-index).

The folder is read-only and holds no embeddings: vectors are computed with the configured
embedder (here the mock server's /v1/embeddings) and must not be written back. Microsoft's
hierarchy is incomplete (25 of the 529 entities are in no community; their level 1 holds only
443), so these tests also pin down what the level projection makes of it.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from mock_llm import start_mock_server
from sensegraph.config import CacheSettings, ChatSettings, EmbeddingSettings, Settings
from sensegraph.query import Searcher
from sensegraph.query.citations import normalise
from sensegraph.query.data import list_ids
from sensegraph.query.global_search import project_reports
from sensegraph.query.local_search import allowed_refs

MS_INDEX = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "msgraphrag-christmas-carol-index"
ENTITIES = 529
LEVEL1_COMMUNITY_ENTITIES = 443  # what Microsoft's own level-1 communities hold


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


@dataclass
class Opened:
    searcher: Searcher
    loop: asyncio.AbstractEventLoop  # the searcher's embedding client belongs to the loop it ran on
    before: dict[str, tuple[int, int]]  # the index folder before any query


@pytest.fixture(scope="module")
def ms(tmp_path_factory):
    """The Microsoft index opened once for the module, so entities are embedded once."""
    if not MS_INDEX.exists():
        pytest.skip(f"Microsoft GraphRAG index not found at {MS_INDEX} (../shared/data is absent)")
    before = snapshot(MS_INDEX)
    with start_mock_server() as server:
        endpoint = dict(provider="openai", model="mock", base_url=server.base_url, api_key="k",
                        retry_base_seconds=0.01)
        settings = Settings(chat=ChatSettings(**endpoint), embedding=EmbeddingSettings(**endpoint, batch_size=128),
                            cache=CacheSettings(enabled=False), root=str(tmp_path_factory.mktemp("project")))
        searcher = Searcher.open(settings, index_dir=MS_INDEX)
        loop = asyncio.new_event_loop()
        try:
            yield Opened(searcher, loop, before)
        finally:
            loop.run_until_complete(searcher.aclose())
            loop.close()


def ask(ms: Opened, question: str, method: str, **kwargs):
    return ms.loop.run_until_complete(ms.searcher.query(question, method, **kwargs))


def members(searcher: Searcher) -> dict[int, list[str]]:
    c = searcher.index.communities
    return {int(k): list_ids(v) for k, v in zip(c["community"], c["entity_ids"])}


def deepest_per_branch(communities: pd.DataFrame, reported: set[int], level: int) -> set[int]:
    """Independent reference for the projection: walk down from every root while the community
    is above `level` and has a reported child; where the walk stops is the branch's report."""
    children = {int(c): [int(k) for k in list_ids(kids)] for c, kids in zip(communities["community"],
                                                                          communities["children"])}
    levels = dict(zip(communities["community"].astype(int), communities["level"].astype(int)))
    picked: set[int] = set()
    stack = [c for c, lvl in levels.items() if lvl == 0 and c in reported]
    while stack:
        c = stack.pop()
        below = [k for k in children.get(c, []) if k in reported]
        if levels[c] < level and below:
            stack.extend(below)
        else:
            picked.add(c)
    return picked


def test_projection_picks_the_deepest_report_of_every_branch(ms):
    searcher = ms.searcher
    index = searcher.index
    reported = set(index.reports["community"].astype(int))
    in_communities = {e for ids in members(searcher).values() for e in ids}
    assert len(index.entities) == ENTITIES
    level1 = {e for c, lvl in zip(index.communities["community"], index.communities["level"]) if lvl == 1
              for e in members(searcher)[int(c)]}
    assert len(level1) == LEVEL1_COMMUNITY_ENTITIES  # Microsoft's level 1 leaves entities out
    coverage = {}
    for level in range(index.max_level() + 1):
        projected = project_reports(index.reports, index.communities, level)
        assert set(projected["community"].astype(int)) == deepest_per_branch(index.communities, reported, level)
        assert (projected["level"] <= level).all()
        counts = Counter(e for c in projected["community"] for e in members(searcher)[int(c)])
        assert max(counts.values()) == 1, f"level {level}: an entity is in two projected reports"
        # the projection restores what every level should hold: all clustered entities
        assert set(counts) == in_communities
        coverage[level] = len(counts)
    # 25 entities have no community at all in Microsoft's index: no level can cover them
    assert coverage == {level: ENTITIES - 25 for level in coverage}
    print(f"\nentities covered per level (of {ENTITIES}): {coverage}; "
          f"Microsoft's level-1 communities alone: {LEVEL1_COMMUNITY_ENTITIES}")


@pytest.mark.parametrize("deepest", [False, True], ids=["level0", "deepest"])
def test_global_search_maps_the_projected_reports(ms, deepest):
    searcher = ms.searcher
    index = searcher.index
    level = index.max_level() if deepest else 0
    r = ask(ms, "What are the main themes of the story?", "global", level=level)
    projected = project_reports(index.reports, index.communities, level)
    assert r.stats["level"] == level and r.stats["reports"] == len(projected)
    given = sorted(rec["community"] for rec in r.context.records()["Reports"].values())
    assert given == sorted(projected["community"].astype(int))
    assert r.stats["map_calls"] >= 1 and r.usage["calls"] == r.stats["map_calls"] + r.stats["reduce_calls"]
    assert r.answer and not r.failures
    assert_citations_exist(searcher, r)


@pytest.mark.parametrize("retrieval", ["neighbourhood", "walk"])
def test_local_search_context_holds_the_named_entity_and_its_neighbourhood(ms, retrieval):
    searcher = ms.searcher
    index = searcher.index
    settings = searcher.settings
    searcher.settings = settings.model_copy(
        update={"query": settings.query.model_copy(update={"local_retrieval": retrieval})})
    try:
        r = ask(ms, "How does EBENEZER SCROOGE change over the story?", "local")
    finally:
        searcher.settings = settings
    assert r.stats["retrieval"] == retrieval
    tables = r.context_tables
    titles = set(tables["Entities"]["title"])
    assert {"EBENEZER SCROOGE", "SCROOGE"} <= titles  # named in the question, so matched first
    rels = tables["Relationships"]
    assert len(rels) and (rels["source"].isin(titles) | rels["target"].isin(titles)).all()
    assert ((rels["source"] == "EBENEZER SCROOGE") | (rels["target"] == "EBENEZER SCROOGE")).any()
    matched_units = {u for ids in tables["Entities"]["text_unit_ids"] for u in ids}
    if retrieval == "neighbourhood":  # source text: the matched entities' units, nothing else
        assert len(tables["Sources"]) and set(tables["Sources"]["id"]) <= matched_units
    else:  # the walk's best units: most of them hold a matched entity, any may lie further out
        sources = set(tables["Sources"]["id"])
        assert len(sources) and len(sources & matched_units) >= len(sources) / 2
    scrooge = index.entities.loc[index.entities["title"] == "EBENEZER SCROOGE"].iloc[0]
    assert set(tables["Sources"]["id"]) & set(list_ids(scrooge["text_unit_ids"]))
    if "Reports" in tables:  # the communities that hold matched entities
        held = {e for c in tables["Reports"]["community"] for e in members(searcher)[int(c)]}
        assert held & set(tables["Entities"]["id"])
    assert r.stats["context_tokens"] <= searcher.settings.query_context_tokens()
    assert r.answer
    assert_citations_exist(searcher, r)


def test_basic_search_returns_text_units_of_the_index(ms):
    searcher = ms.searcher
    r = ask(ms, "What happens on Christmas morning?", "basic")
    sources = r.context_tables["Sources"]
    assert len(sources) > 0  # as many as fit the budget (no top-k cap by default, as in the paper)
    assert r.stats["context_tokens"] <= searcher.settings.query_context_tokens()
    assert set(sources["id"]) <= set(searcher.index.text_units["id"])
    assert r.answer
    assert_citations_exist(searcher, r)


def test_citations_keep_only_records_given_to_the_model(ms):
    """The references of an answer are checked against the context: an id from the context is
    kept, an id the model invented (absent from the context) is dropped and reported."""
    searcher = ms.searcher
    r = ask(ms, "Who is SCROOGE?", "local")
    allowed = allowed_refs(r.context)
    real = sorted(allowed["Entities"])[0]
    invented = max(searcher.index.entities["human_readable_id"]) + 1
    text, found = normalise(f"Scrooge is a miser [Data: Entities ({real}, {invented})].", allowed)
    assert found.cited == {"Entities": [real]} and found.invalid == {"Entities": [invented]}
    assert f"Entities ({real})" in text and str(invented) not in text


def test_nothing_is_written_into_the_read_only_index(ms):
    searcher = ms.searcher
    ask(ms, "Who is SCROOGE?", "local")  # needs entity vectors: computed, kept in memory
    assert "entities" in searcher.index._vectors
    assert snapshot(MS_INDEX) == ms.before
    assert not (MS_INDEX / "embeddings").exists()


def assert_citations_exist(searcher: Searcher, r) -> None:
    """Every citation names a record that was in the context and exists in the index."""
    given = r.context.records()
    exists = {"Reports": set(searcher.index.reports["community"].astype(int)),
              "Entities": set(searcher.index.entities["human_readable_id"].astype(int)),
              "Relationships": set(searcher.index.relationships["human_readable_id"].astype(int)),
              "Claims": set(searcher.index.claims["human_readable_id"].astype(int)),
              "Sources": set(searcher.index.text_units["human_readable_id"].astype(int))}
    for kind, refs in r.citations.items():
        assert set(refs) <= set(given.get(kind, {})) and set(refs) <= exists[kind]
    for kind, records in r.cited.items():
        assert {rec["ref"] for rec in records} == set(r.citations[kind])
