"""Step 2.3: merging element instances and summarising their descriptions."""
import asyncio
import re

import httpx
import pandas as pd
from scripted import ScriptedLLM, last_user, schema_name

from sensegraph.config import ChatSettings, Settings
from sensegraph.index.extract import CLAIM_COLUMNS, ENTITY_COLUMNS, RELATIONSHIP_COLUMNS, ExtractionResult, extract_graph
from sensegraph.index.summarize import entity_id, merge_instances, relationship_id, summarize_graph
from sensegraph.prompts import load_prompt
from sensegraph.tokens import count_tokens


def extraction(entities=(), relationships=(), claims=()) -> ExtractionResult:
    return ExtractionResult(
        entities=pd.DataFrame([(*e, 0) for e in entities], columns=ENTITY_COLUMNS),
        relationships=pd.DataFrame([(*r, 0) for r in relationships], columns=RELATIONSHIP_COLUMNS),
        claims=pd.DataFrame([(*c, 0) for c in claims], columns=CLAIM_COLUMNS),
        failed=[],
    )


TEXT_UNITS = pd.DataFrame({"id": ["t1", "t2", "t3"], "text": ["a", "b", "c"]})


def name_in(body) -> str:
    return re.search(r"Entity or relationship: (.*)", last_user(body)).group(1).strip()


def summarizer(body):
    assert schema_name(body) is None
    return f"Summary of {name_in(body)}."


def summarize(ex, llm, tmp_path, language="en", **summ):
    s = Settings(root=str(tmp_path), summarize=summ)
    return asyncio.run(summarize_graph(ex, TEXT_UNITS, llm, settings=s, language=language))


def test_same_name_with_two_types_keeps_one_entity_with_majority_type(tmp_path):
    ex = extraction(entities=[
        ("Mercury", "person", "Mercury is a messenger god.", "t1"),
        ("Mercury", "geo", "Mercury is a planet.", "t2"),
        ("Mercury", "geo", "Mercury orbits the sun.", "t3"),
    ])
    llm = ScriptedLLM(summarizer)
    entities, _, _, failed = summarize(ex, llm.client(), tmp_path)
    assert len(entities) == 1
    row = entities.iloc[0]
    assert row["type"] == "geo" and list(row["other_types"]) == ["person"]
    assert list(row["text_unit_ids"]) == ["t1", "t2", "t3"] and row["frequency"] == 3
    assert row["description"] == "Summary of Mercury."
    assert len(llm.requests) == 1
    prompt = last_user(llm.requests[0])
    for d in ("messenger god", "is a planet", "orbits the sun"):
        assert d in prompt
    assert failed == []


def test_type_tie_keeps_the_first_seen(tmp_path):
    ex = extraction(entities=[("Jordan", "person", "d1", "t1"), ("Jordan", "geo", "d1", "t2")])
    entities, *_ = summarize(ex, ScriptedLLM(summarizer).client(), tmp_path)
    assert entities.iloc[0]["type"] == "person" and list(entities.iloc[0]["other_types"]) == ["geo"]


def test_case_and_whitespace_variants_merge(tmp_path):
    ex = extraction(entities=[
        ("New York", "geo", "A city.", "t1"),
        ("new  york", "geo", "A city.", "t2"),
        (" New York ", "geo", "A city.", "t3"),
        ("NEW YORK", "geo", "A city.", "t3"),
    ])
    llm = ScriptedLLM(summarizer)
    entities, *_ = summarize(ex, llm.client(), tmp_path)
    assert entities["title"].tolist() == ["New York"]  # the most frequent spelling, case kept
    assert entities.iloc[0]["description"] == "A city."  # one unique description: no call
    assert sorted(entities.iloc[0]["aliases"]) == ["NEW YORK", "new york"]
    assert entities.iloc[0]["id"] == entity_id("NEW  york")
    assert llm.requests == []


def test_undirected_merge_sums_weights_in_both_directions(tmp_path):
    ex = extraction(
        entities=[("Alice", "person", "Alice.", "t1"), ("Bob", "person", "Bob.", "t1")],
        relationships=[("Alice", "Bob", "Alice hired Bob.", 3, "t1"),
                       ("Bob", "Alice", "Bob works for Alice.", 4, "t2"),
                       ("alice", "BOB", "Alice hired Bob.", 2, "t3")],
    )
    llm = ScriptedLLM(summarizer)
    entities, relationships, _, _ = summarize(ex, llm.client(), tmp_path)
    assert len(relationships) == 1
    r = relationships.iloc[0]
    assert (r["source"], r["target"]) == ("Alice", "Bob")
    assert r["weight"] == 9
    assert list(r["text_unit_ids"]) == ["t1", "t2", "t3"]
    assert r["id"] == relationship_id("Bob", "alice")
    assert r["description"] == "Summary of Alice -> Bob."
    assert r["combined_degree"] == 2
    assert entities["degree"].tolist() == [1, 1]
    assert len(llm.requests) == 1  # two unique relationship descriptions; entities have one each


def test_a_relationship_counts_once_per_text_unit_with_its_strongest_strength(tmp_path):
    rows = [("Alice", "Bob", "Alice hired Bob.", 3, "t1", 0),
            ("Bob", "alice", "Bob works for Alice.", 7, "t1", 1),  # restated by a gleaning round
            ("Alice", "Bob", "Alice hired Bob.", 3, "t1", 2),
            ("Alice", "Bob", "Alice pays Bob.", 2, "t2", 0)]
    ex = extraction(entities=[("Alice", "person", "Alice.", "t1"), ("Bob", "person", "Bob.", "t1")])
    ex.relationships = pd.DataFrame(rows, columns=RELATIONSHIP_COLUMNS)
    rel = merge_instances(ex).relationships[("alice", "bob")]
    assert rel.weight == 7 + 2 and rel.text_unit_ids == ["t1", "t2"]
    assert len(rel.descriptions) == 3  # every description is still summarised


def test_relationship_repeated_by_gleaning_does_not_raise_its_weight(tmp_path):
    # Before, the weight summed every record, so a unit whose gleaning round restated a
    # relationship gave it twice the weight of a unit that stated it once.
    glean = load_prompt("glean_continue", "en").strip()[:40]

    def extractor(repeat: bool):
        def respond(body):
            name = schema_name(body)
            if name == "GleanCheck":
                return {"missed": sum(m["role"] == "assistant" for m in body["messages"]) == 1}
            if name == "ExtractedGraph":
                if glean in last_user(body):
                    again = [{"source": "Bob", "target": "Alice", "description": "Bob reports to Alice.",
                              "strength": 6}] if repeat else []
                    return {"entities": [], "relationships": again}
                return {"entities": [{"name": n, "type": "person", "description": f"{n}."} for n in ("Alice", "Bob")],
                        "relationships": [{"source": "Alice", "target": "Bob", "description": "Alice hired Bob.",
                                           "strength": 6}]}
            return summarizer(body)
        return respond

    s = Settings(root=str(tmp_path))
    weights = []
    for repeat in (False, True):
        client = ScriptedLLM(extractor(repeat)).client()
        unit = pd.DataFrame({"id": ["t1"], "text": ["Alice hired Bob."]})
        ex = asyncio.run(extract_graph(unit, client, settings=s, language="en"))
        assert len(ex.relationships) == 1 + repeat
        _, relationships, _, _ = asyncio.run(summarize_graph(ex, TEXT_UNITS, client, settings=s, language="en"))
        weights.append(relationships["weight"].tolist())
    assert weights == [[6.0], [6.0]]


def test_relationship_endpoint_that_was_never_an_entity_becomes_one(tmp_path):
    ex = extraction(
        entities=[("Alice", "person", "Alice.", "t1")],
        relationships=[("Alice", "Ghost Corp", "Alice founded Ghost Corp.", 8, "t2")],
    )
    entities, relationships, _, _ = summarize(ex, ScriptedLLM(summarizer).client(), tmp_path)
    assert entities["title"].tolist() == ["Alice", "Ghost Corp"]
    ghost = entities.set_index("title").loc["Ghost Corp"]
    assert ghost["type"] == "unknown"
    assert ghost["description"] == "Alice founded Ghost Corp."
    assert list(ghost["text_unit_ids"]) == ["t2"] and ghost["degree"] == 1
    assert set(relationships[["source", "target"]].values[0]) <= set(entities["title"])


def test_one_summary_call_per_element_with_several_descriptions(tmp_path):
    ex = extraction(entities=[
        ("Alice", "person", "Alice is a chemist.", "t1"),
        ("Alice", "person", "Alice won a prize.", "t2"),
        ("Alice", "person", "Alice is a chemist.", "t3"),  # duplicate description: not sent twice
        ("Bob", "person", "Bob is a baker.", "t1"),
        ("Carol", "person", "Carol sings.", "t1"),
        ("Carol", "person", "Carol dances.", "t2"),
    ])
    llm = ScriptedLLM(summarizer)
    client = llm.client()
    done = []
    s = Settings(root=str(tmp_path))
    entities, _, _, _ = asyncio.run(summarize_graph(ex, TEXT_UNITS, client, settings=s, language="en",
                                                    advance=done.append))
    assert sorted(name_in(b) for b in llm.requests) == ["Alice", "Carol"]
    alice_prompt = next(last_user(b) for b in llm.requests if name_in(b) == "Alice")
    assert alice_prompt.count("Alice is a chemist.") == 1
    assert entities.set_index("title")["description"].to_dict() == {
        "Alice": "Summary of Alice.", "Bob": "Bob is a baker.", "Carol": "Summary of Carol."}
    assert entities["human_readable_id"].tolist() == [0, 1, 2]
    assert len(done) == merge_instances(ex).size == 3
    assert all(b["max_tokens"] == 300 for b in llm.requests)
    assert client.usage.step("summarize").calls == 2


def test_descriptions_over_the_budget_are_folded(tmp_path):
    sentence = "Alice studied the chemistry of rare metals for many years in several laboratories. "
    descriptions = [f"Fact {i}: " + sentence * 4 for i in range(6)]  # ~70 tokens each
    assert count_tokens(" ".join(descriptions)) > 300
    ex = extraction(entities=[("Alice", "person", d, "t1") for d in descriptions])
    calls = []

    def respond(body):
        calls.append(last_user(body))
        return f"Folded summary {len(calls)}."

    llm = ScriptedLLM(respond)
    entities, _, _, failed = summarize(ex, llm.client(), tmp_path, max_input_tokens=200, max_tokens=40)
    assert len(calls) > 1
    assert entities.iloc[0]["description"] == f"Folded summary {len(calls)}."
    for i in range(1, len(calls)):
        assert f"Folded summary {i}." in calls[i]  # each round carries the summary so far
    for d in descriptions:  # every description was read once
        assert sum(d[:8] in c for c in calls) == 1
    assert failed == []


def test_failed_summary_keeps_descriptions_and_reports_the_id(tmp_path):
    def respond(body):
        if "Alice" in last_user(body):
            return httpx.Response(500, json={"error": "boom"})
        return summarizer(body)

    ex = extraction(entities=[("Alice", "person", "Alice is a chemist.", "t1"),
                              ("Alice", "person", "Alice won a prize.", "t2"),
                              ("Bob", "person", "Bob bakes.", "t1"), ("Bob", "person", "Bob sings.", "t2")])
    client = ScriptedLLM(respond).client(ChatSettings(provider="openai", model="s", base_url="http://scripted/v1",
                                                       retry_base_seconds=0.001, max_retries=1))
    entities, _, _, failed = summarize(ex, client, tmp_path)
    alice = entities.set_index("title").loc["Alice"]
    assert failed == [alice["id"]]
    assert "Alice is a chemist." in alice["description"] and "Alice won a prize." in alice["description"]
    assert entities.set_index("title").loc["Bob", "description"] == "Summary of Bob."
    assert client.usage.step("summarize").failures == ["Alice"]


def test_chinese_summary_prompt(tmp_path):
    ex = extraction(entities=[("陈静", "person", "陈静是首席执行官。", "t1"), ("陈静", "person", "陈静将卸任。", "t2")])
    llm = ScriptedLLM(lambda body: "陈静是即将卸任的首席执行官。")
    entities, *_ = summarize(ex, llm.client(), tmp_path, language="zh")
    assert "用中文书写" in last_user(llm.requests[0])
    assert entities.iloc[0]["description"] == "陈静是即将卸任的首席执行官。"


def test_covariates_take_entity_titles_and_drop_exact_repeats(tmp_path):
    claim = ("acme corp", "", "LAWSUIT", "TRUE", "2024-01-02", "2024-01-02", "Acme was sued.", "Acme was sued.", "t2")
    ex = extraction(
        entities=[("Acme Corp", "organization", "A firm.", "t1")],
        claims=[claim, claim, ("Acme Corp", "Bob", "FRAUD", "SUSPECTED", "", "", "Bob says fraud.", "q", "t1")],
    )
    _, _, covariates, _ = summarize(ex, ScriptedLLM(summarizer).client(), tmp_path)
    assert len(covariates) == 2
    assert covariates["text_unit_id"].tolist() == ["t1", "t2"]  # text-unit order
    assert covariates["subject_id"].tolist() == ["Acme Corp", "Acme Corp"]
    assert covariates["object_id"].tolist() == ["Bob", None]
    assert covariates["covariate_type"].tolist() == ["claim", "claim"]
    assert covariates["start_date"].tolist() == [None, "2024-01-02"]
    assert covariates["human_readable_id"].tolist() == [0, 1]


def test_output_is_deterministic(tmp_path):
    ex = extraction(
        entities=[("Zed", "person", "Z1.", "t1"), ("Amy", "person", "A1.", "t2"), ("Zed", "person", "Z2.", "t3")],
        relationships=[("Zed", "Amy", "They met.", 5, "t1"), ("Amy", "Bo", "Siblings.", 7, "t2")],
    )
    a = summarize(ex, ScriptedLLM(summarizer).client(), tmp_path)
    b = summarize(ex, ScriptedLLM(summarizer).client(), tmp_path)
    for x, y in zip(a[:3], b[:3]):
        pd.testing.assert_frame_equal(x, y)
    entities = a[0]
    assert entities["title"].tolist() == ["Amy", "Bo", "Zed"]
    assert entities["degree"].tolist() == [2, 1, 1]
    assert list(entities.columns)[:8] == ["id", "human_readable_id", "title", "type", "description",
                                          "text_unit_ids", "frequency", "degree"]
    rels = a[1]
    assert rels[["source", "target"]].values.tolist() == [["Amy", "Bo"], ["Amy", "Zed"]]
    assert rels["combined_degree"].tolist() == [3, 3]


def test_empty_extraction(tmp_path):
    entities, relationships, covariates, failed = summarize(extraction(), ScriptedLLM(summarizer).client(), tmp_path)
    assert entities.empty and relationships.empty and covariates.empty and failed == []
    assert "other_types" in entities.columns and "covariate_type" in covariates.columns


def test_an_endpoint_named_by_a_date_or_amount_is_typed_so_not_unknown(tmp_path):
    # Re-DocRED with the 1.5B model: years named only by relationships were typed "unknown".
    ex = extraction(
        entities=[("Alice", "person", "Alice.", "t1")],
        relationships=[("Alice", "1947", "Alice joined ASCAP in 1947.", 6, "t1"),
                       ("Alice", "1 million", "Alice sold 1 million records.", 4, "t1")],
    )
    entities, _, _, _ = summarize(ex, ScriptedLLM(summarizer).client(), tmp_path)
    assert entities.set_index("title")["type"].to_dict() == {"Alice": "person", "1947": "date", "1 million": "number"}
