"""The lazy index (index_method: lazy) through the real pipeline: no chat call, the standard tables
with concepts for entities, complete community partitions, no reports; reruns, upgrades to a
standard index, and the tools that open an index folder."""
from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("spacy")

from click.testing import CliRunner  # noqa: E402

from mock_llm import start_mock_server  # noqa: E402
from sensegraph.cli import main as cli_main  # noqa: E402
from sensegraph.index import steps  # noqa: E402
from sensegraph.store.tables import TABLES  # noqa: E402
from test_pipeline import CHINESE_DOC, DOCS, index, read_all, settings_for, snapshot, write_docs  # noqa: E402


def chat_requests(server) -> list[dict]:
    return [b for b in server.requests if "messages" in b]


def test_a_lazy_index_makes_no_chat_call_and_has_the_standard_tables(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        result = index(settings_for(tmp_path, server, index_method="lazy"))
        assert chat_requests(server) == []
    tables = read_all(tmp_path / "output")
    for name, columns in TABLES.items():
        assert not [c for c in columns if c not in tables[name].columns], name
    ents, rels, comms = tables["entities"], tables["relationships"], tables["communities"]
    assert tables["community_reports"].empty and tables["covariates"].empty
    assert len(ents) > 10 and len(rels) > 10
    titles = set(ents["title"])
    assert {"Maria Okafor", "Harbor Cooperative"} <= titles  # names the text states
    assert set(rels["source"]) | set(rels["target"]) <= titles  # every endpoint is an entity
    for level, part in comms.groupby("level"):  # every level a complete, exclusive partition
        members = [e for ids in part["entity_ids"] for e in ids]
        assert sorted(members) == sorted(ents["id"]), f"level {level}"
    # communities are named by their members, not "Community N"
    assert all(not t.startswith("Community ") for t in comms["title"])
    steps_run = result.stats["steps"]
    assert "concepts" in steps_run and "concept_graph" in steps_run and "extract" not in steps_run
    assert result.stats["llm"]["total"]["calls"] == result.stats["llm"]["embed"]["calls"]  # embeddings only
    # the text units know the concepts found in them
    units = tables["text_units"]
    assert sum(len(ids) for ids in units["entity_ids"]) >= len(ents)


def test_a_lazy_rerun_is_skipped_and_an_upgrade_to_standard_rebuilds_what_differs(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        lazy = settings_for(tmp_path, server, index_method="lazy")
        index(lazy)
        first = snapshot(tmp_path / "output")
        again = index(lazy)
        assert all(again.stats["steps"][s].get("skipped") for s in ("concepts", "concept_graph", "communities"))
        assert snapshot(tmp_path / "output") == first
        # upgrade: the standard steps run and their tables replace the concepts' ...
        standard = index(settings_for(tmp_path, server))
        assert not standard.stats["steps"]["summarize"].get("skipped")
        assert len(standard.tables["community_reports"]) > 0
        # ... and going back to lazy does not take the standard tables for its own
        back = index(lazy)
        assert not back.stats["steps"]["concept_graph"].get("skipped")
    assert snapshot(tmp_path / "output") == first
    state = json.loads((tmp_path / "output" / steps.STATE_FILE).read_text())
    assert "summarize" not in state  # its tables were rewritten by the lazy run


def test_a_chinese_lazy_index(tmp_path):
    write_docs(tmp_path, {"harbor-zh.txt": CHINESE_DOC})
    with start_mock_server() as server:
        result = index(settings_for(tmp_path, server, index_method="lazy", concepts={"min_frequency": 1}))
        assert chat_requests(server) == []
    titles = set(result.tables["entities"]["title"])
    assert {"王丽华", "陈国强"} <= titles
    assert result.stats["language"] == "zh"


def test_a_tiny_lazy_index_says_why_it_has_no_concepts(tmp_path):
    import asyncio

    from sensegraph.index.pipeline import run_index

    # one text unit: every concept occurs in one unit, and concepts.min_frequency (2) removes them all
    write_docs(tmp_path, {"note.txt": "Maria Okafor founded the Harbor Cooperative in Port Ellison."})
    logged: list[str] = []
    with start_mock_server() as server:
        result = asyncio.run(run_index(settings_for(tmp_path, server, index_method="lazy"), log=logged.append))
        assert result.tables["entities"].empty and len(result.tables["text_units"]) == 1
        warnings = [m for m in logged if "concept" in m]
        assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "\n" not in warnings[0]
        assert "concepts.min_frequency (2)" in warnings[0] and "min_frequency: 1" in warnings[0]
        stats = json.loads((tmp_path / "output" / "stats.json").read_text())
        assert stats["concepts_note"] == warnings[0].removeprefix("warning: ")
        # as the warning says: with min_frequency 1 the concepts are kept, and nothing is said
        logged.clear()
        kept = asyncio.run(run_index(settings_for(tmp_path, server, index_method="lazy",
                                                  concepts={"min_frequency": 1}), log=logged.append))
    assert {"Maria Okafor", "Harbor Cooperative", "Port Ellison"} <= set(kept.tables["entities"]["title"])
    assert not [m for m in logged if "concept" in m] and "concepts_note" not in kept.stats


JAPANESE_DOC = ("夏目漱石は明治時代の小説家で、東京で生まれました。代表作には『吾輩は猫である』や『こころ』があります。"
                "漱石は松山や熊本で英語の教師として働いたあと、ロンドンに留学しました。")


def test_a_japanese_lazy_index_is_refused_before_any_work(tmp_path):
    from sensegraph.config import SettingsError
    from sensegraph.index import concepts

    write_docs(tmp_path, {"soseki.txt": JAPANESE_DOC})
    with start_mock_server() as server:
        with pytest.raises(SettingsError, match="lazy index does not support Japanese yet") as raised:
            index(settings_for(tmp_path, server, index_method="lazy"))
        assert not server.requests  # no embedding started
    assert "--method standard" in str(raised.value) and "\n" not in str(raised.value)
    assert not list((tmp_path / "output").rglob("*.parquet"))  # not even the text units
    # the concepts step refuses it too, before spaCy or jieba is loaded
    units = pd.DataFrame({"id": ["u"], "text": [JAPANESE_DOC]})
    with pytest.raises(concepts.UnsupportedLanguage):
        concepts.concept_instances(units, language="ja", settings=settings_for(tmp_path, server))


def test_a_japanese_lazy_index_from_the_command_line_is_a_clear_error(tmp_path):
    write_docs(tmp_path, {"soseki.txt": JAPANESE_DOC})
    with start_mock_server() as server:
        env = {"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__BASE_URL": server.base_url,
               "SENSEGRAPH_CHAT__MODEL": "mock", "SENSEGRAPH_CHAT__API_KEY": "x",
               "SENSEGRAPH_EMBEDDING__PROVIDER": "openai", "SENSEGRAPH_EMBEDDING__BASE_URL": server.base_url,
               "SENSEGRAPH_EMBEDDING__MODEL": "mock", "SENSEGRAPH_EMBEDDING__API_KEY": "x"}
        res = CliRunner().invoke(cli_main, ["index", "--method", "lazy", "--root", str(tmp_path)], env=env)
    assert res.exit_code == 2, res.output
    assert "lazy index does not support Japanese yet" in res.stderr and "Traceback" not in res.output


def test_query_dry_run_and_export_work_on_a_lazy_index(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server, index_method="lazy")
        index(settings)
        env = {"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__BASE_URL": server.base_url,
               "SENSEGRAPH_CHAT__MODEL": "mock", "SENSEGRAPH_CHAT__API_KEY": "x",
               "SENSEGRAPH_EMBEDDING__PROVIDER": "openai", "SENSEGRAPH_EMBEDDING__BASE_URL": server.base_url,
               "SENSEGRAPH_EMBEDDING__MODEL": "mock", "SENSEGRAPH_EMBEDDING__API_KEY": "x",
               "SENSEGRAPH_CHUNKS__SIZE": "120", "SENSEGRAPH_CHUNKS__OVERLAP": "20",
               "SENSEGRAPH_INDEX_METHOD": "lazy"}
        runner = CliRunner()
        dry = runner.invoke(cli_main, ["index", "--dry-run", "--root", str(tmp_path)], env=env)
        assert dry.exit_code == 0, dry.output
        assert "no chat call" in dry.output
        other = tmp_path / "elsewhere"
        other.mkdir()
        asked = runner.invoke(cli_main, ["query", "Who founded the Harbor Cooperative?", "--method", "lazy",
                                         "--budget", "5", "--json", "--index", str(tmp_path / "output"),
                                         "--root", str(other)], env=env)
        assert asked.exit_code == 0, asked.output
        out = json.loads(asked.stdout[asked.stdout.index("{"):])
        assert out["stats"]["tests_used"] <= 5
        exported = runner.invoke(cli_main, ["export", "--format", "graphml", "--root", str(tmp_path)], env=env)
        assert exported.exit_code == 0, exported.output
    import networkx as nx

    graph = nx.read_graphml(tmp_path / "output" / "export" / "graph.graphml")
    assert graph.number_of_nodes() == len(pd.read_parquet(tmp_path / "output" / "entities.parquet"))


# -- concept vectors: embedded with the index, not while the first question waits ----------------

def embedded_texts(server, since: int = 0) -> list[str]:
    """Every text sent to the embeddings endpoint (in request order) from request `since` on."""
    return [t for b in list(server.requests)[since:] if "input" in b for t in b["input"]]


def test_a_lazy_index_embeds_its_concepts_by_title_and_a_rerun_embeds_nothing(tmp_path):
    from sensegraph.store.vectors import VectorIndex, vector_model

    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server, index_method="lazy")
        result = index(settings)
        entities = result.tables["entities"]
        sent = embedded_texts(server)
        # every concept, by its title (what the query's fallback embeds too: query.data)
        assert set(entities["title"]) <= set(sent)
        assert not [t for t in sent if t.startswith(tuple(f"{x}: " for x in entities["title"]))]
        assert result.stats["steps"]["embed"]["vectors"] == {"text_units": len(result.tables["text_units"]),
                                                             "entities": len(entities)}
        out = tmp_path / "output"
        vectors = VectorIndex.load(out, "entities")
        assert vectors.ids == list(entities["id"]) and vectors.dim > 0
        assert vector_model(out, "entities") == "mock"
        assert not (out / "embeddings" / "community_reports.parquet").exists()  # a lazy index has no reports
        # an unchanged index embeds nothing again: every vector comes from the cache
        before = len(server.requests)
        again = index(settings)
        assert len(server.requests) == before
        assert again.stats["llm"]["embed"]["cache_hits"] >= len(entities)
        assert VectorIndex.load(out, "entities").ids == vectors.ids


def test_a_changed_corpus_embeds_only_its_new_concepts_and_units(tmp_path):
    write_docs(tmp_path, {k: DOCS[k] for k in ("harbor.txt", "council.txt")})
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server, index_method="lazy")
        first = index(settings)
        write_docs(tmp_path, {"observatory.txt": DOCS["observatory.txt"]})
        before = len(server.requests)
        second = index(settings)
        sent = embedded_texts(server, before)
    new_titles = set(second.tables["entities"]["title"]) - set(first.tables["entities"]["title"])
    new_units = set(second.tables["text_units"]["text"]) - set(first.tables["text_units"]["text"])
    assert new_titles and new_units
    assert sorted(sent) == sorted(new_titles | new_units)


def test_a_failed_concept_batch_is_reported_and_the_rerun_embeds_it(tmp_path):
    from sensegraph.index.pipeline import IndexFailed
    from sensegraph.store.tables import read_table
    from sensegraph.store.vectors import VectorIndex
    from test_pipeline import FaultyServer

    write_docs(tmp_path, DOCS)
    broken = {"on": True}

    def concept_batch(body) -> bool:  # the batch that holds this concept's title, while broken
        return broken["on"] and "Maria Okafor" in (body.get("input") or [])
    with FaultyServer(concept_batch).start() as server:
        settings = settings_for(tmp_path, server, index_method="lazy", max_retries=1)
        with pytest.raises(IndexFailed) as failed:
            index(settings)
        entities = read_table(tmp_path / "output", "entities")
        lost = failed.value.failures["embed"]
        maria = entities.loc[entities["title"] == "Maria Okafor", "id"].iloc[0]
        assert f"entities:{maria}" in lost and all(x.startswith("entities:") for x in lost)
        stored = VectorIndex.load(tmp_path / "output", "entities").ids
        assert set(stored) == set(entities["id"]) - {x.removeprefix("entities:") for x in lost}
        broken["on"] = False
        before = len(server.requests)
        again = index(settings)  # redoes what failed; the rest comes from the cache
        assert not again.failures
        sent = embedded_texts(server, before)
    assert "Maria Okafor" in sent and len(sent) == len(lost)
    assert VectorIndex.load(tmp_path / "output", "entities").ids == list(entities["id"])
