"""The index as browsable records: communities as a tree, entities, relationships, claims and
text units, with the links between them resolved once at start-up.

Everything the explorer and the JSON API show comes from here. Records are addressed the way
answers cite them: reports by their `community` number, everything else by `human_readable_id`
(`ref`), so a citation `[Data: Entities (5)]` is one lookup away from its record.

A lazy index (LazyGraphRAG: concepts found by NLP, co-occurrence edges, no reports) has the same
tables; its communities are shown by their most frequent concepts instead of a report.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import pandas as pd

from ..language import detect_language
from ..query.context import jsonable
from ..query.data import GraphIndex, list_ids

PREVIEW_CHARS = 240  # text shown for a record in a list; the full text is one click away
TOP_CONCEPTS = 6  # concepts a lazy community's card shows in place of a report summary
CONCEPT_STEPS = ("concepts", "concept_graph")  # the steps of a lazy index (stats.json "steps")
GRAPH_STEPS = ("extract", "summarize")  # the steps of a standard one


def _rows(df: pd.DataFrame | None) -> list[dict[str, Any]]:
    if df is None or df.empty:
        return []
    return [{k: jsonable(v) for k, v in row.items()} for row in df.to_dict("records")]


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _preview(text: Any, limit: int = PREVIEW_CHARS) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


def _findings(value: Any) -> list[dict[str, str]]:
    """Report findings as [{summary, explanation}] whatever shape the table holds."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    out = []
    for f in value or []:
        if isinstance(f, dict):
            out.append({"summary": str(f.get("summary") or ""), "explanation": str(f.get("explanation") or "")})
        elif isinstance(f, str):
            out.append({"summary": f, "explanation": ""})
    return out


def index_method(reports: int, communities: int, steps: Any) -> str:
    """"lazy" or "standard", from what the index holds: a lazy index has no reports. The steps
    that built it (stats.json) tell a lazy index from a standard one whose reports are missing
    (all failed, or a trimmed copy); without them, communities without any report mean lazy."""
    if reports:
        return "standard"
    ran = set(steps) if isinstance(steps, (dict, list)) else set()
    if ran & set(CONCEPT_STEPS):
        return "lazy"
    if ran & set(GRAPH_STEPS):
        return "standard"
    return "lazy" if communities else "standard"


def _read_stats(output_dir: Any) -> dict[str, Any]:
    try:
        stats = json.loads((output_dir / "stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stats if isinstance(stats, dict) else {}


class Explorer:
    """Read-only lookups over one loaded index (built once; every request only reads)."""

    def __init__(self, index: GraphIndex):
        self.index = index
        t = index.tables
        self.reports = {int(r["community"]): r for r in _rows(t.get("community_reports"))}
        self.communities = {int(r["community"]): r for r in _rows(t.get("communities"))}
        # A report without a community row (a trimmed index) still belongs in the tree.
        for c, r in self.reports.items():
            self.communities.setdefault(c, {"community": c, "level": r.get("level"), "parent": r.get("parent"),
                                            "children": r.get("children") or [], "title": r.get("title"),
                                            "entity_ids": [], "relationship_ids": [], "text_unit_ids": [],
                                            "size": r.get("size")})
        self.entities = {int(r["human_readable_id"]): r for r in _rows(t.get("entities"))}
        self.relationships = {int(r["human_readable_id"]): r for r in _rows(t.get("relationships"))}
        self.text_units = {int(r["human_readable_id"]): r for r in _rows(t.get("text_units"))}
        self.claims = {int(r["human_readable_id"]): r for r in _rows(t.get("covariates"))}
        self.documents = {r["id"]: r for r in _rows(t.get("documents"))}

        self.entity_ref = {e["id"]: ref for ref, e in self.entities.items()}
        self.entity_by_title = {str(e["title"]): ref for ref, e in self.entities.items()}
        self.relationship_ref = {r["id"]: ref for ref, r in self.relationships.items()}
        self.unit_ref = {u["id"]: ref for ref, u in self.text_units.items()}
        self.claim_ref = {c["id"]: ref for ref, c in self.claims.items()}

        self.entity_communities: dict[int, list[int]] = defaultdict(list)  # entity ref -> communities
        for c in sorted(self.communities, key=lambda c: (_int(self.communities[c].get("level"), 0), c)):
            for eid in list_ids(self.communities[c].get("entity_ids")):
                if eid in self.entity_ref:
                    self.entity_communities[self.entity_ref[eid]].append(c)
        self.relationships_of: dict[str, list[int]] = defaultdict(list)  # entity title -> relationship refs
        for ref, r in self.relationships.items():
            self.relationships_of[str(r["source"])].append(ref)
            if r["target"] != r["source"]:
                self.relationships_of[str(r["target"])].append(ref)
        self.claims_of: dict[str, list[int]] = defaultdict(list)  # entity title -> claim refs
        for ref, c in self.claims.items():
            self.claims_of[str(c.get("subject_id"))].append(ref)
        self._summaries: dict[int, dict[str, Any]] = {}
        stats = _read_stats(index.output_dir)
        self.method = index_method(len(self.reports), len(self.communities), stats.get("steps"))
        self.lazy = self.method == "lazy"
        self.language = self._language(stats.get("language"))

    # -- summaries (what a list shows) --------------------------------------------------------
    def _language(self, recorded: Any) -> str:
        if recorded in ("en", "zh"):
            return recorded
        sample = [str(e.get("title") or "") + " " + str(e.get("description") or "")
                  for e in list(self.entities.values())[:200]]
        return detect_language(sample) if sample else "en"

    def community_summary(self, c: int) -> dict[str, Any]:
        """Title, rating, summary and place in the tree (computed once: lists show them often)."""
        cached = self._summaries.get(c)
        if cached is None:
            cached = self._summaries[c] = self._summary(c)
        return cached

    def _summary(self, c: int) -> dict[str, Any]:
        row = self.communities[c]
        rep = self.reports.get(c) or {}
        parent = _int(row.get("parent"), -1)
        return {
            "community": c,
            "level": _int(row.get("level"), 0),
            "parent": None if parent is None or parent < 0 else parent,
            "children": [int(k) for k in list_ids(row.get("children")) if int(k) in self.communities],
            "title": str(rep.get("title") or row.get("title") or f"Community {c}"),
            "rating": rep.get("rank"),
            "summary": str(rep.get("summary") or ""),
            "size": _int(row.get("size")) or len(list_ids(row.get("entity_ids"))),
            "entities": len(list_ids(row.get("entity_ids"))),
            "relationships": len(list_ids(row.get("relationship_ids"))),
            "text_units": len(list_ids(row.get("text_unit_ids"))),
            "has_report": c in self.reports,
            **({"top_concepts": [self._concept_brief(r) for r in self._members(row)[:TOP_CONCEPTS]]}
               if self.lazy else {}),
        }

    def _members(self, row: dict[str, Any]) -> list[int]:
        """A community's entity refs, in the order its members matter: for a lazy index the most
        frequent concepts first (the order its title was made in), else the best connected."""
        refs = [self.entity_ref[e] for e in list_ids(row.get("entity_ids")) if e in self.entity_ref]
        if self.lazy:
            return sorted(refs, key=lambda r: (-(_int(self.entities[r].get("frequency"), 0) or 0),
                                               -(_int(self.entities[r].get("degree"), 0) or 0),
                                               str(self.entities[r].get("title"))))
        return sorted(refs, key=lambda ref: (-(_int(self.entities[ref].get("degree"), 0) or 0), ref))

    def _concept_brief(self, ref: int) -> dict[str, Any]:
        e = self.entities[ref]
        return {"ref": ref, "title": e.get("title"), "type": e.get("type"),
                "frequency": _int(e.get("frequency"), 0)}

    def entity_brief(self, ref: int) -> dict[str, Any]:
        e = self.entities[ref]
        return {"ref": ref, "title": e.get("title"), "type": e.get("type"), "degree": _int(e.get("degree"), 0),
                "frequency": _int(e.get("frequency"), 0), "description": _preview(e.get("description"))}

    def relationship_brief(self, ref: int) -> dict[str, Any]:
        r = self.relationships[ref]
        return {"ref": ref, "source": r.get("source"), "target": r.get("target"),
                "source_ref": self.entity_by_title.get(str(r.get("source"))),
                "target_ref": self.entity_by_title.get(str(r.get("target"))),
                "weight": r.get("weight"), "combined_degree": r.get("combined_degree"),
                "description": _preview(r.get("description"))}

    def unit_brief(self, ref: int) -> dict[str, Any]:
        u = self.text_units[ref]
        doc = self.documents.get(u.get("document_id")) or {}
        return {"ref": ref, "document": doc.get("title"), "n_tokens": u.get("n_tokens"),
                "preview": _preview(u.get("text"))}

    def claim_brief(self, ref: int) -> dict[str, Any]:
        c = self.claims[ref]
        return {"ref": ref, "subject": c.get("subject_id"), "object": c.get("object_id"), "type": c.get("type"),
                "status": c.get("status"), "description": _preview(c.get("description"))}

    def _sorted_by_rating(self, communities: list[int]) -> list[dict[str, Any]]:
        out = [self.community_summary(c) for c in communities if c in self.communities]
        # Most important first, as the paper's ratings intend; size breaks ties (and orders unrated).
        return sorted(out, key=lambda s: (-(s["rating"] or 0), -s["size"], s["community"]))

    # -- the community tree --------------------------------------------------------------------
    def roots(self) -> list[int]:
        return [c for c in self.communities if self.community_summary(c)["parent"] not in self.communities]

    def tree(self, level: int | None = None) -> dict[str, Any]:
        if level is None:
            listed = list(self.communities)
        else:
            listed = [c for c in self.communities if _int(self.communities[c].get("level"), 0) == level]
        return {"roots": [s["community"] for s in self._sorted_by_rating(self.roots())],
                "levels": self.max_level() + 1, "communities": self._sorted_by_rating(listed)}

    def max_level(self) -> int:
        return max((_int(r.get("level"), 0) for r in self.communities.values()), default=0)

    def path(self, c: int) -> list[dict[str, Any]]:
        """The breadcrumbs: root community first, `c` last (a cycle in a broken table stops it)."""
        out: list[dict[str, Any]] = []
        seen: set[int] = set()
        node: int | None = c
        while node is not None and node in self.communities and node not in seen:
            seen.add(node)
            s = self.community_summary(node)
            out.append({k: s[k] for k in ("community", "level", "title")})
            node = s["parent"]
        return out[::-1]

    def report(self, c: int) -> dict[str, Any] | None:
        rep = self.reports.get(c)
        if rep is None:
            return None
        return {"community": c, "title": rep.get("title"), "summary": rep.get("summary"), "rating": rep.get("rank"),
                "rating_explanation": rep.get("rating_explanation"), "findings": _findings(rep.get("findings")),
                "full_content": rep.get("full_content"), "level": rep.get("level"), "period": rep.get("period"),
                "size": rep.get("size")}

    def community(self, c: int, limit: int = 500) -> dict[str, Any] | None:
        if c not in self.communities:
            return None
        row = self.communities[c]
        ents = self._members(row)
        rels = sorted((self.relationship_ref[r] for r in list_ids(row.get("relationship_ids"))
                       if r in self.relationship_ref),
                      key=lambda ref: (-float(self.relationships[ref].get("combined_degree") or 0), ref))
        units = sorted(self.unit_ref[u] for u in list_ids(row.get("text_unit_ids")) if u in self.unit_ref)
        return {
            "community": self.community_summary(c),
            "report": self.report(c),
            "path": self.path(c),
            "children": self._sorted_by_rating(self.community_summary(c)["children"]),
            "entities": [self.entity_brief(r) for r in ents[:limit]],
            "relationships": [self.relationship_brief(r) for r in rels[:limit]],
            "text_units": [self.unit_brief(r) for r in units[:limit]],
            "totals": {"entities": len(ents), "relationships": len(rels), "text_units": len(units)},
        }

    # -- graphs --------------------------------------------------------------------------------
    def _graph(self, refs: list[int], group_of: dict[int, int | None], max_nodes: int) -> dict[str, Any]:
        """Nodes (entities, the best connected first when cut) and the relationships among them."""
        ranked = sorted(set(refs), key=lambda r: (-(_int(self.entities[r].get("degree"), 0) or 0), r))
        kept = ranked[:max_nodes]
        titles = {str(self.entities[r]["title"]): r for r in kept}
        edges = []
        seen: set[int] = set()
        for title in titles:
            for rel in self.relationships_of.get(title, []):
                r = self.relationships[rel]
                s, t = titles.get(str(r["source"])), titles.get(str(r["target"]))
                if rel in seen or s is None or t is None:
                    continue
                seen.add(rel)
                edges.append({"ref": rel, "source": s, "target": t, "weight": r.get("weight"),
                              "description": _preview(r.get("description"), 160)})
        nodes = [{**self.entity_brief(r), "description": _preview(self.entities[r].get("description"), 160),
                  "group": group_of.get(r)} for r in kept]
        return {"nodes": nodes, "edges": edges, "total_nodes": len(ranked), "truncated": len(ranked) > len(kept)}

    def community_graph(self, c: int, max_nodes: int = 500) -> dict[str, Any] | None:
        """The community's entities coloured by the sub-community each belongs to."""
        if c not in self.communities:
            return None
        row = self.communities[c]
        refs = [self.entity_ref[e] for e in list_ids(row.get("entity_ids")) if e in self.entity_ref]
        group_of: dict[int, int | None] = {}
        children = self.community_summary(c)["children"]
        for child in children:
            for e in list_ids(self.communities[child].get("entity_ids")):
                if e in self.entity_ref:
                    group_of[self.entity_ref[e]] = child
        groups = [{"community": s["community"], "title": s["title"]} for s in self._sorted_by_rating(children)]
        return {"community": self.community_summary(c), "groups": groups, **self._graph(refs, group_of, max_nodes)}

    def neighbourhood(self, ref: int, depth: int = 1, max_nodes: int = 200) -> dict[str, Any] | None:
        """The entity and the entities within `depth` relationships, grouped by root community."""
        if ref not in self.entities:
            return None
        frontier, found = {ref}, {ref}
        for _ in range(depth):
            nxt: set[int] = set()
            for r in frontier:
                for rel in self.relationships_of.get(str(self.entities[r]["title"]), []):
                    rr = self.relationships[rel]
                    for title in (rr["source"], rr["target"]):
                        other = self.entity_by_title.get(str(title))
                        if other is not None and other not in found:
                            nxt.add(other)
            found |= nxt
            frontier = nxt
        # The centre must survive the cut whatever its degree: put it first.
        group_of = {r: (self.entity_communities.get(r) or [None])[0] for r in found}
        graph = self._graph([ref] + sorted(found - {ref}), group_of, max_nodes)
        if all(n["ref"] != ref for n in graph["nodes"]):
            graph = self._graph([ref], group_of, 1)
        return {"entity": self.entity_brief(ref), **graph}

    # -- single records -----------------------------------------------------------------------
    def search_entities(self, query: str, limit: int = 20) -> list[dict[str, Any]]:
        """Entities whose name (or an alias) matches: exact, then prefix, word prefix, substring;
        better connected entities first within each kind of match."""
        q = query.strip().casefold()
        if not q:
            return []
        word = re.compile(r"(?:^|[\s\-_/.])" + re.escape(q))
        scored = []
        for ref, e in self.entities.items():
            best = None
            for name in [str(e.get("title") or "")] + [str(a) for a in (e.get("aliases") or [])]:
                n = name.casefold()
                rank = 0 if n == q else 1 if n.startswith(q) else 2 if word.search(n) else 3 if q in n else None
                if rank is not None and (best is None or rank < best):
                    best = rank
            if best is not None:
                scored.append((best, -(_int(e.get("degree"), 0) or 0), ref))
        scored.sort()
        return [self.entity_brief(ref) for _, _, ref in scored[:limit]]

    def entity(self, ref: int) -> dict[str, Any] | None:
        e = self.entities.get(ref)
        if e is None:
            return None
        title = str(e["title"])
        rels = sorted(self.relationships_of.get(title, []),
                      key=lambda r: (-float(self.relationships[r].get("weight") or 0), r))
        units = sorted(self.unit_ref[u] for u in list_ids(e.get("text_unit_ids")) if u in self.unit_ref)
        record = {k: v for k, v in e.items() if k not in ("text_unit_ids",)}
        return {
            "ref": ref, "record": record, "title": title, "type": e.get("type"),
            "description": e.get("description"),
            "communities": [self.community_summary(c) for c in self.entity_communities.get(ref, [])],
            "path": self.path(self.entity_communities[ref][-1]) if self.entity_communities.get(ref) else [],
            "relationships": [self.relationship_brief(r) for r in rels],
            "text_units": [self.unit_brief(u) for u in units],
            "claims": [self.claim_brief(c) for c in self.claims_of.get(title, [])],
        }

    def relationship(self, ref: int) -> dict[str, Any] | None:
        r = self.relationships.get(ref)
        if r is None:
            return None
        units = sorted(self.unit_ref[u] for u in list_ids(r.get("text_unit_ids")) if u in self.unit_ref)
        ends = [self.entity_by_title.get(str(r.get(k))) for k in ("source", "target")]
        return {
            "ref": ref, "record": {k: v for k, v in r.items() if k != "text_unit_ids"},
            "source": self.entity_brief(ends[0]) if ends[0] is not None else {"title": r.get("source")},
            "target": self.entity_brief(ends[1]) if ends[1] is not None else {"title": r.get("target")},
            "description": r.get("description"),
            "text_units": [self.unit_brief(u) for u in units],
        }

    def text_unit(self, ref: int) -> dict[str, Any] | None:
        u = self.text_units.get(ref)
        if u is None:
            return None
        doc = self.documents.get(u.get("document_id")) or {}
        ents = [self.entity_ref[e] for e in list_ids(u.get("entity_ids")) if e in self.entity_ref]
        rels = [self.relationship_ref[r] for r in list_ids(u.get("relationship_ids")) if r in self.relationship_ref]
        claims = [self.claim_ref[c] for c in list_ids(u.get("covariate_ids")) if c in self.claim_ref]
        return {
            "ref": ref, "text": u.get("text"), "n_tokens": u.get("n_tokens"),
            "document": {"title": doc.get("title"), "ref": doc.get("human_readable_id")},
            "entities": [self.entity_brief(e) for e in sorted(set(ents))],
            "relationships": [self.relationship_brief(r) for r in sorted(set(rels))],
            "claims": [self.claim_brief(c) for c in sorted(set(claims))],
        }

    def claim(self, ref: int) -> dict[str, Any] | None:
        c = self.claims.get(ref)
        if c is None:
            return None
        unit = self.unit_ref.get(c.get("text_unit_id"))
        subject = self.entity_by_title.get(str(c.get("subject_id")))
        obj = self.entity_by_title.get(str(c.get("object_id")))
        return {
            "ref": ref, "record": c, "description": c.get("description"),
            "subject": self.entity_brief(subject) if subject is not None else {"title": c.get("subject_id")},
            "object": self.entity_brief(obj) if obj is not None else {"title": c.get("object_id")},
            "text_unit": self.unit_brief(unit) if unit is not None else None,
        }

    def info(self) -> dict[str, Any]:
        return {
            "language": self.language, "levels": self.max_level() + 1, "method": self.method,
            "counts": {"communities": len(self.communities), "reports": len(self.reports),
                       "entities": len(self.entities), "relationships": len(self.relationships),
                       "claims": len(self.claims), "text_units": len(self.text_units),
                       "documents": len(self.documents)},
        }
