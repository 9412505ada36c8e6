"""Entity resolution: cheap candidates, the LLM only for ambiguous pairs and never a merge of
different types without it, merges that keep every alias and all provenance, Chinese names and
English/Chinese aliases, and the pipeline and CLI paths against the mock server."""
from __future__ import annotations

import asyncio
import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from mock_llm import MockServer
from test_pipeline import schema_name
from test_pipeline import index, read_all, settings_for, write_docs
from test_update import write_settings_yaml
from sensegraph.cli import main as cli_main
from sensegraph.config import load_settings
from sensegraph.index.resolve import (SameEntity, decide, find_candidates, group, merge, name_similarity,
                                      resolve_entities)


def entities(rows: list[tuple[str, str, str, list[str]]]) -> pd.DataFrame:
    return pd.DataFrame([{"id": f"e{n}", "human_readable_id": n, "title": t, "type": ty, "description": d,
                          "text_unit_ids": tus, "frequency": len(tus), "degree": 0, "other_types": [], "aliases": []}
                         for n, (t, ty, d, tus) in enumerate(rows)])


def relationships(pairs: list[tuple[str, str]]) -> pd.DataFrame:
    return pd.DataFrame([{"id": f"r{n}", "human_readable_id": n, "source": s, "target": t, "description": f"{s}-{t}",
                          "weight": 1.0, "combined_degree": 0, "text_unit_ids": [f"u{n}"]}
                         for n, (s, t) in enumerate(pairs)], columns=["id", "human_readable_id", "source", "target",
                                                                      "description", "weight", "combined_degree",
                                                                      "text_unit_ids"])


class FakeLLM:
    """Answers the yes/no confirmation from a fixed set of pairs; records what it was asked."""

    def __init__(self, yes: set[frozenset[str]]):
        self.yes = yes
        self.asked: list[frozenset[str]] = []

    async def structured(self, messages, model, *, step, item, max_tokens):
        assert model is SameEntity and step == "resolve" and max_tokens > 0
        a, b = item.split(" / ")
        self.asked.append(frozenset((a, b)))
        return SameEntity(same=frozenset((a, b)) in self.yes, reason="test")

    async def complete(self, messages, *, step, item, max_tokens):
        return "merged description of " + item


SETTINGS = load_settings(".", overrides={"resolution": {"enabled": True}}, env={})


def test_name_similarity():
    assert name_similarity("Mr. Fezziwig", "Mr Fezziwig") == 1.0
    assert name_similarity("Holmes", "Sherlock Holmes") == 0.9
    assert name_similarity("Mr. Holmes", "Holmes") == 0.9   # honorifics ignored
    assert name_similarity("悟空", "孙悟空") == 0.9
    assert name_similarity("Holmes", "Watson") < 0.5
    assert name_similarity("Mr. Holmes", "Mrs. Holmes") < 0.5      # never one person
    assert name_similarity("Mrs. Fezziwig", "Miss Fezziwigs") < 0.5
    assert name_similarity("Belle", "Belle's daughter") < 0.5      # a possessive names something else
    assert name_similarity("The Plump Sister", "Plump Sister") == 1.0
    assert name_similarity("唐僧", "孙悟空") < 0.5


def test_candidates_and_decisions_english():
    ents = entities([
        ("Sherlock Holmes", "person", "A consulting detective at Baker Street.", ["u1"]),
        ("Holmes", "person", "The detective who solved the case.", ["u2", "u3"]),
        ("Mr. Holmes", "person", "Retired to the Sussex Downs to keep bees.", ["u4"]),
        ("Doctor Watson", "person", "Holmes's friend and chronicler.", ["u1", "u2"]),
        ("Mycroft Holmes", "person", "Sherlock's elder brother, who works for the government.", ["u5"]),
        ("Holmes Street", "geo", "A street in London.", ["u6"]),
        ("Mr Fezziwig", "person", "Scrooge's old master.", ["u7"]),
        ("Mr. Fezziwig", "person", "Gave a Christmas ball.", ["u8"]),
    ])
    rels = relationships([("Sherlock Holmes", "Doctor Watson"), ("Holmes", "Doctor Watson"), ("Mr. Holmes", "Doctor Watson")])
    cands = find_candidates(ents, rels, None, SETTINGS)
    pairs = {frozenset((c.title_a, c.title_b)): c for c in cands}
    assert frozenset(("Holmes", "Sherlock Holmes")) in pairs
    assert frozenset(("Mr Fezziwig", "Mr. Fezziwig")) in pairs
    assert frozenset(("Doctor Watson", "Holmes")) not in pairs

    yes = {frozenset(("Holmes", "Sherlock Holmes")), frozenset(("Holmes", "Mr. Holmes"))}
    llm = FakeLLM(yes)
    calls = asyncio.run(decide(cands, ents, rels, llm, settings=SETTINGS, language="en"))
    # only the spelling variant is clear; the rest was asked, one call each
    auto = {frozenset((c.title_a, c.title_b)) for c in cands if c.decision == "auto"}
    assert auto == {frozenset(("Mr Fezziwig", "Mr. Fezziwig"))}
    assert calls == len(llm.asked) == len(cands) - 1
    # a contained common word with nothing else in common is not even a candidate
    assert not [c for c in cands if "Holmes Street" in (c.title_a, c.title_b)]
    groups = group(cands, ents)
    titles = [[ents.set_index("id").loc[i, "title"] for i in g] for g in groups]
    assert ["Holmes", "Mr. Holmes", "Sherlock Holmes"] in [[g[0], *sorted(g[1:])] for g in titles]
    assert not any("Mycroft Holmes" in g for g in titles)


def test_different_types_never_merge_without_the_model():
    ents = entities([
        ("Michael Jordan", "person", "A basketball player, also known as Jordan.", ["u1"]),
        ("Jordan", "geo", "A country in the Middle East.", ["u2"]),
    ])
    cands = find_candidates(ents, relationships([]), None, SETTINGS)
    assert len(cands) == 1 and cands[0].alias  # the description even says "also known as"
    asyncio.run(decide(cands, ents, relationships([]), None, settings=SETTINGS, language="en"))
    assert cands[0].decision == "skipped" and not cands[0].same and group(cands, ents) == []
    llm = FakeLLM(set())
    asyncio.run(decide(cands, ents, relationships([]), llm, settings=SETTINGS, language="en"))
    assert cands[0].decision == "asked" and not cands[0].same and len(llm.asked) == 1


def test_chinese_names_and_english_chinese_aliases():
    ents = entities([
        ("孙悟空", "person", "孙悟空，又名美猴王，是花果山的石猴，后随唐僧西天取经。", ["u1", "u2"]),
        ("美猴王", "person", "花果山水帘洞的猴王。", ["u3"]),
        ("悟空", "person", "唐僧的大徒弟，神通广大。", ["u4"]),
        ("Sun Wukong", "person", "Sun Wukong (孙悟空) is the Monkey King of the Mountain of Flowers and Fruit.", ["u5"]),
        ("唐僧", "person", "去西天取经的僧人。", ["u6"]),
        ("花果山", "geo", "孙悟空的故乡。", ["u7"]),
    ])
    rels = relationships([("悟空", "唐僧"), ("孙悟空", "唐僧"), ("孙悟空", "花果山")])
    llm = FakeLLM({frozenset(("孙悟空", "悟空"))})
    res = asyncio.run(resolve_entities(ents, rels, llm, None, settings=SETTINGS, language="zh"))
    by_pair = {frozenset((c.title_a, c.title_b)): c for c in res.candidates}
    assert by_pair[frozenset(("孙悟空", "美猴王"))].decision == "auto"        # 又名 (alias statement)
    assert by_pair[frozenset(("Sun Wukong", "孙悟空"))].decision == "auto"    # "Sun Wukong (孙悟空)"
    assert by_pair[frozenset(("孙悟空", "悟空"))].decision == "asked"
    assert res.merges() == [{"keep": "孙悟空", "merged": ["Sun Wukong", "美猴王", "悟空"]}] or \
        sorted(res.merges()[0]["merged"]) == sorted(["Sun Wukong", "美猴王", "悟空"])
    assert not any("唐僧" in (c.title_a, c.title_b) and c.same for c in res.candidates)

    e2, r2, _ = asyncio.run(merge(ents, rels, pd.DataFrame(), res.groups, llm, settings=SETTINGS, language="zh"))
    wukong = e2.set_index("title").loc["孙悟空"]
    assert sorted(wukong["aliases"]) == sorted(["Sun Wukong", "美猴王", "悟空"])
    assert wukong["text_unit_ids"] == ["u1", "u2", "u3", "u4", "u5"]      # all provenance kept
    assert len(wukong["merged_ids"]) == 3 and len(e2) == 3
    # 悟空-唐僧 and 孙悟空-唐僧 became one relationship with both text units and summed weight
    tang = r2[(r2["source"] == "孙悟空") & (r2["target"] == "唐僧") | (r2["source"] == "唐僧") & (r2["target"] == "孙悟空")]
    assert len(tang) == 1 and sorted(tang.iloc[0]["text_unit_ids"]) == ["u0", "u1"] and tang.iloc[0]["weight"] == 2.0
    assert set(r2["source"]) | set(r2["target"]) <= set(e2["title"])


# -- against the mock server -------------------------------------------------------------------

class ResolvingServer(MockServer):
    """The mock, answering the confirmation "same" when the two names share a word."""

    def _chat(self, writer, body, digest, fault):  # type: ignore[override]
        if schema_name(body) != "SameEntity":
            return super()._chat(writer, body, digest, fault)
        text = body["messages"][-1]["content"]
        a, b = re.findall(r"Entity [AB]: (.+?) \(type", text)
        same = bool(set(a.lower().replace(".", "").split()) & set(b.lower().replace(".", "").split()) - {"mr"})
        content = json.dumps({"same": same, "reason": "shared name" if same else "different"})
        self._send(writer, 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "mock",
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": content}}],
                                 "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}})


HOLMES = {
    "a.txt": "Sherlock Holmes met Doctor Watson at Baker Street in the spring.",
    "b.txt": "Holmes visited Dartmoor Prison with Doctor Watson on a cold morning.",
    "c.txt": "Mr. Holmes wrote to Inspector Lestrade about Dartmoor Prison and the escaped convict.",
}


@pytest.fixture
def server():
    s = ResolvingServer()
    s.start()
    yield s
    s.stop()


def test_pipeline_merges_when_enabled_and_cli_dry_run_lists(tmp_path, server):
    plain, resolved = tmp_path / "plain", tmp_path / "resolved"
    write_docs(plain, HOLMES)
    write_docs(resolved, HOLMES)
    index(settings_for(plain, server))
    write_settings_yaml(plain, server)
    before = read_all(plain / "output")
    holmes = {"Sherlock Holmes", "Holmes", "Mr. Holmes"}
    assert holmes <= set(before["entities"]["title"])

    res = CliRunner().invoke(cli_main, ["resolve", "--root", str(plain), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    assert any({m["keep"], *m["merged"]} >= holmes for m in listed["merges"])
    assert read_all(plain / "output")["entities"].equals(before["entities"])  # dry run: nothing changed
    res = CliRunner().invoke(cli_main, ["resolve", "--root", str(plain)])  # merge and rebuild
    assert res.exit_code == 0, res.output
    assert len(holmes & set(read_all(plain / "output")["entities"]["title"])) == 1
    assert "resolution.enabled is false" in res.output

    result = index(settings_for(resolved, server, resolution={"enabled": True}))
    t = read_all(resolved / "output")
    titles = set(t["entities"]["title"])
    assert len(holmes & titles) == 1
    kept = t["entities"][t["entities"]["title"].isin(holmes)].iloc[0]
    assert holmes - {kept["title"]} <= set(kept["aliases"])
    old_units = before["entities"][before["entities"]["title"].isin(holmes)]["text_unit_ids"]
    assert sorted(kept["text_unit_ids"]) == sorted({u for tus in old_units for u in tus})
    for r in t["relationships"].itertuples():
        assert r.source in titles and r.target in titles
    all_ids = sorted(t["entities"]["id"])
    for level, g in t["communities"].groupby("level"):
        assert sorted(e for ids in g["entity_ids"] for e in ids) == all_ids
    summary = result.stats["steps"]["summarize"]["resolution"]
    assert summary["groups"] >= 1 and summary["asked"] >= 1
