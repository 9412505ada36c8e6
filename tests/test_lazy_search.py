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
import math
import re
from typing import Any

import httpx
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
        return next(n for key, n in (("ratings", "Ratings"), ("relevant", "Picks"), ("answers", "Answers"),
                                     ("claims", "Claims"),
                                     ("expanded_query", "Subqueries")) if key in props)
    return "text"


def tag(ref: int) -> str:
    """A unit's id spelled in letters: a claim's own numbers must be its passage's."""
    return "".join(chr(ord("a") + int(d)) for d in str(ref))


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
        if kind == "Ratings":
            rows = rows_of(body)
            self.tested += [ref for ref, _ in rows]
            ratings = [{"id": ref, "score": 3 if self.relevant(text) else 0} for ref, text in rows]
            # a disobedient server: more ratings than allowed, about units not in the batch
            ratings += [{"id": 999, "score": 3}] * self.extra_verdicts
            return {"ratings": ratings}
        if kind == "Picks":
            rows = rows_of(body)
            self.tested += [ref for ref, _ in rows]
            # every relevant unit, however many the prompt allows; then ids not in the batch
            return {"relevant": [ref for ref, text in rows if self.relevant(text)] + [999] * self.extra_verdicts}
        if kind == "Answers":
            rows = rows_of(body)
            self.tested += [ref for ref, _ in rows]
            out = []
            for ref, text in rows:
                if self.relevant(text):  # the words after "fact", copied from the passage
                    out.append({"subquery": 1, "answer": text.split("fact", 1)[1].strip() or "fact", "id": ref})
                else:  # a guess the passage does not back, and the question's own words
                    out += [{"subquery": 1, "answer": "an invented answer", "id": ref},
                            {"subquery": 2, "answer": "harbor fishing boats", "id": ref}]
            return {"answers": out[:2 * len(rows)] + [{"subquery": 1, "answer": "x", "id": 999}] * self.extra_verdicts}
        if kind == "Claims":
            # a claim in the passage's own words, as claim_grounding requires
            claims = [{"claim": f"CLAIM-{tag(ref)}: {text}", "sources": [ref], "subquery": 1, "score": 80}
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
    q, llm = make(tmp_path, script)
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
    assert [asked(b) for b in llm.requests].count("Ratings") == 0
    # the first unit tested is the best of all, so within the margin of its subquery's best
    assert r.stats["tested"][0]["relevant"] is True
    assert r.stats["relevant_units"] >= 1 and r.answer and r.citations.get("Sources")


def test_auto_tester_is_the_chat_model_for_the_embedded_model_too(tmp_path):
    # It was the embedding tester for the embedded model: free tests, so the budget bought nothing.
    from sensegraph.query.lazy_search import tester_name

    assert tester_name(load_settings(tmp_path)) == "chat"  # provider local by default
    hosted = load_settings(tmp_path, overrides={"chat": {"provider": "openai", "model": "m", "api_key": "k"}})
    assert tester_name(hosted) == "chat"
    assert tester_name(load_settings(tmp_path, overrides={"lazy": {"tester": "embedding"}})) == "embedding"


# -- the order of the tests ----------------------------------------------------------------------
def test_a_relevant_community_is_deepened_before_an_unrelated_siblings_lower_units(tmp_path, monkeypatch):
    import importlib

    lazy = importlib.import_module("sensegraph.query.lazy_search")  # the module, not the function
    monkeypatch.setattr(lazy, "MAX_BATCH", 2)  # one visit per wave: every verdict steers the next visit
    script = Script(subqueries=["harbor fishing boats"])
    q, _ = make(tmp_path, script, follow_links=0)  # the communities alone: no linked units
    r = run(lazy_search(q, budget=100))
    tested = units(t["unit"] for t in r.stats["tested"])
    visits = [v["community"] for v in r.stats["visits"]]
    # A holds the best unit (u0; u0 u1 relevant): its sub-communities A1 (2) and A2 (3) are
    # visited next, before B (1), whose best units rank above A2's
    assert tested[:2] == [0, 1] and visits[0] == 0
    first_b = visits.index(1)
    assert {2, 3} <= set(visits[:first_b])
    score = run(lazy.rank_units(q, lazy.Plan(r.stats["subqueries"], r.stats["expanded_query"]))).score
    assert min(score[u] for u in (6, 7, 8, 9)) > max(score[u] for u in (3, 4, 5))
    # B yielded nothing on its first visit: it comes back only after every community not
    # visited yet (C 5, D 6, the units in no community -1), although its units rank above theirs
    second_b = visits.index(1, first_b + 1)
    assert {5, 6, -1} <= set(visits[first_b:second_b])
    assert min(score[u] for u in (8, 9)) > max(score[u] for u in (11, 12, 13))
    assert r.stats["levels_reached"] == [0, 1] and r.stats["relevant_units"] == 3
    assert sorted(units(t["unit"] for t in r.stats["tested"] if t["relevant"])) == [0, 1, 2]
    assert r.stats["tests_used"] == len(TEXTS) and r.stats["stopped"] == "every unit tested"


def test_a_search_that_finds_nothing_still_spends_its_budget(tmp_path):
    # Three barren communities used to end the search: on 400 podcast transcripts, a server that
    # answers "not relevant" got 9 tests at budget 100 and 9 at budget 500.
    script = Script(relevant=lambda text: False)
    q, llm = make(tmp_path, script)
    for budget in (5, 11):
        r = run(lazy_search(q, budget=budget))
        assert r.stats["tests_used"] == budget and r.stats["stopped"] == "budget spent"
        assert r.answer == NO_ANSWER["en"] and r.stats["claim_calls"] == 0 and r.stats["reduce_calls"] == 0
    # each subquery spends its share
    assert r.stats["budget_per_subquery"] == [6, 5] and r.stats["tests_per_subquery"] == [6, 5]
    assert [asked(b) for b in llm.requests][-2:] == ["Subqueries", "Ratings"]  # 11 units in one call


def test_a_larger_budget_finds_more(tmp_path):
    texts = {**TEXTS, 10: "election council budget fact", 12: "museum archive lighthouse fact",
             14: "lighthouse storm bridge fact"}
    found = []
    for budget in range(2, 16):
        q, _ = make(tmp_path, Script(), tables=lazy_tables(texts))
        found.append(run(lazy_search(q, budget=budget)).stats["relevant_units"])
    assert found == sorted(found) and found[0] < found[-1] == 6  # more tests, more of the corpus seen


def test_a_relevant_leaf_is_tested_further_until_it_yields_nothing(tmp_path):
    # Only C (a root without children) is relevant: after level 0 it comes back for its next
    # units, then stops when they yield nothing.
    texts = {**TEXTS, 10: "harbor fishing boats election fact", 11: "election fact council"}
    tables = lazy_tables(texts)
    script = Script()
    q, _ = make(tmp_path, script, tables=tables, units_per_community=1)
    r = run(lazy_search(q, budget=100))
    tested = units(t["unit"] for t in r.stats["tested"])
    assert 11 in tested and tested.index(11) > tested.index(14)  # C's second unit, in a later round
    assert {0, 10, 11} <= {t["unit"] - 100 for t in r.stats["tested"] if t["relevant"]}


# -- claims and citations ------------------------------------------------------------------------
def test_claims_carry_their_source_ids_into_the_citations(tmp_path):
    script = Script(bad_claims=True)
    q, llm = make(tmp_path, script)
    r = run(lazy_search(q, budget=100))
    relevant = sorted(t["unit"] for t in r.stats["tested"] if t["relevant"])
    assert relevant == [100, 101, 102]
    # claims were asked for the relevant units only, with their human-readable ids
    claim_rows = [ref for b in llm.requests if asked(b) == "Claims" for ref, _ in rows_of(b)]
    assert sorted(claim_rows) == relevant
    used = r.stats["claims_used"]
    assert sorted(s for c in used for s in c["sources"]) == relevant
    assert all(c["claim"].startswith(f"CLAIM-{tag(c['sources'][0])}") for c in used)
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

    q, llm = make(tmp_path, script)
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

    q, llm = make(tmp_path, script)
    llm.responder = respond
    r = run(lazy_search(q, budget=100))
    kept = [c["claim"] for c in r.stats["claims_used"]]
    assert kept and all(c.startswith("The harbor fishing boats: ") for c in kept)
    batches = r.stats["claim_calls"]
    assert r.stats["claims_ungrounded"] == 2 * batches and r.stats["claims_dropped"] == 2 * batches
    reduce = next(b for b in llm.requests if asked(b) == "text")
    assert "maritime" not in last_user(reduce) and "?" not in last_user(reduce).split("Question:")[0]
    # with the check off, the ungrounded statement is kept (a question never is)
    q2, llm2 = make(tmp_path, script, claim_grounding=0)
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


def test_a_claim_framed_in_the_questions_words_is_judged_by_its_own_words():
    # A good model answers "what do tech leaders emphasize?" with "Tech leaders emphasize cloud
    # infrastructure": the framing is the question's, the content the passage's. Counted over
    # every term, the framing sank such claims (5 of the 6 claims of the podcast question at
    # budget 100 were dropped, the answer rested on one); and a name the question gave made an
    # invented answer look half grounded.
    from sensegraph.query.lazy_search import grounded

    asked = ("What recurring topics do tech leaders emphasize in their discussions? "
             "Which areas of technology are frequently covered in tech leader meetings?")
    passage = "We moved software development onto cloud infrastructure last year; the AI team reviews every change."
    assert grounded("Tech leaders emphasize cloud infrastructure.", passage, 0.5, asked)
    assert grounded("Tech leaders frequently cover topics related to software development, cloud "
                    "infrastructure, and artificial intelligence.", passage, 0.5, asked)
    assert not grounded("Tech leaders emphasize quantum computing.", passage, 0.5, asked)
    assert not grounded("Tech leaders emphasize recurring topics in their discussions.", passage, 0.5, asked)
    film = "Fortunella is a 1958 Italian comedy film directed by Eduardo De Filippo."
    assert grounded("Fortunella was directed by Eduardo De Filippo.", film, 0.5, "Who directed the film Fortunella?")
    assert not grounded("The film Fortunella was directed by Federico Fellini.", film, 0.5,
                        "Who directed the film Fortunella?")
    # framed in the question's words (character pairs), in Chinese too
    zh = "猴王漂洋过海，拜菩提祖师为师，得名孙悟空。"
    assert grounded("孙悟空的师父是菩提祖师。", zh, 0.5, "孙悟空的师父是谁？")
    assert not grounded("孙悟空的师父是太上老君。", zh, 0.5, "孙悟空的师父是谁？")


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
    """unit id -> the text a call of `kind` (Ratings or Claims) was given for it."""
    return {ref: text for b in llm.requests if asked(b) == kind for ref, text in rows_of(b)}


def test_a_relevance_test_reads_the_window_that_holds_the_questions_terms(tmp_path):
    from sensegraph.tokens import count_tokens

    text = long_unit()
    assert count_tokens(text) > 800
    script = Script()  # relevant = "fact" in the text it is shown: only if the middle sentence is
    q, llm = make(tmp_path, script, tables=lazy_tables({**TEXTS, 0: text}), snippet_tokens=60)
    r = run(lazy_search(q, budget=100))
    shown = sent(llm, "Ratings")[100]
    assert SINKING in shown and not shown.startswith(FILLER.format(0)) and shown.startswith("…")
    assert count_tokens(shown) <= 60 and "\n" not in shown
    assert shown.replace("… ", "").replace(" …", "") in " ".join(text.split())  # consecutive sentences
    assert sent(llm, "Ratings")[101] == TEXTS[1]  # a unit within the cap is sent whole
    tested = {t["unit"]: t for t in r.stats["tested"]}
    assert tested[100]["relevant"] is True and tested[100]["passage_tokens"] == count_tokens(shown)
    assert r.stats["snippet_tokens"] == 60


def test_claims_read_a_larger_passage_and_still_cite_their_units(tmp_path):
    from sensegraph.tokens import count_tokens

    # u0 answers in two places far apart: the claim passage holds both, the test's window one.
    second = "Later the harbor boats were raised from the storm and fishing resumed."
    text = long_unit(middle=SINKING + " " + " ".join(FILLER.format(100 + i) for i in range(20)) + " " + second)
    script = Script()
    q, llm = make(tmp_path, script, tables=lazy_tables({**TEXTS, 0: text}),
                  snippet_tokens=40, claim_tokens=150)
    r = run(lazy_search(q, budget=100))
    tested, claimed = sent(llm, "Ratings")[100], sent(llm, "Claims")[100]
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
    q, llm = make(tmp_path, script, tables=lazy_tables(texts), snippet_tokens=cap,
                  claim_tokens=2 * cap)
    r = run(lazy_search(q, budget=100))
    tests, claims = sent(llm, "Ratings"), sent(llm, "Claims")
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
    shown = sent(llm, "Ratings")[100]
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
    q, llm = make(tmp_path, script, tables=lazy_tables(texts), snippet_tokens=120,
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
    q, _ = make(tmp_path, script, tables=tables)
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
    # (the scripted claims add two words of their own, "CLAIM-<id>", so a passage says more)
    texts = {0: "港口 渔船 fact 沉没 风暴", 1: "港口 风暴 码头 关闭", 2: "学校 预算", 3: "学校", 4: "博物馆", 5: "灯塔",
             6: "渔船", 7: "渔船 市场", 8: "市场", 9: "桥", 10: "选举", 11: "议会", 12: "档案", 13: "灯塔 桥",
             14: "风暴"}
    q, llm = make(tmp_path, script, question="港口的渔船发生了什么？", tables=lazy_tables(texts))
    r = run(lazy_search(q, budget=10))
    systems = {asked(b): b["messages"][0]["content"] for b in llm.requests}
    assert "子问题" in systems["Subqueries"] and "段落" in systems["Ratings"] and "论断" in systems["Claims"]
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
        if asked(body) == "Ratings" and any(ref == 106 for ref, _ in rows_of(body)):
            return httpx.Response(400, json={"error": {"message": "bad request", "type": "invalid_request_error"}})
        return script(body)

    settings_q, llm = make(tmp_path, script)
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
    assert verdicts[7] == (True, 3) and verdicts[0] == (False, 0)


# -- what the budget buys: refinement, ratings, claims that scale --------------------------------
def two_hop_tables() -> dict[str, pd.DataFrame]:
    """A film's unit names its director; the director's own unit names her father, and shares no
    word with the question. Concepts: the film and the director (in both units)."""
    texts = {0: "Palo Verde is a 2013 film directed by Gia Marlow fact",
             1: "Gia Marlow is the daughter of Tom Marlow fact",
             # they share more words with the second subquery than the director's unit does, and
             # one with the first subquery, which the director's unit shares none with
             **{i: f"the father of a student number{chr(97 + i)} saw a film" for i in range(2, 12)}}
    tables = lazy_tables({i: texts[i] for i in range(12)})
    tables["entities"] = pd.DataFrame([
        {"id": "e0", "human_readable_id": 0, "title": "Palo Verde", "type": "concept", "description": "",
         "text_unit_ids": ["u0"], "frequency": 1, "degree": 1},
        {"id": "e1", "human_readable_id": 1, "title": "Gia Marlow", "type": "concept", "description": "",
         "text_unit_ids": ["u0", "u1"], "frequency": 2, "degree": 1}])
    tables["communities"] = pd.DataFrame([{"id": "c0", "human_readable_id": 0, "community": 0, "level": 0,
                                           "parent": -1, "children": [], "title": "all", "entity_ids": ["e0", "e1"],
                                           "relationship_ids": [], "text_unit_ids": [f"u{i}" for i in range(12)],
                                           "period": "", "size": 2}])
    return tables


def test_a_subquery_that_found_nothing_is_refined_with_the_concepts_of_what_others_found(tmp_path, monkeypatch):
    import importlib

    lazy = importlib.import_module("sensegraph.query.lazy_search")
    monkeypatch.setattr(lazy, "MAX_BATCH", 2)
    subqueries = ["film Palo Verde directed", "father of the director"]
    results = {}
    for refine in (0, 3):
        script = Script(subqueries=subqueries)
        q, _ = make(tmp_path, script, question="Who is the father of the director of Palo Verde?",
                    tables=two_hop_tables(), units_per_community=1, refine_concepts=refine, follow_links=0)
        r = run(lazy_search(q, budget=4))
        results[refine] = r
    # without refinement the second subquery's words match no unit better than the filler does
    assert 101 not in [t["unit"] for t in results[0].stats["tested"]]
    refined = results[3]
    assert refined.stats["refined"] == {2: ["Gia Marlow"]}
    assert {101, 100} <= {t["unit"] for t in refined.stats["tested"] if t["relevant"]}


def test_ratings_outside_0_to_3_are_clamped_and_the_threshold_decides(tmp_path):
    script = Script()

    def respond(body):
        if asked(body) == "Ratings":  # a server that ignores the prompt's scale
            return {"ratings": [{"id": ref, "score": 7 if "fact" in text else (-2 if "school" in text else 1)}
                                for ref, text in rows_of(body)]}
        return script(body)

    lenient = {100 + u for u, text in TEXTS.items() if "fact" in text or "school" not in text}
    for threshold, expect in ((2, {100, 101, 102}), (1, lenient)):
        q, llm = make(tmp_path, script, relevance_threshold=threshold)
        llm.responder = respond
        r = run(lazy_search(q, budget=len(TEXTS)))
        assert {t["unit"] for t in r.stats["tested"] if t["relevant"]} == expect
        assert {t["score"] for t in r.stats["tested"]} <= {0, 1, 3}


def test_auto_test_format_picks_for_a_small_model_and_scores_for_any_other(tmp_path):
    def fmt(model=None, chosen="auto"):
        chat = {} if model is None else {"provider": "openai", "model": model, "api_key": "k"}
        return load_settings(tmp_path, overrides={"chat": chat, "lazy": {"test_format": chosen}}).lazy_test_format()

    assert fmt()[0] == "pick" and "embedded" in fmt()[1]  # provider local by default
    assert fmt("qwen2.5:3b")[0] == "pick"
    assert fmt("gpt-4o-mini")[0] == "scores" and fmt("llama-3.3-70b-instruct")[0] == "scores"
    assert fmt("qwen2.5:3b", "scores") == ("scores", "lazy.test_format")


@pytest.mark.parametrize("server", [None, "ignores_max_items", "no_json_schema"])
def test_a_picking_tester_marks_what_the_model_lists_and_nothing_else(tmp_path, server):
    # The model lists every relevant unit, then ids not in the call: a list over its maxItems is
    # cut (counted as truncated), unknown ids are ignored, a unit not listed was judged 0.
    script = Script(extra_verdicts=0 if server is None else 30)
    q, llm = make(tmp_path, script, server=None if server == "ignores_max_items" else server, test_format="pick")
    r = run(lazy_search(q, budget=len(TEXTS)))
    assert r.stats["test_format"] == "pick" and r.failures == []
    kinds = [asked(b) for b in llm.requests]
    assert "Picks" in kinds and "Ratings" not in kinds
    verdict = {t["unit"]: (t["relevant"], t["score"]) for t in r.stats["tested"]}
    assert set(verdict) == {100 + u for u in TEXTS}  # every unit was read
    for unit, (relevant, score) in verdict.items():
        fact = "fact" in TEXTS[unit - 100]
        assert relevant is fact and (score >= 2 if fact else score == 0)
    if server:
        assert q.llm.usage.step("relevance").truncated >= 1


def test_a_pick_call_may_list_a_quarter_of_its_units_and_its_first_pick_counts_most(tmp_path):
    texts = {i: f"harbor fishing boats fact number{chr(97 + i)}" for i in range(12)}  # all relevant
    tables = lazy_tables(texts)
    tables["communities"] = tables["communities"].iloc[:0]  # no communities: one call of 12 units
    script = Script()
    q, llm = make(tmp_path, script, tables=tables, test_format="pick", units_per_community=12, subqueries=1)
    r = run(lazy_search(q, budget=12))
    calls = [b for b in llm.requests if asked(b) == "Picks"]
    schema = calls[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["relevant"]["maxItems"] == 3  # ceil(12 / 4)
    assert "at most 3" in last_user(calls[0]) or "at most 3" in calls[0]["messages"][0]["content"]
    listed = [t for t in r.stats["tested"] if t["relevant"]]
    assert len(listed) == 3 and sorted(t["score"] for t in listed) == [2, 2, 3]
    assert q.llm.usage.step("relevance").truncated == 1  # the script listed all 12


def test_a_large_budget_reports_its_progress(tmp_path):
    texts = {i: f"harbor fishing boats number{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(60)}
    tables = lazy_tables(texts)
    tables["communities"] = tables["communities"].iloc[:0]
    q, _ = make(tmp_path, Script(), tables=tables, units_per_community=24)
    lines: list[str] = []
    q.log = lines.append
    run(lazy_search(q, budget=50))
    progress = [line for line in lines if line.startswith("lazy search:")]
    assert progress and all("of 50 units tested" in line for line in progress)
    counts = [int(line.split()[2]) for line in progress]
    assert counts == sorted(counts) and counts[-1] < 50


def test_a_claim_call_may_give_claims_in_proportion_to_its_units(tmp_path):
    # At most 10 claims per call of ~25 units: 29 relevant units gave 6 claims, 93 gave 26.
    texts = {i: f"harbor fishing boats fact number{chr(97 + i)} storm" for i in range(15)}
    script = Script()
    q, llm = make(tmp_path, script, tables=lazy_tables(texts), claims_per_unit=2)
    run(lazy_search(q, budget=15))
    calls = [b for b in llm.requests if asked(b) == "Claims"]
    for body in calls:
        n = len(rows_of(body))
        schema = body["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["claims"]["maxItems"] == 2 * n
        assert f"at most {2 * n} claims" in body["messages"][0]["content"]
    assert sum(len(rows_of(b)) for b in calls) == 15


def test_claim_batches_keep_a_communitys_units_together(tmp_path):
    from sensegraph.query.lazy_search import Plan, Search, Test, claim_batches, rank_units

    long = " ".join(["harbor fishing boats fact"] * 30)
    q, _ = make(tmp_path, Script(), tables=lazy_tables({**TEXTS, **{i: long + f" {i}" for i in TEXTS}}),
                query={"context_tokens": 600}, claim_tokens=120)
    plan = Plan(SUBQUERIES)
    ranking = run(rank_units(q, plan))
    # communities 7 (3 units), 8 (2 units), 9 (3 units): a batch holds about 4 units
    groups = {0: 7, 1: 7, 2: 7, 3: 8, 4: 8, 5: 9, 6: 9, 7: 9}
    search = Search(tests={r: Test(r, c, 0, True, [1], n, 3) for n, (r, c) in enumerate(groups.items())})
    batches, community_of = claim_batches(q, plan, search, ranking)
    for b in batches:
        refs = [rec["ref"] for rec in b.records]
        owners = [community_of[ref] for ref in refs]
        assert len(set(owners)) == len(owners) or owners == sorted(owners, key=owners.index)
    seen = [community_of[rec["ref"]] for b in batches for rec in b.records]
    # no community is split over two batches when it fits in one
    for c in (7, 8, 9):
        holding = [i for i, b in enumerate(batches) if any(community_of[rec["ref"]] == c for rec in b.records)]
        assert len(holding) == 1, (c, holding)
    assert sorted(seen) == sorted(groups.values())


@pytest.mark.parametrize("claim,verdict", [
    ("Gia Marlow was born in 1987.", ""),
    ("Gia Marlow was born in 1978.", "number"),
    ("Gia Marlow did not direct Palo Verde.", "negation"),
    ("Tom Marlow never married.", ""),            # the passage's own negation
    ("Tom Marlow married Ann Lee.", "negation"),   # ... denied by the claim's matching sentence
    ("孙悟空没有拜师。", "negation"),
    # a negation counts where it governs what the claim says, not anywhere in the sentence (the
    # podcast's "3G ... as standard and 4G would be out there, but not universal by then")
    ("Gia Marlow directed Palo Verde, not Nine Hills.", ""),
    ("Tom Marlow was not married to Ann Lee.", ""),
    ("Ann Lee married Tom Marlow.", "negation"),
    ("Gia Marlow wasn't the director of Palo Verde.", "negation"),
])
def test_a_claim_that_contradicts_its_passage_is_caught(claim, verdict):
    from sensegraph.query.lazy_search import contradicted

    passage = ("Gia Marlow was born in 1987. Gia Marlow directed Palo Verde in 2013. Tom Marlow never married "
               "Ann Lee. 孙悟空拜菩提祖师为师。")
    assert contradicted(claim, passage) == verdict


def test_a_negation_elsewhere_in_the_matching_sentence_is_no_contradiction():
    from sensegraph.query.lazy_search import contradicted

    passage = ("We knew back in 2006, 2007, that by 2017, we'd have 3G cellular telephony as standard and something "
               "called 4G would almost certainly be out there, but not universal by then.")
    assert contradicted("Tech leaders frequently cover issues related to 3G cellular telephony and 4G networks.",
                        passage) == ""
    assert contradicted("3G cellular telephony was not standard by 2017.", passage) == "negation"
    assert contradicted("孙悟空没有拜菩提祖师为师，而是自学成才。", "孙悟空拜菩提祖师为师，不愿回家。") == "negation"
    assert contradicted("孙悟空拜菩提祖师为师。", "孙悟空拜菩提祖师为师，不愿回家。") == ""


# -- the yes-no tester: one call per unit, the model's P(yes) -------------------------------------
def yesno_reply(p_yes: float | None, content: str | None = None, variants: bool = False) -> httpx.Response:
    """A one-token answer; with `p_yes`, the first token's top log-probabilities as llama.cpp
    and OpenAI give them (`variants`: the mass split over " Yes" and "yes", and a third token)."""
    word = content if content is not None else ("Yes" if (p_yes or 0) >= 0.5 else "No")
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": word}}
    if p_yes is not None:
        if variants:
            top = [("Yes", p_yes * 0.7), (" yes", p_yes * 0.2), ("No", (1 - p_yes) * 0.9), ("To", 0.05)]
        else:
            top = [("Yes", p_yes), ("No", 1 - p_yes)]
        alts = [{"token": t, "logprob": math.log(max(p, 1e-12))} for t, p in top]
        choice["logprobs"] = {"content": [{"token": word, "logprob": alts[0]["logprob"], "top_logprobs": alts}]}
    return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
                                     "choices": [choice],
                                     "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51}})


def is_yesno(body: dict[str, Any]) -> bool:
    return body.get("max_tokens") == 1 and "Answer yes or no" in last_user(body)


def passage_of(body: dict[str, Any]) -> str:
    return last_user(body).split("Passage:\n", 1)[1].split("\n\nDoes this passage", 1)[0]


def yesno_script(p_of, script: Script | None = None, logprobs: bool = True, variants: bool = False):
    script = script or Script()

    def respond(body):
        if is_yesno(body):
            p = p_of(passage_of(body))
            if isinstance(p, httpx.Response):
                return p
            return yesno_reply(p if logprobs else None, None if logprobs else ("Yes." if p >= 0.5 else "no"),
                               variants)
        return script(body)
    return respond


def test_choose_reads_the_first_tokens_probabilities_and_caches_them(tmp_path):
    llm = ScriptedLLM(lambda body: yesno_reply(0.8, variants=True))
    client = llm.client(cache=tmp_path / "c.sqlite")
    messages = [{"role": "user", "content": "Is it? Answer yes or no."}]
    probs = run(client.choose(messages, ("yes", "no"), step="relevance"))
    # "Yes" and " yes" add up; "To" is neither option; normalised over the two options
    assert probs["yes"] == pytest.approx(0.8 * 0.9 / (0.8 * 0.9 + 0.2 * 0.9))
    assert llm.requests[0]["logprobs"] is True and llm.requests[0]["max_tokens"] == 1
    assert run(client.choose(messages, ("yes", "no"), step="relevance")) == probs
    assert len(llm.requests) == 1 and client.usage.step("relevance").cache_hits == 1


def test_choose_without_logprobs_reads_the_word_and_a_server_refusing_them_is_asked_again(tmp_path):
    plain = ScriptedLLM(lambda body: yesno_reply(None, "Yes."))
    assert run(plain.client().choose([{"role": "user", "content": "?"}], ("yes", "no"), step="t")) == \
        {"yes": 1.0, "no": 0.0}

    def refusing(body):
        if body.get("logprobs"):
            return httpx.Response(400, json={"error": {"message": "logprobs is not supported"}})
        return yesno_reply(None, "no")
    llm = ScriptedLLM(refusing)
    client = llm.client()
    assert run(client.choose([{"role": "user", "content": "?"}], ("yes", "no"), step="t")) == {"yes": 0.0, "no": 1.0}
    assert run(client.choose([{"role": "user", "content": "??"}], ("yes", "no"), step="t"))["no"] == 1.0
    assert [bool(b.get("logprobs")) for b in llm.requests] == [True, False, False]  # asked once, then remembered
    # neither word, and no log-probabilities: no verdict rather than a guess
    other = ScriptedLLM(lambda body: yesno_reply(None, "Maybe"))
    assert run(other.client().choose([{"role": "user", "content": "?"}], ("yes", "no"), step="t")) == {}


@pytest.mark.parametrize("logprobs", [True, False])
def test_the_yesno_tester_asks_once_per_unit_and_the_threshold_decides(tmp_path, logprobs):
    # P(yes) by the unit's words: "fact" 0.9, "ferry" 0.6, anything else 0.1
    def p_of(text):
        return 0.9 if "fact" in text else 0.6 if "ferry" in text else 0.1

    for cut, expect in ((0.5, {u for u, t in TEXTS.items() if "fact" in t or "ferry" in t}),
                        (0.7, {u for u, t in TEXTS.items() if "fact" in t})):
        # (no refinement: a refined subquery changes the shared part, once, as it should)
        q, llm = make(tmp_path, Script(), test_format="yesno", yes_threshold=cut, refine_concepts=0)
        llm.responder = yesno_script(p_of, logprobs=logprobs)
        r = run(lazy_search(q, budget=len(TEXTS)))
        tests = [b for b in llm.requests if is_yesno(b)]
        assert len(tests) == len(TEXTS) and r.stats["tests_used"] == len(TEXTS)  # one call per unit
        assert r.stats["test_format"] == "yesno" and r.failures == []
        relevant = {t["unit"] - 100 for t in r.stats["tested"] if t["relevant"]}
        assert relevant == (expect if logprobs else {u for u, t in TEXTS.items() if p_of(t) >= 0.5})
        if logprobs:
            assert {t["unit"] - 100: t["p_yes"] for t in r.stats["tested"]} == \
                {u: pytest.approx(p_of(TEXTS[u])) for u in TEXTS}
        # every test's prompt is the same up to the passage: a server's prompt cache reads only that
        heads = {json.dumps(b["messages"][:-1]) + last_user(b).split("Passage:\n", 1)[0] for b in tests}
        assert len(heads) == 1


def test_the_yesno_tester_counts_a_non_answer_and_names_a_failed_call(tmp_path):
    def p_of(text):
        if "storm" in text:  # refused whether or not it asks for log-probabilities
            return httpx.Response(400, json={"error": {"message": "bad request"}})
        return 0.9 if "fact" in text else 0.2

    q, llm = make(tmp_path, Script(), test_format="yesno")
    plain = yesno_script(p_of)

    def respond(body):
        if is_yesno(body) and "museum archive lighthouse" in passage_of(body):
            return yesno_reply(None, "Perhaps")  # neither word, no log-probabilities
        return plain(body)
    llm.responder = respond
    r = run(lazy_search(q, budget=len(TEXTS)))
    storm = [100 + u for u, t in TEXTS.items() if "storm" in t]
    assert sorted(int(f.rsplit(" ", 1)[1]) for f in r.failures if f.startswith("relevance of unit")) == storm
    odd = [u for u, t in TEXTS.items() if "museum archive lighthouse" in t and "storm" not in t]
    assert r.stats["failed_tests"] == len(storm) and r.stats["no_verdict"] == len(odd) > 0
    assert [b for b in llm.requests if is_yesno(b)][-1]["logprobs"] is True  # a refusal for another reason keeps them asked for
    assert {t["unit"] - 100 for t in r.stats["tested"] if t["relevant"]} == \
        {u for u, t in TEXTS.items() if "fact" in t and "storm" not in t}


def test_units_linked_to_what_was_found_are_tested_next(tmp_path, monkeypatch):
    import importlib

    lazy = importlib.import_module("sensegraph.query.lazy_search")
    monkeypatch.setattr(lazy, "MAX_BATCH", 2)
    subqueries = ["film Palo Verde directed", "father of the director"]
    results = {}
    for follow in (0, 2):
        script = Script(subqueries=subqueries)
        q, _ = make(tmp_path, script, question="Who is the father of the director of Palo Verde?",
                    tables=two_hop_tables(), units_per_community=1, refine_concepts=0, follow_links=follow)
        results[follow] = (run(lazy_search(q, budget=4)), script)
    assert 101 not in [t["unit"] for t in results[0][0].stats["tested"]]
    r, script = results[2]
    # the film's unit is found in the first wave; the director's, linked to it through her
    # name (a concept of both units), is tested in the next, before any filler
    assert script.tested[:2] == [100, script.tested[1]] and script.tested[2] == 101
    assert {100, 101} <= {t["unit"] for t in r.stats["tested"] if t["relevant"]}
    assert any(v["community"] == lazy.LINKED for v in r.stats["visits"])


def test_a_refined_subquery_shows_its_concepts_to_the_tester(tmp_path, monkeypatch):
    import importlib

    lazy = importlib.import_module("sensegraph.query.lazy_search")
    monkeypatch.setattr(lazy, "MAX_BATCH", 2)
    script = Script(subqueries=["film Palo Verde directed", "father of the director"])
    q, llm = make(tmp_path, script, question="Who is the father of the director of Palo Verde?",
                  tables=two_hop_tables(), units_per_community=1, refine_concepts=3)
    run(lazy_search(q, budget=4))
    tests = [last_user(b) for b in llm.requests if asked(b) == "Ratings"]
    assert "2. father of the director\n" in tests[0] + "\n"
    assert "2. father of the director (Gia Marlow)" in tests[-1]


@pytest.mark.parametrize("server", [None, "ignores_max_items", "no_json_schema"])
def test_the_answers_tester_keeps_a_unit_only_when_its_answer_is_in_its_own_words(tmp_path, server):
    script = Script(extra_verdicts=0 if server is None else 30)
    q, llm = make(tmp_path, script, server=None if server == "ignores_max_items" else server, test_format="answers")
    r = run(lazy_search(q, budget=len(TEXTS)))
    assert r.stats["test_format"] == "answers" and r.failures == []
    assert "Answers" in [asked(b) for b in llm.requests]
    verdict = {t["unit"]: t["relevant"] for t in r.stats["tested"]}
    assert set(verdict) == {100 + u for u in TEXTS}
    # "an invented answer" is in no passage, "harbor fishing boats" is the question's own words
    assert {u for u, v in verdict.items() if v} == {100 + u for u, t in TEXTS.items() if "fact" in t}


def test_an_answer_found_refines_the_subqueries_still_unanswered(tmp_path, monkeypatch):
    import importlib

    lazy = importlib.import_module("sensegraph.query.lazy_search")
    monkeypatch.setattr(lazy, "MAX_BATCH", 2)
    script = Script(subqueries=["film Palo Verde directed", "father of the director"])
    base = script.__call__

    def respond(body):
        if asked(body) == "Answers":
            rows = rows_of(body)
            script.tested += [ref for ref, _ in rows]
            film = [ref for ref, text in rows if "directed by" in text]
            father = [ref for ref, text in rows if "daughter of" in text]
            return {"answers": [{"subquery": 1, "answer": "Gia Marlow", "id": ref} for ref in film]
                    + [{"subquery": 2, "answer": "Tom Marlow", "id": ref} for ref in father]}
        return base(body)

    tables = two_hop_tables()
    tables["entities"] = tables["entities"].iloc[:1]  # no concept names the director: only the answer can
    q, llm = make(tmp_path, script, question="Who is the father of the director of Palo Verde?",
                  tables=tables, units_per_community=1, test_format="answers")
    llm.responder = respond
    r = run(lazy_search(q, budget=4))
    assert r.stats["refined"] == {2: ["Gia Marlow"]}
    assert {100, 101} <= {t["unit"] for t in r.stats["tested"] if t["relevant"]}


def test_the_embedding_prior_vouches_for_a_unit_that_stands_out_whatever_the_model_says(tmp_path):
    # A model that turns everything down: only the prior can call a unit relevant.
    nothing = Script(relevant=lambda text: False)
    import importlib
    lazy = importlib.import_module("sensegraph.query.lazy_search")
    results = {}
    for prior in ("off", "on"):
        q, _ = make(tmp_path, nothing, embedding_prior=prior, prior_z=1.0)
        results[prior] = run(lazy_search(q, budget=len(TEXTS)))
        if prior == "on":
            plan_q = q
    assert results["off"].stats["relevant_units"] == 0 and results["off"].stats["vouched_units"] == 0
    on = results["on"].stats
    vouched = {t["unit"] for t in on["tested"] if t.get("vouched")}
    assert vouched and {t["unit"] for t in on["tested"] if t["relevant"]} == vouched
    assert on["vouched_units"] == len(vouched) and on["embedding_prior"] == "on"
    # exactly the units whose similarity stands 1 SD above the corpus's mean
    plan, ranking, _ = run(lazy.retrieve(plan_q, len(TEXTS), []))
    z = lazy.standing_out(ranking)
    assert vouched == {100 + r for r in range(len(TEXTS)) if z[r] >= 1.0}


def test_the_embedding_prior_is_on_for_a_small_model_only(tmp_path):
    def prior(model=None, chosen="auto"):
        chat = {} if model is None else {"provider": "openai", "model": model, "api_key": "k"}
        return load_settings(tmp_path, overrides={"chat": chat, "lazy": {"embedding_prior": chosen}}).lazy_prior()

    assert prior()[0] == "on" and prior("qwen2.5:3b")[0] == "on"
    assert prior("gpt-4o-mini")[0] == "off" and prior("gpt-4o-mini", "on") == ("on", "lazy.embedding_prior")
