"""Memory bounded by design: the LLM-bound steps keep a window of items in progress, not the
whole corpus, and still give the rows of an all-at-once run, in the same order."""
import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from mock_llm import _chat_answer

from sensegraph.config import ChatSettings, Settings
from sensegraph.index.embed import EmbeddingRun, embed_tables
from sensegraph.index.extract import ENTITY_COLUMNS, ExtractionResult, extract_graph, graph_schema
from sensegraph.index.summarize import summarize_graph
from sensegraph.index.windows import MIN_WINDOW, WINDOW_PER_SLOT, window_of
from sensegraph.llm import strict_schema
from sensegraph.llm.client import ChatClient
from sensegraph.store.vectors import VectorIndex, VectorWriter, write_vectors


def run(coro):
    return asyncio.run(coro)


def servers(*concurrency: int) -> SimpleNamespace:
    return SimpleNamespace(all=[SimpleNamespace(concurrency=c) for c in concurrency])


class Open:
    """Items begun and not finished: `peak` is the most ever held at once."""

    def __init__(self):
        self.items: set[str] = set()
        self.peak = 0

    def begin(self, item: str) -> None:
        self.items.add(item)
        self.peak = max(self.peak, len(self.items))

    def end(self, item: str) -> None:
        self.items.discard(item)


def delay(n: int) -> float:
    # Items finish out of their order, so the rows must be put back in it.
    return 0.001 * (7 - n % 7)


class Extractor:
    """Stands in for the chat client: one call per unit (max_gleanings 0), a unit is in
    progress from its first call until it is done."""

    def __init__(self, *concurrency: int):
        self.endpoints = servers(*concurrency)
        self.open = Open()

    async def structured(self, messages, schema, *, step, item, max_tokens, **kw):
        self.open.begin(item)
        n = int(item[1:])
        await asyncio.sleep(delay(n))
        self.open.end(item)
        names = [f"Person {n}", f"Place {n}"]
        return schema.model_validate({
            "entities": [{"name": x, "type": "person", "description": f"{x} is named in unit {n}."} for x in names],
            "relationships": [{"source": names[0], "target": names[1], "description": "visits", "strength": 3}]})


def test_extraction_keeps_a_window_of_units_in_progress_and_their_rows_in_unit_order(tmp_path):
    n = 150
    texts = [f"Person {i} travelled to Place {i}." for i in range(n)]
    units = pd.DataFrame({"id": [f"u{i}" for i in range(n)], "text": texts})
    settings = Settings(root=str(tmp_path), chat={"provider": "openai", "model": "m", "base_url": "http://x/v1"},
                        extraction={"max_gleanings": 0})
    fake = Extractor(3, 2)
    done: list[int] = []
    result = run(extract_graph(units, fake, settings=settings, language="en", advance=done.append))
    window = window_of(fake)
    assert window == WINDOW_PER_SLOT * 5 < n
    # never more units held than the window, and the window kept full
    assert fake.open.peak == window and sum(done) == n and result.failed == []
    # the rows of a run that started every unit at once: unit order, then the model's order
    expected = pd.DataFrame([{"title": x, "type": "person", "description": f"{x} is named in unit {i}.",
                              "text_unit_id": f"u{i}", "round": 0}
                             for i in range(n) for x in (f"Person {i}", f"Place {i}")], columns=ENTITY_COLUMNS)
    pd.testing.assert_frame_equal(result.entities, expected)
    assert list(result.relationships["text_unit_id"]) == [f"u{i}" for i in range(n)]
    assert result.stats["entity_instances"] == 2 * n and result.stats["relationship_instances"] == n


class Summarizer:
    def __init__(self, *concurrency: int):
        self.endpoints = servers(*concurrency)
        self.open = Open()
        self.budget_reached = False

    async def complete(self, messages, *, step, item, max_tokens, **kw):
        self.open.begin(item)
        await asyncio.sleep(delay(int(item.split()[-1])))
        self.open.end(item)
        return f"Summary of {item}."


def test_summaries_keep_a_window_of_elements_in_progress(tmp_path):
    n = 120
    rows = [(f"Person {i}", "person", f"{d} description of {i}.", f"t{j}", 0)
            for i in range(n) for j, d in enumerate(("first", "second"))]
    extraction = ExtractionResult(pd.DataFrame(rows, columns=ENTITY_COLUMNS),
                                  pd.DataFrame(columns=["source", "target", "description", "strength",
                                                        "text_unit_id", "round"]),
                                  pd.DataFrame(), failed=[])
    fake = Summarizer(1, 1)
    units = pd.DataFrame({"id": ["t0", "t1"], "text": ["a", "b"]})
    entities, _, _, failed = run(summarize_graph(extraction, units, fake, settings=Settings(root=str(tmp_path)),
                                                 language="en"))
    assert fake.open.peak == window_of(fake) == MIN_WINDOW < n and failed == []
    assert list(entities["description"]) == [f"Summary of {t}." for t in entities["title"]]
    assert len(entities) == n


class Embedder:
    def __init__(self, *concurrency: int, broken: str = "broken"):
        self.endpoints = servers(*concurrency)
        self.settings = SimpleNamespace(batch_size=2)
        self.model = "fake-embed"
        self.open = Open()
        self.broken = broken

    async def embed(self, texts, *, kind, step):
        from sensegraph.llm import LLMError

        key = texts[0]
        self.open.begin(key)
        await asyncio.sleep(delay(len(key)))
        self.open.end(key)
        if any(self.broken in t for t in texts):
            raise LLMError("embed", "bad input", 1)
        return np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float32)


def test_embeddings_keep_a_window_of_batches_and_write_vectors_in_row_order(tmp_path):
    units = pd.DataFrame({"id": [f"u{i}" for i in range(80)], "text": ["x" * (i + 1) for i in range(80)]})
    entities = pd.DataFrame({"id": ["e0", "e1", "e2"], "title": ["A", "broken", "C"], "description": ["a", "b", "c"]})
    fake = Embedder(2)
    ticks: list[int] = []
    counts, failed = run(embed_tables({"text_units": units, "entities": entities}, fake, tmp_path,
                                      advance=ticks.append))
    assert fake.open.peak == window_of(fake) == MIN_WINDOW and sum(ticks) == 83
    assert counts == {"text_units": 80, "entities": 1} and failed == ["entities:e0", "entities:e1"]
    index = VectorIndex.load(tmp_path, "text_units")
    assert index.ids == list(units["id"])
    assert [int(v) for v in index.vectors[:, 0]] == [i + 1 for i in range(80)]
    assert VectorIndex.load(tmp_path, "entities").ids == ["e2"]
    assert sorted(p.name for p in (tmp_path / "embeddings").iterdir()) == ["entities.parquet", "text_units.parquet"]


def test_a_table_added_early_is_embedded_before_the_embed_step_and_every_table_is_in_row_order(tmp_path):
    units = pd.DataFrame({"id": [f"u{i}" for i in range(40)], "text": ["x" * (i + 1) for i in range(40)]})
    entities = pd.DataFrame({"id": [f"e{i}" for i in range(6)], "title": list("ABCDEF"), "description": list("abcdef")})
    reports = pd.DataFrame({"id": ["r0", "r1", "r2"], "full_content": ["# one", "# two", "# three"]})
    fake = Embedder(2)
    ticks: list[int] = []

    async def index() -> tuple[int, tuple[dict[str, int], list[str]]]:
        vectors = EmbeddingRun(fake, tmp_path)
        vectors.add("text_units", units)  # when the text units are known, before extraction

        async def extraction() -> None:  # the chat steps run meanwhile; finish() is not called yet
            while vectors.done < len(units):
                await asyncio.sleep(0.005)
        await asyncio.wait_for(extraction(), timeout=30)
        early = vectors.done
        vectors.add("entities", entities)  # after the summaries
        tables = {"text_units": units, "entities": entities, "community_reports": reports}
        return early, await embed_tables(tables, fake, tmp_path, advance=ticks.append, run=vectors)

    early, (counts, failed) = run(index())
    assert early == 40 and counts == {"text_units": 40, "entities": 6, "community_reports": 3} and failed == []
    assert sum(ticks) == 49  # the bar, made at the embed step, is advanced by what was done before it
    for name, table in (("text_units", units), ("entities", entities), ("community_reports", reports)):
        assert VectorIndex.load(tmp_path, name).ids == list(table["id"])
    assert fake.open.peak <= window_of(fake)


def test_an_embedding_run_stopped_midway_writes_no_vector_table(tmp_path):
    units = pd.DataFrame({"id": [f"u{i}" for i in range(40)], "text": ["x" * (i + 1) for i in range(40)]})
    fake = Embedder(2)

    async def stopped() -> None:
        vectors = EmbeddingRun(fake, tmp_path)
        vectors.add("text_units", units)
        while vectors.done < 4:
            await asyncio.sleep(0.001)
        vectors.task.cancel()  # what the pipeline does when a run stops (budget, Ctrl-C, an error)
        await asyncio.gather(vectors.task, return_exceptions=True)

    run(stopped())
    embeddings = tmp_path / "embeddings"
    assert not embeddings.exists() or list(embeddings.iterdir()) == []  # no table, no temporary file


def test_vector_writer_writes_what_write_vectors_writes_whatever_order_the_batches_come_in(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(10, 4)).astype(np.float32)
    ids = [f"r{i}" for i in range(10)]
    write_vectors(tmp_path / "all", "t", ids, vectors, model="m")
    writer = VectorWriter(tmp_path / "batched", "t", model="m")
    for number in (2, 0, 4, 1, 3):
        writer.add(number, ids[2 * number:2 * number + 2], vectors[2 * number:2 * number + 2])
    writer.close()
    a = pq.read_table(tmp_path / "all" / "embeddings" / "t.parquet")
    b = pq.read_table(tmp_path / "batched" / "embeddings" / "t.parquet")
    assert a.equals(b) and a.schema.metadata == b.schema.metadata
    assert [p.name for p in (tmp_path / "batched" / "embeddings").iterdir()] == ["t.parquet"]  # no spill left
    VectorWriter(tmp_path / "none", "t", model="m").close()
    assert VectorIndex.load(tmp_path / "none", "t").ids == []


def test_window_counts_every_servers_slots():
    s = ChatSettings(provider="openai", model="m", api_key="k",
                     endpoints=[{"base_url": "http://a/v1", "concurrency": 8}, {"base_url": "http://b/v1"}],
                     concurrency=5)
    assert window_of(ChatClient(s, cache=None)) == WINDOW_PER_SLOT * 13
    assert window_of(object()) == MIN_WINDOW


def test_mock_answer_scale_writes_longer_answers_with_more_items():
    text = " ".join(f"Alpha{i} Person met Beta{i} Company in Gamma{i} City. It was long ago and far away."
                    for i in range(12))
    schema = strict_schema(graph_schema(["person", "organization"], max_entities=10))
    body = {"messages": [{"role": "user", "content": text}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    usual, _ = _chat_answer(body, b"d" * 32, "ok")
    assert _chat_answer(body, b"d" * 32, "ok", answer_scale=1.0)[0] == usual
    one, three = json.loads(usual), json.loads(_chat_answer(body, b"d" * 32, "ok", answer_scale=3)[0])
    assert len(one["entities"]) == 4 and len(three["entities"]) == 10  # 12 asked, cut at maxItems
    assert len(three["entities"][0]["description"]) > 2 * len(one["entities"][0]["description"])
    plain = {"messages": [{"role": "user", "content": text}]}
    assert len(_chat_answer(plain, b"d" * 32, "ok", answer_scale=3)[0]) > 2 * len(_chat_answer(plain, b"d" * 32, "ok")[0])


def test_fingerprints_hash_a_slice_of_a_table_at_a_time_with_the_whole_tables_hash(monkeypatch):
    import hashlib

    from sensegraph.index import steps

    n = 2 * steps.FINGERPRINT_ROWS + 5
    df = pd.DataFrame({"id": [f"u{i}" for i in range(n)], "text": ["é" * (i % 30) for i in range(n)],
                       "ids": [[f"e{i}"] if i % 2 else None for i in range(n)], "n": range(n)})
    whole = hashlib.sha256(json.dumps(list(df.columns)).encode())
    for col in ("id", "text"):
        whole.update(pd.util.hash_pandas_object(df[col].astype(object), index=False).to_numpy().tobytes())
    as_json = df["ids"].map(lambda v: json.dumps(v, sort_keys=True))  # a column with lists: as JSON
    whole.update(pd.util.hash_pandas_object(as_json, index=False).to_numpy().tobytes())
    whole.update(pd.util.hash_pandas_object(df["n"], index=False).to_numpy().tobytes())
    sizes: list[int] = []
    real = pd.util.hash_pandas_object

    def hashing(obj, **kw):
        sizes.append(len(obj))
        return real(obj, **kw)
    monkeypatch.setattr(pd.util, "hash_pandas_object", hashing)
    assert steps.table_fingerprint(df) == whole.hexdigest()[:32]
    assert max(sizes) == steps.FINGERPRINT_ROWS  # never the whole text column at once


LOREM = ("The record notes meetings, letters and shared projects over several years, with details "
         "of places, dates and the people who took part in each of them.")


def community_tree(depth: int):
    """A complete binary tree of communities `depth` levels deep; each leaf holds three
    entities in a chain, each parent its children's elements plus an edge joining them. With
    long descriptions only the leaves fit a small budget: every parent needs its children."""
    entities, relationships, rows = [], [], []

    def entity(name: str) -> str:
        entities.append({"id": f"id-{name}", "human_readable_id": len(entities), "title": name, "type": "person",
                         "description": f"{name} is a person. {LOREM}", "degree": 2})
        return name

    def edge(a: str, b: str) -> str:
        rid = f"r{len(relationships)}"
        relationships.append({"id": rid, "human_readable_id": len(relationships), "source": a, "target": b,
                              "description": f"{a} works with {b}. {LOREM}", "combined_degree": 4})
        return rid

    numbers = iter(range(10**6))

    def build(level: int, parent: int) -> tuple[int, list[str], list[str]]:
        n = next(numbers)
        row = {"id": f"c{n}", "community": n, "level": level, "parent": parent, "carried": False}
        rows.append(row)
        if level == depth - 1:
            names = [entity(f"P{n}x{i}") for i in range(3)]
            edges = [edge(names[0], names[1]), edge(names[1], names[2])]
            children: list[int] = []
        else:
            kids = [build(level + 1, n) for _ in range(2)]
            names = [t for _, ts, _ in kids for t in ts]
            edges = [r for _, _, rs in kids for r in rs] + [edge(kids[0][1][0], kids[1][1][0])]
            children = [k for k, _, _ in kids]
        row.update(children=children, entity_ids=[f"id-{t}" for t in names], relationship_ids=edges,
                   size=len(names))
        return n, names, edges

    build(0, -1)
    comms = pd.DataFrame(rows).sort_values("community", ignore_index=True)
    return comms, pd.DataFrame(entities), pd.DataFrame(relationships)


class ReportWriter:
    """Stands in for the chat client: an answer that depends on the context alone (so any order
    of the calls gives the same reports), and the most calls ever in progress at once."""

    def __init__(self, *concurrency: int):
        self.endpoints = servers(*concurrency)
        self.open = Open()
        self.calls = 0

    async def structured(self, messages, schema, *, step, item, max_tokens, **kw):
        import hashlib
        import re

        self.open.begin(item)
        self.calls += 1
        await asyncio.sleep(delay(int(item)))
        self.open.end(item)
        prompt = "\n".join(m["content"] for m in messages)
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        cited = re.search(r"## Report (\d+):", prompt)
        citation = (f"[Data: Reports ({cited.group(1)})]" if cited else
                    f"[Data: Entities ({prompt.split('-----Entities-----')[1].splitlines()[2].split(',')[0]})]")
        return schema.model_validate({
            "title": f"Report {digest}", "summary": f"About {digest}.", "rating": int(digest, 16) % 10,
            "rating_explanation": "Because.",
            "findings": [{"summary": f"Finding {digest}", "explanation": f"It holds. {citation}"}]})


def reports_of(comms, entities, relationships, fake, ticks=None):
    from sensegraph.config import ReportSettings
    from sensegraph.index.community_reports import write_reports

    settings = Settings(reports=ReportSettings(max_input_tokens=500, max_tokens=800))

    async def go():
        # a guard against a deadlock, not a timing assertion
        return await asyncio.wait_for(write_reports(comms, entities, relationships, None, fake, settings=settings,
                                                    language="en", advance=(ticks if ticks is not None else []).append), 60)
    return run(go())


def test_community_reports_keep_a_window_of_communities_in_progress():
    comms, entities, relationships = community_tree(6)  # 63 communities, 32 leaves
    fake = ReportWriter(1, 1)
    ticks: list[int] = []
    table, failed = reports_of(comms, entities, relationships, fake, ticks)
    assert failed == [] and sum(ticks) == len(comms) == len(table) == fake.calls == 63
    # never more communities in progress than the window (each holds its context), and the
    # window kept full: before, all 32 leaves were started at once
    assert fake.open.peak == window_of(fake) == MIN_WINDOW
    assert table["used_sub_reports"].sum() == 31  # every parent was composed from its children


def test_a_small_window_over_a_deep_hierarchy_gives_the_tables_of_an_all_at_once_run(monkeypatch):
    from sensegraph.index import community_reports

    comms, entities, relationships = community_tree(7)  # 127 communities, every parent waits for its children
    tables = {}
    for window in (1, 2, 3, len(comms)):  # the last: every community at once, as before the windows
        monkeypatch.setattr(community_reports, "window_of", lambda llm, w=window: w, raising=False)
        fake = ReportWriter(1)
        tables[window], failed = reports_of(comms, entities, relationships, fake)
        assert failed == [] and fake.open.peak == min(window, 64)
    for window in (1, 2, 3):
        pd.testing.assert_frame_equal(tables[window], tables[len(comms)])
    assert len(tables[1]) == 127 and tables[1]["used_sub_reports"].sum() == 63
