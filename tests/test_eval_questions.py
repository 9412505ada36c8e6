"""Question generation: K personas x N tasks x M questions, with counts enforced, and loading
questions from CSV/JSONL files."""
import asyncio
import json
import re

from scripted import ScriptedLLM, last_user, schema_name
from sensegraph.evaluate.questions import generate_questions, load_questions


def counting_llm(extra: int = 0, short: int = 0):
    """Answers each list request with `count + extra - short` items (numbered, unique)."""
    seen = {"n": 0}

    def responder(body):
        name = schema_name(body)
        count = int(re.search(r"(\d+)", name).group(1))
        system = body["messages"][0]["content"]
        seen["n"] += 1
        first_try = "Do not repeat any of these" in system and system.rstrip().endswith("-")
        k = max(1, count + extra - (short if first_try else 0))
        n = seen["n"]
        if name.startswith("Personas"):
            return {"personas": [{"name": f"User {n}.{i}", "description": "reads a lot"} for i in range(k)]}
        if name.startswith("Tasks"):
            return {"tasks": [{"description": f"task {n}.{i}"} for i in range(k)]}
        assert "Task:" in last_user(body) and "User:" in last_user(body)
        return {"questions": [f"What are the themes {n}.{i}?" for i in range(k)]}
    return ScriptedLLM(responder)


def run(llm, tmp_path, **kw):
    client = llm.client(cache=tmp_path / "cache.sqlite")
    return asyncio.run(generate_questions(client, "Transcripts of a technology podcast.", **kw)), client


def test_k_n_m_questions_with_ids(tmp_path):
    llm = counting_llm()
    (rows, problems), client = run(llm, tmp_path, k=2, n=3, m=4)
    assert problems == []
    assert len(rows) == 2 * 3 * 4
    assert len(llm.requests) == 1 + 2 + 2 * 3  # personas, tasks per persona, questions per (persona, task)
    assert {r["id"] for r in rows} == {f"p{p}t{t}q{q}" for p in (1, 2) for t in (1, 2, 3) for q in (1, 2, 3, 4)}
    assert all(r["persona"] and r["task"] and r["question"].endswith("?") for r in rows)
    assert len({r["question"] for r in rows}) == 24
    # The same generation again comes from the cache: zero LLM calls.
    again = counting_llm()
    (rows2, _), client2 = run(again, tmp_path, k=2, n=3, m=4)
    assert again.requests == [] and client2.usage.total().calls == 0 and rows2 == rows


def test_too_many_are_cut_and_too_few_are_topped_up(tmp_path):
    (rows, problems), _ = run(counting_llm(extra=3), tmp_path / "a", k=2, n=2, m=2)
    assert len(rows) == 8 and problems == []
    llm = counting_llm(short=1)  # every first request returns one item too few
    (rows, problems), _ = run(llm, tmp_path / "b", k=2, n=2, m=2)
    assert len(rows) == 8 and problems == []
    assert len(llm.requests) == 2 * (1 + 2 + 4)  # one top-up call per list


def test_shortfall_is_reported(tmp_path):
    def responder(body):
        name = schema_name(body)
        if name.startswith("Personas"):
            return {"personas": [{"name": "Only one", "description": "d"}]}
        if name.startswith("Tasks"):
            return {"tasks": [{"description": "t"}]}
        return {"questions": ["Q?"]}
    (rows, problems), _ = run(ScriptedLLM(responder), tmp_path, k=2, n=2, m=2)
    assert len(rows) == 1
    assert any("2 personas, got 1" in p for p in problems) and any("got 1" in p for p in problems)


def test_load_questions_from_csv_and_jsonl(tmp_path, shared_data):
    rows = load_questions(shared_data / "podcast" / "questions.csv")
    assert len(rows) > 10 and rows[0]["question"].endswith("?") and rows[0]["id"]
    j = tmp_path / "q.jsonl"
    j.write_text("\n".join(json.dumps(x) for x in [{"question": "A?", "persona": "p"}, {"text": "B?"}]))
    assert [(r["id"], r["question"], r["persona"]) for r in load_questions(j)] == [("q1", "A?", "p"), ("q2", "B?", "")]
    c = tmp_path / "q.csv"
    c.write_text("question\nWhat?\n")
    assert load_questions(c)[0]["question"] == "What?"
