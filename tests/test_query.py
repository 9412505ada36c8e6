"""Query methods with a scripted LLM: what reaches the model, and what comes back.

The index is synthetic and small enough to reason about: eight entities in a three-level
hierarchy where one branch ends at level 0 and one community has no report (as after a failed
report), so projection has something to get right. Embeddings come from a scripted
OpenAI-compatible /embeddings endpoint that hashes words into a vector, so texts that share
words are similar — enough for retrieval to be meaningful and deterministic.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from scripted import ScriptedLLM, last_user, schema_name
from sensegraph.config import load_settings
from sensegraph.llm.embeddings import Embedder
from sensegraph.query.answer import NO_ANSWER, Query
from sensegraph.query.citations import normalise, parse
from sensegraph.query.data import GraphIndex, list_ids
from sensegraph.query.drift_search import drift_search
from sensegraph.query.global_search import global_search, project_reports, text_search
from sensegraph.query.local_search import local_search
from sensegraph.query.basic_search import basic_search
from sensegraph.tokens import count_tokens

DIM = 64
WORDS = ("harbor fishing boats cooperative council election island ferry school budget museum "
         "lighthouse storm bridge market archive").split()


# -- a synthetic index --------------------------------------------------------------------------
def _entity(i: int) -> dict[str, Any]:
    topic = WORDS[i % len(WORDS)]
    return {"id": f"e{i}", "human_readable_id": i, "title": f"ENTITY {i}", "type": "organization",
            "description": f"Entity {i} is about the {topic} and the {topic} people. " + "detail " * 30,
            "text_unit_ids": [f"t{i}", f"t{(i + 1) % 8}"], "frequency": 2, "degree": 2}


def synthetic_index(tmp_path) -> GraphIndex:
    entities = pd.DataFrame([_entity(i) for i in range(8)])
    rels = []
    for n, (a, b) in enumerate([(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (6, 7), (2, 3), (5, 6)]):
        rels.append({"id": f"r{n}", "human_readable_id": n, "source": f"ENTITY {a}", "target": f"ENTITY {b}",
                     "description": f"ENTITY {a} works with ENTITY {b} on the {WORDS[a]} " + "and more " * 20,
                     "weight": float(n + 1), "combined_degree": 4, "text_unit_ids": [f"t{a}"]})
    units = [{"id": f"t{i}", "human_readable_id": i, "n_tokens": 120, "document_id": "d0",
              "text": f"Source text {i} about the {WORDS[i % len(WORDS)]}. " + "words " * 120,
              "entity_ids": [f"e{i}"], "relationship_ids": [], "covariate_ids": []} for i in range(8)]
    # level 0: 0 = {0..5} -> children 2, 3;   1 = {6, 7} ends here (no children)
    # level 1: 2 = {0, 1, 2} -> child 4;       3 = {3, 4, 5} -> child 5 (community 5 has no report)
    # level 2: 4 = {0, 1, 2};                  5 = {3, 4, 5}
    comm = [(0, 0, -1, [2, 3], range(0, 6)), (1, 0, -1, [], range(6, 8)), (2, 1, 0, [4], range(0, 3)),
            (3, 1, 0, [5], range(3, 6)), (4, 2, 2, [], range(0, 3)), (5, 2, 3, [], range(3, 6))]
    communities = pd.DataFrame([{"id": f"c{c}", "human_readable_id": c, "community": c, "level": lvl,
                                 "parent": parent, "children": kids, "title": f"Community {c}",
                                 "entity_ids": [f"e{i}" for i in members], "relationship_ids": [],
                                 "text_unit_ids": [], "period": "", "size": len(members)}
                                for c, lvl, parent, kids, members in comm])
    reports = pd.DataFrame([{"id": f"cr{c}", "human_readable_id": c, "community": c, "level": lvl,
                             "parent": parent, "children": kids, "title": f"Report {c}",
                             "summary": f"Summary of community {c}",
                             "full_content": f"# Report {c}\nCommunity {c} covers the {WORDS[c]}. " + "text " * 150,
                             "rank": float(10 - c), "rating_explanation": "", "findings": [],
                             "full_content_json": "{}", "period": "", "size": 3}
                            for c, lvl, parent, kids, _ in comm if c != 5])
    claims = pd.DataFrame([{"id": f"k{i}", "human_readable_id": i, "covariate_type": "claim", "type": "FACT",
                            "description": f"Claim {i} about ENTITY {i}. " + "claim " * 20,
                            "subject_id": f"ENTITY {i}", "object_id": "NONE", "status": "TRUE",
                            "start_date": "", "end_date": "", "source_text": "", "text_unit_id": f"t{i}"}
                           for i in range(8)])
    tables = {"entities": entities, "relationships": pd.DataFrame(rels), "text_units": pd.DataFrame(units),
              "communities": communities, "community_reports": reports, "covariates": claims}
    return GraphIndex(tmp_path, tables)


def _vector(text: str) -> list[float]:
    v = np.zeros(DIM, np.float32)
    for word in re.findall(r"\w+", text.lower()):
        v[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += 1.0
    n = np.linalg.norm(v)
    return (v / n if n else v).tolist()


def embedder(settings) -> Embedder:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        data = [{"object": "embedding", "index": i, "embedding": _vector(t)} for i, t in enumerate(body["input"])]
        return httpx.Response(200, json={"object": "list", "data": data, "model": "hash",
                                         "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    s = settings.embedding.model_copy(update={"provider": "openai", "model": "hash", "base_url": "http://e/v1",
                                              "api_key": "k", "dimensions": DIM})
    return Embedder(s, cache=None, http_client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))


def make_query(tmp_path, responder, question="What are the main themes?", **query_settings) -> tuple[Query, ScriptedLLM]:
    settings = load_settings(tmp_path, overrides={"chat": {"provider": "openai", "model": "scripted",
                                                           "base_url": "http://scripted/v1", "api_key": "k"},
                                                  "query": query_settings, "cache": {"enabled": False}})
    llm = ScriptedLLM(responder)
    index = synthetic_index(tmp_path)
    q = Query(question, settings, index, llm.client(settings.chat), embedder(settings))
    return q, llm


def run(coro):
    return asyncio.run(coro)


def data_part(body: dict) -> str:
    text = last_user(body)
    return text.split("\n\n", 1)[1].rsplit("\n\nQuestion:", 1)[0] if "\n\n" in text else text


def kind(body: dict) -> str:
    return schema_name(body) or "text"


# -- projection -------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_level_projection_covers_every_entity_exactly_once(tmp_path, level):
    index = synthetic_index(tmp_path)
    chosen = project_reports(index.reports, index.communities, level)
    members = dict(zip(index.communities["community"], index.communities["entity_ids"]))
    covered = [e for c in chosen["community"] for e in list_ids(members[c])]
    assert sorted(covered) == sorted(index.entities["id"])
    assert len(covered) == len(set(covered))
    # the branch that ends at level 0 contributes its own report at every deeper level
    assert 1 in set(chosen["community"])
    if level >= 2:
        # community 5 has no report, so its parent 3 covers its entities
        assert set(chosen["community"]) == {1, 3, 4}


# -- global search ----------------------------------------------------------------------------
def _map_reduce_responder(scores_per_batch):
    """Map batch i answers points with the given scores; the reduce echoes a fixed answer."""
    calls = {"map": 0}

    def respond(body):
        if kind(body) == "MapAnswer":
            i = calls["map"]
            calls["map"] += 1
            scores = scores_per_batch[i % len(scores_per_batch)]
            return {"points": [{"description": f"POINT b{i} s{s}", "ids": [1, 77], "score": s} for s in scores]}
        return "The answer [Data: Reports (1, 4)]."
    return respond


def test_map_chunks_respect_the_budget_and_cover_every_report(tmp_path):
    q, llm = make_query(tmp_path, _map_reduce_responder([[50]]), context_tokens=400)
    result = run(global_search(q, level=2))
    maps = [b for b in llm.requests if kind(b) == "MapAnswer"]
    assert len(maps) == result.stats["map_calls"] > 1
    for body in maps:
        assert count_tokens(data_part(body)) <= 400
    mapped = [int(m) for body in maps for m in re.findall(r"^(\d+)\|Report", data_part(body), re.M)]
    assert sorted(mapped) == [1, 3, 4]  # every projected report, once


def test_score_zero_points_never_reach_the_reduce_and_reduce_is_sorted(tmp_path):
    q, llm = make_query(tmp_path, _map_reduce_responder([[0, 70, 15], [90, 0], [40]]), context_tokens=400)
    result = run(global_search(q, level=2))
    reduce = [b for b in llm.requests if kind(b) == "text"]
    assert len(reduce) == 1
    text = last_user(reduce[0])
    assert "s0 " not in text
    scores = [int(s) for s in re.findall(r"Importance Score: (\d+)", text)]
    assert scores == sorted(scores, reverse=True) and scores and min(scores) > 0
    assert result.stats["points_scored_zero"] >= 1
    assert result.citations == {"Reports": [1, 4]}


def test_reduce_keeps_the_best_points_when_the_budget_is_short(tmp_path):
    q, llm = make_query(tmp_path, _map_reduce_responder([[10, 95, 30, 80, 55]]), context_tokens=120)
    run(global_search(q, level=0))
    text = last_user([b for b in llm.requests if kind(b) == "text"][0])
    scores = [int(s) for s in re.findall(r"Importance Score: (\d+)", text)]
    assert scores[0] == 95 and scores == sorted(scores, reverse=True)
    assert count_tokens(text.split("\n\n", 1)[1].rsplit("\n\nQuestion:", 1)[0]) <= 120 + 10


def test_nothing_scored_above_zero_gives_a_plain_no_answer_without_reduce(tmp_path):
    q, llm = make_query(tmp_path, _map_reduce_responder([[0, 0]]))
    result = run(global_search(q, level=1))
    assert all(kind(b) == "MapAnswer" for b in llm.requests)
    assert result.answer == NO_ANSWER["en"] and result.stats["reduce_calls"] == 0


def test_text_baseline_maps_shuffled_text_units(tmp_path):
    q, llm = make_query(tmp_path, _map_reduce_responder([[60]]), context_tokens=500)
    result = run(text_search(q))
    sources = [int(m) for b in llm.requests if kind(b) == "MapAnswer"
               for m in re.findall(r"^(\d+)\|Source text", data_part(b), re.M)]
    assert sorted(sources) == list(range(8))
    assert sources != list(range(8))  # shuffled (seeded), as in the paper
    assert result.method == "text" and result.stats["context_units"] == 8


def test_dynamic_selection_descends_only_into_relevant_branches(tmp_path):
    rated: list[int] = []

    def respond(body):
        if kind(body) == "Rating":
            community = int(re.search(r"# Report (\d+)", last_user(body)).group(1))
            rated.append(community)
            return {"reason": "r", "rating": 4 if community in (0, 2) else 0}
        return _map_reduce_responder([[70]])(body)

    q, llm = make_query(tmp_path, respond)
    result = run(global_search(q, level=2, dynamic=True))
    # roots 0 and 1 rated; only 0 is relevant -> its children 2, 3; only 2 -> its child 4
    assert sorted(rated) == [0, 1, 2, 3, 4]
    assert result.stats["dynamic"]["rated"] == 5
    mapped = [int(m) for b in llm.requests if kind(b) == "MapAnswer"
              for m in re.findall(r"^(\d+)\|Report", data_part(b), re.M)]
    assert mapped == [2]  # the deepest relevant report of the one relevant branch
    assert result.stats["dynamic"]["kept"] == 1


# -- citations ----------------------------------------------------------------------------------
def test_citations_are_limited_to_five_and_invented_ids_removed():
    text, found = normalise("Point [Data: Reports (1, 2, 3, 4, 5, 6, 999); entity (7)].",
                            {"Reports": set(range(10)), "Entities": {7}})
    assert text == "Point [Data: Reports (1, 2, 3, 4, 5, +more); Entities (7)]."
    assert found.cited == {"Reports": [1, 2, 3, 4, 5, 6], "Entities": [7]}
    assert found.invalid == {"Reports": [999]}
    text, found = normalise("Only fiction [Data: Sources (42)].", {"Sources": {1}})
    assert text == "Only fiction." and found.invalid == {"Sources": [42]}
    assert parse("见 [Data: 报告 (3)；实体 (2, +more)]") == [("Reports", [3], False), ("Entities", [2], True)]


# -- local search -------------------------------------------------------------------------------
def test_local_context_respects_its_shares_and_puts_named_entities_first(tmp_path):
    q, llm = make_query(tmp_path, lambda b: "Answer [Data: Entities (3); Sources (3)]",
                        question="What does ENTITY 3 do for the council?", context_tokens=1500,
                        text_unit_share=0.5, community_share=0.2)
    result = run(local_search(q))
    sections = {s.kind: s for s in result.context.sections}
    assert sections["Reports"].tokens <= 1500 * 0.2
    graph = sum(sections[k].tokens for k in ("Entities", "Relationships", "Claims") if k in sections)
    assert graph <= 1500 * 0.3
    assert result.context.tokens <= 1500
    assert sections["Entities"].records[0]["title"] == "ENTITY 3"
    # relationships between matched entities come before those leaving the matched set
    titles = {r["title"] for r in sections["Entities"].records}
    inside = [(r["source"] in titles and r["target"] in titles) for r in sections["Relationships"].records]
    assert inside == sorted(inside, reverse=True)
    assert result.citations == {"Entities": [3], "Sources": [3]}
    assert len(llm.requests) == 1 and "ENTITY 3" in last_user(llm.requests[0])


def test_basic_search_retrieves_the_nearest_text_units(tmp_path):
    q, llm = make_query(tmp_path, lambda b: "Answer [Data: Sources (7, 2)]", question="ferry",
                        top_text_units=3)
    result = run(basic_search(q))
    refs = [r["ref"] for r in result.context.sections[0].records]
    assert refs[0] == 7  # the only text unit about the ferry
    assert len(refs) == 3 and result.method == "basic"
    # a cited source that was not retrieved is not evidence
    assert result.citations.get("Sources") == ([7, 2] if 2 in refs else [7])


# -- DRIFT --------------------------------------------------------------------------------------
def test_drift_answers_the_highest_scored_follow_ups(tmp_path):
    asked: list[str] = []

    def respond(body):
        if kind(body) in ("Intermediate", "Primer"):
            text = last_user(body)
            if "Follow-up question:" not in text:  # the primer
                return {"answer": "Primer [Data: Reports (0)]", "score": 40, "follow_ups": [
                    {"question": "Q-low", "score": 10}, {"question": "Q-high", "score": 95},
                    {"question": "Q-mid", "score": 60}, {"question": "Q-top2", "score": 90}]}
            follow = text.rsplit("Follow-up question:", 1)[1].strip()
            asked.append(follow)
            return {"answer": f"About {follow}", "score": 70,
                    "follow_ups": [{"question": f"{follow}-next", "score": 99 if follow == "Q-high" else 5}]}
        if kind(body) == "text" and "Question:" in last_user(body) and "Key point" not in last_user(body):
            return "A hypothetical report about the harbor."
        return "Final [Data: Reports (0)]"

    q, llm = make_query(tmp_path, respond, drift_breadth=2, drift_depth=2)
    result = run(drift_search(q))
    assert asked[:2] == ["Q-high", "Q-top2"] or sorted(asked[:2]) == ["Q-high", "Q-top2"]
    # round 2: the best open follow-up is the one Q-high proposed (99), then Q-mid (60)
    assert sorted(asked[2:]) == ["Q-high-next", "Q-mid"]
    assert "Q-low" not in asked
    assert result.stats["follow_ups_answered"] == 4
    assert result.answer.startswith("Final")


# -- language and conversation --------------------------------------------------------------------
def test_a_chinese_question_gets_chinese_prompts(tmp_path):
    q, llm = make_query(tmp_path, _map_reduce_responder([[50]]), question="这些文档的主要主题是什么？")
    run(global_search(q, level=0))
    assert all("研究分析师" in b["messages"][0]["content"] for b in llm.requests)
    assert "Chinese" in llm.requests[-1]["messages"][0]["content"] or "简体中文" in llm.requests[-1]["messages"][0]["content"]


def test_history_reaches_the_answer_prompt(tmp_path):
    q, llm = make_query(tmp_path, lambda b: "ok", question="And what about ENTITY 2?")
    q.history = [{"role": "user", "content": "Tell me about ENTITY 1"}, {"role": "assistant", "content": "It is big."}]
    run(local_search(q))
    user = last_user(llm.requests[0])
    assert "Tell me about ENTITY 1" in user and "It is big." in user
    assert "ENTITY 1" in q.search_text()


def test_projection_covers_a_branch_whose_child_report_is_missing_with_the_parent(tmp_path):
    index = synthetic_index(tmp_path)
    reports = index.reports[index.reports["community"] != 3]  # 3 failed, and its child 5 has none
    members = dict(zip(index.communities["community"], index.communities["entity_ids"]))
    for level in (1, 2):
        chosen = project_reports(reports, index.communities, level)
        assert set(chosen["community"]) == {0, 1}  # not {2, 1}: that would lose entities 3-5
        covered = [e for c in chosen["community"] for e in list_ids(members[c])]
        assert sorted(covered) == sorted(index.entities["id"])


def test_an_index_without_entities_gets_a_plain_answer_and_no_call(tmp_path):
    q, llm = make_query(tmp_path, lambda b: "should not be asked", question="Who is ENTITY 3?")
    for name in ("entities", "relationships", "communities", "community_reports", "covariates"):
        q.index.tables[name] = q.index.tables[name].iloc[0:0]
    assert run(local_search(q)).answer == NO_ANSWER["en"]
    assert run(global_search(q, level=0)).answer == NO_ANSWER["en"]
    assert llm.requests == []


def test_map_point_ids_become_references_in_the_reduce_context(tmp_path):
    def respond(body):
        if kind(body) == "MapAnswer":
            first = int(re.findall(r"^(\d+)\|Report", data_part(body), re.M)[0])
            return {"points": [{"description": f"About report {first} [Data: Reports ({first}, 555)]",
                                "ids": [first, 999], "score": 60}]}
        return "Answer"
    q, llm = make_query(tmp_path, respond, context_tokens=400)
    run(global_search(q, level=2))
    reduce = last_user([b for b in llm.requests if kind(b) == "text"][0])
    refs = re.findall(r"About report (\d+) \[Data: Reports \((\d+)\)\]", reduce)
    assert refs and all(a == b for a, b in refs)  # ids outside the batch (999, 555) are dropped
    assert "999" not in reduce and "555" not in reduce


# -- the method registry ------------------------------------------------------------------------
def test_one_registry_names_the_methods_for_every_caller():
    import sensegraph
    from sensegraph import api
    from sensegraph.query import METHODS, REGISTRY, method_named

    assert METHODS == tuple(REGISTRY) == ("global", "local", "drift", "basic", "text", "lazy")
    for name in METHODS:  # the Python API has a pair of functions per method, exported at the top
        assert {f"{name}_search", f"a{name}_search"} <= set(sensegraph.__all__)
        assert getattr(api, f"{name}_search").__name__ == f"{name}_search"
    assert [n for n, m in REGISTRY.items() if m.by_level] == ["global"]  # levels and --dynamic
    assert [n for n, m in REGISTRY.items() if m.by_budget] == ["lazy"]  # --budget
    with pytest.raises(ValueError, match="choose one of global, local, drift, basic, text, lazy"):
        method_named("nope")
