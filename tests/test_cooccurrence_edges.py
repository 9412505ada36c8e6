"""Weak edges between entities one sentence names together (index/cooccurrence_edges.py)."""
import pandas as pd
from test_pipeline import DOCS, index, read_all, server, settings_for, stats_json, write_docs  # noqa: F401

from sensegraph.index.cooccurrence_edges import cooccurrence_edges

UNITS = pd.DataFrame({"id": ["t1", "t2"], "text": [
    "Maria Okafor met Daniel Reyes at Pier Nine. Halden is far away.",
    "Daniel Reyes and Maria Okafor sailed. Later Maria Okafor and Reyes argued at Pier Nine. Okafor left.",
]})


def entities(*rows):
    return pd.DataFrame([{"title": t, "aliases": [], "text_unit_ids": u, "frequency": len(u), "degree": d}
                         for t, u, d in rows])


def relationships(*pairs):
    return pd.DataFrame([{"source": a, "target": b, "weight": 1.0} for a, b in pairs],
                        columns=["source", "target", "weight"])


def test_entities_of_one_sentence_without_a_relationship_get_a_marked_weak_edge():
    ents = entities(("Maria Okafor", ["t1", "t2"], 1), ("Daniel Reyes", ["t1", "t2"], 0),
                    ("Pier Nine", ["t1", "t2"], 1), ("Halden", ["t1"], 0))
    weak = cooccurrence_edges(ents, relationships(("Maria Okafor", "Pier Nine")), UNITS, weight=0.3, language="en")
    pairs = {(r.source, r.target): r for r in weak.itertuples()}
    # Okafor-Pier Nine was extracted: no weak edge; Halden, alone in its sentence, is linked to
    # the names of the nearest sentence
    assert set(pairs) == {("Daniel Reyes", "Maria Okafor"), ("Daniel Reyes", "Pier Nine"),
                          ("Daniel Reyes", "Halden"), ("Halden", "Maria Okafor"), ("Halden", "Pier Nine")}
    assert pairs[("Halden", "Pier Nine")].weight == 0.3
    okafor_reyes = pairs[("Daniel Reyes", "Maria Okafor")]
    # three sentences name both ("Reyes" for Daniel Reyes), in two units
    assert okafor_reyes.weight == 0.9 and okafor_reyes.text_unit_ids == ["t1", "t2"]
    assert pairs[("Daniel Reyes", "Pier Nine")].weight == 0.6
    assert weak["co_occurrence"].all() and "same sentence" in okafor_reyes.description
    # capped below 1, the least an extracted relationship weighs
    many = pd.DataFrame({"id": ["t3"], "text": [" ".join(["Ann met Bob."] * 9)]})
    assert cooccurrence_edges(entities(("Ann", ["t3"], 0), ("Bob", ["t3"], 0)), relationships(), many,
                              weight=0.3, language="en")["weight"].tolist() == [0.9]


def test_no_weak_edges_when_turned_off():
    ents = entities(("Maria Okafor", ["t1"], 0), ("Daniel Reyes", ["t1"], 0))
    assert cooccurrence_edges(ents, relationships(), UNITS, weight=0, language="en").empty


def test_weak_edges_join_entities_the_model_left_alone_into_fewer_root_communities():
    from sensegraph.index.communities import build_communities

    text = ("Maria Okafor founded the Harbor Cooperative in Port Ellison. Daniel Reyes chaired the Harbor "
            "Cooperative. Elena Voss met Maria Okafor in Maren Harbour. Tomas Brandt owns the Halden Ferry Line.")
    units = pd.DataFrame({"id": ["t1"], "text": [text]})
    titles = ["Maria Okafor", "Harbor Cooperative", "Port Ellison", "Daniel Reyes", "Elena Voss", "Maren Harbour",
              "Tomas Brandt", "Halden Ferry Line"]
    ents = entities(*((t, ["t1"], 0) for t in titles))
    ents["id"] = [f"e{i}" for i in range(len(ents))]
    ents["human_readable_id"] = range(len(ents))
    rels = pd.DataFrame([{"id": "r0", "human_readable_id": 0, "source": "Maria Okafor",
                          "target": "Harbor Cooperative", "weight": 8.0, "text_unit_ids": ["t1"]}])
    weak = cooccurrence_edges(ents, rels, units, weight=0.3, language="en")
    together = pd.concat([rels, weak], ignore_index=True)

    def roots(r):
        comms = build_communities(ents, r, max_cluster_size=10, seed=1)
        return [len(ids) for ids in comms.loc[comms["level"] == 0, "entity_ids"]]

    # alone, the model's one relationship leaves 6 entities as root communities of their own
    assert sorted(roots(rels)) == [1, 1, 1, 1, 1, 1, 2]
    # with the sentences, no entity is left alone (Brandt and his ferry line are a pair)
    assert len(roots(together)) <= 3 and min(roots(together)) >= 2


def test_index_marks_weak_edges_and_weighs_them_below_extracted_ones(tmp_path, server):  # noqa: F811
    for weight in (0.3, 0.0):
        root = tmp_path / str(weight)
        write_docs(root, DOCS)
        result = index(settings_for(root, server, communities={"cooccurrence_weight": weight}))
        assert result.failures == {}
        tables = read_all(root / "output")
        rels, comms = tables["relationships"], tables["communities"]
        extracted, weak = rels[~rels["co_occurrence"]], rels[rels["co_occurrence"]]
        if weight:
            assert len(weak) > 0 and stats_json(root)["steps"]["summarize"]["cooccurrence_edges"] == len(weak)
            assert weak["weight"].max() < extracted["weight"].min()
            # weak edges join communities like any edge
            assert set(weak["id"]) & {r for ids in comms["relationship_ids"] for r in ids}
            # computed while the summaries were written, from the merged graph: the same edges
            # as from the finished tables
            again = cooccurrence_edges(tables["entities"], extracted, tables["text_units"], weight=weight,
                                       language="en")
            cols = ["id", "source", "target", "weight", "combined_degree"]
            assert again[cols].values.tolist() == weak[cols].values.tolist()
            assert [list(x) for x in again["text_unit_ids"]] == [list(x) for x in weak["text_unit_ids"]]
        else:
            assert weak.empty


def test_a_sentence_wrapped_over_lines_is_one_sentence_and_a_line_is_not():
    # Project Gutenberg texts are hard-wrapped: the old sentence splitter broke at every line end,
    # so names of one sentence on two lines got no edge, and names of two lines of one sentence
    # were linked as neighbours only.
    text = ("Scrooge never painted out Old Marley's name, and\nBob Cratchit kept it so for years. "
            "Nobody met Fred.\n\nSTAVE TWO\n\nThe Ghost of Christmas Past came.")
    units = pd.DataFrame({"id": ["t1"], "text": [text]})
    ents = entities(("Scrooge", ["t1"], 0), ("Bob Cratchit", ["t1"], 0), ("Fred", ["t1"], 0))
    weak = cooccurrence_edges(ents, relationships(), units, weight=0.3, language="en")
    pairs = {(r.source, r.target): r.weight for r in weak.itertuples()}
    assert pairs[("Bob Cratchit", "Scrooge")] == 0.3  # one sentence over two lines
    assert ("Fred", "Scrooge") in pairs or ("Bob Cratchit", "Fred") in pairs  # Fred: the nearest sentence
