"""Paper step 2.4: the entity graph -> a hierarchy of communities (hierarchical Leiden).

Every level is a complete, mutually exclusive partition of *all* entities, which Microsoft's
index is not (their level 1 of the Christmas Carol index covers 443 of 529 entities):

- entities without edges never appear in Leiden's output, so each becomes a singleton
  community at level 0;
- a community that Leiden does not split further (a branch that ends early) is carried down
  unchanged to every deeper level, as a new community whose parent is the one it copies.
  Carried rows are marked `carried=True` so the report step reuses the parent's report
  instead of paying for another LLM call.

Level 0 is the root level (the coarsest partition). Numbers are assigned root level first,
then in tree order (children in their parent's order), so the output is stable for a seed.

Each connected component is clustered separately, with the same seed: the partition of a
component depends only on that component, so an update (update.py) that does not touch a
component leaves its communities, and their reports, exactly as they were, while an updated
index still equals a fresh one (no previous partition is used as a starting point).
"""
from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict

import graspologic_native as gn
import pandas as pd

from ..store.tables import content_id

COLUMNS = [
    "id", "human_readable_id", "community", "level", "parent", "children", "title",
    "entity_ids", "relationship_ids", "text_unit_ids", "period", "size", "carried",
]


def build_communities(
    entities: pd.DataFrame, relationships: pd.DataFrame, *, max_cluster_size: int, seed: int
) -> pd.DataFrame:
    """Cluster the undirected, weighted entity graph into a complete community hierarchy."""
    if entities.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})

    # Nodes are titles (relationships name entities by title). Should two entities share a
    # title, both belong to that node, so no entity is ever left out of a partition.
    order = entities.sort_values("human_readable_id", kind="stable")
    ids_of_title: dict[str, list[str]] = defaultdict(list)
    for title, eid in zip(order["title"], order["id"]):
        ids_of_title[str(title)].append(str(eid))
    titles = list(ids_of_title)  # in human_readable_id order

    edges = _edges(relationships, set(titles))
    # graspologic_native 1.3.1 returns, per level, one record per node of the clustered
    # (sub)network: level 0 covers every connected node, deeper levels only the nodes of
    # clusters larger than max_cluster_size that it split again.
    tree = _Tree()
    # Each connected component is clustered on its own (Leiden never puts two components in one
    # community anyway). Leiden's random choices depend on the whole input, so clustering the
    # graph at once lets a change in one component reshuffle all the others; per component, a
    # component that an update did not touch keeps exactly its communities (and their reports).
    for component in _components(edges):
        offset = tree.max_key + 1
        records = gn.hierarchical_leiden(component, max_cluster_size=max_cluster_size, seed=seed)
        for r in records:
            parent = None if r.parent_cluster is None else (r.level - 1, offset + int(r.parent_cluster))
            tree.add(str(r.node), r.level, offset + int(r.cluster), parent)
    clustered = tree.nodes_at(0)
    for i, title in enumerate(t for t in titles if t not in clustered):
        # Isolated entities: one singleton each, after Leiden's clusters (key > any cluster id).
        tree.add(title, 0, tree.max_key + 1 + i, None)
    tree.carry_down()

    rel = _relationship_index(relationships)
    text_units = {str(eid): list(tus) if tus is not None else []
                  for eid, tus in zip(entities["id"], entities["text_unit_ids"])}
    rank_of_title = {t: i for i, t in enumerate(titles)}
    today = dt.date.today().isoformat()

    # Number the communities: level by level, in the order of their parents, then by key.
    number: dict[tuple[int, int], int] = {}
    ordered: list[tuple[int, int]] = []
    for level in range(tree.depth):
        keys = [k for k in tree.members if k[0] == level]
        keys.sort(key=lambda k: (number.get(tree.parent.get(k), -1), k[1]))
        for k in keys:
            number[k] = len(number)
            ordered.append(k)

    # Relationships inside each community: one pass over the edges per level.
    rel_ids_of: dict[tuple[int, int], list[str]] = defaultdict(list)
    for level in range(tree.depth):
        home = {t: k for k in tree.members if k[0] == level for t in tree.members[k]}
        for rid, s, t in rel:
            if s in home and home[s] == home.get(t):
                rel_ids_of[home[s]].append(rid)

    rows = []
    for k in ordered:
        level = k[0]
        member_titles = sorted(tree.members[k], key=rank_of_title.__getitem__)
        entity_ids = [eid for t in member_titles for eid in ids_of_title[t]]
        rel_ids = rel_ids_of.get(k, [])
        tus = sorted({tu for eid in entity_ids for tu in text_units.get(eid, [])})
        n = number[k]
        parent = tree.parent.get(k)
        rows.append({
            "id": content_id("community", str(level), *sorted(entity_ids)),
            "human_readable_id": n,
            "community": n,
            "level": level,
            "parent": -1 if parent is None else number[parent],
            "children": [number[c] for c in sorted(tree.children[k], key=number.__getitem__)],
            "title": f"Community {n}",
            "entity_ids": entity_ids,
            "relationship_ids": rel_ids,
            "text_unit_ids": tus,
            "period": today,
            "size": len(entity_ids),
            "carried": k in tree.carried,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


class _Tree:
    """Communities keyed by (level, key); Leiden's cluster ids are unique across levels."""

    def __init__(self) -> None:
        self.members: dict[tuple[int, int], set[str]] = defaultdict(set)
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.children: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
        self.carried: set[tuple[int, int]] = set()
        self.max_key = -1

    def add(self, node: str, level: int, key: int, parent: tuple[int, int] | None) -> None:
        k = (level, key)
        self.members[k].add(node)
        self.children.setdefault(k, set())
        self.max_key = max(self.max_key, key)
        if parent is not None:
            self.parent[k] = parent
            self.children[parent].add(k)

    def nodes_at(self, level: int) -> set[str]:
        return {n for k, m in self.members.items() if k[0] == level for n in m}

    @property
    def depth(self) -> int:
        return 1 + max((k[0] for k in self.members), default=-1)

    def carry_down(self) -> None:
        """Copy every childless community one level down until the deepest level is reached."""
        deepest = self.depth - 1
        for level in range(deepest):
            for k in sorted(k for k in self.members if k[0] == level and not self.children[k]):
                self.max_key += 1
                copy = (level + 1, self.max_key)
                self.members[copy] = set(self.members[k])
                self.children[copy] = set()
                self.parent[copy] = k
                self.children[k].add(copy)
                self.carried.add(copy)


def _edges(relationships: pd.DataFrame, nodes: set[str]) -> list[tuple[str, str, float]]:
    """Undirected weighted edges, merged per pair and sorted: Leiden's result depends on the
    order of its input, and the output must not depend on the order of the table's rows."""
    weights: dict[tuple[str, str], float] = defaultdict(float)
    if relationships.empty:
        return []
    for s, t, w in zip(relationships["source"], relationships["target"], relationships["weight"]):
        s, t = str(s), str(t)
        if s == t or s not in nodes or t not in nodes:
            continue  # self-loops say nothing about which community a node belongs to
        w = 1.0 if w is None or (isinstance(w, float) and math.isnan(w)) else float(w)
        if w <= 0:
            continue  # an edge of no strength should not pull two entities together
        weights[(s, t) if s < t else (t, s)] += w
    return [(s, t, w) for (s, t), w in sorted(weights.items())]


def _components(edges: list[tuple[str, str, float]]) -> list[list[tuple[str, str, float]]]:
    """The edges (in their sorted order) of each connected component, components ordered by
    their first edge, so the result depends only on the graph."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for s, t, _ in edges:
        a, b = find(s), find(t)
        if a != b:
            parent[max(a, b)] = min(a, b)
    groups: dict[str, list[tuple[str, str, float]]] = {}
    for e in edges:
        groups.setdefault(find(e[0]), []).append(e)
    return list(groups.values())


def _relationship_index(relationships: pd.DataFrame) -> list[tuple[str, str, str]]:
    if relationships.empty:
        return []
    order = relationships.sort_values("human_readable_id", kind="stable") \
        if "human_readable_id" in relationships else relationships
    return [(str(i), str(s), str(t)) for i, s, t in zip(order["id"], order["source"], order["target"])]



def titles_from_members(comms: pd.DataFrame, entities: pd.DataFrame, k: int = 3) -> pd.DataFrame:
    """Name each community by its `k` most frequent members ("Scrooge, Marley, Fezziwig"): a
    lazy index has no reports, and so no report titles, to name its communities by."""
    if comms.empty:
        return comms
    rank = {str(i): (-int(f), -int(d), str(t)) for i, f, d, t in
            zip(entities["id"], entities["frequency"], entities["degree"], entities["title"])}
    title = dict(zip(entities["id"].astype(str), entities["title"].astype(str)))
    comms = comms.copy()
    comms["title"] = [", ".join(title[e] for e in sorted(map(str, ids), key=lambda e: rank[e])[:k])
                      for ids in comms["entity_ids"]]
    return comms
