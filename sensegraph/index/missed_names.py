"""Paper step 2.2, checked in code: the names a small model missed, found by NER in the text.

The embedded 1.5B model finds about three quarters of the people, organisations and places of
a Wikipedia paragraph (bench/extraction_quality.py); spaCy's small English pipeline, which the
embedded install already carries for the lazy index, finds over 90% of them in a fraction of a
second. So after the model's rounds, each named entity spaCy finds in a unit, of a label that
maps onto a configured entity type, and that the model did not name in that unit (no extracted
name equal to it or holding it as whole words, either way round: "Scrooge" is named by
"Ebenezer Scrooge"), is added as an entity instance of the unit:

- `round` = NER_ROUND (-1), so it is told apart from the model's rounds (0, 1, ...) and counted
  in stats as `names_from_ner`;
- its description is the sentence it first occurs in (the text's words, not the model's): the
  summary step merges it with the model's descriptions of the same entity in other units;
- no relationship: the weak co-occurrence edges (cooccurrence_edges.py) place it in the graph.

Its type is the configured type its spaCy label maps to. A label that maps to several configured
types (GPE to both "city" and "country") takes the generic one if configured ("location"), else
the type the model gave that name in other units; with neither, the name is not added (counted
as `ner_type_ambiguous`): every place typed "country" would be wrong half the time.

A name the model gave in another form is named already: the same words ("Apple Inc" for "Apple
Inc."), or acronym and spelled-out name ("UK" for "United Kingdom"), as grounding.same_name.

Setting `extraction.ner`: "auto" (on for small chat models, the embedded one and those
`Settings.small_chat_model` calls small, whose misses this makes up for; off for hosted and
large models, which extract well and whose runs need not load spaCy), true or false. English only: on classical or modern Chinese, jieba's name tags are mostly wrong (on
chapter 1 of Journey to the West, 208 "names" for 20 real ones), so Chinese gets none.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pandas as pd

from ..config import Settings
from .extract import ENTITY_COLUMNS, ExtractionResult, normalize_name
from .grounding import same_name

NER_ROUND = -1
# A name spaCy found: the unit, the name, its key (concepts.py), its label, and its sentence's
# character offsets in the unit.
SPAN_COLUMNS = ("text_unit_id", "title", "key", "type", "sentence_start", "sentence_end")

# spaCy labels and the configured type names (any case, "_" or "-" for spaces) each may take.
LABEL_TYPES: dict[str, tuple[str, ...]] = {
    "PERSON": ("person", "people", "character", "per"),
    "ORG": ("organization", "organisation", "org", "company", "institution"),
    "GPE": ("geo", "location", "place", "loc", "country", "city", "gpe"),
    "LOC": ("geo", "location", "place", "loc"),
    "FAC": ("geo", "location", "place", "facility", "building", "loc"),
    "EVENT": ("event",),
    "WORK_OF_ART": ("work", "work of art", "creative work", "book", "film"),
    "PRODUCT": ("product",),
    "LAW": ("law", "legislation"),
}
# Configured type names that take any kind of place, person or organisation: the choice when a
# label maps onto several configured types.
GENERIC_TYPES = frozenset({"geo", "location", "place", "loc", "gpe", "organization", "organisation", "org"})
DESCRIPTION_WORDS = 40


def enabled(settings: Settings, language: str) -> bool:
    ner = settings.extraction.ner  # True, False or "auto" (the settings model admits no other)
    if language != "en" or ner is False:
        return False
    return ner is True or settings.small_chat_model()[0]


def _key(t: str) -> str:
    return " ".join(t.replace("_", " ").replace("-", " ").split()).casefold()


def _types_of(label: str, entity_types: list[str]) -> list[str]:
    """The configured types a spaCy label may take, in the label's order."""
    by_key = {_key(t): t for t in entity_types}
    return list(dict.fromkeys(by_key[k] for k in LABEL_TYPES.get(label, ()) if k in by_key))


def _type_of(candidates: list[str], model_types: Counter[str]) -> str | None:
    """One of the candidate types: the only one, the generic one, or the one the model gave the
    name most often elsewhere; None when nothing decides."""
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    generic = [t for t in candidates if _key(t) in GENERIC_TYPES]
    if generic:
        return generic[0]
    voted = [(n, t) for t, n in model_types.items() if t in candidates]
    return max(voted, key=lambda v: (v[0], -candidates.index(v[1])))[1] if voted else None


def _named(title: str, key: str, titles: list[str], keys: set[str]) -> bool:
    """Whether the model named this entity in the unit: the same key or the same name
    (same_name), or one key holding the other between spaces (of at least 4 characters, so
    "Al" is not found in "Al Gore's Alliance"; and "London" is not named by "London's Wembley
    Arena", nor "Stanley Cup" by "Stanley Cup-winning coach": those are other things)."""
    if key in keys:
        return True
    for k, t in zip(map(normalize_name, titles), titles):
        short, long = (key, k) if len(key) < len(k) else (k, key)
        if (len(short) >= 4 and f" {short} " in f" {long} ") or same_name(title, t):
            return True
    return False


def _sentence(text: str) -> str:
    words = " ".join(text.split()).split(" ")
    return " ".join(words[:DESCRIPTION_WORDS]) + (" …" if len(words) > DESCRIPTION_WORDS else "")


def missed_names(text_units: pd.DataFrame, entities: pd.DataFrame, *, entity_types: list[str]) -> pd.DataFrame:
    """Entity instances (ENTITY_COLUMNS, round NER_ROUND) for the names spaCy finds in each unit
    that the model's `entities` (instances with title and text_unit_id) do not name."""
    return _missed(text_units, entities, entity_types, Counter())


def name_spans(ids: list[str], texts: list[str]) -> pd.DataFrame:
    """The named entities spaCy finds in each text (SPAN_COLUMNS, in text order, then in the
    order found), of the labels this pass can type. The costly half of the pass, which depends
    on the texts alone: Ray Data's workers run it beside extraction (index/ray_data.py) and the
    driver only matches the spans against the merged instances (`add_missed_names`)."""
    from .concepts import english_concepts  # spaCy loads only when this runs

    rows = [(unit, f.title, f.key, f.type, f.sentence_start, f.sentence_end)
            for unit, found in zip(ids, english_concepts(texts)) for f in found if f.type in LABEL_TYPES]
    return pd.DataFrame(rows, columns=SPAN_COLUMNS)


@dataclasses.dataclass(frozen=True)
class _Span:
    title: str
    key: str
    type: str
    sentence_start: int
    sentence_end: int


def _by_unit(spans: pd.DataFrame, ids: list[str]) -> list[list[_Span]]:
    out: dict[str, list[_Span]] = {i: [] for i in ids}
    for unit, title, key, label, a, b in spans[list(SPAN_COLUMNS)].itertuples(index=False):
        out[str(unit)].append(_Span(str(title), str(key), str(label), int(a), int(b)))
    return [out[i] for i in ids]


def _missed(text_units: pd.DataFrame, entities: pd.DataFrame, entity_types: list[str],
            counts: Counter[str], spans: pd.DataFrame | None = None) -> pd.DataFrame:
    named: dict[str, list[str]] = {}
    model_types: dict[str, Counter[str]] = {}
    for title, typ, unit in zip(entities["title"], entities["type"], entities["text_unit_id"]):
        named.setdefault(str(unit), []).append(str(title))
        model_types.setdefault(normalize_name(title), Counter())[str(typ)] += 1
    ids, texts = [str(i) for i in text_units["id"]], [str(t) for t in text_units["text"]]
    if spans is None:
        spans = name_spans(ids, texts)
    rows = []
    for unit_id, text, found in zip(ids, texts, _by_unit(spans, ids)):
        titles = named.get(unit_id, [])
        keys = {normalize_name(t) for t in titles}
        added: set[str] = set()
        for f in found:
            candidates = _types_of(f.type, entity_types)
            if not candidates or f.key in added or _named(f.title, normalize_name(f.title), titles, keys):
                continue
            typ = _type_of(candidates, model_types.get(normalize_name(f.title), Counter()))
            if typ is None:
                counts["ner_type_ambiguous"] += 1
                continue
            added.add(f.key)
            titles.append(f.title)  # "Apple Inc." after "Apple Inc" in one unit is one name
            rows.append({"title": f.title, "type": typ, "description": _sentence(text[f.sentence_start:f.sentence_end]),
                         "text_unit_id": unit_id, "round": NER_ROUND})
    return pd.DataFrame(rows, columns=ENTITY_COLUMNS)


async def add_missed_names(extraction: ExtractionResult, text_units: pd.DataFrame, *, settings: Settings,
                           language: str) -> ExtractionResult:
    """`extraction` with the missed names of its units added when `extraction.ner` is on for
    this model and language (each unit's after the model's records of it; spaCy runs here unless
    `extraction.name_spans` holds its spans for these units already), and
    `stats["names_from_ner"]` (and `ner_type_ambiguous`: names not added for want of a type)."""
    if not enabled(settings, language) or text_units.empty:
        return extraction
    # spaCy holds a core for a while: off the event loop, so other work (embeddings) goes on.
    counts: Counter[str] = Counter()
    found = await asyncio.to_thread(_missed, text_units, extraction.entities,
                                    list(settings.extraction.entity_types), counts, extraction.name_spans)
    stats = {**extraction.stats, "names_from_ner": len(found), "ner_type_ambiguous": counts["ner_type_ambiguous"]}
    if found.empty:
        return dataclasses.replace(extraction, stats=stats)
    both = pd.concat([extraction.entities, found], ignore_index=True)
    position = {str(u): n for n, u in enumerate(text_units["id"])}
    order = both["text_unit_id"].astype(str).map(position)
    entities = both.iloc[order.argsort(kind="stable")].reset_index(drop=True)
    stats["entity_instances"] = len(entities)
    return dataclasses.replace(extraction, entities=entities, stats=stats)
