"""Pairwise judge: counterbalancing, repeats, ties and the win-rate arithmetic, with a scripted
LLM behind the real ChatClient (so caching and usage are exercised too)."""
import asyncio
import json
import re

import pandas as pd
import pytest

from scripted import ScriptedLLM, last_user, schema_name
from sensegraph.evaluate.judge import (CRITERIA, comparison_tag, first_is_a, judgements_frame, majority_labels,
                                       pairs_of, position_bias, run_judge, score_of, win_rates)
from sensegraph.evaluate.report import compute
from sensegraph.evaluate.store import EvalStore


def answers_of(answer: dict[str, str], questions: int) -> list[dict]:
    return [{"question_id": f"q{i}", "condition": c, "answer": text} for i in range(questions)
            for c, text in answer.items()]


def make_store(tmp_path, answer: dict[str, str], questions: int = 4) -> EvalStore:
    store = EvalStore(tmp_path / "evaluation" / "t")
    store.write_all("questions", [{"id": f"q{i}", "persona": "", "task": "", "question": f"What are the themes {i}?"}
                                  for i in range(questions)])
    for row in answers_of(answer, questions):
        store.append("answers", row)
    return store


def shown(body) -> tuple[str, str, str, str]:
    """(answer 1, answer 2, criterion, reference) of a judge request."""
    text = last_user(body)
    a1 = re.search(r"--- Answer 1 ---\n(.*?)\n\n--- Answer 2", text, re.S).group(1)
    a2 = re.search(r"--- Answer 2 ---\n(.*?)\n\n--- Comparison", text, re.S).group(1)
    crit = re.search(r"Criterion: (\w+):", text).group(1)
    ref = re.search(r"--- Comparison (.*) ---\n", text).group(1)
    return a1, a2, crit, ref


def judge(tmp_path, store, responder, conditions, **kw):
    llm = ScriptedLLM(responder)
    client = llm.client(cache=tmp_path / "cache.sqlite")
    out = asyncio.run(run_judge(client, store, conditions, **kw))
    return llm, client, out


def test_counterbalancing_alternates_order_by_question_and_repeat():
    assert [first_is_a(q, r) for q in range(2) for r in range(3)] == [True, False, True, False, True, False]
    # a verdict names a position; the score is condition a's
    assert score_of("1", True) == 1 and score_of("1", False) == 0
    assert score_of("2", True) == 0 and score_of("2", False) == 1
    assert score_of("tie", True) == score_of("tie", False) == 0.5
    assert pairs_of(["C0", "TS", "SS"]) == [("C0", "TS"), ("C0", "SS"), ("TS", "SS")]
    assert pairs_of(["C0", "TS"], aa=True) == [("C0", "C0"), ("TS", "TS")]


def test_content_judge_win_rates_ties_and_cached_rerun(tmp_path):
    # The judge prefers the longer answer, except on directness where it prefers the shorter,
    # and calls diversity a tie when both answers mention "themes".
    store = make_store(tmp_path, {"C0": "long answer with many themes and details",
                                  "TS": "medium answer with themes", "SS": "short"})

    def responder(body):
        assert schema_name(body) == "Verdict"
        a1, a2, crit, _ = shown(body)
        if crit == "diversity" and "themes" in a1 and "themes" in a2:
            return {"reasoning": "same", "winner": "tie"}
        longer = "1" if len(a1) > len(a2) else "2"
        shorter = "2" if longer == "1" else "1"
        return {"reasoning": "r", "winner": shorter if crit == "directness" else longer}

    llm, client, out = judge(tmp_path, store, responder, ["C0", "TS", "SS"], repeats=2)
    assert out["estimate"]["comparisons_total"] == 4 * 3 * 4 * 2
    assert len(llm.requests) == 96 and client.usage.total().calls == 96
    df = judgements_frame(list(store.done("judgements").values()))
    # every (question, pair, criterion) was shown once in each order
    firsts = df.groupby(["question_id", "a", "b", "criterion"])["a_first"].agg(set)
    assert all(s == {True, False} for s in firsts)

    comp = win_rates(df, "comprehensiveness", ["C0", "TS", "SS"])["rate"]
    assert comp.loc["C0", "TS"] == 1.0 and comp.loc["TS", "C0"] == 0.0 and comp.loc["TS", "SS"] == 1.0
    direct = win_rates(df, "directness", ["C0", "TS", "SS"])["rate"]
    assert direct.loc["SS", "C0"] == 1.0
    div = win_rates(df, "diversity", ["C0", "TS", "SS"])["rate"]
    assert div.loc["C0", "TS"] == 0.5 and div.loc["TS", "C0"] == 0.5  # ties count half
    assert div.loc["C0", "SS"] == 1.0
    assert pd.isna(comp.loc["C0", "C0"])
    # the reasoning and the winner's name are stored
    row = next(iter(store.done("judgements").values()))
    assert row["reasoning"] and row["winner"] in ("C0", "TS", "SS", "tie")

    # A rerun of the finished judgement costs zero LLM calls and adds no rows.
    llm2, client2, out2 = judge(tmp_path, store, responder, ["C0", "TS", "SS"], repeats=2)
    assert llm2.requests == [] and out2["estimate"]["llm_calls_estimate"] == 0
    assert len(store.rows("judgements")) == 96
    # More repeats later: only the new repeat is judged.
    llm3, _, _ = judge(tmp_path, store, responder, ["C0", "TS", "SS"], repeats=3)
    assert len(llm3.requests) == 48


def test_repeats_average_before_questions(tmp_path):
    # Repeat 1: the answer of condition A wins; repeat 2: tie; repeat 3: B wins on q0 only.
    store = make_store(tmp_path, {"A": "answer of A", "B": "answer of B"}, questions=2)
    # The judge is told an opaque tag; the test knows which comparison each tag stands for.
    tags = {comparison_tag(f"q{i}", "A", "B", r): (f"q{i}", r + 1) for i in range(2) for r in range(3)}

    def responder(body):
        a1, a2, crit, ref = shown(body)
        qid, r = tags[ref]
        if r == 1:
            return {"reasoning": "", "winner": "1" if a1 == "answer of A" else "2"}
        if r == 2 or qid == "q1":
            return {"reasoning": "", "winner": "tie"}
        return {"reasoning": "", "winner": "1" if a1 == "answer of B" else "2"}

    judge(tmp_path, store, responder, ["A", "B"], repeats=3, criteria=("empowerment",))
    df = judgements_frame(list(store.done("judgements").values()))
    m = win_rates(df, "empowerment", ["A", "B"])
    # q0: (1 + 0.5 + 0) / 3 = 0.5; q1: (1 + 0.5 + 0.5) / 3 = 2/3; mean = 7/12
    assert m["rate"].loc["A", "B"] == pytest.approx(7 / 12)
    assert m["rate"].loc["B", "A"] == pytest.approx(5 / 12)
    assert m["n"].loc["A", "B"] == 2
    labels = majority_labels(df)
    assert labels[("q0", "A", "B", "empowerment")] == "tie"  # A, tie, B: no majority
    assert labels[("q1", "A", "B", "empowerment")] == "tie"  # tie twice


def test_position_biased_judge_is_cancelled_by_counterbalancing_and_caught_by_aa(tmp_path):
    store = make_store(tmp_path, {"C0": "one answer", "SS": "another answer"}, questions=3)
    always_first = lambda body: {"reasoning": "the first one", "winner": "1"}  # noqa: E731
    judge(tmp_path, store, always_first, ["C0", "SS"], repeats=2, criteria=("comprehensiveness",))
    judge(tmp_path, store, always_first, ["C0", "SS"], repeats=2, criteria=("comprehensiveness",), aa=True)
    df = judgements_frame(list(store.done("judgements").values()))
    m = win_rates(df, "comprehensiveness", ["C0", "SS"])
    assert m["rate"].loc["C0", "SS"] == 0.5  # every question: one win, one loss
    assert m["p"].loc["C0", "SS"] == 1.0
    bias = position_bias(df).set_index("kind")
    assert bias.loc["A/A", "first"] == 1.0 and bias.loc["A/A", "n"] == 2 * 3 * 2
    assert bias.loc["pairs", "first"] == 1.0


def test_significance_is_holm_corrected(tmp_path):
    # 10 questions, X always beats Y and Z, Y vs Z always tie.
    store = make_store(tmp_path, {"X": "xx", "Y": "yy", "Z": "zz"}, questions=10)

    def responder(body):
        a1, a2, _, _ = shown(body)
        if "xx" not in (a1, a2):
            return {"reasoning": "", "winner": "tie"}
        return {"reasoning": "", "winner": "1" if a1 == "xx" else "2"}

    judge(tmp_path, store, responder, ["X", "Y", "Z"], repeats=1, criteria=("diversity",))
    df = judgements_frame(list(store.done("judgements").values()))
    m = win_rates(df, "diversity", ["X", "Y", "Z"])
    raw = 2 / 2 ** 10  # exact two-sided Wilcoxon signed-rank, 10 positive differences
    assert m["p_raw"].loc["X", "Y"] == pytest.approx(raw)
    assert m["p"].loc["Y", "Z"] == 1.0
    # Holm over the three pairs: the two smallest raw p-values are multiplied by 3 and 2, then made monotone
    assert m["p"].loc["X", "Y"] == pytest.approx(3 * raw) and m["p"].loc["X", "Z"] == pytest.approx(3 * raw)


def test_judge_failure_is_recorded_and_retried(tmp_path):
    import httpx

    store = make_store(tmp_path, {"A": "a", "B": "b"}, questions=1)
    bad = lambda body: httpx.Response(400, json={"error": {"message": "nope"}})  # noqa: E731
    _, client, out = judge(tmp_path, store, bad, ["A", "B"], repeats=1, criteria=("directness",))
    assert out["run"]["failures"] and store.errors("judgements")
    assert store.done("judgements") == {}
    good = lambda body: {"reasoning": "", "winner": "tie"}  # noqa: E731
    llm, _, _ = judge(tmp_path, store, good, ["A", "B"], repeats=1, criteria=("directness",))
    assert len(llm.requests) == 1 and not store.errors("judgements")
    assert len(store.done("judgements")) == 1


def test_criteria_definitions_are_in_the_prompt(tmp_path):
    store = make_store(tmp_path, {"A": "a", "B": "b"}, questions=1)
    llm, _, _ = judge(tmp_path, store, lambda b: {"reasoning": "", "winner": "tie"}, ["A", "B"], repeats=1)
    prompts = [json.dumps(b["messages"]) for b in llm.requests]
    assert any("different perspectives and insights" in p for p in prompts)
    assert any("informed judgements" in p for p in prompts)
    assert len({p for p in prompts}) == len(CRITERIA)


def test_report_with_failed_answer_and_no_judgements(tmp_path):
    from sensegraph.evaluate.report import write_report

    store = make_store(tmp_path, {"A": "a"}, questions=1)
    store.append("answers", {"question_id": "q0", "condition": "B", "error": "reduce timed out"})
    out = write_report(store, ["A", "B"])
    text = out["report"].read_text()
    assert "## Failures" in text and "q0 B: reduce timed out" in text
    assert out["figures"] == []  # nothing judged yet: no heatmap, and no crash


def test_criteria_share_the_answers_prefix_and_run_in_one_lane(tmp_path):
    # Prefix caching (llama.cpp slots, OpenAI) needs the long part first and the criteria of one
    # comparison asked one after another; with one lane, requests come group by group.
    store = make_store(tmp_path, {"A": "answer a " * 50, "B": "answer b " * 50}, questions=2)
    llm, _, _ = judge(tmp_path, store, lambda b: {"reasoning": "", "winner": "tie"}, ["A", "B"], repeats=2,
                      lanes=1)
    texts = [last_user(b) for b in llm.requests]
    groups = [re.search(r"--- Comparison (\S+) ---", t).group(1) for t in texts]  # one tag per (question, pair, repeat)
    assert len(texts) == 2 * 2 * len(CRITERIA)
    # each group's requests are consecutive: the group changes exactly (groups - 1) times
    changes = sum(1 for x, y in zip(groups, groups[1:]) if x != y)
    assert changes == len(set(groups)) - 1 == 3
    for i in range(0, len(texts), len(CRITERIA)):
        block = texts[i:i + len(CRITERIA)]
        prefix = block[0].split("--- Comparison")[0]
        assert len(prefix) > 900 and all(t.startswith(prefix) for t in block)
        assert len({re.search(r"Criterion: (\w+):", t).group(1) for t in block}) == len(CRITERIA)


def test_the_judge_sees_no_condition_name_or_label(tmp_path):
    store = make_store(tmp_path, {"C2": "an answer about harbours", "SS": "an answer about fish",
                                  "bigmodel": "an answer about boats"}, questions=2)
    llm, _, _ = judge(tmp_path, store, lambda b: {"reasoning": "", "winner": "tie"}, ["C2", "SS", "bigmodel"],
                      repeats=2, criteria=("diversity", "directness"))
    assert len(llm.requests) == 2 * 3 * 2 * 2
    for body in llm.requests:
        text = "\n".join(m["content"] for m in body["messages"])
        for name in ("C2", "SS", "bigmodel", "-vs-"):
            assert name not in text, (name, text[-200:])
    # Still one request per repeat: the tag differs between repeats, not between criteria.
    tags = {(shown(b)[3], shown(b)[2]) for b in llm.requests}
    assert len({t for t, _ in tags}) == 2 * 3 * 2 and len(tags) == len(llm.requests)


def responder_longer_wins(body):
    a1, a2, _, _ = shown(body)
    return {"reasoning": "", "winner": "1" if len(a1) > len(a2) else "2"}


def test_a_pair_named_in_the_other_order_is_judged_once(tmp_path):
    store = make_store(tmp_path, {"C0": "the longer answer of the two", "SS": "short"}, questions=3)
    llm, _, _ = judge(tmp_path, store, responder_longer_wins, ["C0", "SS"], repeats=2, criteria=("diversity",))
    assert len(llm.requests) == 3 * 2
    again, _, out = judge(tmp_path, store, responder_longer_wins, ["SS", "C0"], repeats=2, criteria=("diversity",))
    assert again.requests == [] and out["estimate"]["llm_calls_estimate"] == 0
    assert len(store.rows("judgements")) == 3 * 2

    for order in (["C0", "SS"], ["SS", "C0"]):
        results = compute(store, order)
        assert results["holm_tests"] == {"diversity": 1}
        rate = results["win_rates"]["diversity"]["rate"]
        assert rate["C0"]["SS"] == 1.0 and rate["SS"]["C0"] == 0.0


def test_judgements_stored_under_either_order_by_an_older_version_count_once(tmp_path):
    # An older version keyed judgements by the pair as named: `-c SS,C0` stored (SS, C0) rows
    # with SS's score, and a later `-c C0,SS` judged the same comparisons again as (C0, SS).
    store = make_store(tmp_path, {"C0": "the longer answer of the two", "SS": "short"}, questions=2)
    for qi in range(2):
        for r in range(2):
            ss_first = (qi + r) % 2 == 0
            store.append("judgements", {"question_id": f"q{qi}", "a": "SS", "b": "C0", "criterion": "diversity",
                                        "repeat": r, "first": "SS" if ss_first else "C0", "a_first": ss_first,
                                        "verdict": "2" if ss_first else "1", "winner": "C0", "score_a": 0.0,
                                        "reasoning": ""})
    llm, _, _ = judge(tmp_path, store, responder_longer_wins, ["C0", "SS"], repeats=2, criteria=("diversity",))
    assert llm.requests == []  # stored under the other order: already done
    store.append("judgements", {"question_id": "q0", "a": "C0", "b": "SS", "criterion": "diversity", "repeat": 0,
                                "first": "C0", "a_first": True, "verdict": "1", "winner": "C0", "score_a": 1.0,
                                "reasoning": ""})
    df = judgements_frame(list(store.done("judgements").values()))
    assert len(df) == 4 and set(zip(df["a"], df["b"])) == {("C0", "SS")}
    assert all(df["first"] == df["a"].where(df["a_first"], df["b"]))  # a_first follows the swap
    m = win_rates(df, "diversity", ["SS", "C0"])
    assert m["tests"] == [("C0", "SS")]
    assert m["rate"].loc["C0", "SS"] == 1.0 and m["rate"].loc["SS", "C0"] == 0.0
    assert majority_labels(df) == {("q0", "C0", "SS", "diversity"): "C0", ("q1", "C0", "SS", "diversity"): "C0"}
    assert compute(store, ["SS", "C0"])["holm_tests"] == {"diversity": 1}
