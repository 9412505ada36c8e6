"""`sensegraph prompt-tune` with a scripted chat model: what it writes, what it refuses to write
(example names the passage does not hold, more types than the cap, types that are phrases or
junk), that settings.yaml keeps its comments, that the dry run calls nothing, that a rerun costs
no call, and that `sensegraph index`'s extraction then uses the tuned examples and types."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import sensegraph.llm
import sensegraph.llm.doctor
from scripted import ScriptedLLM, last_user, schema_name
from sensegraph import prompt_tune as pt
from sensegraph.cli import main as cli_main
from sensegraph.config import load_settings
from sensegraph.index import documents, text_units
from sensegraph.index.extract import example_names, extract_graph
from sensegraph.llm import Usage, open_cache

DOCS = {
    "harbor.txt": (
        "The Harbor Cooperative of Port Ellison was founded in 1998 by Maria Okafor and Daniel Reyes. "
        "Maria Okafor had worked for twenty years at the Northern Shipping Company before she left to "
        "organise the fishing families of Port Ellison. Daniel Reyes, a former union negotiator, wrote "
        "the first charter of the cooperative and chaired its board until 2010. In 2004 the Harbor "
        "Cooperative signed a supply agreement with Bluewater Foods, a processor based in Halden."
    ),
    "council.txt": (
        "The Island Council of Maren governs the three islands of the Maren Archipelago. Its chair, "
        "Elena Voss, was elected in 2015 after a campaign about the ferry service. The ferry between "
        "Maren Harbour and the mainland port of Halden is run by the Halden Ferry Line, a private "
        "company owned by Tomas Brandt. Elena Voss accused the Halden Ferry Line of cutting winter sailings."
    ),
}
KNOWN = {"Harbor Cooperative": "cooperative", "Port Ellison": "place", "Maria Okafor": "person",
         "Daniel Reyes": "person", "Northern Shipping Company": "company", "Bluewater Foods": "company",
         "Halden": "place", "Island Council of Maren": "council", "Elena Voss": "person",
         "Maren Harbour": "place", "Halden Ferry Line": "company", "Tomas Brandt": "person"}
TYPES = ["person", "cooperative", "company", "place", "council"]
SETTINGS_YAML = """\
# my fishing project
chat:
  provider: openai
  model: scripted
  base_url: http://scripted/v1
  api_key: x                 # not a real key
  retry_base_seconds: 0.001

chunks:
  size: 120
  overlap: 20

extraction:
  entity_types: [organization, person, geo, event]   # the defaults
  max_gleanings: 0
"""


def _enum(schema: Any) -> list[str]:
    """The first enum in a JSON schema (the extraction schema's entity types)."""
    if isinstance(schema, dict):
        if "enum" in schema:
            return schema["enum"]
        for v in schema.values():
            if found := _enum(v):
                return found
    if isinstance(schema, list):
        for v in schema:
            if found := _enum(v):
                return found
    return []


def responder(types: list[str] | None = None, invented: str | None = None, known: dict[str, str] = KNOWN):
    """The proposal answers `types`; an example answer names every known name of its passage
    (typed from `known`, else the first allowed type), plus `invented`, related to the first."""
    def answer(body: dict[str, Any]) -> Any:
        name = schema_name(body)
        if name == "TypeProposal":
            return {"domain": "Fishing cooperatives and island politics.", "entity_types": types or TYPES}
        if name == "ExtractedGraph":
            passage = last_user(body).split('"""')[1]
            allowed = _enum(body["response_format"]["json_schema"]["schema"])
            names = [n for n in known if n in passage]
            if invented:
                names.append(invented)
            entities = [{"name": n, "type": known.get(n) if known.get(n) in allowed else allowed[0],
                         "description": f"{n} is named in the passage."} for n in names]
            relationships = [{"source": a, "target": b, "description": f"{a} and {b} appear together.",
                              "strength": 6} for a, b in zip(names, names[1:])]
            return {"entities": entities, "relationships": relationships}
        raise AssertionError(f"unexpected request {name}")
    return answer


def make_project(root: Path, docs: dict[str, str] = DOCS, settings: str = SETTINGS_YAML) -> Path:
    (root / "input").mkdir(parents=True)
    for name, text in docs.items():
        (root / "input" / name).write_text(text, encoding="utf-8")
    (root / "settings.yaml").write_text(settings, encoding="utf-8")
    return root


@pytest.fixture
def scripted_cli(monkeypatch):
    """Run the CLI with the chat model replaced by `scripted` (the real client, cache included)."""
    def install(scripted: ScriptedLLM) -> None:
        def open_chat(settings, *, cache, usage=None, **kwargs):
            return scripted.client(settings.chat, cache=cache, usage=usage)

        async def preflight(settings, sections=("chat", "embedding")):
            return []
        monkeypatch.setattr(sensegraph.llm, "open_chat", open_chat)
        monkeypatch.setattr(sensegraph.llm.doctor, "preflight", preflight)
    return install


def cli(*args: str, input: str | None = None):
    return CliRunner().invoke(cli_main, ["prompt-tune", *args], input=input, catch_exceptions=False)


def examples_of(text: str) -> list[tuple[str, dict]]:
    """(passage, answer) of every example in an examples_graph.txt (either language)."""
    pattern = r'(?:Example text:|示例文本：)\n"""\n(.*?)\n"""\n(?:Answer:|回答：)\n(.*?)(?=\n\n(?:Example text:|示例文本：)|\Z)'
    return [(p, json.loads(a)) for p, a in re.findall(pattern, text, re.S)]


def tune(root: Path, scripted: ScriptedLLM, **kwargs) -> tuple[pt.TunePlan, Usage]:
    settings = load_settings(root, env={})
    usage = Usage()

    async def go():
        llm = scripted.client(settings.chat, cache=open_cache(settings), usage=usage)
        try:
            return await pt.tune(settings, llm, **kwargs)
        finally:
            await llm.aclose()
            llm.cache.close()
    return asyncio.run(go()), usage


# -- the command ---------------------------------------------------------------------------------

def test_prompt_tune_writes_examples_domain_and_entity_types(tmp_path, scripted_cli):
    root = make_project(tmp_path)
    scripted = ScriptedLLM(responder())
    scripted_cli(scripted)
    res = cli("--root", str(root), "--yes")
    assert res.exit_code == 0, res.output + res.stderr

    text = (root / "settings.yaml").read_text()
    assert yaml.safe_load(text)["extraction"] == {"entity_types": TYPES, "max_gleanings": 0}
    assert "# my fishing project" in text and "# the defaults" in text and "# not a real key" in text

    examples = examples_of((root / "prompts" / "en" / "examples_graph.txt").read_text())
    assert len(examples) == 2
    corpus = " ".join(DOCS.values())
    for passage, answer in examples:
        assert passage in corpus  # a real passage of the corpus, not an invented one
        assert answer["entities"] and {e["type"] for e in answer["entities"]} <= set(TYPES)
        assert all(e["name"] in passage for e in answer["entities"])
        assert all(set(r) == {"source", "target", "description", "strength"} for r in answer["relationships"])
    # the extraction reads the example names back from the file, to filter leaked ones
    assert example_names((root / "prompts" / "en" / "examples_graph.txt").read_text()) == {
        n.casefold() for _, a in examples for n in [e["name"] for e in a["entities"]]}

    extract_prompt = (root / "prompts" / "en" / "extract_graph.txt").read_text()
    assert extract_prompt.startswith("Domain of the documents: Fishing cooperatives and island politics.\n")
    assert all(p in extract_prompt for p in ("{entity_types}", "{examples}", "{text}"))

    assert "+++ b/settings.yaml" in res.output and "+++ b/prompts/en/examples_graph.txt" in res.output
    assert "-  entity_types: [organization, person, geo, event]" in res.output
    assert "sensegraph index --root" in res.output
    assert len(scripted.requests) == 3  # one proposal, two examples


def test_rerun_costs_no_call_and_changes_nothing(tmp_path, scripted_cli):
    root = make_project(tmp_path)
    scripted = ScriptedLLM(responder())
    scripted_cli(scripted)
    assert cli("--root", str(root), "--yes").exit_code == 0
    calls = len(scripted.requests)
    written = {p: p.read_text() for p in [root / "settings.yaml", *root.glob("prompts/en/*.txt")]}

    res = cli("--root", str(root), "--yes")
    assert res.exit_code == 0
    assert len(scripted.requests) == calls  # every answer from the cache
    assert "LLM: 0 calls (+3 from cache)" in res.stderr
    assert "nothing to change" in res.output
    assert {p: p.read_text() for p in written} == written


def test_without_yes_it_asks_and_writes_nothing_on_no(tmp_path, scripted_cli):
    root = make_project(tmp_path)
    scripted_cli(ScriptedLLM(responder()))
    res = cli("--root", str(root), input="n\n")
    assert res.exit_code == 0 and "Nothing written" in res.output
    assert (root / "settings.yaml").read_text() == SETTINGS_YAML
    assert not (root / "prompts").exists()


def test_dry_run_makes_no_call_and_prints_the_cost(tmp_path, monkeypatch):
    root = make_project(tmp_path, settings=SETTINGS_YAML.replace(
        "  retry_base_seconds: 0.001\n", "  retry_base_seconds: 0.001\n  price_per_1k_prompt: 0.5\n"
                                         "  price_per_1k_completion: 1.5\n"))

    def no_chat(*args, **kwargs):
        raise AssertionError("a dry run opened the chat model")
    monkeypatch.setattr(sensegraph.llm, "open_chat", no_chat)
    monkeypatch.setattr(sensegraph.llm.doctor, "preflight", no_chat)
    res = cli("--root", str(root), "--dry-run")
    assert res.exit_code == 0, res.output + res.stderr
    m = re.search(r"LLM calls: 3; tokens: ~([\d,]+) prompt \+ ~([\d,]+) completion", res.output)
    assert m and int(m.group(1).replace(",", "")) > 200 and int(m.group(2).replace(",", "")) > 0
    assert "Estimated cost:" in res.output
    assert not (root / "prompts").exists() and not (root / "cache").exists()
    assert (root / "settings.yaml").read_text().endswith("max_gleanings: 0\n")


def test_no_input_documents_is_a_clear_error(tmp_path, scripted_cli):
    root = make_project(tmp_path, docs={})
    scripted = ScriptedLLM(responder())
    scripted_cli(scripted)
    res = cli("--root", str(root), "--yes")
    assert res.exit_code == 2 and "no documents in" in res.stderr
    assert not scripted.requests


def test_unreachable_chat_model_is_a_clear_error(tmp_path):
    root = make_project(tmp_path, settings=SETTINGS_YAML.replace("http://scripted/v1", "http://127.0.0.1:9/v1"))
    res = cli("--root", str(root), "--yes")
    assert res.exit_code == 2 and "nothing answers at http://127.0.0.1:9/v1" in res.stderr
    assert not (root / "prompts").exists()


# -- what the model answers is checked -------------------------------------------------------------

def test_an_example_name_not_in_its_passage_is_dropped(tmp_path):
    root = make_project(tmp_path)
    plan, _ = tune(root, ScriptedLLM(responder(invented="Atlantis Holdings")))
    assert all(ex.dropped["not_in_passage"] == 1 for ex in plan.examples)
    # its relationship goes with it: no record names it, and the rest is kept
    assert all(ex.dropped["relationship_to_dropped_name"] == 1 for ex in plan.examples)
    rendered = next(c.new for c in plan.changes if c.label.endswith("examples_graph.txt"))
    assert "Atlantis Holdings" not in rendered
    assert "Maria Okafor" in rendered or "Elena Voss" in rendered


def test_ground_example_words_and_chinese_substrings():
    from sensegraph.index.extract import graph_schema

    schema = graph_schema(["person", "place"])

    def answer(*names: str):
        return schema.model_validate({"entities": [{"name": n, "type": "person", "description": "d"} for n in names],
                                      "relationships": []})
    kept, _, dropped = pt.ground_example(answer("Ann", "Annabel Lee", "1998", "annabel  LEE"),
                                         "Annabel Lee was born in 1998.", ["person", "place"])
    assert [e["name"] for e in kept] == ["Annabel Lee"]  # "Ann" is not a word of it; 1998 is no name
    assert dropped == {"not_in_passage": 1, "not_a_name": 1, "duplicate": 1}
    kept, _, dropped = pt.ground_example(answer("孙悟空", "花果山", "水帘洞洞主"), "东胜神洲有座花果山，山上石猴孙悟空。",
                                         ["person", "place"])
    assert [e["name"] for e in kept] == ["孙悟空", "花果山"] and dropped == {"not_in_passage": 1}


def test_more_types_than_the_cap_are_cut_cleaned_and_deduplicated(tmp_path):
    root = make_project(tmp_path)
    many = ["Person", "persons", "Organization", "Unknown", "Ship", "Work of Art", "Port", "Law",
            "Vessel", "Crop", "Festival", "Tax"]
    scripted = ScriptedLLM(responder(types=many))
    plan, usage = tune(root, scripted)
    # the server ignored maxItems: the client keeps the first 8, then duplicates and "unknown" go
    assert plan.entity_types == ["person", "organization", "ship", "work_of_art", "port", "law"]
    assert usage.step("tune_types").truncated == 1
    sent = scripted.requests[0]["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["entity_types"]["maxItems"] == pt.MAX_TYPES
    assert yaml.safe_load(next(c.new for c in plan.changes if c.label == "settings.yaml"))["extraction"][
        "entity_types"] == plan.entity_types


# Types a model proposed that name no kind of thing: a phrase, a sentence, two types in one, junk.
JUNK_TYPES = {
    "the_main_people_in_the_story": "words", "main characters of the novel": "words",
    "people in the story": "words", "a person": "'a'", "their_allies": "'their'", "place_in_story": "'in'",
    "person or group": "'or'", "companies_and_banks": "'and'", "what_is_described": "'what'",
    "of_the_state": "'of'", "person/organization": "'/'", "Organization (company)": "'('",
    "person, place": "','", "e.g. drug": "'.'", "covid_19": "'1'", "type2 diabetes": "'2'",
    "故事中的主要人物": "characters", "  ": "empty", "Unknown": "generic", "other": "generic",
}
# Real types of several domains: biology, law, finance, fiction, and Chinese and Japanese ones.
REAL_TYPES = {
    "gene": "gene", "Protein": "protein", "cell type": "cell_type", "chemical_compound": "chemical_compound",
    "biological process": "biological_process", "court": "court", "statute": "statute",
    "Court of Appeal": "court_of_appeal", "law firm": "law_firm", "central bank": "central_bank",
    "financial instrument": "financial_instrument", "publicly traded company": "publicly_traded_company",
    "stock-exchange": "stock_exchange", "character": "character", "work of art": "work_of_art",
    "head of state": "head_of_state", "fictional creature": "fictional_creature", "œuvre": "œuvre",
    "人物": "人物", "地点": "地点", "组织": "组织", "化学物质": "化学物质", "キャラクター": "キャラクター", "組織": "組織",
}


def test_the_type_rule_refuses_phrases_and_punctuation_and_keeps_real_types():
    kept, refused = pt.check_types([*REAL_TYPES, *JUNK_TYPES], cap=100)
    assert kept == list(REAL_TYPES.values())
    assert [raw for raw, _ in refused] == list(JUNK_TYPES)
    for (raw, why), expected in zip(refused, JUNK_TYPES.values()):
        assert expected in why, (raw, why)


def test_repeated_types_are_refused_and_named():
    kept, refused = pt.check_types(["Person", "person", "persons", "Place", "place ", "ship", "Ships"])
    assert kept == ["person", "place", "ship"]
    assert refused == [("person", "repeats person"), ("persons", "repeats person"), ("place ", "repeats place"),
                       ("Ships", "repeats ship")]


def test_refused_types_are_dropped_and_the_output_says_so(tmp_path, scripted_cli):
    root = make_project(tmp_path)
    proposed = ["person", "the_main_people_in_the_story", "company", "person/organization", "Company", "place"]
    scripted_cli(ScriptedLLM(responder(types=proposed)))
    res = cli("--root", str(root), "--yes")
    assert res.exit_code == 0, res.output + res.stderr
    assert yaml.safe_load((root / "settings.yaml").read_text())["extraction"]["entity_types"] == [
        "person", "company", "place"]
    assert "Refused entity types:" in res.output
    for raw in ("the_main_people_in_the_story", "person/organization", "Company"):
        assert raw in res.output


def test_no_usable_type_writes_nothing(tmp_path):
    root = make_project(tmp_path)
    with pytest.raises(pt.TuneError, match="no usable entity type") as raised:
        tune(root, ScriptedLLM(responder(types=["Unknown", "entity", "  ", "the people of the town"])))
    assert "the people of the town" in str(raised.value) and "words" in str(raised.value)


def test_chinese_corpus_gets_chinese_examples_in_prompts_zh(tmp_path):
    docs = {"xiyou.txt": "东胜神洲海外有一国土，名曰傲来国。国近大海，海中有一座名山，唤为花果山。山顶上有一块仙石，"
                         "石产一卵，化作一个石猴。石猴在花果山寻得水帘洞，众猴拜他为美猴王。后来美猴王漂洋过海，"
                         "到灵台方寸山斜月三星洞拜须菩提祖师为师，祖师为他取名孙悟空。"}
    known = {"傲来国": "place", "花果山": "place", "水帘洞": "place", "美猴王": "person", "须菩提祖师": "person",
             "孙悟空": "person"}
    root = make_project(tmp_path, docs=docs)
    plan, _ = tune(root, ScriptedLLM(responder(types=["person", "place"], invented="东海龙王", known=known)),
                   examples=1)
    assert plan.language == "zh"
    change = next(c for c in plan.changes if c.label == "prompts/zh/examples_graph.txt")
    (passage, answer), = examples_of(change.new)
    assert change.new.startswith('示例文本：\n"""\n') and passage in docs["xiyou.txt"]
    assert [e["name"] for e in answer["entities"]] == [n for n in known if n in passage]  # 东海龙王 dropped
    extract = next(c for c in plan.changes if c.label == "prompts/zh/extract_graph.txt")
    assert extract.new.startswith("文档领域：Fishing cooperatives and island politics。\n") and "{examples}" in extract.new


def test_japanese_corpus_tunes_the_english_prompts_it_uses_and_says_so(tmp_path):
    from sensegraph.language import JAPANESE_NOTE
    from sensegraph.prompts import load_prompt

    docs = {"soseki.txt": "夏目漱石は東京で生まれた小説家である。漱石は松山中学校で英語を教えたあと、ロンドンに留学した。"
                          "帰国後、朝日新聞社に入社し、『三四郎』や『こころ』を連載した。"}
    known = {"夏目漱石": "person", "東京": "place", "松山中学校": "organization", "ロンドン": "place",
             "朝日新聞社": "organization"}
    root = make_project(tmp_path, docs=docs)
    plan, _ = tune(root, ScriptedLLM(responder(types=["person", "place", "organization"], invented="大阪城",
                                               known=known)), examples=1)
    assert plan.language == "ja" and JAPANESE_NOTE in plan.notes
    # written where the index reads them for Japanese: prompts/en/
    labels = {c.label for c in plan.changes}
    assert {"prompts/en/examples_graph.txt", "prompts/en/extract_graph.txt"} <= labels
    assert not any("/ja/" in label for label in labels)
    (passage, answer), = examples_of(next(c.new for c in plan.changes if c.label == "prompts/en/examples_graph.txt"))
    assert [e["name"] for e in answer["entities"]] == [n for n in known if n in passage]  # 大阪城 dropped
    pt.write_changes(plan)
    assert passage in load_prompt("examples_graph", "ja", root)


def test_sample_is_seeded_and_spread_over_documents(tmp_path):
    docs = {f"d{i}.txt": " ".join(f"Sentence {j} of document {i} names Person{i}x{j}." for j in range(60))
            for i in range(4)}
    root = make_project(tmp_path, docs=docs)
    settings = load_settings(root, env={})
    a, b = pt.load_sample(settings, 8), pt.load_sample(settings, 8)
    assert list(a.units["id"]) == list(b.units["id"]) and len(a.units) == 8
    assert a.units["document_id"].value_counts().tolist() == [2, 2, 2, 2]
    assert pt.load_sample(settings, 8, seed=1).units["id"].tolist() != a.units["id"].tolist()


# -- settings.yaml keeps its other lines -------------------------------------------------------------

@pytest.mark.parametrize("before, kept_line", [
    ("chat:\n  model: m   # mine\nextraction:\n  entity_types: [a, b]  # old\n  max_gleanings: 0\n",
     "  entity_types: [person, ship, \"yes\"]  # old\n"),
    ("extraction:\n  max_gleanings: 0\n  entity_types:\n    - a\n    - b\n\n# next\nquery:\n  level: 1\n",
     "  entity_types:\n    - person\n    - ship\n    - \"yes\"\n\n# next\nquery:\n"),
    ("# top\nextraction:\n    max_gleanings: 0\n", "extraction:\n    entity_types: [person, ship, \"yes\"]\n    max_gleanings"),
    ("# top\nchat:\n  model: m\n", "# top\nchat:\n  model: m\n\nextraction:\n  entity_types: [person, ship, \"yes\"]\n"),
    ("", "extraction:\n  entity_types: [person, ship, \"yes\"]\n"),
])
def test_entity_types_are_edited_in_place(before, kept_line):
    edit = pt.set_entity_types(before, ["person", "ship", "yes"])
    assert not edit.rewritten and not edit.dropped_comments and kept_line in edit.text
    expected = yaml.safe_load(before) or {}
    expected.setdefault("extraction", {})["entity_types"] = ["person", "ship", "yes"]
    assert yaml.safe_load(edit.text) == expected


def comments_of(text: str) -> list[str]:
    """The comments of a YAML text as a reader sees them ('#' to the end of the line)."""
    return [ln[ln.index("#"):].strip() for ln in text.splitlines() if "#" in ln]


COMMENTED = """\
# my project
extraction:   # what the model extracts
  # the kinds of names
  entity_types:   # tuned by prompt-tune
    # people first
    - person      # characters
    - geo         # places
    - event
    # - festival  (too noisy)
  # gleaning costs one call per text unit
  max_gleanings: 1
query:
  level: 1        # broad answers
"""


def test_every_comment_of_a_block_list_and_its_section_is_kept():
    edit = pt.set_entity_types(COMMENTED, ["ship", "person", "port"])
    assert not edit.rewritten and edit.dropped_comments == []
    parsed = yaml.safe_load(edit.text)
    assert parsed["extraction"] == {"entity_types": ["ship", "person", "port"], "max_gleanings": 1}
    assert parsed["query"] == {"level": 1}
    for comment in comments_of(COMMENTED):
        assert comment in edit.text, comment
    # a kept type keeps its comment on its line; a removed type's comment stays with it, commented out
    assert "    - person      # characters\n" in edit.text
    assert "    # - geo         # places\n" in edit.text and edit.commented_out == ["geo"]
    assert "\n    - event\n" not in edit.text  # a removed type without a comment just goes
    assert "  # gleaning costs one call per text unit\n  max_gleanings: 1\n" in edit.text
    # a rerun with the same types changes nothing
    again = pt.set_entity_types(edit.text, ["ship", "person", "port"])
    assert again.text == edit.text and not again.dropped_comments


def test_an_indentless_block_list_keeps_the_comment_of_the_next_key():
    before = "extraction:\n  entity_types:\n  - person  # who\n  - geo\n  # gleaning\n  max_gleanings: 0\n"
    edit = pt.set_entity_types(before, ["person", "ship"])
    assert edit.text == "extraction:\n  entity_types:\n  - person  # who\n  - ship\n  # gleaning\n  max_gleanings: 0\n"
    assert not edit.dropped_comments and not edit.rewritten


def test_a_flow_list_over_several_lines_keeps_its_comments_in_their_column():
    before = ("extraction:\n  entity_types: [organization, person,   # who\n"
              "                 geo, event]             # where\n  max_gleanings: 0   # none\n")
    edit = pt.set_entity_types(before, ["person", "ship"])
    assert not edit.rewritten and not edit.dropped_comments
    assert edit.text == ("extraction:\n  entity_types: [person, ship]   # who\n"
                         "                                         # where\n  max_gleanings: 0   # none\n")
    assert yaml.safe_load(edit.text)["extraction"] == {"entity_types": ["person", "ship"], "max_gleanings": 0}


def test_the_packaged_settings_template_keeps_every_comment():
    template = (Path(pt.__file__).parent / "templates" / "settings.yaml").read_text(encoding="utf-8")
    edit = pt.set_entity_types(template, ["person", "ship"])
    assert not edit.rewritten and not edit.dropped_comments
    assert comments_of(edit.text) == comments_of(template)


def test_an_unusual_layout_is_rewritten_and_says_which_comments_are_lost():
    before = "# gone\nextraction: {entity_types: [a], max_gleanings: 0}   # also gone\nchat: {model: m}\n"
    edit = pt.set_entity_types(before, ["person"])
    assert edit.rewritten and edit.dropped_comments == ["# gone", "# also gone"]
    assert yaml.safe_load(edit.text) == {"extraction": {"entity_types": ["person"], "max_gleanings": 0},
                                         "chat": {"model": "m"}}


def test_the_output_says_what_became_of_the_comments(tmp_path, scripted_cli):
    settings = SETTINGS_YAML.replace("  entity_types: [organization, person, geo, event]   # the defaults\n",
                                     "  entity_types:\n    - person   # people\n    - geo      # places\n"
                                     "  # gleaning is off\n")
    root = make_project(tmp_path, settings=settings)
    scripted_cli(ScriptedLLM(responder()))
    res = cli("--root", str(root), "--yes")
    assert res.exit_code == 0, res.output + res.stderr
    text = (root / "settings.yaml").read_text()
    for comment in comments_of(settings):
        assert comment in text, comment
    assert "    # - geo      # places" in text
    assert "comments are lost" not in res.output
    assert "no longer listed keep their comment on a commented-out line: geo" in res.output


# -- the index uses what prompt-tune wrote ---------------------------------------------------------

def test_the_index_extraction_uses_the_tuned_prompts_and_types(tmp_path, scripted_cli):
    root = make_project(tmp_path)
    scripted_cli(ScriptedLLM(responder()))
    assert cli("--root", str(root), "--yes").exit_code == 0
    (passage, _), *_ = examples_of((root / "prompts" / "en" / "examples_graph.txt").read_text())

    settings = load_settings(root, env={})
    units = text_units.make_text_units(documents.load_documents(settings), size=settings.chunks.size,
                                       overlap=settings.chunks.overlap)
    index_llm = ScriptedLLM(responder())

    async def extract():
        llm = index_llm.client(settings.chat)
        try:
            return await extract_graph(units.head(1), llm, settings=settings, language="en")
        finally:
            await llm.aclose()
    result = asyncio.run(extract())
    body, = index_llm.requests
    system = body["messages"][0]["content"]
    assert system.startswith("Domain of the documents: Fishing cooperatives and island politics.")
    assert passage in system and "Harbor Logistics" not in system  # the tuned example, not the packaged one
    assert f"these types: {', '.join(TYPES)}" in system
    assert _enum(body["response_format"]["json_schema"]["schema"]) == TYPES
    assert set(result.entities["type"]) <= set(TYPES) and len(result.entities)


def test_example_passage_ends_at_a_sentence_end_not_an_abbreviation():
    text = "ship left port. " + "Captain Ruiz met Dr. Hale and Mr. Ortiz at the harbour office. " * 20
    passage = pt.example_passage(text, max_tokens=50, mid_document=True)
    assert passage.startswith("Captain Ruiz")  # a unit inside its document starts at a sentence
    assert passage.endswith("harbour office.") and passage in text
    assert pt.example_passage('He said """no""". ' * 3, 100).count('"""') == 0
