"""Entity resolution: cheap candidates, the LLM only for ambiguous pairs and never a merge of
different types without it, merges that keep every alias and all provenance, Chinese names and
English/Chinese aliases, and the pipeline and CLI paths against the mock server."""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from mock_llm import MockServer
from test_pipeline import FaultyServer, _cli_env, schema_name, snapshot, stats_json
from test_pipeline import index, read_all, settings_for, write_docs
from test_update import write_settings_yaml
from sensegraph.cli import main as cli_main
from sensegraph.config import load_settings
from sensegraph.index.resolve import (SameEntity, decide, find_candidates, group, merge, name_similarity,
                                      resolve_entities, resolve_in_pipeline)
from sensegraph.index.windows import window_of
from sensegraph.llm import LLMError
from sensegraph.store.tables import read_table


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

    e2, r2, _, failed = asyncio.run(merge(ents, rels, pd.DataFrame(), res.groups, llm, settings=SETTINGS,
                                          language="zh"))
    assert failed == []
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


# -- failures are failed items, never a silent "not merged" ----------------------------------------


async def held(fake) -> None:
    """One call of a fake model: in flight for `fake.delay` s, counted in `fake.in_flight` and
    its peak in `fake.most_in_flight`."""
    fake.in_flight += 1
    fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
    try:
        await asyncio.sleep(fake.delay)
    finally:
        fake.in_flight -= 1


class FailingLLM(FakeLLM):
    """FakeLLM whose confirmation of the pairs in `fail` and whose summaries of the names in
    `fail_summary` fail as a call does after every retry; counts the calls in flight."""

    def __init__(self, yes: set[frozenset[str]], fail: set[frozenset[str]] = frozenset(),
                 fail_summary: set[str] = frozenset(), concurrency: int = 1, delay: float = 0.0):
        super().__init__(yes)
        self.fail, self.fail_summary, self.delay = fail, fail_summary, delay
        self.endpoints = SimpleNamespace(all=[SimpleNamespace(concurrency=concurrency)])
        self.in_flight = self.most_in_flight = 0
        self.summarised: list[str] = []

    async def _call(self) -> None:
        await held(self)

    async def structured(self, messages, model, *, step, item, max_tokens):
        await self._call()
        if frozenset(item.split(" / ")) in self.fail:
            raise LLMError(item, "HTTP 500", 3)
        return await super().structured(messages, model, step=step, item=item, max_tokens=max_tokens)

    async def complete(self, messages, *, step, item, max_tokens):
        await self._call()
        self.summarised.append(item)
        if item in self.fail_summary:
            raise LLMError(item, "HTTP 500", 3)
        return await super().complete(messages, step=step, item=item, max_tokens=max_tokens)


class FakeEmbedder:
    """Vectors from a text's hash; the batches holding a text that starts with one of `fail`
    fail; counts the calls in flight and the texts per call."""

    def __init__(self, fail: tuple[str, ...] = (), batch_size: int = 2, concurrency: int = 1, delay: float = 0.0):
        self.fail, self.delay = fail, delay
        self.settings = SimpleNamespace(batch_size=batch_size)
        self.endpoints = SimpleNamespace(all=[SimpleNamespace(concurrency=concurrency)])
        self.in_flight = self.most_in_flight = 0
        self.sizes: list[int] = []

    async def embed(self, texts, *, kind, step):
        assert step == "resolve"
        self.sizes.append(len(texts))
        await held(self)
        if any(t.startswith(self.fail) for t in texts if self.fail):
            raise LLMError("embedding", "HTTP 503", 3)
        rows = np.stack([np.random.default_rng(list(hashlib.sha256(t.encode()).digest())).normal(size=64)
                         for t in texts])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


HOLMES_ENTITIES = [
    ("Sherlock Holmes", "person", "A consulting detective at Baker Street.", ["u1"]),
    ("Holmes", "person", "The detective who solved the case.", ["u2", "u3"]),
    ("Doctor Watson", "person", "Holmes's friend and chronicler.", ["u1", "u2"]),
    ("Mr Fezziwig", "person", "Scrooge's old master.", ["u7"]),
    ("Mr. Fezziwig", "person", "Gave a Christmas ball.", ["u8"]),
]


def test_a_failed_confirmation_is_a_failed_item_not_a_no():
    ents = entities(HOLMES_ENTITIES)
    rels = relationships([("Sherlock Holmes", "Doctor Watson"), ("Holmes", "Doctor Watson")])
    pair = frozenset(("Holmes", "Sherlock Holmes"))
    llm = FailingLLM(yes={pair}, fail={pair})
    out = asyncio.run(resolve_in_pipeline(ents, rels, pd.DataFrame(), llm, None, settings=SETTINGS, language="en"))
    ents2, summary = out[0], out[3]
    assert summary.get("failed") == 1 and summary["confirmed"] == 1  # the Fezziwigs merged without asking
    # e0 = Sherlock Holmes, e1 = Holmes: the failed pair is named, not taken for a "no"
    assert out[4] == ["resolve:confirm:e0+e1"]
    assert {"Sherlock Holmes", "Holmes"} <= set(ents2["title"])  # not merged in this run
    res = asyncio.run(resolve_entities(ents, rels, FailingLLM(yes={pair}, fail={pair}), None, settings=SETTINGS,
                                       language="en"))
    asked = next(c for c in res.candidates if frozenset((c.title_a, c.title_b)) == pair)
    assert asked.decision == "failed" and not asked.same and "failed" in asked.reason
    # the same call answered (the rerun): merged, nothing failed
    ents3, _, _, summary, failed = asyncio.run(resolve_in_pipeline(ents, rels, pd.DataFrame(), FailingLLM(yes={pair}),
                                                                   None, settings=SETTINGS, language="en"))
    assert failed == [] and summary["failed"] == 0
    assert len({"Sherlock Holmes", "Holmes"} & set(ents3["title"])) == 1


def test_a_failed_summary_and_a_failed_embedding_are_failed_items():
    ents = entities(HOLMES_ENTITIES)
    rels = relationships([("Sherlock Holmes", "Doctor Watson"), ("Holmes", "Doctor Watson")])
    pair = frozenset(("Holmes", "Sherlock Holmes"))
    # the merged Holmes' new description fails, and so does its relationship's (two now coincide)
    llm = FailingLLM(yes={pair}, fail_summary={"Holmes", "Holmes -> Doctor Watson"})
    embedder = FakeEmbedder(fail=("Doctor Watson:",), batch_size=2)
    out = asyncio.run(resolve_in_pipeline(ents, rels, pd.DataFrame(), llm, embedder, settings=SETTINGS,
                                          language="en"))
    ents2, rels2, summary = out[0], out[1], out[3]
    holmes = ents2.set_index("title").loc["Holmes"]
    edge = rels2.iloc[0]
    assert len(rels2) == 1
    assert summary.get("failed") == 4
    # Doctor Watson (e2) shares its batch of two with Mr Fezziwig (e3): both rows of it failed
    assert set(out[4]) == {"resolve:embedding:e2", "resolve:embedding:e3",
                           f"resolve:summary:{holmes['id']}", f"resolve:summary:{edge['id']}"}
    # what failed keeps the joined descriptions (nothing lost), and names still found the merges
    assert "Baker Street" in holmes["description"] and "solved the case" in holmes["description"]
    assert summary["groups"] == 2 and "Sherlock Holmes" in list(holmes["aliases"])


def test_every_resolution_call_runs_in_the_windows():
    """Confirmations, summaries and embedding batches: at most window_of(client) in flight
    (16 for one request slot), not every item at once."""
    n = 40
    rows = []
    names = [hashlib.sha256(str(k).encode()).hexdigest()[:12] for k in range(n)]  # alike in nothing
    for k, name in enumerate(names):  # one name, two types: a candidate that must be asked
        rows += [(name, "person", f"The person {k}.", [f"u{k}"]), (name, "geo", f"The place {k}.", [f"v{k}"])]
    ents = entities(rows)
    yes = {frozenset((name,)) for name in names}
    llm = FailingLLM(yes=yes, delay=0.01)
    embedder = FakeEmbedder(batch_size=2, delay=0.01)
    window = window_of(llm)
    assert window == window_of(embedder) == 16
    out = asyncio.run(resolve_in_pipeline(ents, relationships([]), pd.DataFrame(), llm, embedder,
                                          settings=SETTINGS, language="en"))
    ents2, summary = out[0], out[3]
    assert summary["asked"] == n and summary["groups"] == n and len(ents2) == n
    assert len(llm.asked) == n and len(llm.summarised) == n
    assert 1 < llm.most_in_flight <= window
    assert max(embedder.sizes) <= 2 and sum(embedder.sizes) == 2 * n  # one call per batch ...
    assert 1 < embedder.most_in_flight <= window                      # ... a window of them at once
    assert out[4] == []


# -- relationships that coincide after a merge -----------------------------------------------------

def test_coinciding_relationships_count_a_shared_text_unit_once():
    ents = entities([
        ("Sherlock Holmes", "person", "A consulting detective.", ["u1", "u2"]),
        ("Holmes", "person", "The detective.", ["u2", "u3"]),
        ("Doctor Watson", "person", "Holmes's friend.", ["u1", "u2", "u3"]),
        ("Baker Street", "geo", "A street.", ["u4", "u5"]),
    ])
    rels = pd.DataFrame([
        # the same pair seen in u2 by both names: one observation of Holmes - Watson there
        {"id": "r0", "human_readable_id": 0, "source": "Sherlock Holmes", "target": "Doctor Watson",
         "description": "Friends.", "weight": 4.0, "combined_degree": 0, "text_unit_ids": ["u1", "u2"]},
        {"id": "r1", "human_readable_id": 1, "source": "Doctor Watson", "target": "Holmes",
         "description": "Share rooms.", "weight": 6.0, "combined_degree": 0, "text_unit_ids": ["u2", "u3"]},
        # seen in the same unit by both names, with the same strength: counted once
        {"id": "r2", "human_readable_id": 2, "source": "Holmes", "target": "Baker Street",
         "description": "Lives there.", "weight": 5.0, "combined_degree": 0, "text_unit_ids": ["u4"]},
        {"id": "r3", "human_readable_id": 3, "source": "Sherlock Holmes", "target": "Baker Street",
         "description": "His address.", "weight": 5.0, "combined_degree": 0, "text_unit_ids": ["u4"]},
    ])
    groups = [["e1", "e0"]]  # Holmes kept, Sherlock Holmes merged into it
    llm = FakeLLM(set())
    out = asyncio.run(merge(ents, rels, pd.DataFrame(), groups, llm, settings=SETTINGS, language="en"))
    rels2 = out[1]
    assert len(rels2) == 2
    by_other = {({r.source, r.target} - {"Holmes"}).pop(): r for r in rels2.itertuples()}
    watson, street = by_other["Doctor Watson"], by_other["Baker Street"]
    # u1: 4/2 = 2 (r0 only), u2: max(2, 3) = 3, u3: 3 (r1 only); the plain sum would say 10
    assert watson.weight == pytest.approx(8.0)
    assert sorted(watson.text_unit_ids) == ["u1", "u2", "u3"]
    assert watson.description == "merged description of Holmes -> Doctor Watson"  # both summarised
    assert street.weight == pytest.approx(5.0) and list(street.text_unit_ids) == ["u4"]
    assert out[3] == []  # nothing failed
    from sensegraph.index.resolve import combined_weight
    # different text units are different evidence: added up, exactly
    assert combined_weight([{"weight": 1.5, "text_unit_ids": ["a"]}, {"weight": 2.25, "text_unit_ids": ["b"]}]) \
        == 3.75
    assert combined_weight([{"weight": 2.0, "text_unit_ids": []}, {"weight": 3.0, "text_unit_ids": ["b"]}]) == 5.0


# -- in the pipeline: the run fails clearly, the rerun resolves --------------------------------------

class RefusingResolvingServer(FaultyServer, ResolvingServer):
    """The resolving mock, answering 500 to the requests `fail_when` picks."""


def refuses_mr_holmes(body) -> bool:
    return schema_name(body) == "SameEntity" and "Mr. Holmes (type" in body["messages"][-1]["content"]


def test_a_failed_confirmation_fails_the_run_and_the_rerun_resolves(tmp_path, server):
    fresh, project = tmp_path / "fresh", tmp_path / "project"
    write_docs(fresh, HOLMES)
    write_docs(project, HOLMES)
    reference = index(settings_for(fresh, server, resolution={"enabled": True}))
    assert reference.failures == {}
    asked = reference.stats["steps"]["summarize"]["resolution"]["asked"]

    with RefusingResolvingServer(refuses_mr_holmes).start() as broken:
        env = {**_cli_env(broken), "SENSEGRAPH_RESOLUTION__ENABLED": "true"}
        run = CliRunner().invoke(cli_main, ["index", "--root", str(project)], env=env)
        assert broken.refused > 0
    stats = stats_json(project)
    failed = stats["failures"].get("summarize", [])
    # every pair with Mr. Holmes is a failed item, named in stats.json and in the run's last words
    assert failed and all(f.startswith("resolve:confirm:") for f in failed)
    assert stats["partial"] is True and stats["steps"]["summarize"]["failures"] == failed
    assert stats["steps"]["summarize"]["resolution"]["failed"] == len(failed)
    assert run.exit_code == 1, run.output
    said = "".join(run.output.split())  # (the console wraps long lines)
    assert f"summarize:{len(failed)}failed" in said and all(f in said for f in failed)
    # the step is not marked finished: the rerun must resolve again
    assert "summarize" not in json.loads((project / "output" / "state.json").read_text())
    assert "Mr. Holmes" in set(read_table(project / "output", "entities")["title"])  # not merged yet

    server.requests.clear()
    again = index(settings_for(project, server, resolution={"enabled": True}))
    assert again.failures == {} and again.stats["partial"] is False
    assert not again.stats["steps"]["summarize"].get("skipped")
    confirmations = [b for b in server.requests if schema_name(b) == "SameEntity"]
    # only the failed confirmations are asked again; the others come from the cache
    assert 0 < len(confirmations) == len(failed) < asked
    assert all("Mr. Holmes (type" in b["messages"][-1]["content"] for b in confirmations)
    assert snapshot(project / "output") == snapshot(fresh / "output")
    third = index(settings_for(project, server, resolution={"enabled": True}))
    assert third.stats["steps"]["summarize"].get("skipped")


def test_a_dry_run_with_failed_confirmations_lists_the_rest_and_exits_1(tmp_path, server):
    """`sensegraph resolve --dry-run` whose confirmations failed says so and exits 1 (after the
    listing): a script must not take a partial listing for a complete one."""
    write_docs(tmp_path, HOLMES)
    index(settings_for(tmp_path, server))
    with RefusingResolvingServer(refuses_mr_holmes).start() as broken:
        run = CliRunner().invoke(cli_main, ["resolve", "--root", str(tmp_path), "--dry-run"], env=_cli_env(broken))
        assert broken.refused > 0
    said = " ".join(run.output.split())
    assert run.exit_code == 1, run.output
    assert "candidate pairs" in said  # the listing is printed first
    assert "resolution calls failed" in said and "resolve:confirm:" in said
