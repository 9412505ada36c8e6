"""Lazy search with a scripted LLM over a small hand-built index that has no community reports.

Similarity comes from test_query's hashing embedder (texts that share words are similar), so
the ranking is set by the words of each unit; the scripted tester calls a unit relevant when
its text holds the word "fact", which the ranking never sees.

    roots:   A (0) -> children A1 (2) = u0 u1 u2,  A2 (3) = u3 u4 u5
             B (1) -> child   B1 (4) = u6 u7 u8 u9
             C (5) = u10 u11  (no children)          D (6) = u12 u13  (no children)
    u14 is in no community (an extra root of its own)
"""
from __future__ import annotations

import json
import re
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from mock_llm import start_mock_server
from scripted import ScriptedLLM, last_user, schema_name
from sensegraph.cli import main as cli_main
from sensegraph.config import load_settings
from sensegraph.query import Searcher
from sensegraph.query.answer import NO_ANSWER, Query
from sensegraph.query.data import GraphIndex
from sensegraph.query.lazy_search import lazy_search
from sensegraph.store.tables import TABLES, write_table
from test_disobedient_server import refusing_json_schema
from test_query import embedder, run

QUESTION = "What happened to the harbor fishing boats?"
SUBQUERIES = ["harbor fishing boats", "harbor boats"]
# Words shared with the subqueries set the ranking: B's units rank high, A2's low.
TEXTS = {
    0: "harbor fishing boats harbor fishing boats fact one",
    1: "harbor fishing boats storm fact two",
    2: "harbor council budget museum school archive fact three",
    3: "harbor boats market island ferry school",
    4: "harbor market island ferry school bridge",
    5: "harbor school museum archive lighthouse election",
    6: "harbor fishing boats harbor fishing festival",
    7: "harbor fishing boats ferry island",
    8: "harbor fishing boats ferry",
    9: "harbor fishing boats island",
    10: "election council budget",
    11: "election council school",
    12: "museum archive lighthouse",
    13: "museum archive bridge",
    14: "lighthouse storm bridge",
}
TREE = [  # community, level, parent, children, units
    (0, 0, -1, [2, 3], [0, 1, 2, 3, 4, 5]), (1, 0, -1, [4], [6, 7, 8, 9]),
    (2, 1, 0, [], [0, 1, 2]), (3, 1, 0, [], [3, 4, 5]), (4, 1, 1, [], [6, 7, 8, 9]),
    (5, 0, -1, [], [10, 11]), (6, 0, -1, [], [12, 13]),
]


def lazy_tables(texts: dict[int, str] = TEXTS) -> dict[str, pd.DataFrame]:
    units = pd.DataFrame([{"id": f"u{i}", "human_readable_id": 100 + i, "text": t, "n_tokens": 20,
                           "document_id": "d0", "entity_ids": [], "relationship_ids": [], "covariate_ids": []}
                          for i, t in texts.items()])
    entities = pd.DataFrame([{"id": f"e{c}", "human_readable_id": c, "title": f"concept {c}", "type": "concept",
                              "description": "", "text_unit_ids": [f"u{u}" for u in members], "frequency": 1,
                              "degree": 0} for c, _, _, _, members in TREE])
    communities = pd.DataFrame([{"id": f"c{c}", "human_readable_id": c, "community": c, "level": lvl,
                                 "parent": parent, "children": kids, "title": f"Community {c}",
                                 "entity_ids": [f"e{c}"], "relationship_ids": [],
                                 "text_unit_ids": [f"u{u}" for u in members], "period": "", "size": 1}
                                for c, lvl, parent, kids, members in TREE])
    return {"text_units": units, "entities": entities, "communities": communities,
            "relationships": pd.DataFrame(columns=TABLES["relationships"]),
            "community_reports": pd.DataFrame(columns=TABLES["community_reports"])}  # a lazy index has none


def rows_of(body: dict[str, Any]) -> list[tuple[int, str]]:
    """The (id, text) rows of the Sources table in a request."""
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^(\d+)\|(.*)$", last_user(body), re.M)]


def asked(body: dict[str, Any]) -> str:
    """Which call this is: by schema name, or (JSON mode) by the schema written into the prompt."""
    name = schema_name(body)
    if name:
        return name
    system = body["messages"][0]["content"]
    if "JSON schema:\n" in system:
        props = json.loads(system.rsplit("JSON schema:\n", 1)[1]).get("properties", {})
        return next(n for key, n in (("verdicts", "Verdicts"), ("claims", "Claims"),
                                     ("expanded_query", "Subqueries")) if key in props)
    return "text"


class Script:
    """Subqueries, verdicts ("fact" in the text = relevant), one claim per passage, an answer
    citing every source the key points give."""

    def __init__(self, subqueries=SUBQUERIES, relevant=lambda text: "fact" in text, extra_verdicts=0,
                 bad_claims=False):
        self.subqueries = subqueries
        self.relevant = relevant
        self.extra_verdicts = extra_verdicts
        self.bad_claims = bad_claims
        self.tested: list[int] = []  # unit ids in the order they were sent to the tester

    def __call__(self, body: dict[str, Any]):
        kind = asked(body)
        if kind == "Subqueries":
            return {"subqueries": self.subqueries, "expanded_query": "harbor fishing boats and their fate"}
        if kind == "Verdicts":
            rows = rows_of(body)
            self.tested += [ref for ref, _ in rows]
            verdicts = [{"id": ref, "relevant": self.relevant(text), "subqueries": [1, 7]} for ref, text in rows]
            # a disobedient server: more verdicts than allowed, about units not in the batch
            verdicts += [{"id": 999, "relevant": True, "subqueries": []}] * self.extra_verdicts
            return {"verdicts": verdicts}
        if kind == "Claims":
            # a claim in the passage's own words, as claim_grounding requires
            claims = [{"claim": f"CLAIM-{ref}: {text}", "sources": [ref], "subquery": 1, "score": 80}
                      for ref, text in rows_of(body)]
            if self.bad_claims:
                claims.append({"claim": "INVENTED claim", "sources": [555], "subquery": 9, "score": 99})
            return {"claims": claims}
        refs = sorted({int(n) for group in re.findall(r"Sources \(([^)]*)\)", last_user(body))
                       for n in re.findall(r"\d+", group)}) or sorted(ref for ref, _ in rows_of(body))
        return "The boats were found [Data: Sources (" + ", ".join(map(str, refs + [777])) + ")]."


def make(tmp_path, script: Script, question: str = QUESTION, tables=None, server=None, query=None,
         **lazy) -> tuple[Query, ScriptedLLM]:
    settings = load_settings(tmp_path, overrides={
        "chat": {"provider": "openai", "model": "scripted", "base_url": "http://scripted/v1", "api_key": "k"},
        "cache": {"enabled": False}, "lazy": {"tester": "chat", "units_per_community": 2, **lazy},
        "query": query or {}})
    responder = refusing_json_schema(script) if server == "no_json_schema" else script
    llm = ScriptedLLM(responder)
    q = Query(question, settings, GraphIndex(tmp_path, tables or lazy_tables()), llm.client(settings.chat),
              embedder(settings))
    return q, llm


def units(refs) -> list[int]:
    return [r - 100 for r in refs]


# -- the budget ----------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [1, 2, 3, 5, 8, 100])
def test_the_budget_is_never_exceeded(tmp_path, budget):
    script = Script(relevant=lambda text: True)  # everything relevant: the search wants to go on
    q, llm = make(tmp_path, script, barren_communities=2)
    r = run(lazy_search(q, budget=budget))
    assert r.stats["tests_used"] == len(r.stats["tested"]) <= budget
    assert len(script.tested) == len(set(script.tested)) == r.stats["tests_used"]  # each unit sent once
    assert r.stats["tests_used"] == min(budget, len(TEXTS))  # and the budget is used while there is work
    if budget < len(TEXTS):
        assert r.stats["stopped"] == "budget spent"


def test_the_embedding_tester_keeps_the_budget_and_makes_no_test_call(tmp_path):
    script = Script()
    q, llm = make(tmp_path, script, tester="embedding", embedding_margin=0.2)
    r = run(lazy_search(q, budget=4))
    assert r.stats["tester"] == "embedding" and r.stats["tests_used"] <= 4
    assert script.tested == [] and "relevance" not in q.llm.usage.steps
    assert [asked(b) for b in llm.requests].count("Verdicts") == 0
    # the first unit tested is the best of all, so within the margin of its subquery's best
    assert r.stats["tested"][0]["relevant"] is True
    assert r.stats["relevant_units"] >= 1 and r.answer and r.citations.get("Sources")


def test_auto_tester_is_embedding_for_the_embedded_model_and_chat_for_a_hosted_one(tmp_path):
    from sensegraph.query.lazy_search import tester_name

    assert tester_name(load_settings(tmp_path)) == "embedding"  # provider local by default
    hosted = load_settings(tmp_path, overrides={"chat": {"provider": "openai", "model": "m", "api_key": "k"}})
    assert tester_name(hosted) == "chat"


# -- the order of the tests ----------------------------------------------------------------------
def test_a_relevant_community_is_deepened_before_an_unrelated_siblings_lower_units(tmp_path):
    from sensegraph.query.lazy_search import Plan, rank_units

    script = Script()
    q, _ = make(tmp_path, script, barren_communities=3)
    r = run(lazy_search(q, budget=100))
    tested = units(t["unit"] for t in r.stats["tested"])
    visits = [(v["community"], v["level"]) for v in r.stats["visits"]]
    # Level 0 in rank order, two units each: A first (u0 is the best unit; u0 u1 relevant), then
    # B (its best two: not relevant) and the others; then A's sub-communities: A1's untested u2, A2's.
    b_tested = [u for u in tested if u in (6, 7, 8, 9)]
    assert tested[:2] == [0, 1] and len(b_tested) == 2
    assert visits[0] == (0, 0) and (1, 0) in visits and (4, 1) not in visits
    first_deep = next(i for i, (_, level) in enumerate(visits) if level == 1)
    assert all(level == 0 for _, level in visits[:first_deep])
    assert {c for c, level in visits[first_deep:]} == {2, 3}
    # B's next units rank above A2's units (pure vector ranking would test them first), but B
    # yielded nothing, so they are never tested, while A's sub-communities are.
    score = run(rank_units(q, Plan(r.stats["subqueries"], r.stats["expanded_query"]))).score
    a2 = [u for u in tested if u in (3, 4, 5)]
    b_rest = {6, 7, 8, 9} - set(b_tested)
    assert a2 and 2 in tested and not b_rest & set(tested)
    assert min(score[u] for u in b_rest) > max(score[u] for u in a2)
    assert r.stats["levels_reached"] == [0, 1] and r.stats["relevant_units"] == 3
    assert sorted(units(t["unit"] for t in r.stats["tested"] if t["relevant"])) == [0, 1, 2]


def test_barren_communities_in_a_row_end_the_search(tmp_path):
    script = Script(relevant=lambda text: False)
    q, llm = make(tmp_path, script, barren_communities=2)
    r = run(lazy_search(q, budget=100))
    # A and B yield nothing: C, D and the rest are never tested, and nothing is left to deepen
    assert [t["community"] for t in r.stats["tested"]] == [0, 0, 1, 1]
    assert r.stats["tests_used"] == 4 and r.stats["stopped"] == "no relevant community left"
    assert r.answer == NO_ANSWER["en"] and r.stats["claim_calls"] == 0 and r.stats["reduce_calls"] == 0
    assert [asked(b) for b in llm.requests] == ["Subqueries", "Verdicts"]  # A's and B's units in one call


def test_a_relevant_leaf_is_tested_further_until_it_yields_nothing(tmp_path):
    # Only C (a root without children) is relevant: after level 0 it comes back for its next
    # units, then stops when they yield nothing.
    texts = {**TEXTS, 10: "harbor fishing boats election fact", 11: "election fact council"}
    tables = lazy_tables(texts)
    script = Script()
    q, _ = make(tmp_path, script, tables=tables, barren_communities=9, units_per_community=1)
    r = run(lazy_search(q, budget=100))
    tested = units(t["unit"] for t in r.stats["tested"])
    assert 11 in tested and tested.index(11) > tested.index(14)  # C's second unit, in a later round
    assert {0, 10, 11} <= {t["unit"] - 100 for t in r.stats["tested"] if t["relevant"]}


# -- claims and citations ------------------------------------------------------------------------
def test_claims_carry_their_source_ids_into_the_citations(tmp_path):
    script = Script(bad_claims=True)
    q, llm = make(tmp_path, script, barren_communities=3)
    r = run(lazy_search(q, budget=100))
    relevant = sorted(t["unit"] for t in r.stats["tested"] if t["relevant"])
    assert relevant == [100, 101, 102]
    # claims were asked for the relevant units only, with their human-readable ids
    claim_rows = [ref for b in llm.requests if asked(b) == "Claims" for ref, _ in rows_of(b)]
    assert sorted(claim_rows) == relevant
    used = r.stats["claims_used"]
    assert sorted(s for c in used for s in c["sources"]) == relevant
    assert all(c["claim"].startswith(f"CLAIM-{c['sources'][0]}") for c in used)
    # the claim that cites a passage it was not given is dropped and counted, never shown
    assert r.stats["claims_dropped"] >= 1 and not any("INVENTED" in c["claim"] for c in used)
    reduce = [b for b in llm.requests if asked(b) == "text"]
    assert len(reduce) == 1 and "INVENTED" not in last_user(reduce[0])
    assert "[Data: Sources (100)]" in last_user(reduce[0])
    # the answer's citations are the claims' sources; an id it invented is removed and reported
    assert sorted(r.citations["Sources"]) == relevant
    assert r.invalid_citations == {"Sources": [777]}
    assert sorted(rec["ref"] for rec in r.cited["Sources"]) == relevant
    assert r.stats["subqueries"] == SUBQUERIES and r.usage["steps"]["reduce"]["calls"] == 1


def test_claims_that_name_no_passage_leave_the_answer_to_the_relevant_units(tmp_path):
    script = Script()

    def respond(body):
        if asked(body) == "Claims":  # a model that never fills `sources` in
            return {"claims": [{"claim": "the boats sank", "sources": [], "subquery": 1, "score": 90}]}
        return script(body)

    q, llm = make(tmp_path, script, barren_communities=3)
    llm.responder = respond
    r = run(lazy_search(q, budget=100))
    assert r.stats["claims"] == 0 and r.stats["claims_dropped"] == 1 and r.stats["answered_from"] == "sources"
    answer_call = next(b for b in llm.requests if asked(b) == "text")
    assert sorted(ref for ref, _ in rows_of(answer_call)) == [100, 101, 102]  # the relevant units
    assert sorted(r.citations["Sources"]) == [100, 101, 102] and r.usage["steps"]["answer"]["calls"] == 1


def test_claims_that_restate_the_question_or_that_no_passage_says_are_dropped_and_counted(tmp_path):
    # What the embedded 1.5B model returned on Operation Dulce: a subquery as a "claim", and a
    # claim made of the question's words that its passage does not hold.
    script = Script()

    def respond(body):
        if asked(body) == "Claims":
            rows = rows_of(body)
            ref, text = rows[0]
            return {"claims": [
                {"claim": "What happened to the harbor fishing boats?", "sources": [ref], "subquery": 1, "score": 95},
                {"claim": "The story explores themes related to maritime disasters and coastal communities.",
                 "sources": [ref], "subquery": 1, "score": 90},
                {"claim": f"The harbor fishing boats: {text}", "sources": [ref], "subquery": 1, "score": 80}]}
        return script(body)

    q, llm = make(tmp_path, script, barren_communities=3)
    llm.responder = respond
    r = run(lazy_search(q, budget=100))
    kept = [c["claim"] for c in r.stats["claims_used"]]
    assert kept and all(c.startswith("The harbor fishing boats: ") for c in kept)
    batches = r.stats["claim_calls"]
    assert r.stats["claims_ungrounded"] == 2 * batches and r.stats["claims_dropped"] == 2 * batches
    reduce = next(b for b in llm.requests if asked(b) == "text")
    assert "maritime" not in last_user(reduce) and "?" not in last_user(reduce).split("Question:")[0]
    # with the check off, the ungrounded statement is kept (a question never is)
    q2, llm2 = make(tmp_path, script, barren_communities=3, claim_grounding=0)
    llm2.responder = respond
    r2 = run(lazy_search(q2, budget=100))
    assert r2.stats["claims_ungrounded"] == batches
    assert any("maritime" in c["claim"] for c in r2.stats["claims_used"])


def test_claim_grounding_in_both_scripts():
    from sensegraph.query.lazy_search import grounded

    passage = "Jane Doe joined Acme Corp in Berlin in 2019 and now leads its research lab."
    assert grounded("Jane Doe leads the research lab of Acme Corp.", passage, 0.5)
    assert not grounded("Jane Doe leads the research lab of Acme Corp?", passage, 0.5)
    assert not grounded("The text explores themes of leadership and ambition.", passage, 0.5)
    assert grounded("孙悟空拜菩提祖师为师。", "猴王漂洋过海，拜菩提祖师为师，得名孙悟空。", 0.5)
    assert not grounded("故事探讨了自由与命运的主题。", "猴王漂洋过海，拜菩提祖师为师，得名孙悟空。", 0.5)


def test_claims_are_ranked_round_robin_over_communities(tmp_path):
    from sensegraph.query.lazy_search import Found, Search, Test, rank_claims

    search = Search(tests={0: Test(0, 7, 0, True, [], 0), 1: Test(1, 7, 0, True, [], 1),
                           2: Test(2, 8, 0, True, [], 2)})
    claims = [Found("a1", [0], 1, 90, 7, 0), Found("a2", [1], 1, 80, 7, 1), Found("b1", [2], 1, 50, 8, 2),
              Found("zero", [2], 1, 0, 8, 3)]
    # community 7 has more relevant units, so it leads; community 8 is heard before 7's second claim
    assert [c.text for c in rank_claims(claims, search)] == ["a1", "b1", "a2"]


# -- passages: what the tester and the claim extractor read --------------------------------------
FILLER = "The weather on day {} was grey and the market sold bread."
SINKING = "Then the harbor fishing boats sank in the storm, fact one."


def long_unit(before: int = 30, after: int = 30, middle: str = SINKING) -> str:
    """A unit of ~{before + after} filler sentences that share no word with the question, with
    the one sentence that answers it in the middle; wrapped over lines as books are."""
    sentences = ([FILLER.format(i) for i in range(before)] + [middle]
                 + [FILLER.format(i) for i in range(before, before + after)])
    return "\n".join(" ".join(sentences[i:i + 3]) for i in range(0, len(sentences), 3))


def sent(llm: ScriptedLLM, kind: str) -> dict[int, str]:
    """unit id -> the text a call of `kind` (Verdicts or Claims) was given for it."""
    return {ref: text for b in llm.requests if asked(b) == kind for ref, text in rows_of(b)}


def test_a_relevance_test_reads_the_window_that_holds_the_questions_terms(tmp_path):
    from sensegraph.tokens import count_tokens

    text = long_unit()
    assert count_tokens(text) > 800
    script = Script()  # relevant = "fact" in the text it is shown: only if the middle sentence is
    q, llm = make(tmp_path, script, tables=lazy_tables({**TEXTS, 0: text}), barren_communities=3, snippet_tokens=60)
    r = run(lazy_search(q, budget=100))
    shown = sent(llm, "Verdicts")[100]
    assert SINKING in shown and not shown.startswith(FILLER.format(0)) and shown.startswith("…")
    assert count_tokens(shown) <= 60 and "\n" not in shown
    assert shown.replace("… ", "").replace(" …", "") in " ".join(text.split())  # consecutive sentences
    assert sent(llm, "Verdicts")[101] == TEXTS[1]  # a unit within the cap is sent whole
    tested = {t["unit"]: t for t in r.stats["tested"]}
    assert tested[100]["relevant"] is True and tested[100]["passage_tokens"] == count_tokens(shown)
    assert r.stats["snippet_tokens"] == 60


def test_claims_read_a_larger_passage_and_still_cite_their_units(tmp_path):
    from sensegraph.tokens import count_tokens

    # u0 answers in two places far apart: the claim passage holds both, the test's window one.
    second = "Later the harbor boats were raised from the storm and fishing resumed."
    text = long_unit(middle=SINKING + " " + " ".join(FILLER.format(100 + i) for i in range(20)) + " " + second)
    script = Script()
    q, llm = make(tmp_path, script, tables=lazy_tables({**TEXTS, 0: text}), barren_communities=3,
                  snippet_tokens=40, claim_tokens=150)
    r = run(lazy_search(q, budget=100))
    tested, claimed = sent(llm, "Verdicts")[100], sent(llm, "Claims")[100]
    assert count_tokens(tested) <= 40 and 40 < count_tokens(claimed) <= 150
    assert SINKING in claimed and second in claimed and "… " in claimed.strip("… ")  # two windows, a gap
    assert sorted(sent(llm, "Claims")) == [100, 101, 102]  # the relevant units, by their ids
    used = r.stats["claims_used"]
    assert sorted(s for c in used for s in c["sources"]) == [100, 101, 102]
    assert sorted(r.citations["Sources"]) == [100, 101, 102]
    # the context shown with the result is what the claim extractor read
    assert {rec["ref"]: rec["text"] for rec in r.context.records()["Sources"].values()}[100] == claimed


@pytest.mark.parametrize("cap", [25, 60, 150])
def test_snippet_tokens_and_claim_tokens_are_respected(tmp_path, cap):
    from sensegraph.tokens import count_tokens

    no_stop = "harbor fishing boats " * 200 + "fact"  # one sentence longer than any cap: cut
    texts = {i: long_unit(10 + i, 40 - i) for i in range(15)} | {3: no_stop}
    script = Script(relevant=lambda text: True)
    q, llm = make(tmp_path, script, tables=lazy_tables(texts), barren_communities=3, snippet_tokens=cap,
                  claim_tokens=2 * cap)
    r = run(lazy_search(q, budget=100))
    tests, claims = sent(llm, "Verdicts"), sent(llm, "Claims")
    assert len(tests) == 15 and len(claims) == 15
    assert all(count_tokens(t) <= cap for t in tests.values()), sorted(count_tokens(t) for t in tests.values())
    assert all(count_tokens(t) <= 2 * cap for t in claims.values())
    assert all(t["passage_tokens"] <= cap for t in r.stats["tested"])
    # windows are filled, not stingy: the first sentences of a match use most of the cap
    assert all(count_tokens(t) >= cap // 2 for t in tests.values())


def test_a_chinese_unit_sends_the_sentence_that_holds_the_questions_characters(tmp_path):
    from sensegraph.tokens import count_tokens

    filler = [f"第{i}天的天气很好，集市上卖面包。" for i in range(40)]
    middle = "后来港口的渔船在风暴中沉没了！"
    unit = "".join(filler[:20]) + middle + "".join(filler[20:])
    texts = {0: unit, 1: "港口 风暴", 2: "学校 预算", 3: "学校", 4: "博物馆", 5: "灯塔", 6: "渔船", 7: "渔船 市场",
             8: "市场", 9: "桥", 10: "选举", 11: "议会", 12: "档案", 13: "灯塔 桥", 14: "风暴"}
    script = Script(subqueries=["港口的渔船怎么了"], relevant=lambda text: "沉没" in text)
    q, llm = make(tmp_path, script, question="港口的渔船发生了什么？", tables=lazy_tables(texts), snippet_tokens=50)
    r = run(lazy_search(q, budget=15))
    shown = sent(llm, "Verdicts")[100]
    assert middle in shown and filler[0] not in shown and count_tokens(shown) <= 50
    assert [t["unit"] for t in r.stats["tested"] if t["relevant"]] == [100]


def test_passage_picks_by_idf_and_splits_sentences_in_both_scripts():
    from sensegraph.query.passages import Vocabulary, passage, sentences, terms

    assert terms("The Harbor's fishing boats, 港口渔船") == ["harbor", "fishing", "boat", "港口", "口渔", "渔船"]
    assert sentences("Mr. Scrooge said 'no.' He left! 他走了。她呢？好\n\nNext", 100) == [
        "Mr. Scrooge said 'no.' ", "He left! ", "他走了。", "她呢？", "好\n\n", "Next"]
    # "harbor" is in every unit, "lighthouse" in one: the rare term decides the window
    units = [" ".join(["The harbor was busy that day."] * 20 + ["A storm hit the lighthouse on the cliff."]
                      + ["Bread was sold at the harbor market."] * 20)] + ["the harbor"] * 9
    weights = Vocabulary.of(units).weights(["harbor lighthouse"])
    assert weights["lighthouse"] > 3 * weights["harbor"]
    shown = passage(units[0], weights, 30)
    assert "lighthouse" in shown and shown.startswith("…") and shown.endswith("…")
    # no term of the query at all: the unit's beginning, not an arbitrary window
    assert passage(units[0], Vocabulary.of(units).weights(["volcano"]), 30).startswith("The harbor was busy")


def test_every_lazy_call_keeps_its_data_within_the_context_budget(tmp_path):
    from sensegraph.tokens import count_tokens

    texts = {i: long_unit(10 + i, 40 - i) for i in range(15)}
    script = Script(relevant=lambda text: True)
    q, llm = make(tmp_path, script, tables=lazy_tables(texts), barren_communities=3, snippet_tokens=120,
                  claim_tokens=300, query={"context_tokens": 700})
    assert q.budget == 700
    r = run(lazy_search(q, budget=100))
    for body in llm.requests:
        user = last_user(body)
        data = user[user.index("-----"):] if "-----" in user else ""
        assert count_tokens(data) <= 700, (asked(body), count_tokens(data))
    assert [asked(b) for b in llm.requests].count("Claims") > 1  # 15 x 300 tokens: several batches
    assert r.stats["claims_reduced"] >= 1 and r.stats["context_tokens"] <= 700 * r.stats["claim_calls"]


# -- the index and the language ------------------------------------------------------------------
def test_an_index_without_community_reports_and_units_without_communities(tmp_path):
    # Communities with empty text_unit_ids (as in test_query's synthetic index) are reached
    # through their entities; the orphan unit u14 is still reachable.
    tables = lazy_tables()
    tables["communities"]["text_unit_ids"] = [[] for _ in range(len(tables["communities"]))]
    script = Script(relevant=lambda text: "lighthouse storm" in text)
    q, _ = make(tmp_path, script, tables=tables, barren_communities=9)
    r = run(lazy_search(q, budget=100))
    assert q.index.reports.empty
    assert [t["community"] for t in r.stats["tested"] if t["relevant"]] == [-1]  # u14, in no community
    assert r.citations == {"Sources": [114]}


def test_works_on_a_standard_index_too(tmp_path):
    from test_query import synthetic_index

    index = synthetic_index(tmp_path)
    script = Script(relevant=lambda text: "harbor" in text)
    settings = load_settings(tmp_path, overrides={
        "chat": {"provider": "openai", "model": "scripted", "base_url": "http://scripted/v1", "api_key": "k"},
        "cache": {"enabled": False}, "lazy": {"tester": "chat"}})
    llm = ScriptedLLM(script)
    q = Query("What happened at the harbor?", settings, index, llm.client(settings.chat), embedder(settings))
    r = run(lazy_search(q, budget=6))
    assert r.stats["tests_used"] <= 6 and r.stats["relevant_units"] >= 1
    assert set(r.citations["Sources"]) <= {t["unit"] for t in r.stats["tested"] if t["relevant"]}
    assert "Reports" not in r.citations  # reports are there, but lazy search does not read them


def test_a_chinese_question_gets_chinese_prompts(tmp_path):
    script = Script(subqueries=["港口 渔船", "港口"], relevant=lambda text: "港口" in text)
    texts = {0: "港口 渔船 fact", 1: "港口 风暴", 2: "学校 预算", 3: "学校", 4: "博物馆", 5: "灯塔",
             6: "渔船", 7: "渔船 市场", 8: "市场", 9: "桥", 10: "选举", 11: "议会", 12: "档案", 13: "灯塔 桥",
             14: "风暴"}
    q, llm = make(tmp_path, script, question="港口的渔船发生了什么？", tables=lazy_tables(texts))
    r = run(lazy_search(q, budget=10))
    systems = {asked(b): b["messages"][0]["content"] for b in llm.requests}
    assert "子问题" in systems["Subqueries"] and "段落" in systems["Verdicts"] and "论断" in systems["Claims"]
    assert "要点" in last_user(next(b for b in llm.requests if asked(b) == "text"))
    assert "Chinese" in systems["Subqueries"]  # {language}: subqueries are asked for in Chinese
    assert r.stats["subqueries"] == ["港口 渔船", "港口"] and r.citations.get("Sources")


# -- servers that do not obey --------------------------------------------------------------------
@pytest.mark.parametrize("server", ["ignores_max_items", "no_json_schema"])
def test_disobedient_servers_do_not_lose_the_answer(tmp_path, server):
    # 30 extra verdicts (maxItems 24), subquery numbers out of range, claims citing unknown ids
    script = Script(extra_verdicts=30, bad_claims=True,
                    subqueries=[f"harbor boats {n}" for n in range(12)])  # maxItems 8, setting 3
    q, llm = make(tmp_path, script, server=server)
    r = run(lazy_search(q, budget=100))
    assert r.failures == [] and r.answer.startswith("The boats were found")
    assert len(r.stats["subqueries"]) == 3
    assert q.llm.usage.step("relevance").truncated >= 1 and q.llm.usage.step("subqueries").truncated == 1
    assert all(set(t["subqueries"]) <= {1, 2, 3} for t in r.stats["tested"])  # 7 is not a subquery
    assert sorted(r.citations["Sources"]) == [100, 101, 102]
    if server == "no_json_schema":
        assert "json_object" in [(b.get("response_format") or {}).get("type") for b in llm.requests]


def test_a_failed_test_call_is_reported_and_the_search_goes_on(tmp_path):
    import httpx

    script = Script()

    def respond(body):
        if asked(body) == "Verdicts" and any(ref == 106 for ref, _ in rows_of(body)):
            return httpx.Response(400, json={"error": {"message": "bad request", "type": "invalid_request_error"}})
        return script(body)

    settings_q, llm = make(tmp_path, script, barren_communities=1)
    llm.responder = respond
    r = run(lazy_search(settings_q, budget=100))
    assert any(f.startswith("relevance of units") for f in r.failures)
    assert r.stats["failed_tests"] >= 1 and r.answer.startswith("The boats were found")
    assert [t["relevant"] for t in r.stats["tested"] if t["unit"] == 106] == [None]


# -- the command line and the Searcher -----------------------------------------------------------
def test_searcher_takes_a_budget_for_lazy_search_only(tmp_path):
    settings = load_settings(tmp_path)
    searcher = Searcher(settings, GraphIndex(tmp_path, lazy_tables()), cache=False)
    with pytest.raises(ValueError, match="lazy search only"):
        run(searcher.query("x", "basic", budget=5))


@pytest.fixture
def lazy_project(tmp_path):
    with start_mock_server() as server:
        (tmp_path / "settings.yaml").write_text(
            f"chat:\n  provider: openai\n  model: m\n  base_url: {server.base_url}\n  api_key: k\n"
            f"embedding:\n  provider: openai\n  model: e\n  base_url: {server.base_url}\n  api_key: k\n",
            encoding="utf-8")
        for name, df in lazy_tables().items():
            write_table(df, tmp_path / "output", name)
        yield tmp_path, server


def test_query_lazy_budget_json(lazy_project):
    root, _ = lazy_project
    res = CliRunner().invoke(cli_main, ["query", QUESTION, "--root", str(root), "-m", "lazy", "--budget", "5",
                                        "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    st = data["stats"]
    assert data["method"] == "lazy" and data["answer"]
    assert st["budget"] == 5 and st["tests_used"] == len(st["tested"]) <= 5 and st["tester"] == "chat"
    assert all(isinstance(t["relevant"], bool) and {"unit", "community", "level", "subqueries"} <= set(t)
               for t in st["tested"])
    assert data["usage"]["steps"]["subqueries"]["calls"] == 1 and data["usage"]["steps"]["relevance"]["calls"] >= 1


def test_query_lazy_footer_and_budget_only_with_lazy(lazy_project):
    root, _ = lazy_project
    (root / "settings.yaml").write_text((root / "settings.yaml").read_text() + "lazy:\n  tester: embedding\n")
    res = CliRunner().invoke(cli_main, ["query", QUESTION, "--root", str(root), "-m", "lazy", "-b", "4"])
    assert res.exit_code == 0, res.output
    footer = " ".join(res.stderr.split())
    assert "of 4 relevance tests (embedding)" in footer and "LLM calls" in footer
    res = CliRunner().invoke(cli_main, ["query", QUESTION, "--root", str(root), "-m", "basic", "--budget", "4"])
    assert res.exit_code == 2 and "--budget works with --method lazy only" in res.stderr


# -- sensegraph eval: Z<budget> conditions ------------------------------------------------------
def test_eval_conditions_name_the_budget():
    from sensegraph.evaluate.answers import parse_condition, resolve_labels

    z = parse_condition("Z500")
    assert (z.label, z.method, z.budget) == ("Z500", "lazy", 500) and "budget of 500" in z.describe()
    assert parse_condition("cheap=z100").label == "cheap" and parse_condition("cheap=z100").budget == 100
    assert [c.label for c in resolve_labels([parse_condition(c) for c in ("Z100", "Z500", "C0", "SS")],
                                            {None: 0})] == ["Z100", "Z500", "C0", "SS"]
    with pytest.raises(ValueError, match="Z100"):
        parse_condition("Z0")


def test_eval_answer_with_a_lazy_condition(lazy_project, tmp_path):
    root, _ = lazy_project
    src = tmp_path / "qs.csv"
    src.write_text(f"question_text,question_id\n{QUESTION},q1\nWhat are the main themes?,q2\n")
    assert CliRunner().invoke(cli_main, ["eval", "questions", "-r", str(root), "--from", str(src)]).exit_code == 0
    res = CliRunner().invoke(cli_main, ["eval", "answer", "-r", str(root), "-c", "Z5,SS"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (root / "evaluation" / "default" / "answers.jsonl").read_text().splitlines()]
    lazy = [r for r in rows if r["condition"] == "Z5"]
    assert len(lazy) == 2 and all(r["method"] == "lazy" and r["budget"] == 5 and r["answer"] for r in lazy)
    assert all(r["stats"]["budget"] == 5 and r["stats"]["tests_used"] <= 5 for r in lazy)
    assert all("budget" not in r for r in rows if r["condition"] == "SS")  # other conditions as they were


def test_the_embedding_tester_keeps_what_stands_out_not_half_of_a_compressed_corpus(tmp_path):
    """Embedding similarities crowd together (e5: half a large corpus within 0.05 of the best
    unit); a unit is relevant when it stands out from the corpus's distribution."""
    from types import SimpleNamespace

    import numpy as np

    from sensegraph.query.lazy_search import Ranking, embedding_tester

    rng = np.random.default_rng(0)
    sims = 0.80 + rng.normal(0, 0.01, size=(500, 1))  # a crowd within a few hundredths
    sims[7, 0], sims[42, 0] = 0.86, 0.84               # two units that stand out
    q = SimpleNamespace(settings=load_settings(tmp_path))
    ranking = Ranking(score=sims.max(axis=1), per_subquery=sims)
    verdicts = run(embedding_tester(q, None, ranking, [(None, list(range(500)))], []))
    relevant = {r for r, (ok, _) in verdicts.items() if ok}
    assert {7, 42} <= relevant and len(relevant) <= 25  # z >= 2: about the top 2%, not the crowd
    assert verdicts[7][1] == [1]
