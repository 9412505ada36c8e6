"""Names the model missed, found by spaCy's NER in the unit (index/missed_names.py)."""
import asyncio
import dataclasses

import pandas as pd
from test_pipeline import DOCS, index, read_all, server, settings_for, stats_json, write_docs  # noqa: F401

from sensegraph.config import Settings
from sensegraph.index.extract import ENTITY_COLUMNS, ExtractionResult
from sensegraph.index.missed_names import NER_ROUND, add_missed_names, enabled, missed_names

TEXT = ("Ebenezer Scrooge was a partner of Jacob Marley in London. In 1843 Charles Dickens wrote about them "
        "for Chapman and Hall, and the story was later staged at the Lyceum Theatre.")


def units(*texts):
    return pd.DataFrame({"id": [f"u{i}" for i in range(len(texts))], "text": list(texts)})


def instances(*rows):
    return pd.DataFrame([{"title": t, "type": "person", "description": "", "text_unit_id": u, "round": 0}
                         for t, u in rows], columns=ENTITY_COLUMNS)


def test_names_the_model_missed_are_added_once_with_the_sentence_as_description():
    found = missed_names(units(TEXT), instances(("Scrooge", "u0"), ("Charles Dickens", "u0")),
                         entity_types=["organization", "person", "geo", "event"])
    got = dict(zip(found["title"], found["type"]))
    # "Scrooge" names Ebenezer Scrooge, Dickens is named; the year is no configured type
    assert "Ebenezer Scrooge" not in got and "Charles Dickens" not in got and "1843" not in got
    assert got["Jacob Marley"] == "person" and got["London"] == "geo"
    assert (found["round"] == NER_ROUND).all() and (found["text_unit_id"] == "u0").all()
    marley = found.set_index("title").loc["Jacob Marley", "description"]
    assert marley.startswith("Ebenezer Scrooge was a partner of Jacob Marley")


def test_configured_type_names_decide_what_is_added():
    found = missed_names(units(TEXT), instances(), entity_types=["PERSON", "Location"])
    assert set(found["type"]) <= {"PERSON", "Location"} and "Jacob Marley" in set(found["title"])
    assert not set(found["title"]) & {"Chapman and Hall"}  # ORG: no configured type


def test_on_for_the_embedded_model_in_english_only_by_default(tmp_path):
    local = Settings(root=str(tmp_path), chat={"provider": "local"})
    hosted = Settings(root=str(tmp_path), chat={"provider": "openai", "model": "m", "base_url": "http://x/v1"})
    assert enabled(local, "en") and not enabled(local, "zh") and not enabled(hosted, "en")
    forced = Settings(root=str(tmp_path), chat={"provider": "openai", "model": "m", "base_url": "http://x/v1"},
                      extraction={"ner": True})
    assert enabled(forced, "en")
    assert not enabled(Settings(root=str(tmp_path), chat={"provider": "local"}, extraction={"ner": False}), "en")


def test_added_names_come_after_the_models_records_of_their_unit(tmp_path):
    s = Settings(root=str(tmp_path), extraction={"ner": True})
    ex = ExtractionResult(instances(("Scrooge", "u0"), ("Bob Cratchit", "u1")), pd.DataFrame(), pd.DataFrame(),
                          failed=[], stats={"entity_instances": 2})
    out = asyncio.run(add_missed_names(ex, units(TEXT, "Bob Cratchit lived in Camden Town with Tiny Tim."),
                                       settings=s, language="en"))
    assert out.entities["text_unit_id"].tolist() == sorted(out.entities["text_unit_id"])
    assert out.entities["title"].tolist()[0] == "Scrooge"
    assert out.stats["names_from_ner"] == len(out.entities) - 2 == out.stats["entity_instances"] - 2


def test_spans_found_elsewhere_give_the_same_names_without_running_spacy_here(tmp_path, monkeypatch):
    from sensegraph.index import concepts, missed_names as pass_

    s = Settings(root=str(tmp_path), extraction={"ner": True})
    texts = units(TEXT, "Bob Cratchit lived in Camden Town with Tiny Tim.")
    ex = ExtractionResult(instances(("Scrooge", "u0"), ("Bob Cratchit", "u1")), pd.DataFrame(), pd.DataFrame(),
                          failed=[], stats={"entity_instances": 2})
    here = asyncio.run(add_missed_names(ex, texts, settings=s, language="en"))
    spans = pass_.name_spans(["u0", "u1"], texts["text"].tolist())  # as a Ray Data worker finds them
    assert list(spans.columns) == list(pass_.SPAN_COLUMNS) and set(spans["text_unit_id"]) == {"u0", "u1"}

    def no_spacy(*args, **kwargs):
        raise AssertionError("spaCy ran although the spans were given")
    monkeypatch.setattr(concepts, "english_concepts", no_spacy)
    elsewhere = asyncio.run(add_missed_names(dataclasses.replace(ex, name_spans=spans), texts,
                                             settings=s, language="en"))
    assert elsewhere.entities.equals(here.entities) and elsewhere.stats == here.stats
    assert here.stats["names_from_ner"] >= 3  # Jacob Marley, Charles Dickens, Tiny Tim, ...


def test_index_with_ner_has_the_added_names_and_counts_them(tmp_path, server):  # noqa: F811
    titles = {}
    for ner in (True, False):
        root = tmp_path / str(ner)
        write_docs(root, DOCS)
        assert index(settings_for(root, server, extraction={"ner": ner})).failures == {}
        titles[ner] = set(read_all(root / "output")["entities"]["title"])
        assert ("names_from_ner" in stats_json(root)["steps"]["extract"]) == ner
    # the mock names the first capitalised phrases of a unit; NER finds the rest
    assert titles[False] < titles[True] and stats_json(tmp_path / "True")["steps"]["extract"]["names_from_ner"] > 0


def test_a_name_the_model_gave_in_another_form_is_not_added_again():
    text = "Apple Inc. opened an office in the United Kingdom, and the U.S. Army bought its phones."
    found = missed_names(units(text), instances(("Apple Inc", "u0"), ("UK", "u0"), ("United States Army", "u0")),
                         entity_types=["organization", "person", "geo"])
    assert not set(found["title"]) & {"Apple Inc.", "United Kingdom", "the United Kingdom", "U.S. Army"}


def test_a_place_is_typed_city_or_country_only_when_something_decides():
    # prompt-tune proposed these types on Re-DocRED; spaCy's GPE is both
    text = "Maria Okafor flew from Paris to Lagos, then on to Kenya."
    model = pd.DataFrame([{"title": "Paris", "type": "city", "description": "", "text_unit_id": "u1", "round": 0},
                          {"title": "Kenya", "type": "country", "description": "", "text_unit_id": "u1", "round": 0},
                          {"title": "Maria Okafor", "type": "person", "description": "", "text_unit_id": "u0",
                           "round": 0}], columns=ENTITY_COLUMNS)
    ex = ExtractionResult(model, pd.DataFrame(), pd.DataFrame(), failed=[], stats={"entity_instances": 3})
    s = Settings(extraction={"ner": True, "entity_types": ["city", "country", "organization", "person"]})
    out = asyncio.run(add_missed_names(ex, units(text, "Paris and Kenya."), settings=s, language="en"))
    added = out.entities[out.entities["round"] == NER_ROUND]
    got = dict(zip(added["title"], added["type"]))
    # the model's own types of Paris and Kenya decide; nothing decides for Lagos
    assert got.get("Paris") == "city" and got.get("Kenya") == "country" and "Lagos" not in got
    assert out.stats["ner_type_ambiguous"] >= 1
    # with a generic place type configured, that one is taken
    generic = missed_names(units(text), instances(), entity_types=["city", "country", "location", "person"])
    assert set(generic.loc[generic["title"].isin(["Paris", "Lagos", "Kenya"]), "type"]) == {"location"}


def test_on_for_a_small_hosted_model_by_its_name(tmp_path):
    small = Settings(root=str(tmp_path), chat={"provider": "openai", "model": "qwen2.5:3b", "base_url": "http://x/v1"})
    large = Settings(root=str(tmp_path), chat={"provider": "openai", "model": "qwen2.5:32b", "base_url": "http://x/v1"})
    assert enabled(small, "en") and not enabled(large, "en")
