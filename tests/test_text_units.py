import pandas as pd
import pytest

from sensegraph.index.text_units import link_documents, make_text_units, split_text
from sensegraph.store.tables import content_id
from sensegraph.tokens import count_tokens, encode, encoding


def _docs(*texts: str) -> pd.DataFrame:
    return pd.DataFrame({
        "id": [content_id(f"doc{i}", t) for i, t in enumerate(texts)],
        "human_readable_id": list(range(len(texts))),
        "title": [f"doc{i}.txt" for i in range(len(texts))],
        "text": list(texts),
        "text_unit_ids": [[] for _ in texts],
    })


ENGLISH = " ".join(
    f"Sentence number {i} tells of Scrooge, Marley and the ghost of Christmas {['past', 'present', 'yet to come'][i % 3]}."
    for i in range(400)
)


def _mid_character_boundaries(text: str) -> int:
    data, pos, inside = text.encode("utf-8"), 0, 0
    for token in encode(text)[:-1]:
        pos += len(encoding().decode_single_token_bytes(token))
        inside += (data[pos] & 0xC0) == 0x80
    return inside


def _check_cover(text: str, units: list[tuple[int, str, int]]) -> None:
    """Each unit is the document's text at its offset, and together they cover every character."""
    covered_to = 0
    for start, piece, _ in units:
        assert text[start:start + len(piece)] == piece
        assert start <= covered_to, "gap between units"
        covered_to = max(covered_to, start + len(piece))
    assert units[0][0] == 0 and covered_to == len(text)


@pytest.mark.parametrize("size,overlap", [(600, 100), (100, 0), (64, 32), (16, 15)])
def test_size_overlap_and_coverage_english(size, overlap):
    units = split_text(ENGLISH, size=size, overlap=overlap)
    assert len(units) > 2
    for _, piece, n in units:
        assert n == count_tokens(piece) <= size
    # every unit but the last is (nearly) full
    assert all(n >= size - 2 for _, _, n in units[:-1])
    for (s1, p1, _), (s2, _, _) in zip(units, units[1:]):
        shared = p1[s2 - s1:] if s2 < s1 + len(p1) else ""
        assert abs(count_tokens(shared) - overlap) <= 2 if shared else overlap == 0
    _check_cover(ENGLISH, units)


def test_chinese_never_splits_a_character(shared_data):
    text = (shared_data / "xiyouji-ch01-07.txt").read_text(encoding="utf-8")
    # The test only means something if token boundaries really do fall inside characters.
    assert _mid_character_boundaries(text) > 1000
    for size, overlap in [(600, 100), (37, 11)]:
        units = split_text(text, size=size, overlap=overlap)
        for _, piece, n in units:
            assert "\ufffd" not in piece
            assert piece in text
            assert n <= size
        _check_cover(text, units)


def test_chinese_edges_inside_characters_are_moved():
    # Rare characters take several tokens each, so many window edges land inside one.
    text = "龘靐齉爩麤鱻" * 50 + "混沌未分天地乱，茫茫渺渺无人见。" * 20
    assert _mid_character_boundaries(text) > 100
    units = split_text(text, size=16, overlap=5)
    for _, piece, n in units:
        assert piece and "\ufffd" not in piece and n <= 16
    _check_cover(text, units)


def test_make_text_units_table_and_ids():
    docs = _docs(ENGLISH, "A short second document.", "")
    units = make_text_units(docs, size=200, overlap=50)
    assert list(units.columns[:5]) == ["id", "human_readable_id", "text", "n_tokens", "document_id"]
    assert units["human_readable_id"].tolist() == list(range(len(units)))
    assert units["id"].is_unique
    first = units[units["document_id"] == docs["id"][0]]
    assert first["chunk_index"].tolist() == list(range(len(first)))
    assert units["document_ids"].map(len).eq(1).all()
    assert (units["document_ids"].str[0] == units["document_id"]).all()
    last = units.iloc[-1]
    assert last["document_id"] == docs["id"][1] and last["text"] == "A short second document."
    assert last["n_tokens"] == count_tokens(last["text"])
    assert (units["n_tokens"] <= 200).all()
    # same input, same ids: ids are content hashes
    again = make_text_units(docs, size=200, overlap=50)
    assert again["id"].tolist() == units["id"].tolist()
    assert units["id"][0] == content_id(docs["id"][0], units["text"][0])


def test_repeated_passages_get_distinct_ids():
    docs = _docs("word " * 1000)
    units = make_text_units(docs, size=50, overlap=0)
    assert len(units) > 10 and units["id"].is_unique
    assert units["text"].nunique() < len(units)


def test_link_documents_fills_text_unit_ids_in_order():
    docs = _docs(ENGLISH, "Short.")
    units = make_text_units(docs, size=300, overlap=30)
    linked = link_documents(docs, units)
    assert docs["text_unit_ids"].tolist() == [[], []]  # input untouched
    ids0 = units[units["document_id"] == docs["id"][0]].sort_values("chunk_index")["id"].tolist()
    assert linked["text_unit_ids"][0] == ids0
    assert len(linked["text_unit_ids"][1]) == 1


def test_documents_follow_human_readable_order():
    docs = _docs("first doc", "second doc").iloc[::-1]
    units = make_text_units(docs, size=50, overlap=10)
    assert units["text"].tolist() == ["first doc", "second doc"]


@pytest.mark.parametrize("size,overlap", [(0, 0), (10, 10), (10, -1)])
def test_bad_sizes_are_refused(size, overlap):
    with pytest.raises(ValueError):
        make_text_units(_docs("x"), size=size, overlap=overlap)


def _strings_in_arrow() -> bool:
    dtype = pd.Series(["x"]).dtype
    return isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow"


def test_the_table_is_the_one_built_from_rows_whatever_the_chunks(monkeypatch):
    from sensegraph.store import text_column

    monkeypatch.setattr(text_column, "CHUNK_ROWS", 3)  # several Arrow chunks
    repeated = "The same passage again. " * 40
    docs = _docs(ENGLISH, "短い文章です。" * 150, "", repeated + repeated)
    units = make_text_units(docs, size=60, overlap=10)
    rows = []
    for doc_id, text in zip(docs["id"], docs["text"]):  # the table as it was built: a dict per unit
        used: set[str] = set()
        for index, (_, piece, count) in enumerate(split_text(text, size=60, overlap=10)):
            unit_id = content_id(doc_id, piece)
            if unit_id in used:
                unit_id = content_id(doc_id, piece, str(index))
            used.add(unit_id)
            rows.append({"id": unit_id, "human_readable_id": len(rows), "text": piece, "n_tokens": count,
                         "document_id": doc_id, "document_ids": [doc_id], "chunk_index": index})
    expected = pd.DataFrame(rows, columns=list(units.columns)).astype(
        {"human_readable_id": "int64", "n_tokens": "int64", "chunk_index": "int64"})
    assert len(units) > 3 * 3
    pd.testing.assert_frame_equal(units, expected, check_index_type=True)
    empty = make_text_units(docs.iloc[2:3], size=60, overlap=10)
    pd.testing.assert_frame_equal(empty, expected.iloc[0:0].astype({c: object for c in ("id", "text", "document_id")}),
                                  check_index_type=True)
    assert list(empty.dtypes.astype(str)) == ["object", "int64", "object", "int64", "object", "object", "int64"]


@pytest.mark.skipif(not _strings_in_arrow(), reason="pandas keeps strings as Python objects: nothing to save")
def test_units_text_is_not_held_as_python_strings_while_the_table_is_built(monkeypatch):
    import tracemalloc

    from sensegraph.store import text_column

    monkeypatch.setattr(text_column, "CHUNK_ROWS", 16)
    docs = _docs(*(f"Document {d}. " + ENGLISH[:20_000] for d in range(100)))
    text_chars = int(docs["text"].str.len().sum())
    make_text_units(_docs(ENGLISH), size=600, overlap=100)  # the tokenizer's tables, loaded once
    tracemalloc.start()
    try:
        units = make_text_units(docs, size=600, overlap=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert int(units["text"].str.len().sum()) > text_chars  # the overlap: more unit text than text
    # Python-side peak: the ids, a chunk of unit texts and one document's tokens. Every unit's
    # text alive at once as a Python string (a dict per row) is more than the corpus text.
    assert peak < text_chars / 2
