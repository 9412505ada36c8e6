"""Query methods on a lazy index (no community reports): global and DRIFT search say that a lazy
index has no reports and which method to use, from the query API (so the CLI, the server and
Python callers all get it) and before any model call; local search works, from the concept
vectors the index made (or, on an index made before it embedded them, from vectors embedded the
first time it is asked)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("spacy")

from click.testing import CliRunner  # noqa: E402

from mock_llm import start_mock_server  # noqa: E402
from sensegraph.cli import main as cli_main  # noqa: E402
from sensegraph.query import Searcher  # noqa: E402
from test_pipeline import DOCS, index, settings_for, write_docs  # noqa: E402

QUESTION = "Who founded the Harbor Cooperative?"


@pytest.fixture(scope="module")
def lazy(tmp_path_factory):
    """(project folder, mock server, settings) of a lazy index built by the pipeline."""
    root = tmp_path_factory.mktemp("lazy-project")
    write_docs(root, DOCS)
    with start_mock_server() as server:
        settings = settings_for(root, server, index_method="lazy")
        index(settings)
        yield root, server, settings


def chat_requests(server) -> list[dict]:
    return [b for b in server.requests if "messages" in b]


def _ask(settings, method: str, **options):
    logged: list[str] = []

    async def go():
        searcher = Searcher.open(settings, log=logged.append)
        try:
            return await searcher.query(QUESTION, method, **options)
        finally:
            await searcher.aclose()
    return asyncio.run(go()), logged


@pytest.mark.parametrize("method, options", [("global", {}), ("global", {"dynamic": True}), ("drift", {})])
def test_report_methods_on_a_lazy_index_say_what_to_use(lazy, method, options):
    from sensegraph.query import MethodUnavailable

    _, server, settings = lazy
    before = len(chat_requests(server))
    with pytest.raises(MethodUnavailable) as raised:
        _ask(settings, method, **options)
    message = str(raised.value)
    assert isinstance(raised.value, ValueError) and "\n" not in message
    assert message.startswith(f"{method} search reads community reports") and "lazy index" in message
    for remedy in ("--method lazy", "basic", "sensegraph index --method standard"):
        assert remedy in message, remedy
    assert len(chat_requests(server)) == before  # nothing was asked


def embedded_texts(server, since: int = 0) -> list[str]:
    return [t for b in list(server.requests)[since:] if "input" in b for t in b["input"]]


def only_question_and_facts(texts: list[str], settings) -> bool:
    """Whether a local question embedded only itself and the fact sentences of the walk (each a
    sentence of a text unit, of at most query.walk_fact_units units): no concept, no unit."""
    import pandas as pd

    from sensegraph.query.graph_walk import FACT_TOKENS
    from sensegraph.query.passages import sentences

    units = pd.read_parquet(Path(settings.root) / "output" / "text_units.parquet")["text"].tolist()
    whole = {x.strip() for u in units for x in sentences(u, FACT_TOKENS)}
    facts = set(texts) - {QUESTION}
    return facts <= whole and len({u for u in units for f in facts if f in u}) <= settings.query.walk_fact_units * 2


def test_local_search_on_a_lazy_index_embeds_only_the_question(lazy):
    root, server, settings = lazy
    assert (root / "output" / "embeddings" / "entities.parquet").exists()  # the index embedded its concepts
    before = len(server.requests)
    result, logged = _ask(settings, "local")
    assert result.stats["context_units"] > 0 and result.stats["sections"]["Entities"]["rows"] > 0
    assert not [m for m in logged if m.startswith("embedding")], logged
    # (none once the question is cached)
    assert only_question_and_facts(embedded_texts(server, before), settings), embedded_texts(server, before)


def test_a_lazy_index_without_concept_vectors_embeds_them_on_the_first_question(lazy, tmp_path):
    """A lazy index built before its concepts were embedded with it: the first local question
    embeds them, says so, and writes them; the same texts as the index embeds (every one is
    found in the cache the index filled), so the vectors are the index's."""
    from sensegraph.store.vectors import VectorIndex

    root, server, settings = lazy
    vectors = root / "output" / "embeddings" / "entities.parquet"
    made = VectorIndex.load(root / "output", "entities")
    kept = tmp_path / "entities.parquet"
    vectors.rename(kept)
    try:
        before = len(server.requests)
        result, logged = _ask(settings, "local")
        assert result.stats["context_units"] > 0
        said = [m for m in logged if m.startswith("embedding")]
        assert len(said) == 1 and f"embedding {len(made.ids)} concepts of this lazy index" in said[0], logged
        assert only_question_and_facts(embedded_texts(server, before), settings)  # the concepts' were cached
        assert vectors.exists()
        again = VectorIndex.load(root / "output", "entities")
        assert again.ids == made.ids and (again.vectors == made.vectors).all()
        _, logged = _ask(settings, "local")
        assert not [m for m in logged if m.startswith("embedding")]
    finally:
        kept.replace(vectors)


def test_the_command_line_says_it_in_one_line(lazy):
    root, server, _ = lazy
    env = {"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__BASE_URL": server.base_url,
           "SENSEGRAPH_CHAT__MODEL": "mock", "SENSEGRAPH_CHAT__API_KEY": "x",
           "SENSEGRAPH_EMBEDDING__PROVIDER": "openai", "SENSEGRAPH_EMBEDDING__BASE_URL": server.base_url,
           "SENSEGRAPH_EMBEDDING__MODEL": "mock", "SENSEGRAPH_EMBEDDING__API_KEY": "x",
           "SENSEGRAPH_CHUNKS__SIZE": "120", "SENSEGRAPH_CHUNKS__OVERLAP": "20"}
    for method in ("global", "drift"):
        res = CliRunner().invoke(cli_main, ["query", QUESTION, "--method", method, "--root", str(root)], env=env)
        assert res.exit_code == 2, res.output
        said = " ".join(res.stderr.split())
        assert said.startswith("error: ") and said.count("error:") == 1 and "--method lazy" in said, res.output
        assert "Traceback" not in res.output and "could not find" not in res.stdout
    asked = CliRunner().invoke(cli_main, ["query", QUESTION, "--method", "basic", "--json", "--root", str(root)],
                               env=env)
    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.stdout[asked.stdout.index("{"):])["method"] == "basic"


def test_a_standard_index_without_reports_is_not_taken_for_a_lazy_one(lazy, tmp_path):
    from sensegraph.query import GraphIndex

    root = lazy[0]
    stats = json.loads((root / "output" / "stats.json").read_text())
    assert GraphIndex.load(root / "output").lazy
    standard = {k: v for k, v in stats["steps"].items() if k not in ("concepts", "concept_graph")}
    copy = tmp_path / "output"
    copy.mkdir()
    for p in (root / "output").glob("*.parquet"):
        (copy / p.name).write_bytes(p.read_bytes())
    (copy / "stats.json").write_text(json.dumps({**stats, "steps": {**standard, "extract": {}, "summarize": {}}}))
    assert not GraphIndex.load(copy).lazy  # a standard index whose reports all failed
    (copy / "stats.json").unlink()
    assert GraphIndex.load(copy).lazy  # a copied index without stats.json: communities but no reports
