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

Setting `extraction.ner`: "auto" (on for the embedded chat model, whose misses this makes up
for; off for hosted models, which extract well and whose runs need not load spaCy), true or
false. English only: on classical or modern Chinese, jieba's name tags are mostly wrong (on
chapter 1 of Journey to the West, 208 "names" for 20 real ones), so Chinese gets none.
"""
from __future__ import annotations

import asyncio
import dataclasses

import pandas as pd

from ..config import Settings
from .extract import ENTITY_COLUMNS, ExtractionResult, normalize_name

NER_ROUND = -1

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
DESCRIPTION_WORDS = 40


def enabled(settings: Settings, language: str) -> bool:
    ner = settings.extraction.ner  # True, False or "auto" (the settings model admits no other)
    if language != "en" or ner is False:
        return False
    return ner is True or settings.chat.provider == "local"


def _type_of(label: str, entity_types: list[str]) -> str | None:
    by_key = {" ".join(t.replace("_", " ").replace("-", " ").split()).casefold(): t for t in entity_types}
    return next((by_key[k] for k in LABEL_TYPES.get(label, ()) if k in by_key), None)


def _named(key: str, keys: set[str]) -> bool:
    """Whether the model named this entity in the unit: the same key, or one holding the other
    as whole words (of at least 4 characters, so "Al" is not found in "Al Gore's Alliance")."""
    if key in keys:
        return True
    for k in keys:
        short, long = (key, k) if len(key) < len(k) else (k, key)
        if len(short) >= 4 and f" {short} " in f" {long} ":
            return True
    return False


def _sentence(text: str) -> str:
    words = " ".join(text.split()).split(" ")
    return " ".join(words[:DESCRIPTION_WORDS]) + (" …" if len(words) > DESCRIPTION_WORDS else "")


def missed_names(text_units: pd.DataFrame, entities: pd.DataFrame, *, entity_types: list[str]) -> pd.DataFrame:
    """Entity instances (ENTITY_COLUMNS, round NER_ROUND) for the names spaCy finds in each unit
    that the model's `entities` (instances with title and text_unit_id) do not name."""
    from .concepts import english_concepts  # spaCy loads only when this runs

    named: dict[str, set[str]] = {}
    for title, unit in zip(entities["title"], entities["text_unit_id"]):
        named.setdefault(str(unit), set()).add(normalize_name(title))
    texts = [str(t) for t in text_units["text"]]
    rows = []
    for unit_id, text, found in zip(map(str, text_units["id"]), texts, english_concepts(texts)):
        keys = named.get(unit_id, set())
        added: set[str] = set()
        for f in found:
            typ = _type_of(f.type, entity_types)
            if typ is None or f.key in added or _named(f.key, keys):
                continue
            added.add(f.key)
            rows.append({"title": f.title, "type": typ, "description": _sentence(text[f.sentence_start:f.sentence_end]),
                         "text_unit_id": unit_id, "round": NER_ROUND})
    return pd.DataFrame(rows, columns=ENTITY_COLUMNS)


async def add_missed_names(extraction: ExtractionResult, text_units: pd.DataFrame, *, settings: Settings,
                           language: str) -> ExtractionResult:
    """`extraction` with the missed names of its units added when `extraction.ner` is on for
    this model and language (each unit's after the model's records of it), and
    `stats["names_from_ner"]`."""
    if not enabled(settings, language) or text_units.empty:
        return extraction
    # spaCy holds a core for a while: off the event loop, so other work (embeddings) goes on.
    found = await asyncio.to_thread(missed_names, text_units, extraction.entities,
                                    entity_types=list(settings.extraction.entity_types))
    stats = {**extraction.stats, "names_from_ner": len(found)}
    if found.empty:
        return dataclasses.replace(extraction, stats=stats)
    both = pd.concat([extraction.entities, found], ignore_index=True)
    position = {str(u): n for n, u in enumerate(text_units["id"])}
    order = both["text_unit_id"].astype(str).map(position)
    entities = both.iloc[order.argsort(kind="stable")].reset_index(drop=True)
    stats["entity_instances"] = len(entities)
    return dataclasses.replace(extraction, entities=entities, stats=stats)
