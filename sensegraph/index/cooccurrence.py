"""Lazy index: concept instances -> the co-occurrence graph (entities and relationships tables).

Concepts become entities, pairs of concepts found in one sentence (settings
`concepts.cooccurrence: sentence`) or one text unit (`unit`) become relationships, in the tables
and columns of a standard index (summarize.py), so communities, the explorer and every query
method read a lazy index as they read a standard one. No LLM:
- a concept is kept when it occurs in at least `min_frequency` text units, and a unit keeps at
  most `max_per_unit` concepts, those most frequent in the corpus first (ties: first in the
  unit); a concept that the cap leaves in fewer than `min_frequency` units is dropped too;
- title: the most frequent display form (an all-capitals form such as a transcript's speaker
  label "KEVIN SCOTT" only when there is no other); type: the most frequent (ties: first seen),
  where NAME (a proper noun the NER gave no type: it misses many names, upper-case speaker labels
  always) does not vote, so "Christina Warren" is a PERSON when the NER said so at least once;
  NAME only when nothing else was said; the other types in `other_types`; aliases: the other
  forms seen, as written;
- description: the first sentence the concept occurs in (one of at least 40 characters when
  there is one), cut to 40 words; it is what the explorer and local search show;
- weight: the number of sentences (units) in which both concepts occur, each pair counted once
  per sentence (unit). A sentence pairs at most `PAIR_CAP` of its concepts (most frequent first),
  so a run-on sentence of a transcript cannot produce a quadratic number of pairs;
- statistics as columns: degree and pagerank (weighted) of entities; combined_degree, pmi and
  npmi (pointwise mutual information of the pair over sentences or units) of relationships.
A graph left with (next to) no concepts is explained in one line (few_concepts_note: none found, or
`min_frequency` removed them, as it removes every concept of a one-unit corpus), which the
pipeline prints as a warning and keeps in stats.json (`concepts_note`).
Ids are those of a standard index (`summarize.entity_id` / `relationship_id` of the titles).
Rows are sorted by key (entities) and key pair (relationships), like summarize's.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..config import Settings
from ..language import detect_language
from ..store.tables import content_id
from .concepts import NAME
from .summarize import ENTITY_COLUMNS, RELATIONSHIP_COLUMNS

ENTITY_STAT_COLUMNS = ["pagerank"]
RELATIONSHIP_STAT_COLUMNS = ["pmi", "npmi"]
# Concepts of one sentence (unit) that are paired, at most: C(50, 2) = 1225 pairs.
PAIR_CAP = 50
DESCRIPTION_WORDS = 40
DESCRIPTION_CHARS = 300  # Chinese has no spaces to count words by
_GOOD_SENTENCE_CHARS = 40
_PAGERANK_DAMPING = 0.85


def _empty() -> tuple[pd.DataFrame, pd.DataFrame]:
    return (pd.DataFrame({c: pd.Series(dtype=object) for c in ENTITY_COLUMNS + ENTITY_STAT_COLUMNS}),
            pd.DataFrame({c: pd.Series(dtype=object) for c in RELATIONSHIP_COLUMNS + RELATIONSHIP_STAT_COLUMNS}))


def _first_per_group(group: np.ndarray) -> np.ndarray:
    """Positions where a new group starts in an array sorted by group."""
    return np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.zeros(0, dtype=np.int64)


def _kept_unit_concepts(u: np.ndarray, k: np.ndarray, n_keys: int, *, min_frequency: int,
                        max_per_unit: int) -> pd.DataFrame:
    """Distinct (unit, concept) pairs that survive the frequency filter and the per-unit cap,
    with the row of the concept's first occurrence in the unit."""
    uk = pd.DataFrame({"u": u, "k": k, "row": np.arange(len(u))}).drop_duplicates(["u", "k"])
    freq = np.bincount(uk["k"].to_numpy(), minlength=n_keys)
    uk = uk[freq[uk["k"].to_numpy()] >= min_frequency]
    uk = uk.assign(f=freq[uk["k"].to_numpy()])
    uk = uk.sort_values(["u", "f", "row"], ascending=[True, False, True], kind="stable")
    uk = uk[uk.groupby("u", sort=False).cumcount().to_numpy() < max_per_unit]
    after = np.bincount(uk["k"].to_numpy(), minlength=n_keys)
    return uk[after[uk["k"].to_numpy()] >= min_frequency]


def _ranked(k: np.ndarray, value: np.ndarray, row: np.ndarray,
            penalty: Callable[[pd.Series], np.ndarray] | None = None) -> dict[int, list]:
    """Per concept, its distinct values by penalty, then count (descending), then first row: the
    first is the choice."""
    df = pd.DataFrame({"k": k, "v": value, "row": row})
    g = df.groupby(["k", "v"], sort=False).agg(n=("row", "size"), first=("row", "min")).reset_index()
    g["p"] = 0 if penalty is None else penalty(g["v"])
    g = g.sort_values(["k", "p", "n", "first"], ascending=[True, True, False, True], kind="stable")
    out: dict[int, list] = {}
    for kk, v in zip(g["k"].to_numpy(), g["v"].to_numpy()):
        out.setdefault(int(kk), []).append(v)
    return out


def _shouted(forms: pd.Series) -> np.ndarray:
    """1 for an all-capitals form of more than 4 letters (a speaker label, a shouted heading)."""
    return np.array([int(f.isupper() and sum(ch.isalpha() for ch in f) > 4) for f in forms], dtype=np.int64)


def _description(text: str) -> str:
    words = " ".join(text.split()).split(" ")
    out = " ".join(words[:DESCRIPTION_WORDS])
    if len(words) > DESCRIPTION_WORDS or len(out) > DESCRIPTION_CHARS:
        out = out[:DESCRIPTION_CHARS].rstrip() + " …"
    return out


def _pairs(ctx: np.ndarray, k: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, unit) for every pair of distinct concepts of each context. Rows must be sorted by
    context and hold distinct concepts per context. Built per group size with triangular index
    arrays, so no Python loop runs over pairs or contexts."""
    starts = _first_per_group(ctx)
    sizes = np.diff(np.r_[starts, len(ctx)])
    los, his, units = [], [], []
    for s in np.unique(sizes):
        if s < 2:
            continue
        g = starts[sizes == s]
        idx = g[:, None] + np.arange(s)[None, :]
        iu, ju = np.triu_indices(int(s), 1)
        a, b = k[idx[:, iu]].ravel(), k[idx[:, ju]].ravel()
        los.append(np.minimum(a, b))
        his.append(np.maximum(a, b))
        units.append(np.repeat(u[g], len(iu)))
    if not los:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    return np.concatenate(los), np.concatenate(his), np.concatenate(units)


def pagerank(n: int, lo: np.ndarray, hi: np.ndarray, weight: np.ndarray, *, damping: float = _PAGERANK_DAMPING,
             tol: float = 1e-10, max_iter: int = 200) -> np.ndarray:
    """Weighted PageRank of an undirected graph (edges lo-hi), by power iteration with numpy."""
    if n == 0:
        return np.zeros(0)
    src = np.r_[lo, hi]
    dst = np.r_[hi, lo]
    w = np.r_[weight, weight].astype(float)
    out = np.bincount(src, weights=w, minlength=n)
    dangling = out == 0
    pr = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        share = np.where(dangling, 0.0, pr / np.where(dangling, 1.0, out))
        new = np.bincount(dst, weights=share[src] * w, minlength=n)
        new = (1 - damping) / n + damping * (new + pr[dangling].sum() / n)
        done = np.abs(new - pr).sum() < tol
        pr = new
        if done:
            break
    return pr


def concept_graph(instances: pd.DataFrame, units: pd.DataFrame, *, settings: Settings,
                  language: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(entities, relationships) of the concept co-occurrence graph. `language` words the
    relationship descriptions (detected from the units when not given)."""
    c = settings.concepts
    min_frequency, max_per_unit, mode = c.min_frequency, c.max_per_unit, c.cooccurrence
    unit_ids = [str(i) for i in units["id"]]
    texts = [str(t or "") for t in units["text"]]
    position = {uid: i for i, uid in enumerate(unit_ids)}
    if instances.empty:
        return _empty()
    # Instances of units no longer in the table (a removed document) are not part of the graph.
    u_all = instances["text_unit_id"].astype(str).map(position)
    inst = instances[u_all.notna().to_numpy()].assign(_u=u_all.dropna().astype(np.int64).to_numpy())
    inst = inst.assign(_row=np.arange(len(inst))).sort_values(["_u", "_row"], kind="stable").reset_index(drop=True)
    if inst.empty:
        return _empty()
    code, keys = pd.factorize(inst["key"].astype(str))  # first-seen order
    u = inst["_u"].to_numpy()
    uk = _kept_unit_concepts(u, code, len(keys), min_frequency=min_frequency, max_per_unit=max_per_unit)
    if uk.empty:
        return _empty()

    # Keep the instances of kept (unit, concept) pairs; renumber concepts in key order (row order).
    n_keys = len(keys)
    kept_pair = uk["u"].to_numpy() * n_keys + uk["k"].to_numpy()
    inst = inst[np.isin(u * n_keys + code, kept_pair)].reset_index(drop=True)
    old = pd.factorize(inst["key"].astype(str))[1]
    order = np.argsort(np.asarray(old, dtype=object), kind="stable")
    key_of = np.asarray(old, dtype=object)[order]
    rank = np.empty(len(old), dtype=np.int64)
    rank[order] = np.arange(len(old))
    k = rank[pd.factorize(inst["key"].astype(str))[0]]
    u = inst["_u"].to_numpy()
    row = np.arange(len(inst))
    n = len(key_of)

    # -- entities -------------------------------------------------------------------------------
    # The title is a display form (whose normalised form is the key, so ids follow from titles);
    # aliases are the other display forms and the forms as written ("AI models" for "AI model").
    titles = inst["title"].astype(str).to_numpy()
    surfaces = (inst["surface"] if "surface" in inst else inst["title"]).astype(str).to_numpy()
    title = [v[0] for _, v in sorted(_ranked(k, titles, row, _shouted).items())]
    forms = _ranked(np.r_[k, k], np.r_[titles, surfaces], np.r_[row, row])
    aliases = [[f for f in forms[i] if f != title[i]] for i in range(n)]
    types = _ranked(k, inst["type"].astype(str).to_numpy(), row, lambda v: (v == NAME).to_numpy(np.int64))
    unit_rows = pd.DataFrame({"k": k, "u": u}).drop_duplicates()
    units_of: list[list[str]] = [[] for _ in range(n)]
    for kk, uu in zip(unit_rows["k"].to_numpy(), unit_rows["u"].to_numpy()):
        units_of[kk].append(unit_ids[uu])
    units_of = [sorted(x) for x in units_of]
    # description: the first sentence of some length the concept occurs in, else its first
    if {"sentence_start", "sentence_end"} <= set(inst.columns):
        s0, s1 = inst["sentence_start"].to_numpy(), inst["sentence_end"].to_numpy()
    else:
        s0, s1 = inst["start"].to_numpy(), inst["end"].to_numpy()
    short = (s1 - s0) < _GOOD_SENTENCE_CHARS
    pick = pd.DataFrame({"k": k, "short": short, "row": row}).sort_values(["k", "short", "row"], kind="stable")
    pick = pick.drop_duplicates("k")
    description = [""] * n
    for kk, r in zip(pick["k"].to_numpy(), pick["row"].to_numpy()):
        description[kk] = _description(texts[u[r]][s0[r]:s1[r]])

    # -- co-occurrence pairs --------------------------------------------------------------------
    sentence = inst["sentence"].to_numpy() if mode == "sentence" else np.zeros(len(inst), dtype=np.int64)
    ctx_df = pd.DataFrame({"u": u, "s": sentence, "k": k, "row": row}).drop_duplicates(["u", "s", "k"])
    ctx_df["ctx"] = pd.factorize(ctx_df["u"].to_numpy() * (int(sentence.max(initial=0)) + 1)
                                 + ctx_df["s"].to_numpy())[0]
    freq = np.array([len(x) for x in units_of], dtype=np.int64)
    ctx_df["f"] = freq[ctx_df["k"].to_numpy()]
    ctx_df = ctx_df.sort_values(["ctx", "f", "row"], ascending=[True, False, True], kind="stable")
    ctx_df = ctx_df[ctx_df.groupby("ctx", sort=False).cumcount().to_numpy() < PAIR_CAP]
    n_contexts = int(ctx_df["ctx"].nunique())
    in_contexts = np.bincount(ctx_df["k"].to_numpy(), minlength=n)
    lo, hi, pu = _pairs(ctx_df["ctx"].to_numpy(), ctx_df["k"].to_numpy(), ctx_df["u"].to_numpy())

    pair = lo * n + hi
    pair_codes, weight = np.unique(pair, return_counts=True)
    r_lo, r_hi = pair_codes // n, pair_codes % n
    # text units per pair: distinct (pair, unit), sorted by pair then unit id (as integers: the
    # rank of each unit id in string order, so no string column is sorted)
    id_rank = np.empty(len(unit_ids), dtype=np.int64)
    id_rank[np.argsort(np.asarray(unit_ids, dtype=object), kind="stable")] = np.arange(len(unit_ids))
    p_of = np.searchsorted(pair_codes, pair)
    pu_code = np.unique(p_of * len(unit_ids) + id_rank[pu])
    by_pair = pu_code // len(unit_ids)
    sorted_ids = np.asarray(sorted(unit_ids), dtype=object)[pu_code % len(unit_ids)].tolist()
    bounds = np.r_[_first_per_group(by_pair), len(by_pair)].tolist()
    rel_units = [sorted_ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    del pair, p_of, pu_code, by_pair, lo, hi, pu

    degree = np.bincount(np.r_[r_lo, r_hi], minlength=n)
    rank_pr = pagerank(n, r_lo, r_hi, weight)

    entities = pd.DataFrame({
        "id": [content_id("entity", key) for key in key_of],
        "human_readable_id": np.arange(n),
        "title": title,
        "type": [types[i][0] for i in range(n)],
        "description": description,
        "text_unit_ids": units_of,
        "frequency": freq,
        "degree": degree,
        "other_types": [types[i][1:] for i in range(n)],
        "aliases": aliases,
        "pagerank": rank_pr,
    })

    w = weight.astype(float)
    p_ab = w / max(n_contexts, 1)
    pmi = np.log(w * n_contexts / (in_contexts[r_lo] * in_contexts[r_hi]).astype(float))
    with np.errstate(divide="ignore", invalid="ignore"):
        npmi = np.where(p_ab < 1, pmi / -np.log(p_ab), 1.0)
    what = _contexts_word(mode, language or detect_language(texts))
    relationships = pd.DataFrame({
        "id": [content_id("relationship", key_of[a], key_of[b]) for a, b in zip(r_lo, r_hi)],
        "human_readable_id": np.arange(len(pair_codes)),
        "source": [title[a] for a in r_lo],
        "target": [title[b] for b in r_hi],
        "description": [what(title[a], title[b], int(x)) for a, b, x in zip(r_lo, r_hi, weight)],
        "weight": w,
        "combined_degree": degree[r_lo] + degree[r_hi],
        "text_unit_ids": rel_units,
        "pmi": pmi,
        "npmi": npmi,
    })
    return entities, relationships


# Fewer concepts than this after concepts.min_frequency is a graph with next to nothing to rank
# or cluster: said, with the reason, rather than left to show as empty answers.
FEW_CONCEPTS = 10


def few_concepts_note(instances: pd.DataFrame, entities: pd.DataFrame, units: pd.DataFrame, *,
                      settings: Settings) -> str | None:
    """One line saying why the graph has (next to) no concepts and what to do, or None: when the
    NLP found none in the text units, or when concepts.min_frequency removed enough of them to
    leave fewer than FEW_CONCEPTS (a one-unit document, where every concept occurs once)."""
    n_units = len(units)
    unit_ids = set(map(str, units["id"]))
    inst = instances[instances["text_unit_id"].astype(str).isin(unit_ids)] if len(instances) else instances
    in_units = inst.drop_duplicates(["key", "text_unit_id"]).groupby("key").size() if len(inst) else pd.Series()
    found, kept, min_frequency = len(in_units), len(entities), settings.concepts.min_frequency
    rare = int((in_units < min_frequency).sum())
    units_word = f"{n_units} text unit{'' if n_units == 1 else 's'}"
    if n_units and not found:
        return (f"the lazy index found no concept (noun phrase or name) in its {units_word}: is the `language` "
                "setting right for these documents? Lazy and basic search still read the text units.")
    if kept >= FEW_CONCEPTS or not rare:
        return None
    why = ", as every concept of a one-unit corpus does" if n_units == 1 else ""
    return (f"the lazy index kept {kept} of the {found} concepts found in its {units_word}: {rare} occur in fewer "
            f"than concepts.min_frequency ({min_frequency}) text units{why}. For a small corpus set "
            "concepts.min_frequency: 1 in settings.yaml (or index more documents); lazy and basic search still "
            "read the text units.")


def _contexts_word(mode: str, language: str):
    if language == "zh":
        unit = "个句子" if mode == "sentence" else "个文本单元"
        return lambda a, b, n: f"{a}与{b}在{n}{unit}中同时出现"
    one, many = ("sentence", "sentences") if mode == "sentence" else ("text unit", "text units")
    return lambda a, b, n: f"{a} and {b} occur together in {n} {one if n == 1 else many}"
