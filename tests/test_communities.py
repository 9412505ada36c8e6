"""Paper step 2.4: hierarchical Leiden, every level a complete partition of all entities."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from sensegraph.index.communities import COLUMNS, build_communities


def make_graph(seed: int = 7, sizes: tuple[int, ...] = (120, 60, 30), isolated: int = 5):
    """Several connected components made of planted groups of 6, plus isolated entities."""
    rng = random.Random(seed)
    titles: list[str] = []
    pairs: list[tuple[str, str]] = []
    for comp, n in enumerate(sizes):
        nodes = [f"C{comp}N{i}" for i in range(n)]
        titles += nodes
        for i, a in enumerate(nodes):
            group = nodes[i // 6 * 6:(i // 6 + 1) * 6]
            pairs += [(a, b) for b in group if a < b and rng.random() < 0.7]
            if rng.random() < 0.3 or i % 6 == 0:
                b = rng.choice(nodes)
                if b != a:
                    pairs.append((a, b))
    titles += [f"ISO{i}" for i in range(isolated)]
    degree = {t: 0 for t in titles}
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
    entities = pd.DataFrame({
        "id": [f"e-{t}" for t in titles], "human_readable_id": range(len(titles)), "title": titles,
        "type": "thing", "description": [f"{t} is a thing." for t in titles],
        "text_unit_ids": [[f"tu{i % 17}"] for i in range(len(titles))], "frequency": 1,
        "degree": [degree[t] for t in titles],
    })
    relationships = pd.DataFrame({
        "id": [f"r{i}" for i in range(len(pairs))], "human_readable_id": range(len(pairs)),
        "source": [a for a, _ in pairs], "target": [b for _, b in pairs],
        "description": [f"{a} works with {b}." for a, b in pairs],
        "weight": [1.0 + i % 3 for i in range(len(pairs))],
        "combined_degree": [degree[a] + degree[b] for a, b in pairs],
        "text_unit_ids": [["tu0", f"tu{i % 5}"] for i in range(len(pairs))],
    })
    return entities, relationships


def assert_complete_hierarchy(comms: pd.DataFrame, entities: pd.DataFrame) -> None:
    all_ids = sorted(entities["id"])
    levels = sorted(comms["level"].unique())
    assert levels == list(range(len(levels)))
    by_number = comms.set_index("community")
    for level in levels:
        at = comms[comms["level"] == level]
        members = [e for ids in at["entity_ids"] for e in ids]
        assert sorted(members) == all_ids, f"level {level} is not a complete, exclusive partition"
        assert (at["size"] == at["entity_ids"].map(len)).all()
    assert sorted(comms["community"]) == list(range(len(comms)))
    assert (comms["human_readable_id"] == comms["community"]).all()
    assert comms["id"].is_unique
    for row in comms.itertuples():
        if row.level == 0:
            assert row.parent == -1
        else:
            parent = by_number.loc[row.parent]
            assert parent["level"] == row.level - 1
            assert row.community in list(parent["children"])
            assert set(row.entity_ids) <= set(parent["entity_ids"])
        if row.level < levels[-1]:
            # Every community has children down to the deepest level, and they partition it.
            kids = by_number.loc[list(row.children)]
            assert len(kids) >= 1
            assert sorted(e for ids in kids["entity_ids"] for e in ids) == sorted(row.entity_ids)
        else:
            assert list(row.children) == []
        if row.carried:
            parent = by_number.loc[row.parent]
            assert sorted(row.entity_ids) == sorted(parent["entity_ids"])
            assert list(parent["children"]) == [row.community]
    # Levels are numbered root first.
    assert list(comms["level"]) == sorted(comms["level"])


def test_levels_are_complete_exclusive_partitions():
    entities, relationships = make_graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    assert list(comms.columns) == COLUMNS
    assert comms["level"].nunique() >= 3
    assert_complete_hierarchy(comms, entities)
    # Isolated entities are singletons at the root level, carried down to the deepest level.
    for i in range(5):
        rows = comms[comms["entity_ids"].map(lambda ids, i=i: f"e-ISO{i}" in list(ids))]
        assert len(rows) == comms["level"].nunique()
        assert (rows["size"] == 1).all()
        assert rows["carried"].tolist() == [False] + [True] * (len(rows) - 1)
    assert comms["carried"].any() and not comms["carried"].all()


def test_communities_stay_within_connected_components():
    entities, relationships = make_graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    for ids in comms["entity_ids"]:
        prefixes = {e.split("N")[0] if "N" in e else e for e in ids}
        assert len(prefixes) == 1


def test_columns_relationships_and_text_units():
    entities, relationships = make_graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    ent_tus = dict(zip(entities["id"], entities["text_unit_ids"]))
    title_of = dict(zip(entities["id"], entities["title"]))
    for row in comms.itertuples():
        titles = {title_of[e] for e in row.entity_ids}
        inside = relationships[relationships["source"].isin(titles) & relationships["target"].isin(titles)]
        assert sorted(row.relationship_ids) == sorted(inside["id"])
        assert sorted(row.text_unit_ids) == sorted({t for e in row.entity_ids for t in ent_tus[e]})
        assert row.title == f"Community {row.community}"
        assert len(row.period) == 10 and row.period[4] == "-"


def test_stable_for_a_seed_and_row_order():
    entities, relationships = make_graph()
    a = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    b = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    pd.testing.assert_frame_equal(a, b)
    # The order of the input rows must not matter either (Leiden's result depends on edge order).
    shuffled = relationships.sample(frac=1.0, random_state=3).reset_index(drop=True)
    c = build_communities(entities.iloc[::-1].reset_index(drop=True), shuffled, max_cluster_size=5, seed=1)
    key = ["id", "community", "level", "parent"]
    pd.testing.assert_frame_equal(a[key], c[key])


def test_ids_are_content_hashes():
    entities, relationships = make_graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    assert comms["id"].map(len).eq(64).all()
    carried = comms[comms["carried"]].iloc[0]
    parent = comms.set_index("community").loc[carried["parent"]]
    assert carried["id"] != parent["id"]  # same members, different level


def test_edge_cases():
    entities, relationships = make_graph(sizes=(), isolated=3)
    comms = build_communities(entities, relationships.iloc[:0], max_cluster_size=5, seed=1)
    assert len(comms) == 3 and (comms["level"] == 0).all() and not comms["carried"].any()
    empty = build_communities(entities.iloc[:0], relationships.iloc[:0], max_cluster_size=5, seed=1)
    assert empty.empty and list(empty.columns) == COLUMNS
    # Self-loops, unknown endpoints and duplicate pairs in both directions.
    ents, _ = make_graph(sizes=(), isolated=4)
    rels = pd.DataFrame({"id": ["a", "b", "c", "d"], "human_readable_id": range(4),
                         "source": ["ISO0", "ISO0", "ISO1", "ISO2"], "target": ["ISO0", "ISO1", "ISO0", "NOPE"],
                         "description": "", "weight": [1.0, 2.0, 1.0, 1.0], "combined_degree": 1,
                         "text_unit_ids": [[]] * 4})
    comms = build_communities(ents, rels, max_cluster_size=5, seed=1)
    assert_complete_hierarchy(comms, ents)
    pair = comms[comms["size"] == 2].iloc[0]
    assert sorted(pair["relationship_ids"]) == ["a", "b", "c"]


def test_christmas_carol_index(shared_data):
    folder = shared_data / "msgraphrag-christmas-carol-index"
    if not (folder / "entities.parquet").exists():
        pytest.skip("Microsoft's Christmas Carol index not found")
    entities = pd.read_parquet(folder / "entities.parquet")
    relationships = pd.read_parquet(folder / "relationships.parquet")
    comms = build_communities(entities, relationships, max_cluster_size=10, seed=0xDEADBEEF)
    assert_complete_hierarchy(comms, entities)
    per_level = comms.groupby("level").size().to_dict()
    print(f"\nChristmas Carol: {len(entities)} entities, {len(per_level)} levels, communities per level "
          f"{per_level}, carried {comms.groupby('level')['carried'].sum().to_dict()}")
    # Microsoft's own table leaves entities out below the root level; ours never does.
    theirs = pd.read_parquet(folder / "communities.parquet")
    assert (theirs.groupby("level")["size"].sum() < len(entities)).any()
