import json
from pathlib import Path

import pytest

from sensegraph.config import load_settings
from sensegraph.index.documents import InputError, load_documents
from sensegraph.store.tables import TABLES


def _load(root: Path, **input_settings):
    settings = load_settings(root, overrides={"input": input_settings} if input_settings else None, env={})
    warnings: list[str] = []
    return load_documents(settings, warn=warnings.append), warnings


def _input(root: Path) -> Path:
    folder = root / "input"
    folder.mkdir(exist_ok=True)
    return folder


def test_txt_and_md_are_one_document_each_sorted_by_path(tmp_path):
    folder = _input(tmp_path)
    (folder / "b.md").write_text("# Heading\n\nSome markdown.", encoding="utf-8")
    (folder / "sub").mkdir()
    (folder / "sub" / "c.txt").write_text("Nested file.", encoding="utf-8")
    (folder / "a.txt").write_text("Hello world.", encoding="utf-8")
    (folder / "notes.pdf").write_bytes(b"%PDF-1.4")  # not a configured type: ignored
    (folder / ".hidden.txt").write_text("hidden", encoding="utf-8")
    docs, warnings = _load(tmp_path)
    assert warnings == []
    assert docs["title"].tolist() == ["a.txt", "b.md", "sub/c.txt"]
    assert docs["path"].tolist() == ["a.txt", "b.md", "sub/c.txt"]
    assert docs["human_readable_id"].tolist() == [0, 1, 2]
    assert docs["text"][0] == "Hello world."
    assert all(c in docs.columns for c in TABLES["documents"])
    assert docs["text_unit_ids"].tolist() == [[], [], []]
    assert docs["raw_data"].isna().all()
    assert docs["creation_date"][0].endswith("+00:00") and "T" in docs["creation_date"][0]
    assert docs["id"].is_unique


def test_ids_are_stable_across_runs(tmp_path):
    folder = _input(tmp_path)
    (folder / "a.txt").write_text("Stable text.", encoding="utf-8")
    first, _ = _load(tmp_path)
    second, _ = _load(tmp_path)
    assert first["id"].tolist() == second["id"].tolist()
    (folder / "a.txt").write_text("Changed text.", encoding="utf-8")
    third, _ = _load(tmp_path)
    assert third["id"][0] != first["id"][0]


def test_duplicate_texts_keep_both_with_distinct_ids_and_warn(tmp_path):
    folder = _input(tmp_path)
    (folder / "one.txt").write_text("The same words.", encoding="utf-8")
    (folder / "two.txt").write_text("The same words.", encoding="utf-8")
    docs, warnings = _load(tmp_path)
    assert len(docs) == 2 and docs["id"].is_unique
    assert any("two.txt" in w and "one.txt" in w for w in warnings)


def test_repeated_csv_rows_still_get_distinct_ids(tmp_path):
    folder = _input(tmp_path)
    (folder / "rows.csv").write_text("title,text\nsame,words\nsame,words\n", encoding="utf-8")
    docs, warnings = _load(tmp_path)
    assert len(docs) == 2 and docs["id"].is_unique
    assert warnings


def test_utf8_bom_is_stripped(tmp_path):
    folder = _input(tmp_path)
    (folder / "bom.txt").write_bytes("\ufeffCafé au lait".encode("utf-8"))
    docs, warnings = _load(tmp_path)
    assert docs["text"][0] == "Café au lait" and warnings == []


def test_gb18030_chinese_is_detected(tmp_path):
    folder = _input(tmp_path)
    text = "孙悟空大闹天宫，花果山水帘洞美猴王。"
    (folder / "gb.txt").write_bytes(text.encode("gb18030"))
    (folder / "utf8.txt").write_text(text + "（UTF-8）", encoding="utf-8")
    docs, warnings = _load(tmp_path)
    assert docs["text"].tolist() == [text, text + "（UTF-8）"]
    assert warnings == []


def test_unknown_encoding_is_skipped_with_warning_then_read_when_configured(tmp_path):
    folder = _input(tmp_path)
    (folder / "latin.txt").write_bytes("Ça va très bien, naïve façade.".encode("latin-1"))
    (folder / "ok.txt").write_text("fine", encoding="utf-8")
    docs, warnings = _load(tmp_path)
    assert docs["title"].tolist() == ["ok.txt"]
    assert any("latin.txt" in w and "input.encoding" in w for w in warnings)
    docs, warnings = _load(tmp_path, encoding="latin-1")
    assert docs["text"][0] == "Ça va très bien, naïve façade."


def test_empty_and_binary_files_are_skipped_with_a_warning_naming_them(tmp_path):
    folder = _input(tmp_path)
    (folder / "empty.txt").write_bytes(b"")
    (folder / "blank.md").write_text("  \n\t\n", encoding="utf-8")
    (folder / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (folder / "noise.txt").write_bytes(bytes([0xFF, 0xFE, 0x80, 0x81]) * 40 + b"\xff")
    (folder / "good.txt").write_text("Real text.", encoding="utf-8")
    docs, warnings = _load(tmp_path)
    assert docs["title"].tolist() == ["good.txt"]
    for name in ("empty.txt", "blank.md", "image.txt", "noise.txt"):
        assert any(name in w for w in warnings), name


def test_empty_folder_says_where_and_what_to_put(tmp_path):
    folder = _input(tmp_path)
    with pytest.raises(InputError) as err:
        _load(tmp_path)
    msg = str(err.value)
    assert str(folder) in msg and ".txt" in msg and ".jsonl" in msg
    assert isinstance(err.value, ValueError)


def test_missing_folder_and_only_unusable_files_are_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        _load(tmp_path)
    folder = _input(tmp_path)
    (folder / "empty.txt").write_bytes(b"")
    with pytest.raises(InputError, match="usable"):
        _load(tmp_path)


def test_csv_rows_with_title_and_metadata(tmp_path):
    folder = _input(tmp_path)
    (folder / "news.csv").write_text(
        "headline,body,author,year\n"
        'First,"Line one,\nline two",Ann,2020\n'
        "Second,Just text,Bob,2021\n"
        ",Untitled row,Cy,2022\n"
        "Empty,,Dee,2023\n",
        encoding="utf-8",
    )
    docs, warnings = _load(tmp_path, text_field="body", title_field="headline", metadata_fields=["author", "year"])
    assert docs["title"].tolist() == ["First", "Second", "news.csv#3"]
    assert docs["text"][0] == "Line one,\nline two"
    assert docs["raw_data"][1] == {"author": "Bob", "year": "2021"}
    assert docs["path"].tolist() == ["news.csv"] * 3
    assert any("news.csv" in w and "empty" in w for w in warnings)


def test_csv_without_title_field_uses_file_and_row(tmp_path):
    folder = _input(tmp_path)
    (folder / "t.csv").write_text("text\nalpha\nbeta\n", encoding="utf-8")
    docs, _ = _load(tmp_path)
    assert docs["title"].tolist() == ["t.csv#1", "t.csv#2"]


def test_csv_missing_text_field_names_file_field_and_setting(tmp_path):
    folder = _input(tmp_path)
    (folder / "bad.csv").write_text("title,content\na,b\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        _load(tmp_path)
    msg = str(err.value)
    assert "bad.csv" in msg and "'text'" in msg and "input.text_field" in msg and "content" in msg


def test_json_object_and_list(tmp_path):
    folder = _input(tmp_path)
    (folder / "one.json").write_text(json.dumps({"title": "Solo", "text": "Only one.", "src": "x"}), encoding="utf-8")
    (folder / "many.json").write_text(
        json.dumps([{"title": "A", "text": "First."}, {"text": "Second.", "src": "y"}], ensure_ascii=False),
        encoding="utf-8",
    )
    docs, warnings = _load(tmp_path, metadata_fields=["src"])
    assert docs["title"].tolist() == ["A", "many.json#2", "Solo"]
    assert docs["text"].tolist() == ["First.", "Second.", "Only one."]
    assert docs["raw_data"].tolist() == [{"src": None}, {"src": "y"}, {"src": "x"}]
    assert any("many.json#1" in w and "src" in w for w in warnings)


def test_jsonl_one_document_per_line(tmp_path):
    folder = _input(tmp_path)
    lines = [{"name": "n1", "content": "第一行"}, {"name": "n2", "content": "second"}]
    (folder / "d.jsonl").write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n\n", encoding="utf-8")
    docs, _ = _load(tmp_path, text_field="content", title_field="name")
    assert docs["title"].tolist() == ["n1", "n2"]
    assert docs["text"].tolist() == ["第一行", "second"]


def test_json_missing_text_field_names_record_and_setting(tmp_path):
    folder = _input(tmp_path)
    (folder / "d.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n', encoding="utf-8")
    with pytest.raises(InputError) as err:
        _load(tmp_path)
    msg = str(err.value)
    assert "d.jsonl#2" in msg and "'text'" in msg and "input.text_field" in msg


def test_invalid_json_names_the_file(tmp_path):
    folder = _input(tmp_path)
    (folder / "broken.json").write_text('{"text": "unterminated', encoding="utf-8")
    with pytest.raises(InputError, match="broken.json"):
        _load(tmp_path)


def test_file_types_setting_limits_what_is_read(tmp_path):
    folder = _input(tmp_path)
    (folder / "a.txt").write_text("text file", encoding="utf-8")
    (folder / "b.md").write_text("markdown file", encoding="utf-8")
    docs, _ = _load(tmp_path, file_types=["md"])
    assert docs["title"].tolist() == ["b.md"]


def test_real_corpus_loads(tmp_path, shared_data):
    folder = _input(tmp_path)
    (folder / "xiyouji.txt").write_bytes((shared_data / "xiyouji-ch01-07.txt").read_bytes())
    (folder / "xiyouji-gb.txt").write_bytes(
        (shared_data / "xiyouji-ch01-07.txt").read_text(encoding="utf-8").encode("gb18030")
    )
    docs, warnings = _load(tmp_path)
    assert docs["text"][0] == docs["text"][1]
    assert docs["id"].is_unique
    assert any("same text" in w for w in warnings)


def test_mixed_type_metadata_can_be_written_to_parquet(tmp_path):
    from sensegraph.store.tables import read_table, write_table

    folder = _input(tmp_path)
    records = [
        {"text": "a", "year": 2020, "tags": ["x", "y"], "n": 1.5},
        {"text": "b", "year": "2021", "tags": {"k": 1}, "n": 2.5},
        {"text": "c"},
    ]
    (folder / "m.jsonl").write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    docs, _ = _load(tmp_path, metadata_fields=["year", "tags", "n"])
    write_table(docs, tmp_path / "output", "documents")
    back = read_table(tmp_path / "output", "documents")
    assert back["raw_data"].tolist() == [
        {"year": "2020", "tags": '["x", "y"]', "n": 1.5},
        {"year": "2021", "tags": '{"k": 1}', "n": 2.5},
        {"year": None, "tags": None, "n": None},
    ]


def test_csv_cells_longer_than_the_csv_default_limit(tmp_path):
    folder = _input(tmp_path)
    long_text = "word " * 60_000  # 300 KB in one cell
    (folder / "big.csv").write_text(f'title,text\nbig,"{long_text}"\n', encoding="utf-8")
    docs, _ = _load(tmp_path)
    assert docs["text"][0] == long_text


def test_binary_file_skipped_with_configured_encoding(tmp_path):
    folder = _input(tmp_path)
    (folder / "blob.txt").write_bytes(b"abc\x00\x00def")
    (folder / "ok.txt").write_text("fine", encoding="utf-8")
    docs, warnings = _load(tmp_path, encoding="utf-8")
    assert docs["title"].tolist() == ["ok.txt"]
    assert any("blob.txt" in w and "binary" in w for w in warnings)


def test_the_table_is_the_one_built_from_rows_whatever_the_chunks(tmp_path, monkeypatch):
    import pandas as pd

    from sensegraph.store import text_column
    from sensegraph.store.tables import content_id

    folder = _input(tmp_path)
    for i in range(7):
        (folder / f"f{i}.txt").write_text(f"File {i} says hello." if i != 5 else "File 0 says hello.", encoding="utf-8")
    (folder / "g.jsonl").write_text('{"text": "one", "year": 2020}\n{"text": "two", "year": "2021"}\n', encoding="utf-8")
    monkeypatch.setattr(text_column, "CHUNK_ROWS", 2)  # several Arrow chunks
    docs, warnings = _load(tmp_path, file_types=["txt", "jsonl"], metadata_fields=["year"])
    assert warnings == ["f5.txt has the same text as f0.txt; both are kept as separate documents"]
    created = docs["creation_date"].tolist()
    rows = [{"id": content_id(f"f{i}.txt", t), "human_readable_id": i, "title": f"f{i}.txt", "text": t,
             "text_unit_ids": [], "creation_date": created[i], "raw_data": None, "path": f"f{i}.txt"}
            for i, t in enumerate(f"File {i if i != 5 else 0} says hello." for i in range(7))]
    rows += [{"id": content_id(f"g.jsonl#{n}", t), "human_readable_id": 6 + n, "title": f"g.jsonl#{n}", "text": t,
              "text_unit_ids": [], "creation_date": created[6 + n], "raw_data": {"year": y}, "path": "g.jsonl"}
             for n, t, y in ((1, "one", "2020"), (2, "two", "2021"))]  # mixed types: stored as text
    pd.testing.assert_frame_equal(docs, pd.DataFrame(rows, columns=list(docs.columns)), check_index_type=True)


def test_documents_text_is_not_held_as_python_strings_while_the_table_is_built(tmp_path, monkeypatch):
    import tracemalloc

    import pandas as pd

    from sensegraph.store import text_column

    dtype = pd.Series(["x"]).dtype
    if not (isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow"):
        pytest.skip("pandas keeps strings as Python objects: nothing to save")
    folder = _input(tmp_path)
    for i in range(100):
        (folder / f"doc{i:03}.txt").write_text(f"Document {i}. " + "Words of a transcript, said aloud. " * 570,
                                               encoding="utf-8")
    settings = load_settings(tmp_path, env={})
    monkeypatch.setattr(text_column, "CHUNK_ROWS", 8)
    tracemalloc.start()
    try:
        docs = load_documents(settings, warn=lambda m: None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    text_chars = int(docs["text"].str.len().sum())
    assert len(docs) == 100 and text_chars > 1_900_000
    # Python-side peak: a chunk of texts and the ids, titles and paths. Every text alive at once
    # as a Python string is the corpus text itself.
    assert peak < text_chars / 2
