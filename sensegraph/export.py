"""`sensegraph export`: the entity graph for other tools.

- GraphML and GEXF (Gephi, yEd, networkx, Cytoscape): entities are nodes, relationships are
  undirected weighted edges. Every node carries its community at every level (`level_0`,
  `level_1`, ...; -1 where an index, such as Microsoft's, leaves an entity out of a level) and
  `community`, its deepest one, so a viewer can colour by any level.
- Neo4j: CSV files that follow `neo4j-admin database import full` conventions (`:ID(group)`,
  `:START_ID(group)`, `:END_ID(group)`, `:LABEL`, `:TYPE`, typed columns such as `weight:float`,
  arrays as `string[]` joined by `;`), plus import.sh with the command; or one Cypher script
  for `cypher-shell`. Nodes: Entity, Community (with its report), TextUnit is left out (the
  text_unit_ids of each entity and relationship are kept as arrays). Relationships: RELATED
  (entity-entity), IN_COMMUNITY (entity-community), PARENT_OF (community-community).

Written with the standard library (csv, xml.etree), so export needs no extra package.
"""
from __future__ import annotations

import csv
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd

from .store.tables import has_table, read_table

FORMATS = ("graphml", "gexf", "neo4j", "cypher")
ARRAY_DELIMITER = ";"


def _plain(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def _list(v: Any) -> list:
    v = _plain(v)
    return list(v) if isinstance(v, (list, tuple)) else []


class _Graph:
    """Entities, relationships and community memberships of one index folder."""

    def __init__(self, folder: Path):
        for name in ("entities", "relationships"):
            if not has_table(folder, name):
                raise FileNotFoundError(f"no {name} table in {folder}; run `sensegraph index` first")
        self.entities = read_table(folder, "entities")
        self.relationships = read_table(folder, "relationships")
        self.communities = read_table(folder, "communities") if has_table(folder, "communities") else pd.DataFrame()
        self.reports = read_table(folder, "community_reports") if has_table(folder, "community_reports") \
            else pd.DataFrame()
        self.id_of_title = {str(t): str(i) for t, i in zip(self.entities["title"], self.entities["id"])}
        self.levels = sorted({int(x) for x in self.communities["level"]}) if not self.communities.empty else []
        self.membership: dict[str, dict[int, int]] = {}
        for row in self.communities.to_dict("records"):
            for e in _list(row["entity_ids"]):
                self.membership.setdefault(str(e), {})[int(row["level"])] = int(row["community"])

    def node_attributes(self, row: dict[str, Any]) -> dict[str, Any]:
        levels = self.membership.get(str(row["id"]), {})
        attrs = {
            "title": str(row["title"]), "type": str(_plain(row.get("type")) or ""),
            "description": str(_plain(row.get("description")) or ""),
            "human_readable_id": int(row.get("human_readable_id") or 0),
            "frequency": int(_plain(row.get("frequency")) or 0), "degree": int(_plain(row.get("degree")) or 0),
            "aliases": ARRAY_DELIMITER.join(map(str, _list(row.get("aliases")))),
        }
        for level in self.levels:
            attrs[f"level_{level}"] = levels.get(level, -1)
        attrs["community"] = levels[max(levels)] if levels else -1
        return attrs

    def edges(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for row in self.relationships.to_dict("records"):
            s, t = self.id_of_title.get(str(row["source"])), self.id_of_title.get(str(row["target"]))
            if s is None or t is None:
                continue
            w = _plain(row.get("weight"))
            out.append((s, t, {"id": str(row["id"]), "description": str(_plain(row.get("description")) or ""),
                               "weight": float(w) if w is not None else 1.0,
                               "human_readable_id": int(row.get("human_readable_id") or 0)}))
        return out


def _xml_type(v: Any) -> str:
    return "int" if isinstance(v, int) and not isinstance(v, bool) else "double" if isinstance(v, float) else "string"


def write_graphml(g: _Graph, path: Path) -> Path:
    ns = "http://graphml.graphdrawing.org/xmlns"
    root = ET.Element("graphml", {"xmlns": ns})
    nodes = [(str(r["id"]), g.node_attributes(r)) for r in g.entities.to_dict("records")]
    edges = g.edges()
    keys: dict[tuple[str, str], str] = {}
    for kind, attrs in [("node", a) for _, a in nodes[:1]] + [("edge", a) for _, _, a in edges[:1]]:
        for name, value in attrs.items():
            if name == "id" and kind == "edge":
                continue
            key = f"{kind[0]}_{name}"
            keys[(kind, name)] = key
            ET.SubElement(root, "key", {"id": key, "for": kind, "attr.name": name, "attr.type": _xml_type(value)})
    graph = ET.SubElement(root, "graph", {"id": "entities", "edgedefault": "undirected"})
    for nid, attrs in nodes:
        node = ET.SubElement(graph, "node", {"id": nid})
        for name, value in attrs.items():
            ET.SubElement(node, "data", {"key": keys[("node", name)]}).text = str(value)
    for s, t, attrs in edges:
        edge = ET.SubElement(graph, "edge", {"id": attrs["id"], "source": s, "target": t})
        for name, value in attrs.items():
            if name != "id":
                ET.SubElement(edge, "data", {"key": keys[("edge", name)]}).text = str(value)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


def write_gexf(g: _Graph, path: Path) -> Path:
    ns = "http://gexf.net/1.3"
    root = ET.Element("gexf", {"xmlns": ns, "version": "1.3"})
    ET.SubElement(ET.SubElement(root, "meta"), "creator").text = "sensegraph"
    graph = ET.SubElement(root, "graph", {"defaultedgetype": "undirected", "mode": "static"})
    nodes = [(str(r["id"]), g.node_attributes(r)) for r in g.entities.to_dict("records")]
    edges = g.edges()
    node_attrs = [n for n in (nodes[0][1] if nodes else {}) if n != "title"]
    gexf_type = {"int": "integer", "double": "double", "string": "string"}
    na = ET.SubElement(graph, "attributes", {"class": "node"})
    for i, name in enumerate(node_attrs):
        ET.SubElement(na, "attribute", {"id": str(i), "title": name, "type": gexf_type[_xml_type(nodes[0][1][name])]})
    ea = ET.SubElement(graph, "attributes", {"class": "edge"})
    ET.SubElement(ea, "attribute", {"id": "0", "title": "description", "type": "string"})
    ET.SubElement(ea, "attribute", {"id": "1", "title": "human_readable_id", "type": "integer"})
    xn = ET.SubElement(graph, "nodes")
    for nid, attrs in nodes:
        node = ET.SubElement(xn, "node", {"id": nid, "label": attrs["title"]})
        values = ET.SubElement(node, "attvalues")
        for i, name in enumerate(node_attrs):
            ET.SubElement(values, "attvalue", {"for": str(i), "value": str(attrs[name])})
    xe = ET.SubElement(graph, "edges")
    for s, t, attrs in edges:
        edge = ET.SubElement(xe, "edge", {"id": attrs["id"], "source": s, "target": t, "weight": str(attrs["weight"])})
        values = ET.SubElement(edge, "attvalues")
        ET.SubElement(values, "attvalue", {"for": "0", "value": attrs["description"]})
        ET.SubElement(values, "attvalue", {"for": "1", "value": str(attrs["human_readable_id"])})
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


# -- Neo4j ------------------------------------------------------------------------------------------

def _neo4j_rows(g: _Graph) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """file name -> (header, rows) in neo4j-admin import format."""
    arr = lambda v: ARRAY_DELIMITER.join(str(x).replace(ARRAY_DELIMITER, ",") for x in _list(v))  # noqa: E731
    files: dict[str, tuple[list[str], list[list[Any]]]] = {}
    files["entities.csv"] = (
        ["entityId:ID(Entity)", "title", "type", "description", "human_readable_id:int", "frequency:int",
         "degree:int", "aliases:string[]", "text_unit_ids:string[]", ":LABEL"],
        [[r["id"], r["title"], _plain(r.get("type")) or "", _plain(r.get("description")) or "",
          int(r.get("human_readable_id") or 0), int(_plain(r.get("frequency")) or 0),
          int(_plain(r.get("degree")) or 0), arr(r.get("aliases")), arr(r.get("text_unit_ids")), "Entity"]
         for r in g.entities.to_dict("records")])
    rel_rows = []
    by_id = {str(r["id"]): r for r in g.relationships.to_dict("records")}
    for s, t, a in g.edges():
        r = by_id[a["id"]]
        rel_rows.append([s, t, a["id"], a["description"], a["weight"], a["human_readable_id"],
                         arr(r.get("text_unit_ids")), "RELATED"])
    files["relationships.csv"] = ([":START_ID(Entity)", ":END_ID(Entity)", "relationshipId", "description",
                                   "weight:float", "human_readable_id:int", "text_unit_ids:string[]", ":TYPE"],
                                  rel_rows)
    report_of: dict[int, dict[str, Any]] = {int(r["community"]): r for r in g.reports.to_dict("records")} \
        if not g.reports.empty else {}
    comm_rows, member_rows, parent_rows = [], [], []
    number_to_id = {int(r["community"]): str(r["id"]) for r in g.communities.to_dict("records")}
    for r in g.communities.to_dict("records"):
        n = int(r["community"])
        rep = report_of.get(n, {})
        rank = _plain(rep.get("rank"))
        comm_rows.append([str(r["id"]), n, int(r["level"]), str(r.get("title") or ""), int(_plain(r.get("size")) or 0),
                          str(rep.get("title") or ""), str(rep.get("summary") or ""),
                          str(rep.get("full_content") or ""), float(rank) if rank is not None else 0.0,
                          str(rep.get("rating_explanation") or ""), "Community"])
        for e in _list(r["entity_ids"]):
            member_rows.append([str(e), str(r["id"]), int(r["level"]), "IN_COMMUNITY"])
        parent = int(_plain(r.get("parent")) if _plain(r.get("parent")) is not None else -1)
        if parent in number_to_id:
            parent_rows.append([number_to_id[parent], str(r["id"]), "PARENT_OF"])
    files["communities.csv"] = (["communityId:ID(Community)", "community:int", "level:int", "title", "size:int",
                                 "report_title", "report_summary", "report_full_content", "report_rank:float",
                                 "report_rating_explanation", ":LABEL"], comm_rows)
    files["in_community.csv"] = ([":START_ID(Entity)", ":END_ID(Community)", "level:int", ":TYPE"], member_rows)
    files["parent_of.csv"] = ([":START_ID(Community)", ":END_ID(Community)", ":TYPE"], parent_rows)
    return files


def write_neo4j(g: _Graph, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (header, rows) in _neo4j_rows(g).items():
        p = folder / name
        with p.open("w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh)  # RFC 4180 quoting, which neo4j-admin reads (--multiline-fields for descriptions)
            w.writerow(header)
            w.writerows(rows)
        written.append(p)
    script = folder / "import.sh"
    script.write_text(
        "#!/bin/sh\n# Load into an empty database (stop it first). Run from this folder.\n"
        "neo4j-admin database import full neo4j --overwrite-destination --multiline-fields=true \\\n"
        "  --array-delimiter=';' \\\n"
        "  --nodes=entities.csv --nodes=communities.csv \\\n"
        "  --relationships=relationships.csv --relationships=in_community.csv --relationships=parent_of.csv\n",
        encoding="utf-8")
    written.append(script)
    return written


def _cypher_value(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def write_cypher(g: _Graph, path: Path) -> Path:
    """One script of parameter-free statements (`cypher-shell -f graph.cypher`)."""
    files = _neo4j_rows(g)
    lines = ["CREATE CONSTRAINT entity_id IF NOT EXISTS FOR (e:Entity) REQUIRE e.id IS UNIQUE;",
             "CREATE CONSTRAINT community_id IF NOT EXISTS FOR (c:Community) REQUIRE c.id IS UNIQUE;"]

    def props(header: list[str], row: list[Any], skip: set[str]) -> str:
        parts = []
        for h, v in zip(header, row):
            name, _, typ = h.partition(":")
            if not name or h in skip or name in skip:
                continue
            if typ.endswith("[]"):
                v = [x for x in str(v).split(ARRAY_DELIMITER) if x]
            parts.append(f"{name}: {_cypher_value(v)}")
        return ", ".join(parts)

    header, rows = files["entities.csv"]
    for row in rows:
        lines.append(f"MERGE (e:Entity {{id: {_cypher_value(row[0])}}}) SET e += {{{props(header, row, {'entityId', ':LABEL'})}}};")
    header, rows = files["communities.csv"]
    for row in rows:
        lines.append(f"MERGE (c:Community {{id: {_cypher_value(row[0])}}}) SET c += {{{props(header, row, {'communityId', ':LABEL'})}}};")
    for name, (a, b, typ) in (("relationships.csv", ("Entity", "Entity", "RELATED")),
                              ("in_community.csv", ("Entity", "Community", "IN_COMMUNITY")),
                              ("parent_of.csv", ("Community", "Community", "PARENT_OF"))):
        header, rows = files[name]
        for row in rows:
            p = props(header, row, {":START_ID(Entity)", ":END_ID(Entity)", ":END_ID(Community)",
                                    ":START_ID(Community)", ":TYPE"})
            lines.append(f"MATCH (x:{a} {{id: {_cypher_value(row[0])}}}), (y:{b} {{id: {_cypher_value(row[1])}}}) "
                         f"CREATE (x)-[:{typ}{(' {' + p + '}') if p else ''}]->(y);")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def export_index(folder: Path, fmt: str, dest: Path | None = None) -> list[Path]:
    """Write `folder`'s graph in `fmt` (graphml, gexf, neo4j, cypher); returns the files written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    g = _Graph(Path(folder))
    base = Path(folder) / "export"
    if fmt == "graphml":
        return [write_graphml(g, dest or base / "graph.graphml")]
    if fmt == "gexf":
        return [write_gexf(g, dest or base / "graph.gexf")]
    if fmt == "cypher":
        return [write_cypher(g, dest or base / "graph.cypher")]
    return write_neo4j(g, dest or base / "neo4j")
