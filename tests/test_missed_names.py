"""Names the model missed, found by spaCy's NER in the unit (index/missed_names.py)."""
import asyncio

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
