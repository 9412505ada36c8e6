import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sensegraph.store import tables
from sensegraph.store.tables import (
    TABLES, TableError, content_id, has_table, read_table, write_json_atomic, write_table,
)


def _documents(n: int = 2) -> pd.DataFrame:
    return pd.DataFrame({
        "id": [content_id("d", str(i)) for i in range(n)],
        "human_readable_id": list(range(n)),
        "title": [f"doc{i}.txt" for i in range(n)],
        "text": [f"text {i}" for i in range(n)],
        "text_unit_ids": [[f"u{i}a", f"u{i}b"] for i in range(n)],
        "creation_date": ["2024-01-01T00:00:00+00:00"] * n,
        "raw_data": [None] * n,
    })


def test_content_id_is_stable_and_separates_parts():
    assert content_id("a", "b") == content_id("a", "b")
    assert len(content_id("x")) == 64
    assert content_id("ab", "c") != content_id("a", "bc")
    assert content_id("a", "b") != content_id("b", "a")


def test_write_and_read_round_trip_with_list_columns(tmp_path):
    df = _documents()
    df["extra"] = [1.5, 2.5]  # extra columns are allowed and kept
    path = write_table(df, tmp_path, "documents")
    assert path == tmp_path / "documents.parquet"
    assert has_table(tmp_path, "documents")
    back = read_table(tmp_path, "documents")
    assert list(back.columns) == list(df.columns)
    assert back["text_unit_ids"].tolist() == [["u0a", "u0b"], ["u1a", "u1b"]]
    assert isinstance(back["text_unit_ids"][0], list)
    assert back["extra"].tolist() == [1.5, 2.5]


def test_findings_lists_of_dicts_round_trip(tmp_path):
    findings = [
        [{"summary": "s1", "explanation": "e1"}, {"summary": "s2", "explanation": "e2"}],
        [],
    ]
    df = pd.DataFrame({c: [None, None] for c in TABLES["community_reports"]})
    df["id"] = ["r1", "r2"]
    df["human_readable_id"] = [0, 1]
    df["children"] = [[1, 2], []]
    df["findings"] = findings
    write_table(df, tmp_path, "community_reports")
    back = read_table(tmp_path, "community_reports")
    assert back["findings"].tolist() == findings
    assert back["children"].tolist() == [[1, 2], []]


def test_empty_id_lists_are_written_as_string_lists(tmp_path):
    df = _documents()
    df["text_unit_ids"] = [[], []]
    write_table(df, tmp_path, "documents")
    schema = pq.read_schema(tmp_path / "documents.parquet")
    assert str(schema.field("text_unit_ids").type) in ("list<item: string>", "list<element: string>")
    assert read_table(tmp_path, "documents")["text_unit_ids"].tolist() == [[], []]


def test_missing_columns_are_named(tmp_path):
    df = _documents().drop(columns=["text_unit_ids", "raw_data"])
    with pytest.raises(TableError) as err:
        write_table(df, tmp_path, "documents")
    assert "text_unit_ids" in str(err.value) and "raw_data" in str(err.value)
    assert not has_table(tmp_path, "documents")


def test_missing_table_says_what_to_run(tmp_path):
    assert not has_table(tmp_path, "entities")
    with pytest.raises(TableError, match=r"no entities table in .*run `sensegraph index` first"):
        read_table(tmp_path, "entities")


def test_crash_midway_keeps_old_table_and_leaves_no_partial_file(tmp_path, monkeypatch):
    old = _documents(2)
    write_table(old, tmp_path, "documents")
    before = (tmp_path / "documents.parquet").read_bytes()

    real_write = pq.write_table

    def crashing_write(table, where, *args, **kwargs):
        # Write some real bytes first, as a writer dying halfway through would.
        where.write(b"PAR1 half a table")
        raise OSError("disk full")

    monkeypatch.setattr(tables.pq, "write_table", crashing_write)
    with pytest.raises(OSError, match="disk full"):
        write_table(_documents(5), tmp_path, "documents")
    monkeypatch.setattr(tables.pq, "write_table", real_write)

    assert (tmp_path / "documents.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["documents.parquet"]
    assert len(read_table(tmp_path, "documents")) == 2


def test_write_creates_output_dir(tmp_path):
    out = tmp_path / "a" / "b"
    write_table(_documents(), out, "documents")
    assert has_table(out, "documents")


def test_write_json_atomic(tmp_path):
    path = write_json_atomic(tmp_path / "stats.json", {"steps": {"documents": 3}, "name": "西游记"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"steps": {"documents": 3}, "name": "西游记"}
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]


def test_unsafe_table_name_is_refused(tmp_path):
    with pytest.raises(TableError):
        write_table(_documents(), tmp_path, "../documents")


def test_tables_match_microsoft_index(shared_data: Path):
    folder = shared_data / "msgraphrag-christmas-carol-index"
    if not folder.exists():
        pytest.skip(f"Microsoft index not found at {folder}")
    for name, columns in TABLES.items():
        ms = pq.read_schema(folder / f"{name}.parquet").names
        assert columns == ms, name
        # and our reader opens their files
        assert list(read_table(folder, name).columns) == ms


def test_parts_read_as_one_table_in_their_order_an_empty_part_taking_the_others_types(tmp_path):
    from sensegraph.store.tables import read_parts

    parts = [pd.DataFrame({"name": ["A", "B"], "ids": [["u1"], ["u1", "u2"]], "n": [1, 2]}),
             pd.DataFrame({"name": [None], "ids": [None], "n": [None]}).iloc[:0],  # no rows: null-typed columns
             pd.DataFrame({"name": ["C"], "ids": [["u3"]], "n": [3]})]
    for i, part in enumerate(parts):
        write_table(part, tmp_path / f"p{i}", "instances")
    df = read_parts([tmp_path / f"p{i}" for i in (2, 0, 1)], "instances")
    assert df["name"].tolist() == ["C", "A", "B"]
    assert df["ids"].tolist() == [["u3"], ["u1"], ["u1", "u2"]]  # lists, not numpy arrays
    assert df["n"].tolist() == [3, 1, 2]
