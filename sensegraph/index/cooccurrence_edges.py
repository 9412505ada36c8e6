"""Standard index, between paper steps 2.3 and 2.4: weak edges between entities that one sentence
names together but that the model gave no relationship.

A small model relates few of the entities it extracts: on Operation Dulce the embedded 1.5B
model left 67 of 121 entities without any relationship, and every such entity is a root
community of its own, so the hierarchy Leiden builds is mostly singletons and the root-level
reports (C0) are mostly one-entity pages. The text says more than the model did: two names in
one sentence are related by that sentence. So each pair of entities mentioned in one sentence of
a text unit (both extracted from that unit, mentions found as grounding.py finds names) with no
extracted relationship between them gets an edge:

- marked `co_occurrence = True` (extracted relationships are False), with a description that
  says only that (queries and reports read it as what it is, not as a stated relationship);
- weighted `communities.cooccurrence_weight` per sentence naming both, capped below 1: an
  extracted relationship weighs at least 1 (one instance of strength 1), so Leiden still
  prefers what the model said, and the weak edges only join what would otherwise fall apart;
- a sentence pairs at most `PAIR_CAP` of its entities (those extracted most often first), so a
  list-like sentence cannot add a quadratic number of edges;
- an entity that is still without any edge (the only name of its sentences) is linked the same
  way to the entities of the nearest sentence of its unit that names some.

Computed from the entities table (titles, aliases, text units) after entity resolution, so it
sees the final names; no LLM. Lazy indexes build their whole graph from co-occurrence
(cooccurrence.py) and do not use this.
"""
from __future__ import annotations

from collections import defaultdict
from itertools import combinations

import pandas as pd

from ..store.tables import content_id
from .extract import normalize_name
from .grounding import UnitText, sentences_of

PAIR_CAP = 12
# A weak edge stays lighter than one extracted relationship instance (strength >= 1).
MAX_WEIGHT = 0.9

DESCRIPTIONS = {
    "en": "{a} and {b} are mentioned in the same sentence (no relationship was extracted).",
    "zh": "{a}与{b}在同一句中被提及（未抽取到关系）。",
    "ja": "{a}と{b}は同じ文で言及されている（関係は抽出されていない）。",
}


def _listed(value: object) -> list[str]:
    if value is None or isinstance(value, float):
        return []
    return [str(v) for v in value]  # type: ignore[union-attr]


def cooccurrence_edges(entities: pd.DataFrame, relationships: pd.DataFrame, text_units: pd.DataFrame, *,
                       weight: float, language: str) -> pd.DataFrame:
    """Weak edges (module docstring), as relationship rows with `co_occurrence = True`, sorted by
    pair; human_readable_id continues after the extracted relationships'."""
    columns = ["id", "human_readable_id", "source", "target", "description", "weight", "combined_degree",
               "text_unit_ids", "co_occurrence"]
    if entities.empty or text_units.empty or weight <= 0:
        return pd.DataFrame(columns=columns)
    related = {frozenset((normalize_name(s), normalize_name(t)))
               for s, t in zip(relationships["source"], relationships["target"])}
    names_in: dict[str, list[tuple[str, list[str], int]]] = defaultdict(list)
    for title, aliases, units, frequency in zip(entities["title"], entities.get("aliases", [None] * len(entities)),
                                                entities["text_unit_ids"], entities["frequency"]):
        for unit in _listed(units):
            names_in[unit].append((str(title), [str(title), *_listed(aliases)], int(frequency or 0)))

    together: dict[tuple[str, str], list[str]] = defaultdict(list)  # (title, title) -> a unit per sentence
    sentences: dict[str, dict[int, list[str]]] = {}  # unit -> sentence -> the titles it names
    for unit_id, text in zip(text_units["id"], text_units["text"]):
        present = names_in.get(str(unit_id))
        if not present or len(present) < 2:
            continue
        unit = UnitText.of(str(text))
        by_sentence: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for title, names, frequency in present:
            for i in set().union(*(sentences_of(n, unit) for n in names)):
                by_sentence[i].append((-frequency, title))
        sentences[str(unit_id)] = {i: [t for _, t in sorted(set(m))[:PAIR_CAP]] for i, m in by_sentence.items()}
        for titles in sentences[str(unit_id)].values():
            for a, b in combinations(sorted(titles, key=normalize_name), 2):
                ka, kb = normalize_name(a), normalize_name(b)
                if ka != kb and frozenset((ka, kb)) not in related:
                    together[(a, b)].append(str(unit_id))

    # An entity still without any edge is alone in its sentences: it is linked to the entities
    # of the nearest sentence of its unit that names some (the text's next or previous thought).
    linked = {normalize_name(x) for pair in related for x in pair} | {
        normalize_name(x) for pair in together for x in pair}
    for unit_id, by_index in sentences.items():
        for i, titles in sorted(by_index.items()):
            for a in titles:
                if normalize_name(a) in linked:
                    continue
                near = sorted((j for j, others in by_index.items() if j != i and others), key=lambda j: (abs(j - i), j))
                for b in (by_index[near[0]] if near else []):
                    if normalize_name(b) != normalize_name(a):
                        together[tuple(sorted((a, b), key=normalize_name))].append(unit_id)  # type: ignore[index]
                linked.add(normalize_name(a))

    degree = dict(zip(entities["title"].astype(str), entities["degree"]))
    template = DESCRIPTIONS.get(language, DESCRIPTIONS["en"])
    start = len(relationships)
    rows = []
    for n, ((a, b), units) in enumerate(sorted(together.items(), key=lambda kv: tuple(map(normalize_name, kv[0])))):
        ka, kb = sorted((normalize_name(a), normalize_name(b)))
        rows.append({
            "id": content_id("relationship", ka, kb), "human_readable_id": start + n, "source": a, "target": b,
            "description": template.format(a=a, b=b), "weight": round(min(MAX_WEIGHT, weight * len(units)), 6),
            "combined_degree": int(degree.get(a, 0) or 0) + int(degree.get(b, 0) or 0),
            "text_unit_ids": sorted(set(units)), "co_occurrence": True,
        })
    return pd.DataFrame(rows, columns=columns)
