"""Graph-walk retrieval (sensegraph/query/graph_walk.py): personalised PageRank over entities and
text units, seeded from the question, and what local search makes of it.

The graphs are hand-made so the expected ranking can be reasoned out: a film, its director and
the director's father, each in their own passage, as in 2WikiMultihopQA's "Who is the father of
the director of film X?", with a generic entity ("FILM") that many distractor passages share.
Embeddings come from test_query's hashing embedder (texts that share words are similar).
"""
from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd

from scripted import ScriptedLLM, last_user
from sensegraph.config import load_settings
from sensegraph.query.answer import Query
from sensegraph.query.data import GraphIndex
from sensegraph.query.graph_walk import build_graph, pagerank, walk
from sensegraph.query.local_search import local_context, local_search
from test_query import embedder


def graph_index(tmp_path, entities, relationships, units) -> GraphIndex:
    """A GraphIndex from (title, description, [unit ids]), (source, target, weight) and
    (unit id, text) lists."""
    ents = pd.DataFrame([{"id": f"e{i}", "human_readable_id": i, "title": t, "type": "person", "description": d,
                          "text_unit_ids": u, "frequency": len(u), "degree": 1}
                         for i, (t, d, u) in enumerate(entities)])
    rels = pd.DataFrame([{"id": f"r{i}", "human_readable_id": i, "source": s, "target": t,
                          "description": f"{s} and {t}", "weight": w, "combined_degree": 2, "text_unit_ids": []}
                         for i, (s, t, w) in enumerate(relationships)],
                        columns=["id", "human_readable_id", "source", "target", "description", "weight",
                                 "combined_degree", "text_unit_ids"])
    text_units = pd.DataFrame([{"id": u, "human_readable_id": i, "n_tokens": 30, "document_id": "d0", "text": text,
                                "entity_ids": [], "relationship_ids": [], "covariate_ids": []}
                               for i, (u, text) in enumerate(units)])
    empty = pd.DataFrame(columns=["id", "human_readable_id", "community", "level", "parent", "children", "title",
                                  "entity_ids", "full_content", "rank"])
    return GraphIndex(tmp_path, {"entities": ents, "relationships": rels, "text_units": text_units,
                                 "communities": empty.copy(), "community_reports": empty.copy()})


def film_index(tmp_path, distractors: int = 5) -> GraphIndex:
    """Palo Alto (film) -> Gia Coppola (its director) -> Francis Coppola (her father), plus
    `distractors` other films that share only the generic entity FILM."""
    others = [f"d{i}" for i in range(distractors)]
    entities = [
        ("PALO ALTO", "a 2013 film", ["u_film"]),
        ("GIA COPPOLA", "a director", ["u_film", "u_director"]),
        ("FRANCIS COPPOLA", "a film maker", ["u_director"]),
        ("FILM", "a motion picture", ["u_film"] + others),
    ] + [(f"OTHER MOVIE {i}", "another motion picture", [f"d{i}"]) for i in range(distractors)]
    relationships = [("PALO ALTO", "GIA COPPOLA", 2.0), ("GIA COPPOLA", "FRANCIS COPPOLA", 2.0),
                     ("PALO ALTO", "FILM", 1.0)] + [(f"OTHER MOVIE {i}", "FILM", 1.0) for i in range(distractors)]
    units = [("u_film", "Palo Alto is a 2013 film directed by Gia Coppola."),
             ("u_director", "Gia Coppola is the granddaughter of Carmine; her father is Francis.")]
    units += [(d, f"Other movie {i} is a film released in 2013 about a father.") for i, d in enumerate(others)]
    return graph_index(tmp_path, entities, relationships, units)


def query(tmp_path, index: GraphIndex, question: str, llm: ScriptedLLM | None = None, **query_settings) -> Query:
    settings = load_settings(tmp_path, overrides={"chat": {"provider": "openai", "model": "scripted",
                                                           "base_url": "http://scripted/v1", "api_key": "k"},
                                                  "query": query_settings, "cache": {"enabled": False}})
    llm = llm or ScriptedLLM(lambda body: "Answer [Data: Sources (1)]")
    return Query(question, settings, index, llm.client(settings.chat), embedder(settings))


def unit_rank(index: GraphIndex, scores: np.ndarray) -> list[str]:
    graph = build_graph(index)
    n = len(graph.entity_ids)
    return [graph.unit_ids[i] for i in np.argsort(-scores[n:], kind="stable")]


def test_pagerank_from_one_entity_ranks_the_two_hop_passage_above_one_hop_distractors(tmp_path):
    index = film_index(tmp_path)
    graph = build_graph(index)
    restart = np.zeros(graph.size)
    restart[graph.entity_ids.index("e0")] = 1.0  # PALO ALTO
    # FILM, one hop from every distractor passage, seeded as node specificity weighs it (6 units)
    restart[graph.entity_ids.index("e3")] = 1.0 / np.sqrt(6)
    scores = pagerank(graph, restart, damping=0.5)
    assert abs(scores.sum() - 1) < 1e-6 and (scores >= 0).all()
    ranked = unit_rank(index, scores)
    # the director's passage names neither seed, yet beats every passage FILM touches directly
    assert ranked[:2] == ["u_film", "u_director"]
    # without the bridge entity the chain is cut and the director's passage falls behind them
    cut = graph_index(tmp_path, [e for e in [("PALO ALTO", "", ["u_film"]), ("FILM", "", ["u_film", "d0", "d1"]),
                                             ("FRANCIS COPPOLA", "", ["u_director"])]],
                      [], [("u_film", "a"), ("u_director", "b"), ("d0", "c"), ("d1", "d")])
    g = build_graph(cut)
    r = np.zeros(g.size)
    r[0] = r[1] = 1.0
    assert unit_rank(cut, pagerank(g, r, damping=0.5))[-1] == "u_director"


def test_pagerank_equals_the_closed_form_with_a_dangling_seed(tmp_path):
    """The iteration solves p = (1-d)·r + d·(Pᵀp + (mass on dangling nodes)·r); check it against
    numpy's linear solve on a graph with weighted edges and an entity without any."""
    index = graph_index(tmp_path, [("LONER", "", []), ("A", "", ["u1", "u2"]), ("B", "", ["u2"])],
                        [("A", "B", 3.0), ("A", "B", 1.0)], [("u1", "one"), ("u2", "two")])
    graph = build_graph(index)
    assert list(graph.dangling) == [0]
    restart = np.array([1.0, 0.5, 0.0, 0.0, 0.25])
    d = 0.85
    scores = pagerank(graph, restart, damping=d)
    r = restart / restart.sum()
    P = np.zeros((graph.size, graph.size))
    np.add.at(P, (graph.source, graph.target), graph.probability)
    dangling = np.zeros(graph.size)
    dangling[graph.dangling] = 1.0
    expected = np.linalg.solve(np.eye(graph.size) - d * (P.T + np.outer(r, dangling)), (1 - d) * r)
    assert np.allclose(scores, expected, atol=1e-7) and abs(scores.sum() - 1) < 1e-6
    # relationship weights are scaled by their median (2.0), mentions weigh 1: A->B gets 2 of A's 4
    assert np.allclose(P[1], [0, 0, 0.5, 0.25, 0.25])


def test_seeds_come_from_names_in_the_question_and_from_embedding_neighbours(tmp_path):
    index = film_index(tmp_path)
    q = query(tmp_path, index, "Who is the father of the director of film Palo Alto?", top_entities=2,
              walk_fact_weight=0)  # the entities and the units only (facts: below)
    path = asyncio.run(walk(q, q.question))
    assert path.named[0] == "e0"  # PALO ALTO, named; FILM too (a whole-word match of "film")
    assert set(path.named) == {"e0", "e3"}
    entity_seeds = {e for e in path.seeds if e.startswith("e")}
    # at most top_entities embedding neighbours beside the named ones
    assert {"e0", "e3"} <= entity_seeds and len(entity_seeds) <= 2 + 2
    # the named film weighs more than the generic FILM, whose five other passages dilute it
    assert path.seeds["e0"] > path.seeds["e3"]
    # and the passages nearest to the question seed the walk too (walk_seed_units)
    assert any(not e.startswith("e") for e in path.seeds)
    # entities ranked by the walk: the bridge entity, named nowhere in the question, is near the top
    assert "e1" in path.entity_ids(3)


def test_local_search_retrieves_a_passage_only_the_walk_reaches(tmp_path):
    index = film_index(tmp_path, distractors=8)
    question = "Who is the father of the director of film Palo Alto?"
    walked = asyncio.run(local_context(query(tmp_path, index, question, top_entities=2, walk_seed_units=2,
                                             context_tokens=300), question))
    near = asyncio.run(local_context(query(tmp_path, index, question, top_entities=2, context_tokens=300,
                                           local_retrieval="neighbourhood"), question))
    sources = {kind: [r["id"] for r in s.records] for kind, s in (("walk", walked.sections[-1]),
                                                                    ("near", near.sections[-1]))}
    assert "u_director" in sources["walk"][:3]
    assert "u_director" not in sources["near"]  # one hop from the matched entities does not reach it


def test_chinese_names_seed_the_walk(tmp_path):
    entities = [("孙悟空", "石猴", ["u1"]), ("菩提祖师", "师父", ["u1", "u2"]), ("斜月三星洞", "洞府", ["u2"]),
                ("花果山", "山", ["u3"])]
    relationships = [("孙悟空", "菩提祖师", 3.0), ("菩提祖师", "斜月三星洞", 2.0)]
    units = [("u1", "猴王拜菩提祖师为师，得名孙悟空。"), ("u2", "菩提祖师住在灵台方寸山斜月三星洞。"), ("u3", "花果山有一块仙石。")]
    index = graph_index(tmp_path, entities, relationships, units)
    q = query(tmp_path, index, "孙悟空的师父住在哪里？", walk_seed_units=0, top_entities=1)
    path = asyncio.run(walk(q, q.question))
    assert path.named == ["e0"]  # 孙悟空 found inside a sentence without spaces
    assert path.unit_ids(2) == ["u1", "u2"]  # the master's cave, two hops from the named monkey


def test_local_search_with_the_walk_answers_from_the_walked_context(tmp_path):
    index = film_index(tmp_path)
    llm = ScriptedLLM(lambda body: "Gia Coppola [Data: Sources (0)]")
    result = asyncio.run(local_search(query(tmp_path, index, "Who directed Palo Alto?", llm)))
    assert result.stats["retrieval"] == "walk"
    assert result.context.sections[1].records[0]["title"] == "PALO ALTO"  # the named entity leads
    assert len(llm.requests) == 1 and "directed by Gia Coppola" in last_user(llm.requests[0])
    assert result.citations == {"Sources": [0]}


def test_confident_seeds_weigh_a_group_by_how_far_its_best_match_stands_out(tmp_path):
    """walk_confident_seeds: with no name of the question in the index, the entities' share of
    the restart follows how far their best match stands out, and so does the units' share."""
    index = film_index(tmp_path, distractors=8)
    question = "granddaughter of Carmine"  # names no entity; words of one passage only
    two = dict(walk_unit_weight=1, walk_fact_weight=0)  # the two groups, no facts
    off = asyncio.run(walk(query(tmp_path, index, question, walk_confident_seeds=False, **two), question))
    sure = asyncio.run(walk(query(tmp_path, index, question, walk_confident_seeds=True, **two), question))
    units = set(index.text_units["id"])

    def unit_share(w):
        total = sum(w.seeds.values())
        return sum(v for k, v in w.seeds.items() if k in units) / total
    assert abs(unit_share(off) - 0.5) < 1e-9  # fixed: entities 1, units walk_unit_weight 1
    assert abs(unit_share(sure) - 0.5) > 0.01  # the groups' shares now differ, as their best matches do
    # a question naming an entity keeps the entities' full share
    named = "Palo Alto"
    a = asyncio.run(walk(query(tmp_path, index, named, walk_confident_seeds=False, walk_fact_weight=0), named))
    b = asyncio.run(walk(query(tmp_path, index, named, walk_confident_seeds=True, walk_fact_weight=0), named))
    assert sum(v for k, v in b.seeds.items() if k not in units) == sum(v for k, v in a.seeds.items() if k not in units)


def test_a_match_that_stands_out_weighs_more_than_one_that_barely_beats_the_crowd():
    from sensegraph.query.graph_walk import _standing_out

    crowd = np.linspace(0.80, 0.82, 200)
    peaked = np.append(crowd, 0.95)
    barely = np.append(crowd, 0.821)
    assert _standing_out(peaked) > 3 * _standing_out(barely)
    assert _standing_out(np.full(10, 0.8)) == 1.0  # no spread: the group's plain share
    assert _standing_out(np.array([-1.0, -1.0])) == 1.0  # no vectors


def test_embedding_many_entities_on_first_use_shows_its_progress(tmp_path):
    """The first local question of a lazy index embeds every concept (minutes on a large corpus):
    it says so, then reports its progress, and writes the vectors so it happens once."""
    n = 200
    index = graph_index(tmp_path, [(f"THING {i}", f"thing number {i}", [f"u{i}"]) for i in range(n)], [],
                        [(f"u{i}", f"text {i}") for i in range(n)])
    settings = load_settings(tmp_path, overrides={"embedding": {"batch_size": 8}, "cache": {"enabled": False}})
    lines: list[str] = []
    vectors = asyncio.run(index.vectors("entities", embedder(settings), lines.append))
    assert len(vectors.ids) == n
    assert lines[0].startswith(f"embedding {n} entities")
    progress = [line for line in lines if "embedded" in line]
    assert 5 <= len(progress) <= 10 and all(" s left)" in line for line in progress), lines
    assert progress[0].strip().startswith("embedded 24 of 200")  # the first tenth, in whole batches


def test_fact_linking_seeds_the_entity_the_best_matching_sentence_names(tmp_path):
    """walk_fact_weight: the sentences of the nearest units are matched to the question, and the
    entities they name seed the walk, the bridge the question does not name among them."""
    index = film_index(tmp_path, distractors=8)
    question = "Who is the father of the director of film Palo Alto?"
    off = asyncio.run(walk(query(tmp_path, index, question, top_entities=1, walk_seed_units=1, walk_fact_weight=0),
                           question))
    on = asyncio.run(walk(query(tmp_path, index, question, top_entities=1, walk_seed_units=1,
                                walk_fact_weight=1.0, walk_fact_units=2), question))
    assert "e1" not in off.seeds  # GIA COPPOLA: not named, not the nearest entity
    assert on.seeds["e1"] > 0  # named in "Palo Alto is a 2013 film directed by Gia Coppola."
    # the seeds of the other groups are those of the walk without facts
    assert {k: v for k, v in on.seeds.items() if k != "e1"}.keys() >= off.seeds.keys()
    assert on.unit_ids().index("u_director") <= off.unit_ids().index("u_director")


def test_fact_linking_finds_nothing_in_units_that_name_no_entity(tmp_path):
    entities = [("ALPHA", "a thing", ["u2"])]
    units = [("u1", "Nothing here names anything. Still nothing."), ("u2", "Alpha is here.")]
    index = graph_index(tmp_path, entities, [], units)
    question = "nothing here"
    on = asyncio.run(walk(query(tmp_path, index, question, walk_fact_weight=1.0, walk_fact_units=1), question))
    off = asyncio.run(walk(query(tmp_path, index, question, walk_fact_weight=0), question))
    assert on.seeds == off.seeds  # the nearest unit's sentences name no entity: no fact seeds


def _facts_llm(answer) -> ScriptedLLM:
    """Answers the recognition filter's call with `answer` (a Picks reply or an httpx.Response)
    and any other call (local search's answer) with a cited sentence."""
    from scripted import schema_name

    return ScriptedLLM(lambda body: answer if schema_name(body) == "Picks" else "Answer [Data: Sources (1)]")


def test_the_recognition_filter_seeds_only_the_facts_the_model_keeps(tmp_path):
    """walk_fact_filter (HippoRAG 2's recognition filter): the chat model is shown the facts that
    best match the question and only those it keeps seed; none kept, no fact seeds."""
    index = film_index(tmp_path, distractors=8)
    question = "Who is the father of the director of film Palo Alto?"
    common = dict(top_entities=1, walk_seed_units=1, walk_fact_weight=1.0, walk_fact_units=2)
    off = asyncio.run(walk(query(tmp_path, index, question, top_entities=1, walk_seed_units=1, walk_fact_weight=0),
                           question))
    unfiltered = asyncio.run(walk(query(tmp_path, index, question, **common), question))
    keep = _facts_llm({"relevant": [1]})
    kept = asyncio.run(walk(query(tmp_path, index, question, keep, walk_fact_filter=True, **common), question))
    none = asyncio.run(walk(query(tmp_path, index, question, _facts_llm({"relevant": []}), walk_fact_filter=True,
                                  **common), question))
    outside = asyncio.run(walk(query(tmp_path, index, question, _facts_llm({"relevant": [7]}), walk_fact_filter=True,
                                     **common), question))

    [call] = keep.requests  # one call for the question, showing the question and the fact
    prompt = last_user(call)
    assert question in prompt and "1. Palo Alto is a 2013 film directed by Gia Coppola." in prompt
    assert "e1" in unfiltered.seeds and kept.seeds == unfiltered.seeds  # the one fact kept
    assert none.seeds == off.seeds and "e1" not in none.seeds  # turned down: it seeds nothing
    assert outside.seeds == off.seeds  # a number that was not shown keeps nothing


def test_a_failed_recognition_call_leaves_the_facts_unfiltered_and_is_reported(tmp_path):
    import httpx

    index = film_index(tmp_path, distractors=8)
    question = "Who is the father of the director of film Palo Alto?"
    common = dict(top_entities=1, walk_seed_units=1, walk_fact_weight=1.0, walk_fact_units=2)
    unfiltered = asyncio.run(walk(query(tmp_path, index, question, **common), question))
    refused = httpx.Response(400, json={"error": {"message": "bad request", "type": "invalid_request_error"}})
    q = query(tmp_path, index, question, _facts_llm(refused), walk_fact_filter=True, **common)
    r = asyncio.run(local_search(q))
    assert r.answer.startswith("Answer")
    assert len(r.failures) == 1 and r.failures[0].startswith("recognition filter of the walk's facts")
    q2 = query(tmp_path, index, question, _facts_llm(refused), walk_fact_filter=True, **common)
    assert asyncio.run(walk(q2, question)).seeds == unfiltered.seeds
