"""Entity resolution (opt-in): one entity known under several names becomes one entity.

Extraction merges instances only by exact name (after case and spacing), so "Scrooge",
"Ebenezer Scrooge" and "Mr. Scrooge" are three nodes, and "孙悟空" / "美猴王" / "Sun Wukong" too.
Here, after the summaries (paper step 2.3) and before clustering:

1. Candidates, cheaply and without the LLM, from blocks of entities that share a name word (or,
   for Han names, a two-character run) or are near neighbours by the embedding of their
   descriptions; a pair is a candidate when
   - its names are alike (containment of name words, e.g. "Holmes" in "Sherlock Holmes", or a
     character ratio; honorifics such as "Mr." are ignored for the comparison), or
   - one description names the other as an alias ("also known as X", "X (Y)", "又名X"), or
   - its descriptions are very close (cosine) and the two share neighbours or a name part
     (this is what finds "Sun Wukong" / "孙悟空": nothing in the names matches).
2. Decision: names that differ only in case, punctuation or spacing, or an alias statement, with
   the same type, merge without asking. Every other candidate, and every pair of different
   types, is asked to the chat model as a structured yes/no (prompt `resolve_entities`), at most
   `max_llm_checks` per run, most likely first; an unasked pair is not merged.
3. Merge (union-find over confirmed pairs): the most frequent name is kept (id included), every
   other name goes to `aliases`, other types to `other_types`, the ids to `merged_ids`; text
   units are united (all provenance is kept); the descriptions are summarised again; the
   relationships are re-pointed, pairs that now coincide are merged (see `combined_weight`)
   and an edge between two merged names is dropped (its text units stay with the entity).

Nothing is lost silently: a confirmation, a summary or an embedding batch that fails after every
retry is a failed item (`resolve:confirm:<id>+<id>`, `resolve:summary:<id>`,
`resolve:embedding:<entity id>`) of the step that runs resolution, so the run ends with its
failures listed and the step is not marked finished: the rerun resolves again (what succeeded
comes from the answer cache). A pair whose confirmation failed is not merged in this run.
The LLM items (embedding batches, confirmations, summaries) run in bounded windows
(windows.py), as every other step's do.

Everything is a function of the tables, the cached embeddings and the cached answers, so an
updated index and a fresh one resolve alike.
"""
from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from pydantic import BaseModel

from ..config import Settings
from ..llm import LLMError
from ..prompts import load_prompt, render, to_messages
from ..store.tables import content_id
from ..tokens import truncate
from .extract import normalize_name
from .windows import run_windowed, window_of

STEP = "resolve"
HONORIFICS = {"mr", "mrs", "ms", "miss", "mister", "master", "dr", "sir", "lady", "lord", "madam", "madame",
              "dame", "st", "saint", "the", "old", "young", "little", "uncle", "aunt", "captain", "prof",
              "professor", "先生", "女士", "小姐", "老"}
ALIAS_CUES = re.compile(
    r"(?:also known as|also called|a\.k\.a\.?|\baka\b|\balias\b|nicknamed|又名|又称|也叫|别名|别称|人称|绰号)"
    r"\s*[\"“'‘「]?([^\"”'’」,.;:!?()（）\[\]，。；：！？、]{1,40})")
PARENTHESIS = re.compile(r"([^()（）,.;，。；]{1,40}?)\s*[（(]\s*([^()（）]{1,40}?)\s*[)）]")
HAN = re.compile(r"[\u3400-\u9fff]")
BLOCK_LIMIT = 60      # a name word shared by more entities than this is too common to block on
NEIGHBOURS_K = 8      # embedding neighbours considered per entity
MUTUAL_K = 3          # description-only candidates must be among each other's 3 nearest
DESCRIPTION_CHARS = 600


class SameEntity(BaseModel):
    same: bool
    reason: str


@dataclass
class Candidate:
    a: str                # entity ids, a < b
    b: str
    title_a: str
    title_b: str
    type_a: str
    type_b: str
    name_similarity: float
    description_similarity: float | None
    shared_neighbours: float
    alias: bool
    decision: str = ""    # auto | asked | skipped | failed (the confirmation call failed)
    same: bool = False
    reason: str = ""

    @property
    def score(self) -> float:
        return max(self.name_similarity, 1.0 if self.alias else 0.0) + (self.description_similarity or 0) \
            + self.shared_neighbours


@dataclass
class Resolution:
    candidates: list[Candidate] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)   # entity ids; the kept one first
    titles: dict[str, str] = field(default_factory=dict)    # id -> title
    llm_checks: int = 0
    failed: list[str] = field(default_factory=list)         # items that failed (see the module doc)

    def merges(self) -> list[dict[str, Any]]:
        return [{"keep": self.titles[g[0]], "merged": [self.titles[i] for i in g[1:]]} for g in self.groups]

    def summary(self) -> dict[str, Any]:
        return {"candidates": len(self.candidates), "auto": sum(c.decision == "auto" for c in self.candidates),
                "asked": sum(c.decision == "asked" for c in self.candidates),
                "confirmed": sum(c.same for c in self.candidates),
                "skipped": sum(c.decision == "skipped" for c in self.candidates),
                "failed": len(self.failed),
                "groups": len(self.groups), "entities_merged": sum(len(g) - 1 for g in self.groups),
                "merges_sample": self.merges()[:20]}


# -- names --------------------------------------------------------------------------------------

def _fold(name: str) -> str:
    return unicodedata.normalize("NFKC", str(name)).casefold()


def name_key(name: str) -> str:
    """Case, punctuation and spacing removed: "Mr. Fezziwig" == "Mr Fezziwig", "孙 悟空" == "孙悟空"."""
    return "".join(ch for ch in _fold(name) if ch.isalnum())


MALE = {"mr", "mister", "sir", "lord", "master"}
FEMALE = {"mrs", "ms", "miss", "lady", "madam", "madame", "dame", "女士", "小姐"}
POSSESSIVE = re.compile(r"(\w+)['’]s\b")


def name_words(name: str) -> list[str]:
    """Words without honorifics or possessive endings; Han runs stay whole (compared by characters)."""
    words = [w for w in re.findall(r"\w+", POSSESSIVE.sub(r"\1", _fold(name))) if len(w) > 1 or HAN.match(w)]
    core = [w for w in words if w not in HONORIFICS]
    return core or words


def _conflict(a: str, b: str) -> bool:
    """Names that cannot be one entity whatever the words say: "Mr. X" / "Mrs. X", or
    "Belle" / "Belle's daughter" (a possessive names something of the other)."""
    wa, wb = set(re.findall(r"\w+", _fold(a))), set(re.findall(r"\w+", _fold(b)))
    if (wa & MALE and wb & FEMALE) or (wa & FEMALE and wb & MALE):
        return True
    if ("mrs" in wa and "miss" in wb) or ("miss" in wa and "mrs" in wb):
        return True  # Mrs. Fezziwig is not one of the Miss Fezziwigs
    for x, y in ((a, b), (b, a)):
        owners = {m.group(1) for m in POSSESSIVE.finditer(_fold(x))}
        if owners and set(name_words(y)) <= owners | HONORIFICS:
            return True
    return False


def _blocks_of(name: str) -> set[str]:
    keys = {w for w in name_words(name) if len(w) >= 3 or HAN.search(w)}
    for w in name_words(name):
        han = "".join(HAN.findall(w))
        keys |= {han[i:i + 2] for i in range(len(han) - 1)}
    return keys


def name_similarity(a: str, b: str) -> float:
    """1.0 for the same key; 0.9 when all name words of one are in the other ("Holmes" /
    "Sherlock Holmes", "悟空" / "孙悟空"); otherwise a character ratio of the name words."""
    ka, kb = name_key(a), name_key(b)
    if not ka or not kb:
        return 0.0
    if ka == kb:
        return 1.0
    if _conflict(a, b):
        return 0.3
    articles = {"the", "a", "an"}
    if [w for w in re.findall(r"\w+", _fold(a)) if w not in articles] == \
            [w for w in re.findall(r"\w+", _fold(b)) if w not in articles]:
        return 1.0  # "The Plump Sister" / "Plump Sister"
    wa, wb = name_words(a), name_words(b)
    sa, sb = " ".join(wa), " ".join(wb)
    if set(wa) <= set(wb) or set(wb) <= set(wa):
        return 0.9
    han_a, han_b = "".join(HAN.findall(sa)), "".join(HAN.findall(sb))
    if len(han_a) >= 2 and len(han_b) >= 2 and (han_a in han_b or han_b in han_a):
        return 0.9
    return SequenceMatcher(None, sa, sb).ratio()


def _alias_mentions(description: str, own: str) -> set[str]:
    """Names a description of `own` gives as its aliases: "also known as X", "又名X", and
    "<own name> (X)" or "X (<own name>)" (a parenthesis elsewhere is not an alias)."""
    out = {name_key(m.group(1)) for m in ALIAS_CUES.finditer(description)}
    me = name_key(own)
    for m in PARENTHESIS.finditer(description):
        before, inside = m.group(1).strip(), m.group(2).strip()
        if name_key(inside) == me:
            out.add(name_key(before))
        elif before and (name_key(before) == me or _fold(before).endswith(_fold(own))):
            out.add(name_key(inside))
    return {k for k in out if k and k != me}


# -- candidates ---------------------------------------------------------------------------------

def _neighbours(relationships: pd.DataFrame) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for s, t in zip(relationships["source"].astype(str), relationships["target"].astype(str)):
        ks, kt = normalize_name(s), normalize_name(t)
        out[ks].add(kt)
        out[kt].add(ks)
    return out


def find_candidates(entities: pd.DataFrame, relationships: pd.DataFrame, vectors: np.ndarray | None,
                    settings: Settings) -> list[Candidate]:
    """Candidate duplicate pairs (no LLM). `vectors`: one L2-normalised row per entity (title:
    description), or None to skip description similarity."""
    rs = settings.resolution
    ents = entities.reset_index(drop=True)
    titles = [str(t) for t in ents["title"]]
    ids = [str(i) for i in ents["id"]]
    types = [str(t or "") for t in ents["type"]] if "type" in ents else [""] * len(ents)
    descs = [str(d or "") for d in ents["description"]]
    keys = [normalize_name(t) for t in titles]
    nbrs = _neighbours(relationships) if not relationships.empty else {}
    key_index: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(titles):
        key_index[name_key(t)].append(i)
        for alias in (ents["aliases"][i] if "aliases" in ents and isinstance(ents["aliases"][i], list) else []):
            key_index[name_key(alias)].append(i)

    word_df: dict[str, int] = defaultdict(int)  # in how many entity names each name word occurs
    for t in titles:
        for w in set(name_words(t)):
            word_df[w] += 1
    pairs: set[tuple[int, int]] = set()
    blocks: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(titles):
        for b in _blocks_of(t):
            blocks[b].append(i)
    for members in blocks.values():
        if len(members) <= BLOCK_LIMIT:
            pairs |= {(x, y) for n, x in enumerate(members) for y in members[n + 1:]}
    alias_pairs: set[tuple[int, int]] = set()
    for i, d in enumerate(descs):
        for k in _alias_mentions(d, titles[i]):
            for j in key_index.get(k, []):
                if j != i:
                    alias_pairs.add((min(i, j), max(i, j)))
    pairs |= alias_pairs
    sims: dict[tuple[int, int], float] = {}
    mutual: set[tuple[int, int]] = set()  # each among the other's nearest descriptions
    if vectors is not None and len(vectors) == len(ents) and len(ents) > 1:
        k = min(NEIGHBOURS_K, len(ents) - 1)
        near: dict[int, set[int]] = {}
        for start in range(0, len(ents), 512):
            block = vectors[start:start + 512] @ vectors.T
            for row, scores in enumerate(block):
                i = start + row
                scores[i] = -1
                top = [int(j) for j in np.argpartition(-scores, k - 1)[:k]]
                near[i] = set(sorted(top, key=lambda j: -scores[j])[:MUTUAL_K])
                for j in top:
                    pair = (min(i, j), max(i, j))
                    pairs.add(pair)
                    sims[pair] = float(scores[j])
        mutual = {(i, j) for i, js in near.items() for j in js if i < j and i in near.get(j, set())}

    out = []
    for i, j in sorted(pairs):
        ns = name_similarity(titles[i], titles[j])
        if (i, j) in sims:
            ds: float | None = sims[(i, j)]
        elif vectors is not None and len(vectors) == len(ents):
            ds = float(vectors[i] @ vectors[j])
        else:
            ds = None
        a, b = nbrs.get(keys[i], set()) - {keys[j]}, nbrs.get(keys[j], set()) - {keys[i]}
        shared = len(a & b) / len(a | b) if a | b else 0.0
        if len(a & b) < 2:
            shared = min(shared, 0.15)  # two leaves of one hub ("Bedroom", "Closet" of Scrooge) prove little
        alias = (i, j) in alias_pairs
        shares_name = ns >= 0.5 or shared >= 0.2
        if ns == 0.9 and not alias:
            # "Holmes" in "Sherlock Holmes" is a candidate; "Street" in "Next Street" is not: a
            # contained name needs a rare word (few entities carry it), shared neighbours or
            # close descriptions.
            shorter = min((titles[i], titles[j]), key=lambda t: len(name_words(t)))
            rare = any(word_df.get(w, 0) <= 2 for w in name_words(shorter))
            if not (rare or shared >= 0.1 or (ds is not None and ds >= rs.description_similarity)):
                continue
        # A character ratio alone ("Paragraph 1.E.7" / "Paragraph 1.E.8") also needs a shared
        # neighbour; containment (0.9) and equal keys (1.0) passed their own test above.
        ns_ok = ns >= 0.9 or (ns >= rs.name_similarity and shared >= 0.1)
        # Embedding scores of short descriptions are crowded (most pairs of one book score
        # 0.85-0.95 with small models), so closeness alone counts only between mutual nearest
        # neighbours that also share a name part or neighbours.
        close = ds is not None and ds >= rs.description_similarity and (i, j) in mutual and shares_name
        if not (ns_ok or alias or close):
            continue
        x, y = (i, j) if ids[i] < ids[j] else (j, i)
        out.append(Candidate(ids[x], ids[y], titles[x], titles[y], types[x], types[y], round(ns, 3),
                             None if ds is None else round(ds, 3), round(shared, 3), alias))
    return out


def _clear(c: Candidate) -> bool:
    """Merged without asking: same type and names equal but for case, punctuation, spacing or
    an article, or a description that states the alias."""
    return c.type_a == c.type_b and (c.name_similarity >= 1.0 or c.alias)


async def decide(candidates: list[Candidate], entities: pd.DataFrame, relationships: pd.DataFrame, llm,
                 *, settings: Settings, language: str) -> int:
    """Fill in decision/same/reason; returns the LLM calls made."""
    rs = settings.resolution
    template = load_prompt("resolve_entities", language, settings.root) if llm is not None else ""
    info = {str(r["id"]): r for r in entities.to_dict("records")}
    nbrs = _neighbours(relationships) if not relationships.empty else {}
    title_of_key = {normalize_name(t): str(t) for t in entities["title"]}
    asked: list[Candidate] = []
    for c in candidates:
        if _clear(c):
            c.decision, c.same, c.reason = "auto", True, "same name but for case, punctuation or spacing" \
                if c.name_similarity >= 1.0 else "a description gives one name as an alias of the other"
        else:
            asked.append(c)
    asked.sort(key=lambda c: (-c.score, c.a, c.b))
    budget = rs.max_llm_checks if llm is not None else 0
    for c in asked[budget:]:
        c.decision, c.reason = "skipped", "over max_llm_checks (or no chat model): not merged"

    def side(eid: str) -> dict[str, str]:
        r = info[eid]
        near = sorted(title_of_key.get(k, k) for k in nbrs.get(normalize_name(str(r["title"])), set()))[:10]
        return {"name": str(r["title"]), "type": str(r.get("type") or ""),
                "description": truncate(str(r.get("description") or ""), 300), "neighbours": ", ".join(near) or "-"}

    async def ask(c: Candidate) -> None:
        a, b = side(c.a), side(c.b)
        messages = to_messages(render(template, name_a=a["name"], type_a=a["type"], description_a=a["description"],
                                      neighbours_a=a["neighbours"], name_b=b["name"], type_b=b["type"],
                                      description_b=b["description"], neighbours_b=b["neighbours"]))
        try:
            reply = await llm.structured(messages, SameEntity, step=STEP, item=f"{a['name']} / {b['name']}",
                                         max_tokens=rs.max_tokens)
        except LLMError as exc:
            # Not a "no": nobody answered. The pair is a failed item (confirm_id), so the run
            # reports it and the rerun asks again; until then it is not merged.
            c.decision, c.same = "failed", False
            c.reason = f"confirmation failed ({str(exc)[:200]}): not merged in this run, asked again on the rerun"
            return
        c.decision, c.same, c.reason = "asked", bool(reply.same), reply.reason.strip()

    # A few pairs per request slot in flight (windows.py), most likely first, as other steps do.
    await run_windowed(asked[:budget], ask, window=window_of(llm), done=lambda position, result: None)
    return min(len(asked), budget)


def confirm_id(c: Candidate) -> str:
    """The failed-item id of a candidate whose confirmation call failed."""
    return f"{STEP}:confirm:{c.a}+{c.b}"


def group(candidates: list[Candidate], entities: pd.DataFrame) -> list[list[str]]:
    """Union-find over confirmed pairs; in each group the most frequent entity comes first
    (ties: the longer title, then the smaller human_readable_id)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for c in candidates:
        if c.same:
            ra, rb = find(c.a), find(c.b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    members: dict[str, list[str]] = defaultdict(list)
    for x in {x for c in candidates if c.same for x in (c.a, c.b)}:
        members[find(x)].append(x)
    rank = {str(r["id"]): (-int(r.get("frequency") or len(r.get("text_unit_ids") or [])), -len(str(r["title"])),
                            int(r.get("human_readable_id") or 0)) for r in entities.to_dict("records")}
    groups = [sorted(m, key=lambda x: rank.get(x, (0, 0, 0))) for m in members.values() if len(m) > 1]
    return sorted(groups, key=lambda g: rank.get(g[0], (0, 0, 0)))


# -- merging ------------------------------------------------------------------------------------

def _as_list(v: Any) -> list:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return []
    return list(v)


def combined_weight(relationships: list[dict[str, Any]]) -> float:
    """The weight of one edge made of relationships that coincide after a merge ("Holmes" -
    "Watson" and "Sherlock Holmes" - "Watson").

    The rule is the one of summarize.merge_instances: an instance is one text unit stating the
    pair, counted once with the largest strength given there. Two relationships observed in the
    same text unit are one observation of the merged pair, so that unit must not count twice;
    units seen by only one of them add up as before. The tables keep an edge's total weight and
    its text units, not the strength per unit, so each edge's weight is taken as spread evenly
    over its units (weight / number of units) and a shared unit counts with the largest share:

        weight = sum over the union of the units of max(share of each edge that has the unit)

    which is the plain sum when no unit is shared (computed so, exactly) and never more than
    it. An edge without text units has nothing to compare: its weight is added whole."""
    total = 0.0
    shares: dict[str, list[float]] = defaultdict(list)
    for r in relationships:
        weight = float(r.get("weight") or 0)
        total += weight
        units = set(map(str, _as_list(r.get("text_unit_ids"))))
        for u in units:
            shares[u].append(weight / len(units))
    # every unit's shares were all added above; take back all but the largest where several edges have it
    return total - sum(sum(s) - max(s) for s in shares.values() if len(s) > 1)


def summary_id(element_id: str) -> str:
    """The failed-item id of a merged entity or relationship whose new summary failed."""
    return f"{STEP}:summary:{element_id}"


async def merge(entities: pd.DataFrame, relationships: pd.DataFrame, covariates: pd.DataFrame,
                groups: list[list[str]], llm, *, settings: Settings, language: str,
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """Apply the merges; descriptions of merged entities and relationships are summarised again
    (through the cache) when an LLM is given, else joined. Returns the tables and the failed
    items: merged elements whose summary call failed (they keep their joined descriptions)."""
    from .summarize import summarize_one

    if not groups:
        return entities, relationships, covariates, []
    template = load_prompt("summarize_descriptions", language, settings.root)
    rows = {str(r["id"]): r for r in entities.to_dict("records")}
    kept_of: dict[str, str] = {}
    for g in groups:
        for x in g:
            kept_of[x] = g[0]
    title_map = {str(rows[x]["title"]): str(rows[kept_of[x]]["title"]) for x in kept_of}
    failed: list[str] = []

    async def describe(name: str, descriptions: list[str], element_id: str) -> str:
        descriptions = sorted({d.strip() for d in descriptions if d and d.strip()})
        if llm is None or len(descriptions) <= 1:
            return "\n".join(descriptions)
        text, ok = await summarize_one(name, descriptions, llm, settings, template)
        if not ok:
            failed.append(summary_id(element_id))
        return text

    async def merged_entity(g: list[str]) -> dict[str, Any]:
        keep = dict(rows[g[0]])
        others = [rows[x] for x in g[1:]]
        aliases = list(dict.fromkeys([*_as_list(keep.get("aliases")), *(str(o["title"]) for o in others),
                                      *(a for o in others for a in _as_list(o.get("aliases")))]))
        types = [str(o.get("type") or "") for o in others] + [t for o in [keep, *others] for t in _as_list(o.get("other_types"))]
        keep["aliases"] = [a for a in aliases if a != keep["title"]]
        keep["other_types"] = sorted({t for t in types if t and t != keep.get("type")})
        keep["text_unit_ids"] = sorted({u for o in [keep, *others] for u in _as_list(o.get("text_unit_ids"))})
        keep["frequency"] = len(keep["text_unit_ids"])
        keep["merged_ids"] = sorted(g[1:])
        keep["description"] = await describe(str(keep["title"]), [str(o.get("description") or "")
                                                                  for o in [keep, *others]], str(keep["id"]))
        return keep

    window = window_of(llm)
    merged: list[dict[str, Any]] = [{}] * len(groups)

    def entity_done(position: int, row: dict[str, Any]) -> None:
        merged[position] = row

    await run_windowed(groups, merged_entity, window=window, done=entity_done)
    by_kept = {m["id"]: m for m in merged}
    ent_rows = []
    for r in entities.to_dict("records"):
        i = str(r["id"])
        if i in kept_of and kept_of[i] != i:
            continue
        row = by_kept.get(i, dict(r))
        row.setdefault("merged_ids", [])
        ent_rows.append(row)

    # relationships: re-point, drop the ones inside a group, merge pairs that now coincide
    rel_groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in relationships.to_dict("records"):
        s, t = title_map.get(str(r["source"]), str(r["source"])), title_map.get(str(r["target"]), str(r["target"]))
        if normalize_name(s) == normalize_name(t):
            continue
        r = dict(r, source=s, target=t)
        ks, kt = sorted((normalize_name(s), normalize_name(t)))
        rel_groups[(ks, kt)].append(r)

    async def merged_rel(key: tuple[str, str]) -> dict[str, Any]:
        rs = rel_groups[key]
        first = dict(rs[0])
        first["id"] = content_id("relationship", *key)
        if len(rs) > 1:
            first["weight"] = combined_weight(rs)
            first["text_unit_ids"] = sorted({u for x in rs for u in _as_list(x.get("text_unit_ids"))})
            first["description"] = await describe(f"{first['source']} -> {first['target']}",
                                                  [str(x.get("description") or "") for x in rs], first["id"])
        return first

    keys = sorted(rel_groups)
    rel_rows: list[dict[str, Any]] = [{}] * len(keys)

    def rel_done(position: int, row: dict[str, Any]) -> None:
        rel_rows[position] = row

    # Only the pairs that coincide make a call; the others pass straight through their lane.
    await run_windowed(keys, merged_rel, window=window, done=rel_done)
    degree: dict[str, int] = defaultdict(int)
    for r in rel_rows:
        degree[normalize_name(r["source"])] += 1
        degree[normalize_name(r["target"])] += 1
    for n, r in enumerate(rel_rows):
        r["human_readable_id"] = n
        r["combined_degree"] = degree[normalize_name(r["source"])] + degree[normalize_name(r["target"])]
    for n, r in enumerate(ent_rows):
        r["human_readable_id"] = n
        r["degree"] = degree[normalize_name(str(r["title"]))]
    ents = pd.DataFrame(ent_rows, columns=[*entities.columns, *(["merged_ids"] if "merged_ids" not in entities else [])])
    rels = pd.DataFrame(rel_rows, columns=relationships.columns)
    covs = covariates.copy()
    if not covs.empty:
        covs["subject_id"] = [title_map.get(str(s), s) for s in covs["subject_id"]]
        covs["object_id"] = [title_map.get(str(o), o) if o is not None else None for o in covs["object_id"]]
    return ents, rels, covs, sorted(failed)


# -- entry points -------------------------------------------------------------------------------

EMBEDDING_BATCH = 64  # texts per embedding call when the embedder does not say


def embedding_id(entity_id: str) -> str:
    """The failed-item id of an entity whose description embedding failed."""
    return f"{STEP}:embedding:{entity_id}"


async def _vectors(entities: pd.DataFrame, embedder) -> tuple[np.ndarray | None, list[str]]:
    """One L2-normalised row per entity, and the failed items: the entities of every batch whose
    embedding failed after every retry. Their rows are zeros (close to nothing), so names and
    aliases still find their candidates in this run; the rerun embeds them again. None when
    there is no embedder or no batch could be embedded."""
    if embedder is None or entities.empty:
        return None, []
    ids = [str(i) for i in entities["id"]]
    texts = [f"{t}: {truncate(str(d or ''), 200)}"[:DESCRIPTION_CHARS]
             for t, d in zip(entities["title"], entities["description"])]
    size = max(1, int(getattr(getattr(embedder, "settings", None), "batch_size", 0) or EMBEDDING_BATCH))
    batches = [range(start, min(start + size, len(texts))) for start in range(0, len(texts), size)]
    parts: list[np.ndarray | None] = [None] * len(batches)

    async def one(rows: range) -> np.ndarray | None:
        try:
            return await embedder.embed([texts[i] for i in rows], kind="passage", step=STEP)
        except LLMError:
            return None

    def done(position: int, vectors: np.ndarray | None) -> None:
        parts[position] = vectors

    # One call per batch, a few per request slot in flight (windows.py).
    await run_windowed(batches, one, window=window_of(embedder), done=done)
    failed = [embedding_id(ids[i]) for rows, part in zip(batches, parts) if part is None for i in rows]
    dim = next((p.shape[1] for p in parts if p is not None and p.ndim == 2), None)
    if dim is None:
        return None, failed
    vectors = np.zeros((len(texts), dim), dtype=np.float32)
    for rows, part in zip(batches, parts):
        if part is not None:
            vectors[rows.start:rows.stop] = part
    return vectors, failed


async def resolve_entities(entities: pd.DataFrame, relationships: pd.DataFrame, llm, embedder, *,
                           settings: Settings, language: str) -> Resolution:
    """Candidates, decisions and merge groups (the tables are not changed); `failed` lists the
    embeddings and confirmations that failed."""
    vectors, failed = await _vectors(entities, embedder)
    candidates = find_candidates(entities, relationships, vectors, settings)
    checks = await decide(candidates, entities, relationships, llm, settings=settings, language=language)
    failed += [confirm_id(c) for c in candidates if c.decision == "failed"]
    return Resolution(candidates, group(candidates, entities),
                      {str(i): str(t) for i, t in zip(entities["id"], entities["title"])}, checks, failed)


async def resolve_in_pipeline(entities, relationships, covariates, llm, embedder, *, settings: Settings,
                              language: str):
    """Called by the summarize step when resolution.enabled: merged tables, a summary for
    stats.json and the failed items (the step reports them, and is redone by the rerun)."""
    res = await resolve_entities(entities, relationships, llm, embedder, settings=settings, language=language)
    ents, rels, covs, failed = await merge(entities, relationships, covariates, res.groups, llm, settings=settings,
                                           language=language)
    res.failed += failed
    return ents, rels, covs, res.summary(), res.failed


async def resolve_index(settings: Settings, *, index_dir: str | None = None, dry_run: bool = True,
                        log: Callable[[str], None] = print) -> Resolution:
    """`sensegraph resolve`: find the merges for an index folder (ours or Microsoft's)."""
    from ..language import resolve_language
    from ..llm import Usage, open_cache, open_chat, open_embedder
    from ..store.tables import has_table, read_table

    folder = Path(index_dir) if index_dir else settings.path(settings.output_dir)
    if not has_table(folder, "entities"):
        raise FileNotFoundError(f"no entities table in {folder}; run `sensegraph index` first")
    entities = read_table(folder, "entities")
    relationships = read_table(folder, "relationships") if has_table(folder, "relationships") else \
        pd.DataFrame(columns=["source", "target"])
    if not index_dir and settings.resolution.enabled:
        log("note: resolution.enabled is true, so the index is already resolved; listing what is left")
    language = resolve_language(settings.language, entities["description"].astype(str).head(200))
    usage = Usage()
    cache = open_cache(settings, None)
    llm = open_chat(settings, cache=cache, usage=usage)
    embedder = open_embedder(settings, cache=cache, usage=usage)
    try:
        res = await resolve_entities(entities, relationships, llm, embedder, settings=settings, language=language)
    finally:
        await llm.aclose()
        await embedder.aclose()
        if cache is not None:
            cache.close()
    res.usage = usage.as_dict()  # type: ignore[attr-defined]
    if res.failed:
        shown = ", ".join(res.failed[:5]) + (" …" if len(res.failed) > 5 else "")
        log(f"warning: {len(res.failed)} resolution calls failed after every retry ({shown}); the pairs "
            "they concern are not merged in this listing: run it again to retry them (answers received "
            "come from the cache)")
    return res
