"""Step 2.2: extraction with gleaning and claims, driven by a scripted LLM."""
import asyncio
import json

import httpx
import pandas as pd
import pytest
from scripted import ScriptedLLM, last_user, schema_name

from sensegraph.config import ChatSettings, Settings
from sensegraph.index.extract import describe_schema, extract_graph
from sensegraph.index.summarize import summarize_graph
from sensegraph.prompts import load_prompt

GLEAN = load_prompt("glean_continue", "en").strip()[:40]


def settings(tmp_path, **extraction) -> Settings:
    return Settings(root=str(tmp_path), extraction=extraction)


def units(*texts: str) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"u{i}" for i in range(len(texts))], "text": list(texts)})


def ent(name, type="person", description=""):
    return {"name": name, "type": type, "description": description or f"{name} is here."}


def rel(source, target, strength=5, description=""):
    return {"source": source, "target": target, "description": description or f"{source} knows {target}.",
            "strength": strength}


def whole(body) -> str:
    """The first prompt of a conversation: its system and user messages."""
    return "\n".join(m["content"] for m in body["messages"][:2])


def assistant_turns(body) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def run(coro):
    return asyncio.run(coro)


def test_gleaning_keeps_every_record_of_every_round(tmp_path):
    def respond(body):
        name = schema_name(body)
        if name == "GleanCheck":
            return {"missed": assistant_turns(body) == 1}  # yes after round 1, no after round 2
        if name == "ExtractedGraph":
            if GLEAN in last_user(body):
                return {"entities": [ent("Carol")], "relationships": [rel("Bob", "Carol")]}
            return {"entities": [ent("Alice"), ent("Bob")], "relationships": [rel("Alice", "Bob")]}
        raise AssertionError(name)

    llm = ScriptedLLM(respond)
    done = []
    result = run(extract_graph(units("Alice met Bob. Bob met Carol."), llm.client(),
                               settings=settings(tmp_path, max_gleanings=3), language="en", advance=done.append))
    assert result.entities["title"].tolist() == ["Alice", "Bob", "Carol"]
    assert result.entities["round"].tolist() == [0, 0, 1]
    assert result.relationships[["source", "target"]].values.tolist() == [["Alice", "Bob"], ["Bob", "Carol"]]
    assert result.failed == [] and done == [1]
    assert [schema_name(b) for b in llm.requests] == ["ExtractedGraph", "GleanCheck", "ExtractedGraph", "GleanCheck"]
    # The gleaning call continues the conversation: the first answer is in its messages.
    glean = llm.requests[2]
    assert [m["role"] for m in glean["messages"]] == ["system", "user", "assistant", "user"]
    assert "Alice" in glean["messages"][2]["content"]
    assert llm.requests[1]["max_tokens"] <= 20 and llm.requests[0]["max_tokens"] == settings(tmp_path).extraction.max_tokens


def test_no_gleaning_when_check_says_nothing_missed(tmp_path):
    def respond(body):
        if schema_name(body) == "GleanCheck":
            return {"missed": False}
        return {"entities": [ent("Alice")], "relationships": []}

    llm = ScriptedLLM(respond)
    result = run(extract_graph(units("Alice."), llm.client(), settings=settings(tmp_path, max_gleanings=2),
                               language="en"))
    assert len(result.entities) == 1 and len(llm.requests) == 2


def test_gleaned_claims_are_kept(tmp_path):
    def respond(body):
        name = schema_name(body)
        if name in ("GleanCheck",):
            return {"missed": False}
        if name == "ExtractedGraph":
            return {"entities": [ent("Acme", "organization"), ent("Bob")], "relationships": []}
        claim = {"subject": "Acme", "object": "", "type": "LAWSUIT", "status": "suspected", "start_date": "",
                 "end_date": "", "description": "Acme was sued.", "source_text": "Acme was sued."}
        if name == "ClaimGleanCheck":
            return {"missed": assistant_turns(body) == 1}
        if name == "ExtractedClaims":
            if GLEAN in last_user(body):
                return {"claims": [{**claim, "subject": "Bob", "type": "FRAUD", "description": "Bob lied."}]}
            return {"claims": [claim]}
        raise AssertionError(name)

    llm = ScriptedLLM(respond)
    client = llm.client()
    result = run(extract_graph(units("Acme was sued. Bob lied."), client,
                               settings=settings(tmp_path, claims=True), language="en"))
    assert result.claims["subject"].tolist() == ["Acme", "Bob"]
    assert result.claims["status"].tolist() == ["SUSPECTED", "SUSPECTED"]
    assert result.claims["round"].tolist() == [0, 1]
    claim_prompt = whole(next(b for b in llm.requests if schema_name(b) == "ExtractedClaims"))
    assert "Acme, Bob" in claim_prompt
    assert client.usage.step("claims").calls == 3  # claims, check, glean (max_gleanings=1)


def test_failed_unit_is_reported_and_others_continue(tmp_path):
    def respond(body):
        if "BROKEN" in whole(body):
            return httpx.Response(500, json={"error": "boom"})
        if schema_name(body) == "GleanCheck":
            return {"missed": False}
        return {"entities": [ent("Alice")], "relationships": []}

    llm = ScriptedLLM(respond)
    client = llm.client(ChatSettings(provider="openai", model="s", base_url="http://scripted/v1",
                                     retry_base_seconds=0.001, max_retries=2))
    done = []
    result = run(extract_graph(units("Alice one.", "BROKEN text", "Alice two."), client,
                               settings=settings(tmp_path), language="en", advance=done.append))
    assert result.failed == ["u1"]
    assert result.entities["text_unit_id"].tolist() == ["u0", "u2"]
    assert len(done) == 3
    assert client.usage.step("extract").failures == ["u1"]


def test_unit_without_entities_is_not_a_failure(tmp_path):
    llm = ScriptedLLM(lambda b: {"missed": False} if schema_name(b) == "GleanCheck"
                      else {"entities": [], "relationships": []})
    result = run(extract_graph(units("Nothing here."), llm.client(), settings=settings(tmp_path), language="en"))
    assert result.failed == [] and result.entities.empty and list(result.entities.columns)[:4] == [
        "title", "type", "description", "text_unit_id"]


def test_records_are_cleaned(tmp_path):
    def respond(body):
        if schema_name(body) == "GleanCheck":
            return {"missed": False}
        return {"entities": [ent("  Alice   Smith "), ent("   "), ent("Bob")],
                "relationships": [rel("Alice Smith", " alice  smith", 5), rel("Alice Smith", "Bob", 15),
                                  rel("Bob", "Alice Smith", 0), rel("", "Bob")]}

    llm = ScriptedLLM(respond)
    result = run(extract_graph(units("Alice Smith met Bob."), llm.client(), settings=settings(tmp_path),
                               language="en"))
    assert result.entities["title"].tolist() == ["Alice Smith", "Bob"]
    assert result.relationships["strength"].tolist() == [10, 1]
    assert result.self_loops == 1 and result.empty_names == 2


def test_prompt_has_entity_types_and_schema_enum(tmp_path):
    llm = ScriptedLLM(lambda b: {"missed": False} if schema_name(b) == "GleanCheck"
                      else {"entities": [ent("Widget", "product")], "relationships": []})
    s = settings(tmp_path, entity_types=["company", "person", "product"])
    result = run(extract_graph(units("Widget sold by Acme."), llm.client(), settings=s, language="en"))
    assert result.entities["type"].tolist() == ["product"]
    body = llm.requests[0]
    prompt = whole(body)
    assert "company, person, product" in prompt
    assert "Harbor Logistics" in prompt  # the few-shot examples
    assert "English" not in prompt
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["entities"]["items"]["properties"]["type"]["enum"] == ["company", "person", "product"]


def test_types_outside_the_enum_are_mapped_not_retried(tmp_path):
    # A server without constrained decoding ignores the enum. Before, such a type failed
    # validation, every retry resent the identical request and got the same answer, and the
    # whole unit was lost.
    def respond(body):
        if schema_name(body) == "GleanCheck":
            return {"missed": False}
        return {"entities": [ent("Acme", "ORGANISATION"), ent("Ann", "Persons"), ent("Bus 12", "VEHICLE"),
                             ent("Bob", "Person"), ent("Oslo", "")],
                "relationships": [rel("Ann", "Bus 12")]}

    llm = ScriptedLLM(respond)
    client = llm.client()
    result = run(extract_graph(units("Ann of Acme drove Bus 12 to Oslo with Bob."), client,
                               settings=settings(tmp_path), language="en"))
    assert result.failed == [] and client.usage.step("extract").retries == 0
    assert result.entities["title"].tolist() == ["Acme", "Ann", "Bus 12", "Bob", "Oslo"]
    assert result.entities["type"].tolist() == ["organization", "person", "other", "person", "other"]
    assert result.relationships[["source", "target"]].values.tolist() == [["Ann", "Bus 12"]]
    # a case variant is the configured type; a spelling variant or plural is counted as mapped
    assert result.stats["types_mapped"] == 2 and result.stats["types_to_catch_all"] == 2


def test_catch_all_is_the_configured_other_when_there_is_one(tmp_path):
    def respond(body):
        if schema_name(body) == "GleanCheck":
            return {"missed": False}
        return {"entities": [ent("Widget", "gadget"), ent("Acme", "companies")], "relationships": []}

    llm = ScriptedLLM(respond)
    s = settings(tmp_path, entity_types=["COMPANY", "PRODUCT", "Other"])
    result = run(extract_graph(units("Widget sold by Acme."), llm.client(), settings=s, language="en"))
    assert result.entities["type"].tolist() == ["Other", "COMPANY"]
    assert result.stats["types_mapped"] == 1 and result.stats["types_to_catch_all"] == 1


def test_the_schema_still_sends_the_enum_for_constrained_decoding():
    schema = json.loads(describe_schema(["organization", "person"]))
    entity = schema["properties"]["entities"]["items"]
    assert entity["properties"]["type"] == {"type": "string", "enum": ["organization", "person"]}


FLAKY = ChatSettings(provider="openai", model="s", base_url="http://scripted/v1", retry_base_seconds=0.001,
                     max_retries=2)


def gleaning_twice(fail: str):
    """A unit gleaned twice: round 1 adds Carol, round 2 would add Dave; the call named `fail`
    (the second check, or the second continuation) fails on every retry."""
    def respond(body):
        name, turns = schema_name(body), assistant_turns(body)
        if "Dave" not in whole(body):  # any other unit: one entity, nothing missed
            return {"missed": False} if name == "GleanCheck" else {"entities": [ent("Erin")], "relationships": []}
        if name == "GleanCheck":
            if fail == "check" and turns == 2:
                return httpx.Response(500, json={"error": "boom"})
            return {"missed": turns < 3}
        if name == "ExtractedGraph":
            if GLEAN in last_user(body):
                if turns == 2:
                    if fail == "round":
                        return httpx.Response(500, json={"error": "boom"})
                    return {"entities": [ent("Dave")], "relationships": [rel("Carol", "Dave")]}
                return {"entities": [ent("Carol")], "relationships": [rel("Bob", "Carol")]}
            return {"entities": [ent("Alice"), ent("Bob")], "relationships": [rel("Alice", "Bob")]}
        raise AssertionError(name)
    return respond


@pytest.mark.parametrize("fail", ["check", "round"])
def test_failed_gleaning_round_keeps_the_earlier_rounds_and_reports_the_unit(tmp_path, fail):
    llm = ScriptedLLM(gleaning_twice(fail))
    client = llm.client(FLAKY)
    result = run(extract_graph(units("Alice met Bob. Bob met Carol. Carol met Dave."), client,
                               settings=settings(tmp_path, max_gleanings=2), language="en"))
    # Before, the first gleaning round's records were thrown away with the failed second one.
    assert result.entities["title"].tolist() == ["Alice", "Bob", "Carol"]
    assert result.entities["round"].tolist() == [0, 0, 1]
    assert result.relationships[["source", "target"]].values.tolist() == [["Alice", "Bob"], ["Bob", "Carol"]]
    assert result.failed == ["u0"] and client.usage.step("extract").failures == ["u0"]
    assert result.stats["gleaning_failed"] == 1 and result.stats["units_partial"] == 1


def test_failed_claim_gleaning_keeps_the_earlier_claim_rounds(tmp_path):
    claim = {"subject": "Acme", "object": "", "type": "LAWSUIT", "status": "TRUE", "start_date": "",
             "end_date": "", "description": "Acme was sued.", "source_text": "Acme was sued."}

    def respond(body):
        name, turns = schema_name(body), assistant_turns(body)
        if name == "GleanCheck":
            return {"missed": False}
        if name == "ExtractedGraph":
            return {"entities": [ent("Acme", "organization"), ent("Bob")], "relationships": []}
        if name == "ClaimGleanCheck":
            return httpx.Response(500, json={"error": "boom"}) if turns == 2 else {"missed": True}
        if name == "ExtractedClaims":
            if GLEAN in last_user(body):
                return {"claims": [{**claim, "subject": "Bob", "type": "FRAUD", "description": "Bob lied."}]}
            return {"claims": [claim]}
        raise AssertionError(name)

    result = run(extract_graph(units("Acme was sued. Bob lied."), ScriptedLLM(respond).client(FLAKY),
                               settings=settings(tmp_path, claims=True, max_gleanings=2), language="en"))
    assert result.claims["subject"].tolist() == ["Acme", "Bob"] and result.claims["round"].tolist() == [0, 1]
    assert result.entities["title"].tolist() == ["Acme", "Bob"]
    assert result.failed == ["u0"] and result.stats["gleaning_failed"] == 1


def test_rerun_after_a_failed_gleaning_round_equals_a_clean_run(tmp_path):
    # The partial unit is listed as failed and rerun from scratch: its finished calls come from
    # the cache, the failed one is made again, and no record is doubled.
    tu = units("Alice met Bob. Bob met Carol. Carol met Dave.", "Erin was alone.")
    s = settings(tmp_path, max_gleanings=2)

    async def extract(respond, cache):
        client = ScriptedLLM(respond).client(FLAKY, cache=cache)
        result = await extract_graph(tu, client, settings=s, language="en")
        client.cache.close()
        return result

    first = run(extract(gleaning_twice("round"), tmp_path / "a.sqlite"))
    assert first.failed == ["u0"]
    again = run(extract(gleaning_twice("none"), tmp_path / "a.sqlite"))
    clean = run(extract(gleaning_twice("none"), tmp_path / "b.sqlite"))
    assert again.failed == [] == clean.failed and again.stats["gleaning_failed"] == 0
    assert "Dave" in clean.entities["title"].tolist()
    for a, b in ((again.entities, clean.entities), (again.relationships, clean.relationships),
                 (again.claims, clean.claims)):
        pd.testing.assert_frame_equal(a, b)


def test_chinese_prompt_for_zh(tmp_path):
    llm = ScriptedLLM(lambda b: {"missed": False} if schema_name(b) in ("GleanCheck", "ClaimGleanCheck")
                      else {"claims": []} if schema_name(b) == "ExtractedClaims"
                      else {"entities": [ent("陈静")], "relationships": []})
    result = run(extract_graph(units("陈静卸任。"), llm.client(), settings=settings(tmp_path, claims=True),
                               language="zh"))
    assert result.entities["title"].tolist() == ["陈静"]
    graph_prompt = whole(llm.requests[0])
    assert "用中文书写" in graph_prompt and "organization, person, geo, event" in graph_prompt
    assert "陈静卸任。" in graph_prompt
    check = llm.requests[1]["messages"][-1]["content"]
    assert "遗漏" in check
    claims_prompt = whole(next(b for b in llm.requests if schema_name(b) == "ExtractedClaims"))
    assert "主张" in claims_prompt


def test_project_prompt_overrides_the_packaged_one(tmp_path):
    (tmp_path / "prompts" / "en").mkdir(parents=True)
    (tmp_path / "prompts" / "en" / "examples_graph.txt").write_text("MY DOMAIN EXAMPLE", encoding="utf-8")
    llm = ScriptedLLM(lambda b: {"missed": False} if schema_name(b) == "GleanCheck"
                      else {"entities": [], "relationships": []})
    run(extract_graph(units("x"), llm.client(), settings=settings(tmp_path), language="en"))
    assert "MY DOMAIN EXAMPLE" in whole(llm.requests[0])


def test_rerun_with_the_same_cache_makes_no_request(tmp_path):
    def respond(body):
        name = schema_name(body)
        if name == "GleanCheck":
            return {"missed": assistant_turns(body) == 1}
        if name == "ExtractedGraph":
            if GLEAN in last_user(body):
                return {"entities": [ent("Carol", description="Carol again.")], "relationships": [rel("Bob", "Carol")]}
            return {"entities": [ent("Alice"), ent("Bob"), ent("Carol")],
                    "relationships": [rel("Alice", "Bob")]}
        if name is None:
            return "A summary."
        raise AssertionError(name)

    s = settings(tmp_path)
    tu = units("Alice met Bob.", "Bob met Carol.")

    async def index(llm: ScriptedLLM):
        client = llm.client(cache=tmp_path / "cache" / "llm.sqlite")
        extraction = await extract_graph(tu, client, settings=s, language="en")
        tables = await summarize_graph(extraction, tu, client, settings=s, language="en")
        client.cache.close()
        return tables

    first = ScriptedLLM(respond)
    e1, r1, _, _ = run(index(first))
    assert len(first.requests) > 0 and any(schema_name(b) is None for b in first.requests)
    second = ScriptedLLM(respond)
    e2, r2, _, _ = run(index(second))
    assert second.requests == []
    pd.testing.assert_frame_equal(e1, e2)
    pd.testing.assert_frame_equal(r1, r2)


class InFlight:
    """Stands in for the chat client: counts the units with a call in progress or a chain begun
    and not finished (a unit's chain: extract, check, continue, check)."""

    def __init__(self):
        self.calls: dict[str, int] = {}
        self.open: set[str] = set()
        self.peak = 0

    async def structured(self, messages, schema, *, step, item, max_tokens, **kw):
        self.open.add(item)
        self.peak = max(self.peak, len(self.open))
        n = self.calls[item] = self.calls.get(item, 0) + 1
        await asyncio.sleep(0.005)
        if schema.__name__ == "GleanCheck":
            if n == 4:
                self.open.discard(item)  # the second check ends the chain
            return schema(missed=n == 2)
        return schema.model_validate({"entities": [ent(f"Person {item[1:]}")], "relationships": []})


def test_embedded_server_gets_no_more_units_in_progress_than_slots(tmp_path):
    # so each unit's gleaning calls find its own slot idle with the prompt still cached there
    texts = [f"Person {i} walked." for i in range(6)]
    local = Settings(root=str(tmp_path), chat={"provider": "local"}, local={"parallel": 2},
                     extraction={"max_gleanings": 2})
    fake = InFlight()
    result = run(extract_graph(units(*texts), fake, settings=local, language="en"))
    assert len(result.entities) == 12 and fake.peak == 2 and set(fake.calls.values()) == {4}
    hosted = Settings(root=str(tmp_path), chat={"provider": "openai", "model": "m", "base_url": "http://x/v1"},
                      extraction={"max_gleanings": 2})
    fake = InFlight()
    run(extract_graph(units(*texts), fake, settings=hosted, language="en"))
    assert fake.peak == 6  # a hosted server queues and caches on its own: every unit starts at once


def test_few_shot_example_names_never_enter_the_graph_unless_the_text_holds_them(tmp_path):
    # A small model copies the example answer of the prompt (examples_graph.txt: Harbor
    # Logistics, Anna de Vries, Rotterdam ...) into its own.
    def respond(body):
        if schema_name(body) == "ExtractedGraph":
            return {"entities": [ent("Anna de Vries"), ent("Harbor Logistics", "organization"), ent("Rotterdam", "geo"),
                                 ent("Maria Okafor")],
                    "relationships": [rel("Anna de Vries", "Harbor Logistics"), rel("Maria Okafor", "Rotterdam"),
                                      rel("Maria Okafor", "Anna de Vries")]}
        return {"missed": False}

    llm = ScriptedLLM(respond)
    result = run(extract_graph(units("Maria Okafor moved to Rotterdam in May."), llm.client(),
                               settings=settings(tmp_path, max_gleanings=0), language="en"))
    # Rotterdam is in the examples, and in this text too: it stays
    assert result.entities["title"].tolist() == ["Rotterdam", "Maria Okafor"]
    assert result.relationships[["source", "target"]].values.tolist() == [["Maria Okafor", "Rotterdam"]]
    assert result.stats["example_leaks"] == 4  # two entities, two relationships naming them


def test_example_names_are_read_from_the_projects_own_examples(tmp_path):
    from sensegraph.index.extract import example_names

    for language in ("en", "zh"):
        names = example_names(load_prompt("examples_graph", language))
        assert len(names) >= 5
    assert "anna de vries" in example_names(load_prompt("examples_graph", "en"))
    assert "陈静" in example_names(load_prompt("examples_graph", "zh"))


def test_names_are_checked_against_their_unit_and_what_fails_is_dropped_and_counted(tmp_path):
    # Re-DocRED with the embedded 1.5B model: invented names, common nouns ("city", "fire"),
    # clauses ("just three weeks shy of his 42nd birthday") and dates typed as anything.
    def respond(body):
        if schema_name(body) == "ExtractedGraph":
            return {"entities": [ent("Sweden", "geo"), ent("John Smith"), ent("fire", "event"), ent("city", "geo"),
                                 ent("just three weeks shy of his 42nd birthday", "event"), ent("ASCAP", "organization"),
                                 ent("Ebenezer Scrooge"), ent("1947", "year"), ent("United Nations", "organization")],
                    "relationships": [rel("Ebenezer Scrooge", "ASCAP"), rel("John Smith", "ASCAP"),
                                      rel("Ebenezer Scrooge", "city"), rel("Scrooge", "1947")]}
        return {"missed": False}

    text = ("Scrooge, just three weeks shy of his 42nd birthday, left for the Swedish coast. The fire spread to "
            "the city. He joined ASCAP in 1947, and the UN sent help.")
    llm = ScriptedLLM(respond)
    result = run(extract_graph(units(text), llm.client(), settings=settings(tmp_path, max_gleanings=0), language="en"))
    # inflected ("Swedish"), part of a full name ("Scrooge"), an acronym the text uses: kept
    assert result.entities["title"].tolist() == ["Sweden", "ASCAP", "Ebenezer Scrooge", "1947", "United Nations"]
    # a type outside the configured list: the value's type, not the catch-all
    assert result.entities.set_index("title").loc["1947", "type"] == "date"
    assert result.relationships[["source", "target"]].values.tolist() == [["Ebenezer Scrooge", "ASCAP"],
                                                                          ["Scrooge", "1947"]]
    st = result.stats
    assert (st["names_ungrounded"], st["names_generic"], st["names_clause"]) == (1, 2, 1)
    assert st["relationships_dropped"] == 2 and st["types_from_value"] == 1


def test_a_configured_type_the_model_chose_is_kept_and_only_placeholders_are_typed_by_value(tmp_path):
    # "May" the person, "1984" the novel, "3M" the company, 万里 a person's name: the old code
    # made them a date, a date, a number and a number whatever the model said.
    answers = [ent("May", "person"), ent("1984", "work"), ent("3M", "organization"), ent("万里", "person"),
               ent("1947", "other"), ent("1 million", "unknown"), ent("March", "other")]

    def respond(body):
        if schema_name(body) == "ExtractedGraph":
            return {"entities": answers, "relationships": []}
        return {"missed": False}

    text = "May said 3M sold 1 million copies of 1984 in 1947, one March. 万里说。"
    result = run(extract_graph(units(text), ScriptedLLM(respond).client(), language="en",
                               settings=settings(tmp_path, max_gleanings=0,
                                                 entity_types=["person", "organization", "work", "other"])))
    types = dict(zip(result.entities["title"], result.entities["type"]))
    assert types == {"May": "person", "1984": "work", "3M": "organization", "万里": "person", "1947": "date",
                     "1 million": "number", "March": "other"}  # a month alone is no unambiguous date
    assert result.stats["types_from_value"] == 2


def test_strict_keeps_the_values_and_concepts_of_their_configured_types(tmp_path):
    # bench/extraction_oracle.py: a perfect extractor's spelled-out numbers and durations, typed
    # number and time, were dropped as common nouns under strict
    answers = [ent("two", "number"), ent("six months", "time"), ent("the 26th day of the 4th month", "time"),
               ent("machine learning", "concept"), ent("city", "location"), ent("two", "location")]

    def respond(body):
        if schema_name(body) == "ExtractedGraph":
            return {"entities": answers, "relationships": [rel("machine learning", "two")]}
        return {"missed": False}

    text = "The two of them studied machine learning for six months in the city, until the 26th day of the 4th month."
    result = run(extract_graph(units(text), ScriptedLLM(respond).client(), language="en",
                               settings=settings(tmp_path, max_gleanings=0, checks="strict",
                                                 entity_types=["number", "time", "concept", "location"])))
    kept = list(zip(result.entities["title"], result.entities["type"]))
    assert kept == [("two", "number"), ("six months", "time"), ("the 26th day of the 4th month", "time"),
                    ("machine learning", "concept")]
    assert result.stats["names_generic"] == 2  # "city", and "two" typed as a place
    assert len(result.relationships) == 1


def test_chinese_names_must_be_substrings_of_their_unit(tmp_path):
    def respond(body):
        if schema_name(body) == "ExtractedGraph":
            return {"entities": [ent("花果山", "geo"), ent("石猴"), ent("孙悟空"), ent("那猴在山中，却会行走跳跃")],
                    "relationships": [rel("石猴", "花果山"), rel("孙悟空", "花果山")]}
        return {"missed": False}

    llm = ScriptedLLM(respond)
    result = run(extract_graph(units("海中有一座名山，唤为花果山。山上有一石猴。那猴在山中，却会行走跳跃。"), llm.client(),
                               settings=settings(tmp_path, max_gleanings=0), language="zh"))
    assert result.entities["title"].tolist() == ["花果山", "石猴"]
    assert result.relationships[["source", "target"]].values.tolist() == [["石猴", "花果山"]]
    assert result.stats["names_ungrounded"] == 1 and result.stats["names_clause"] == 1


def test_name_checks_can_be_turned_off(tmp_path):
    llm = ScriptedLLM(lambda b: {"missed": False} if schema_name(b) == "GleanCheck"
                      else {"entities": [ent("John Smith"), ent("city", "geo")], "relationships": []})
    result = run(extract_graph(units("The city slept."), llm.client(),
                               settings=settings(tmp_path, checks="off"), language="en"))
    assert result.entities["title"].tolist() == ["John Smith", "city"]


def _first_prompt(tmp_path, language="en", text="Alice met Bob.", **kwargs) -> str:
    llm = ScriptedLLM(lambda body: {"missed": False} if schema_name(body) == "GleanCheck"
                      else {"entities": [], "relationships": []})
    run(extract_graph(units(text), llm.client(), settings=Settings(root=str(tmp_path), **kwargs), language=language))
    return whole(llm.requests[0])


def test_short_descriptions_are_asked_for_when_chosen_and_full_ones_by_default(tmp_path):
    # Short answers are a choice for speed: on held-out documents the 1.5B found fewer names
    # with them (docs/performance.md), so no model gets them unasked.
    hosted = {"provider": "openai", "model": "gpt-4o", "base_url": "http://x/v1"}
    small, large = _first_prompt(tmp_path), _first_prompt(tmp_path, chat=hosted)
    for full in (small, large):
        assert "complete, self-contained sentences" in full and "at most 12 words" not in full
    short = _first_prompt(tmp_path, extraction={"descriptions": "short"})
    assert "at most 12 words" in short and "complete, self-contained sentences" not in short
    assert "{description_rule}" not in small + large + short
    chinese = _first_prompt(tmp_path, language="zh", text="孙悟空拜菩提祖师为师。", extraction={"descriptions": "short"})
    assert "不超过25个字" in chinese and "{description_rule}" not in chinese


def test_a_projects_own_extraction_prompt_without_the_description_rule_is_sent_as_written(tmp_path):
    # Prompts written before {description_rule} existed (a user's, prompt-tune's) keep working.
    own = tmp_path / "prompts" / "en" / "extract_graph.txt"
    own.parent.mkdir(parents=True)
    own.write_text("Extract {entity_types} from this.\n{examples}\n=== user ===\n{text}", encoding="utf-8")
    sent = _first_prompt(tmp_path)
    assert sent.startswith("Extract organization, person, geo, event from this.") and "12 words" not in sent


def test_short_descriptions_show_short_examples_unless_the_project_changed_its_examples(tmp_path):
    # The 1.5B copied the examples' 12-word sentences whatever the rule said: the examples
    # themselves have to be short.
    full = "Harbor Logistics is a shipping firm based in Rotterdam"
    short = {"descriptions": "short"}
    small = _first_prompt(tmp_path, extraction=short)
    assert '"description": "shipping firm based in Rotterdam"' in small and full not in small
    assert full in _first_prompt(tmp_path)
    chinese = _first_prompt(tmp_path, language="zh", text="孙悟空拜菩提祖师为师。", extraction=short)
    assert '"description": "总部位于杭州的物流企业"' in chinese
    # A project's own examples (prompt-tune's, a user's) are what the model sees, in any mode.
    own = tmp_path / "prompts" / "en" / "examples_graph.txt"
    own.parent.mkdir(parents=True)
    own.write_text('Example text:\n"""\nMina met Ola.\n"""\nAnswer:\n{"entities": [], "relationships": []}\n',
                   encoding="utf-8")
    mine = _first_prompt(tmp_path, extraction=short)
    assert "Mina met Ola." in mine and "Harbor Logistics" not in mine
