"""Paper step 2.3: element instances -> element summaries.

Instances of one entity (same name after trimming, collapsing whitespace and ignoring case) or
one relationship (same unordered pair of entities) merge into one element; when an element has
several distinct descriptions the LLM writes one description from them. Nothing is dropped:
- a name seen with several types is one entity with the majority type; the other types are kept
  in `other_types` (Microsoft silently drops same-title entities of different types);
- a relationship endpoint that was never extracted as an entity becomes an entity described by
  its relationships, typed "date" or "number" when its name is one (grounding.value_type), else
  "unknown" (we do not guess a type; the summarize step counts them in stats as
  `entities_untyped`);
- a summary call that fails keeps the descriptions joined (truncated to the input budget) and
  reports the element's id as failed.
Display names keep their case (the most frequent spelling); Microsoft upper-cases them.
"""
from __future__ import annotations

import asyncio
import hashlib
from itertools import chain
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from ..config import Settings
from ..llm import ChatClient, LLMError
from ..prompts import load_prompt, render
from ..tokens import count_tokens, truncate, within
from .extract import ExtractionResult, clean_name, normalize_name
from .grounding import value_type
from .windows import run_windowed, window_of

try:
    from ..store.tables import content_id
except ImportError:  # pragma: no cover - store/tables.py is written alongside this module
    def content_id(*parts: str) -> str:
        return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()

# Type given to an entity known only as a relationship endpoint.
UNKNOWN_TYPE = "unknown"

ENTITY_COLUMNS = ["id", "human_readable_id", "title", "type", "description", "text_unit_ids", "frequency",
                  "degree", "other_types", "aliases"]
RELATIONSHIP_COLUMNS = ["id", "human_readable_id", "source", "target", "description", "weight",
                        "combined_degree", "text_unit_ids"]
COVARIATE_COLUMNS = ["id", "human_readable_id", "covariate_type", "type", "description", "subject_id",
                     "object_id", "status", "start_date", "end_date", "source_text", "text_unit_id"]


def entity_id(name: str) -> str:
    """Stable id of the entity called `name` (any case/spacing variant gives the same id)."""
    return content_id("entity", normalize_name(name))


def relationship_id(a: str, b: str) -> str:
    """Stable id of the undirected relationship between entities `a` and `b`."""
    x, y = sorted((normalize_name(a), normalize_name(b)))
    return content_id("relationship", x, y)


@dataclass
class MergedEntity:
    key: str
    title: str
    type: str
    other_types: list[str]
    aliases: list[str]             # other spellings seen for this name
    descriptions: list[str]        # unique, non-empty, sorted (stable across reruns and updates)
    text_unit_ids: list[str]
    from_relationships_only: bool = False


@dataclass
class MergedRelationship:
    key: tuple[str, str]           # normalised names, sorted
    descriptions: list[str]
    weight: float
    text_unit_ids: list[str]


@dataclass
class MergedGraph:
    entities: dict[str, MergedEntity] = field(default_factory=dict)
    relationships: dict[tuple[str, str], MergedRelationship] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Elements summarised (the `advance` total of summarize_graph)."""
        return len(self.entities) + len(self.relationships)


def _majority(values: list[str]) -> tuple[str, list[str]]:
    """Most frequent value (ties: first seen) and the others, by frequency then first seen."""
    counts = Counter(values)
    first = {v: i for i, v in reversed(list(enumerate(values)))}
    ordered = sorted(counts, key=lambda v: (-counts[v], first[v]))
    return ordered[0], ordered[1:]


def _unique_sorted(values) -> list[str]:
    return sorted({v for v in (str(x).strip() for x in values) if v})


def merge_instances(extraction: ExtractionResult) -> MergedGraph:
    """Group entity and relationship instances by normalised name / unordered pair (no LLM)."""
    ents = extraction.entities
    rels = extraction.relationships
    spellings: dict[str, list[str]] = {}
    types: dict[str, list[str]] = {}
    descs: dict[str, list[str]] = {}
    units: dict[str, set[str]] = {}
    for title, typ, desc, unit in zip(ents["title"], ents["type"], ents["description"], ents["text_unit_id"]):
        name = clean_name(title)
        if not name:
            continue
        k = normalize_name(name)
        spellings.setdefault(k, []).append(name)
        types.setdefault(k, []).append(str(typ))
        descs.setdefault(k, []).append(str(desc))
        units.setdefault(k, set()).add(str(unit))

    graph = MergedGraph()
    endpoint_spellings: dict[str, list[str]] = {}
    endpoint_descs: dict[str, list[str]] = {}
    # The paper's edge weight is the "normalised count of relationship instances". Here each
    # instance counts with its strength, clamped to 1-10 at extraction: that is the normalisation,
    # and the weight's unit is strength points, as in Microsoft's sum of strengths (no division
    # by a total: Leiden's modularity is the same when every weight is scaled). An instance is
    # one text unit stating the pair: every record of the pair in one unit (either direction, any
    # spelling, any gleaning round) is one instance, with the largest strength given there. A
    # gleaning round restating a relationship says nothing new about the corpus; counting it
    # again would make the weight follow how often the model repeats itself and skew Leiden
    # towards the units that were gleaned. Max rather than mean, so a passing restatement with a
    # lower strength does not weaken what the unit's first pass said.
    strongest: dict[tuple[tuple[str, str], str], float] = {}
    for source, target, desc, strength, unit in zip(rels["source"], rels["target"], rels["description"],
                                                    rels["strength"], rels["text_unit_id"]):
        s, t = clean_name(source), clean_name(target)
        ks, kt = normalize_name(s), normalize_name(t)
        if not ks or not kt or ks == kt:
            continue
        pair = (ks, kt) if ks < kt else (kt, ks)
        rel = graph.relationships.get(pair)
        if rel is None:
            rel = graph.relationships[pair] = MergedRelationship(pair, [], 0.0, [])
        rel.descriptions.append(str(desc))
        instance = (pair, str(unit))
        strongest[instance] = max(strongest.get(instance, float("-inf")), float(strength))
        rel.text_unit_ids.append(str(unit))
        for k, name in ((ks, s), (kt, t)):
            # A text unit whose relationship names an entity mentions that entity.
            units.setdefault(k, set()).add(str(unit))
            endpoint_spellings.setdefault(k, []).append(name)
            endpoint_descs.setdefault(k, []).append(str(desc))
    for (pair, _), strength in strongest.items():
        graph.relationships[pair].weight += strength
    for rel in graph.relationships.values():
        rel.descriptions = _unique_sorted(rel.descriptions)
        rel.text_unit_ids = sorted(set(rel.text_unit_ids))

    for k in list(spellings) + [k for k in endpoint_spellings if k not in spellings]:
        if k in spellings:
            title, aliases = _majority(spellings[k])
            typ, other_types = _majority(types[k])
            description_list = descs[k]
            only_rel = False
        else:
            title, aliases = _majority(endpoint_spellings[k])
            typ, other_types = value_type(title) or UNKNOWN_TYPE, []
            description_list = endpoint_descs[k]
            only_rel = True
        graph.entities[k] = MergedEntity(k, title, typ, other_types, aliases, _unique_sorted(description_list),
                                         sorted(units[k]), only_rel)
    return graph


# -- description summaries ------------------------------------------------------------------------

def _batches_text(parts: list[str]) -> str:
    return "\n".join(f"- {p}" for p in parts)


async def summarize_one(name: str, descriptions: list[str], llm: ChatClient, settings: Settings,
                     template: str) -> tuple[str, bool]:
    """(description, ok). One description is used as is; several are summarised in one call, or
    folded batch by batch (summary so far + the next descriptions) when they exceed the budget."""
    if not descriptions:
        return "", True
    if len(descriptions) == 1:
        return descriptions[0], True
    s = settings.summarize
    budget = settings.summary_input_tokens()
    max_words = max(10, s.max_tokens * 2 // 3)
    pending, sizes = [], []
    for d in descriptions:  # each description encoded once: counted, and cut if over the budget
        cut, tokens = within(d, budget)
        pending.append(cut)
        sizes.append(tokens + 2)  # + the "- " bullet and newline
    summary: str | None = None
    i = 0
    try:
        while i < len(pending):
            batch: list[str] = []
            used = 0
            if summary is not None:
                # Leave at least half the budget for new descriptions so every round makes progress.
                carried = truncate(summary, budget // 2)
                batch.append(carried)
                used = count_tokens(carried) + 2
            while i < len(pending) and used + sizes[i] <= budget:
                batch.append(pending[i])
                used += sizes[i]
                i += 1
            if i < len(pending) and len(batch) == (summary is not None):
                # Not even one new description fits beside the carried summary: take a cut of it.
                batch.append(truncate(pending[i], max(1, budget - used - 2)))
                i += 1
            prompt = render(template, name=name, max_words=max_words, descriptions=_batches_text(batch))
            summary = (await llm.complete([{"role": "user", "content": prompt}], step="summarize", item=name,
                                          max_tokens=s.max_tokens)).strip()
    except LLMError:
        return truncate("\n".join(descriptions), budget), False
    return summary or truncate("\n".join(descriptions), budget), True


def graph_shape(graph: MergedGraph) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The merged graph's entities (title, aliases, text_unit_ids, frequency, degree) and
    relationships (source, target) as the summarised tables will have them, before any
    description is written: what the co-occurrence edges need, so they can be computed while
    the summaries are."""
    degree: dict[str, int] = {k: 0 for k in graph.entities}
    for a, b in graph.relationships:
        degree[a] += 1
        degree[b] += 1
    entities = sorted(graph.entities.values(), key=lambda e: (e.key, e.title))
    title_of = {e.key: e.title for e in entities}
    ents = pd.DataFrame({"title": [e.title for e in entities], "aliases": [e.aliases for e in entities],
                         "text_unit_ids": [e.text_unit_ids for e in entities],
                         "frequency": [len(e.text_unit_ids) for e in entities],
                         "degree": [degree[e.key] for e in entities]})
    pairs = sorted(graph.relationships)
    rels = pd.DataFrame({"source": [title_of[a] for a, _ in pairs], "target": [title_of[b] for _, b in pairs]})
    return ents, rels


async def summarize_graph(extraction: ExtractionResult, text_units: pd.DataFrame, llm: ChatClient, *,
                          settings: Settings, language: str,
                          advance: Callable[[int], None] | None = None, graph: MergedGraph | None = None,
                          elsewhere: Callable[..., list[tuple[str, bool]]] | None = None,
                          ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """Merged entities, relationships and covariates (claims), plus the ids of the entities and
    relationships whose summary call failed (they keep their joined descriptions).

    `advance(1)` is called once per merged entity and relationship (`merge_instances(...).size`
    in all), whether or not it needed an LLM call. `graph`: `merge_instances(extraction)` when
    the caller already has it. `elsewhere(items, advance=...)`: summarize_one's result for each
    (name, descriptions) that needs a call, in order, computed elsewhere (on a Ray cluster:
    ray_data.summarize_on_ray); this process then makes no summary call itself."""
    graph = graph if graph is not None else merge_instances(extraction)
    template = load_prompt("summarize_descriptions", language, settings.root)
    entities = sorted(graph.entities.values(), key=lambda e: (e.key, e.title))
    relationships = sorted(graph.relationships.values(), key=lambda r: r.key)
    title_of = {e.key: e.title for e in entities}

    async def one(name: str, descriptions: list[str]) -> tuple[str, bool]:
        try:
            return await summarize_one(name, descriptions, llm, settings, template)
        finally:
            if advance:
                advance(1)

    # A few elements per request slot in progress at once (windows.py), in the order a
    # gather over all of them would start them.
    results: list[tuple[str, bool]] = [("", True)] * (len(entities) + len(relationships))
    items = chain(((e.title, e.descriptions) for e in entities),
                  ((f"{title_of[r.key[0]]} -> {title_of[r.key[1]]}", r.descriptions) for r in relationships))

    def finished(position: int, result: tuple[str, bool]) -> None:
        results[position] = result

    if elsewhere is None:
        await run_windowed(items, lambda item: one(*item), window=window_of(llm), done=finished)
    else:
        # Only the elements with several descriptions need a call; the others keep theirs here.
        needed = []
        for n, (name, descriptions) in enumerate(items):
            if len(descriptions) > 1:
                needed.append((n, name, descriptions))
            else:
                results[n] = (descriptions[0] if descriptions else "", True)
                if advance:
                    advance(1)
        done = await asyncio.to_thread(elsewhere, [(name, d) for _, name, d in needed], advance=advance)
        for (n, _, _), result in zip(needed, done):
            results[n] = result
    entity_results, relationship_results = results[:len(entities)], results[len(entities):]

    neighbours: dict[str, set[str]] = {e.key: set() for e in entities}
    for r in relationships:
        neighbours[r.key[0]].add(r.key[1])
        neighbours[r.key[1]].add(r.key[0])
    degree = {k: len(v) for k, v in neighbours.items()}

    failed: list[str] = []
    entity_rows = []
    for n, (e, (description, ok)) in enumerate(zip(entities, entity_results)):
        eid = content_id("entity", e.key)
        if not ok:
            failed.append(eid)
        entity_rows.append({
            "id": eid, "human_readable_id": n, "title": e.title, "type": e.type, "description": description,
            "text_unit_ids": e.text_unit_ids, "frequency": len(e.text_unit_ids), "degree": degree[e.key],
            "other_types": e.other_types, "aliases": e.aliases,
        })
    relationship_rows = []
    for n, (r, (description, ok)) in enumerate(zip(relationships, relationship_results)):
        rid = content_id("relationship", *r.key)
        if not ok:
            failed.append(rid)
        relationship_rows.append({
            "id": rid, "human_readable_id": n, "source": title_of[r.key[0]], "target": title_of[r.key[1]],
            "description": description, "weight": r.weight,
            "combined_degree": degree[r.key[0]] + degree[r.key[1]], "text_unit_ids": r.text_unit_ids,
        })
    covariates = _covariates(extraction.claims, text_units, title_of)
    return (pd.DataFrame(entity_rows, columns=ENTITY_COLUMNS),
            pd.DataFrame(relationship_rows, columns=RELATIONSHIP_COLUMNS),
            covariates, failed)


def _covariates(claims: pd.DataFrame, text_units: pd.DataFrame, title_of: dict[str, str]) -> pd.DataFrame:
    """Claim instances as Microsoft's covariates table. Subjects and objects that name an entity
    take the entity's display title; exact duplicates within one text unit (a gleaning round
    repeating a claim) are kept once."""
    if claims is None or claims.empty:
        return pd.DataFrame(columns=COVARIATE_COLUMNS)
    unit_order = {str(u): i for i, u in enumerate(text_units["id"])} if "id" in text_units else {}
    rows = []
    seen: set[str] = set()
    for pos, c in enumerate(claims.to_dict("records")):
        subject = clean_name(c["subject"])
        obj = clean_name(c.get("object") or "")
        subject = title_of.get(normalize_name(subject), subject)
        obj = title_of.get(normalize_name(obj), obj) if obj else None
        unit = str(c["text_unit_id"])
        fields = [unit, normalize_name(subject), normalize_name(obj or ""), str(c["type"]).strip(),
                  str(c["status"]), str(c.get("start_date") or ""), str(c.get("end_date") or ""),
                  str(c["description"]).strip(), str(c.get("source_text") or "").strip()]
        cid = content_id("claim", *fields)
        if cid in seen:
            continue
        seen.add(cid)
        rows.append({
            "id": cid, "covariate_type": "claim", "type": fields[3], "description": fields[7],
            "subject_id": subject, "object_id": obj, "status": fields[4],
            "start_date": fields[5] or None, "end_date": fields[6] or None, "source_text": fields[8],
            "text_unit_id": unit, "_order": (unit_order.get(unit, len(unit_order)), pos),
        })
    rows.sort(key=lambda r: r["_order"])
    for n, r in enumerate(rows):
        r.pop("_order")
        r["human_readable_id"] = n
    df = pd.DataFrame(rows, columns=COVARIATE_COLUMNS)
    # Missing object/dates are None (null in parquet), not the NaN pandas puts in by default.
    for col in ("object_id", "start_date", "end_date"):
        df[col] = pd.Series([r[col] for r in rows], dtype=object, index=df.index)
    return df
