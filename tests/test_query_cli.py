"""`sensegraph query` and the Python API against the mock OpenAI-compatible server, over the
synthetic index of test_query.py written to disk as parquet."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import sensegraph
from mock_llm import start_mock_server
from sensegraph.cli import main as cli_main
from sensegraph.store.tables import write_table
from test_query import synthetic_index


@pytest.fixture
def project(tmp_path):
    with start_mock_server() as server:
        (tmp_path / "settings.yaml").write_text(
            "chat:\n"
            f"  provider: openai\n  model: m\n  base_url: {server.base_url}\n  api_key: k\n"
            "embedding:\n"
            f"  provider: openai\n  model: e\n  base_url: {server.base_url}\n  api_key: k\n",
            encoding="utf-8")
        index = synthetic_index(tmp_path / "output")
        for name, df in index.tables.items():
            write_table(df, tmp_path / "output", name)
        yield tmp_path, server


def test_query_json_has_answer_citations_context_and_usage(project):
    root, server = project
    res = CliRunner().invoke(cli_main, ["query", "What are the main themes?", "--root", str(root),
                                        "--level", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["method"] == "global" and data["answer"]
    assert data["stats"]["level"] == 1 and data["stats"]["map_calls"] >= 1
    # level 1 projects to reports 1, 2, 3: the full context lists exactly those
    assert sorted(r["community"] for r in data["context"]["records"]["Reports"]) == [1, 2, 3]
    assert data["usage"]["calls"] == data["stats"]["map_calls"] + data["stats"]["reduce_calls"]
    # the same question again is answered from the cache
    again = json.loads(CliRunner().invoke(cli_main, ["query", "What are the main themes?", "--root", str(root),
                                                     "--level", "1", "--json"]).stdout)
    assert again["usage"]["calls"] == 0 and again["answer"] == data["answer"]


def test_query_stream_prints_the_answer_and_a_cost_footer(project):
    root, server = project
    res = CliRunner().invoke(cli_main, ["query", "Who is ENTITY 3?", "--root", str(root), "-m", "local", "--stream"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip()
    assert "LLM calls" in res.stderr and "local" in res.stderr


def test_query_without_an_index_says_what_to_do(tmp_path):
    res = CliRunner().invoke(cli_main, ["query", "anything", "--root", str(tmp_path)])
    assert res.exit_code == 2
    assert "sensegraph index" in res.stderr


def test_query_rejects_dynamic_with_local(project):
    root, _ = project
    res = CliRunner().invoke(cli_main, ["query", "x", "--root", str(root), "-m", "local", "--dynamic"])
    assert res.exit_code == 2 and "--dynamic" in res.stderr


def test_python_api_per_method_functions(project):
    root, _ = project
    for fn, method in ((sensegraph.basic_search, "basic"), (sensegraph.text_search, "text")):
        result = fn("What happened at the harbor?", root=root)
        assert result.method == method and result.answer
        assert result.context_tables["Sources"].shape[0] == result.context.units
    result = sensegraph.search("Tell me about ENTITY 2", "local", root=root,
                               history=[{"role": "user", "content": "Who is ENTITY 1?"}])
    assert "ENTITY 2" in set(result.context_tables["Entities"]["title"])


def test_demo_ends_with_a_global_and_a_local_answer(tmp_path):
    with start_mock_server() as server:
        (tmp_path / "settings.yaml").write_text(
            f"chat:\n  provider: openai\n  model: m\n  base_url: {server.base_url}\n  api_key: k\n"
            f"embedding:\n  provider: openai\n  model: e\n  base_url: {server.base_url}\n  api_key: k\n",
            encoding="utf-8")
        res = CliRunner().invoke(cli_main, ["demo", "--root", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())  # rich wraps long lines
    assert "--method global" in out and "--method local" in out
    assert "Einar Lund" in out  # the local question names an entity of the demo corpus
    assert " ".join(res.stderr.split()).count("LLM calls") == 2  # one cost footer per question
