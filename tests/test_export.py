"""`sensegraph export`: GraphML and GEXF that networkx reads back with the community levels as
node attributes, and Neo4j CSV that follows neo4j-admin import conventions."""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mock_llm import start_mock_server
from test_pipeline import DOCS, index, read_all, settings_for, write_docs
from sensegraph.cli import main as cli_main
from sensegraph.export import export_index

nx = pytest.importorskip("networkx")
MS_INDEX = Path(__file__).resolve().parents[2] / "shared" / "data" / "msgraphrag-christmas-carol-index"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    with start_mock_server() as server:
        write_docs(root, DOCS)
        index(settings_for(root, server))
    return root / "output"


def _membership(out: Path) -> dict[str, dict[int, int]]:
    comms = read_all(out)["communities"]
    m: dict[str, dict[int, int]] = {}
    for r in comms.to_dict("records"):
        for e in r["entity_ids"]:
            m.setdefault(e, {})[int(r["level"])] = int(r["community"])
    return m


@pytest.mark.parametrize("fmt, reader", [("graphml", "read_graphml"), ("gexf", "read_gexf")])
def test_graph_files_parse_with_levels_as_attributes(indexed, tmp_path, fmt, reader):
    [path] = export_index(indexed, fmt, tmp_path / f"g.{fmt}")
    g = getattr(nx, reader)(path)
    t = read_all(indexed)
    assert g.number_of_nodes() == len(t["entities"])
    assert g.number_of_edges() == len(t["relationships"])
    membership = _membership(indexed)
    levels = sorted(t["communities"]["level"].unique())
    for eid, attrs in g.nodes(data=True):
        for level in levels:
            assert int(attrs[f"level_{level}"]) == membership[eid][level]
        assert int(attrs["community"]) == membership[eid][max(levels)]
    titles = {a.get("title", a.get("label")) for _, a in g.nodes(data=True)}
    assert titles == set(t["entities"]["title"])
    assert all(float(a["weight"]) > 0 for _, _, a in g.edges(data=True))


def test_neo4j_csv_follows_the_import_conventions(indexed, tmp_path):
    written = export_index(indexed, "neo4j", tmp_path / "neo4j")
    names = {p.name for p in written}
    assert {"entities.csv", "relationships.csv", "communities.csv", "in_community.csv", "parent_of.csv",
            "import.sh"} <= names
    header_re = re.compile(r"^(\w*:(ID|START_ID|END_ID)\(\w+\)|:LABEL|:TYPE|\w+(:(int|float|string\[\]))?)$")
    ids: dict[str, set[str]] = {}
    rows: dict[str, list[dict[str, str]]] = {}
    for p in written:
        if p.suffix != ".csv":
            continue
        with p.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            assert all(header_re.match(h) for h in reader.fieldnames), (p.name, reader.fieldnames)
            rows[p.name] = list(reader)
        for h in reader.fieldnames:
            m = re.match(r"\w*:ID\((\w+)\)", h)
            if m:
                ids[m.group(1)] = {r[h] for r in rows[p.name]}
    for name, data in rows.items():
        for h in data[0] if data else []:
            m = re.match(r":(START|END)_ID\((\w+)\)", h)
            if m:
                assert {r[h] for r in data} <= ids[m.group(2)], (name, h)  # no dangling endpoint
    t = read_all(indexed)
    assert len(rows["entities.csv"]) == len(t["entities"]) and len(rows["communities.csv"]) == len(t["communities"])
    assert len(rows["in_community.csv"]) == sum(len(e) for e in t["communities"]["entity_ids"])
    assert all(r["report_full_content"] for r in rows["communities.csv"])  # reports travel with communities
    assert "neo4j-admin database import full" in (tmp_path / "neo4j" / "import.sh").read_text()


def test_cypher_script_and_cli(indexed, tmp_path):
    root = indexed.parent
    res = CliRunner().invoke(cli_main, ["export", "--root", str(root), "--format", "cypher",
                                        "-o", str(tmp_path / "g.cypher")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "g.cypher").read_text(encoding="utf-8")
    t = read_all(indexed)
    assert text.count("MERGE (e:Entity") == len(t["entities"])
    assert text.count("[:RELATED") == len(t["relationships"])
    assert text.count("MERGE (c:Community") == len(t["communities"])


@pytest.mark.skipif(not MS_INDEX.exists(), reason="Microsoft index not available")
def test_exports_a_microsoft_index(tmp_path):
    [path] = export_index(MS_INDEX, "graphml", tmp_path / "cc.graphml")
    g = nx.read_graphml(path)
    assert g.number_of_nodes() > 400 and g.number_of_edges() > 400
    # their levels are not complete partitions: entities left out of a level are marked -1
    assert any(int(a["level_1"]) == -1 for _, a in g.nodes(data=True))
