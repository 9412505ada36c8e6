"""Extraction quality on annotated documents: how much of the gold graph the model finds, how
much of what it finds is real, and how fragmented the resulting graph is.

Reads ../shared/data/redocred-test/test_revised.json (Re-DocRED test: 500 Wikipedia documents,
every entity mention with its type, relations as head/tail/Wikidata id), draws --docs documents
(seeded), one text unit each (~200 words), and runs sensegraph's own extraction step on them
(prompts, settings and the configured chat model; the embedded 1.5B by default). Then, per
document:

- entity recall: gold entities (PER/ORG/LOC, and all types) with at least one mention matched
  by an extracted entity name of that document;
- precision: extracted names that match some gold mention (of any type); the others are
  counted apart as "not annotated" (the text writes the name, but Re-DocRED annotates no
  concepts, roles or common nouns, so such a name is not necessarily wrong) and "invented" (the
  text does not write it: wrong whatever the annotation);
- recall per gold type (PER, ORG, LOC, TIME, NUM, MISC);
- relation recall: gold head–tail pairs (either direction) whose two entities were matched and
  joined by an extracted relationship;

and for the graph of all drawn documents (instances merged by name, as the index merges them,
without description summaries): root communities per 100 entities and the share of entities
with no relationship, the fragmentation hierarchical Leiden sees.

A name matches a mention when they are equal after case folding, dropping punctuation and a
leading article, or when one is a whole-word part of the other of at least 4 characters
("Rihanna" in "Barbadian artist Rihanna"). Answers are cached in --workdir: a rerun is free.

Each figure is given for the model's raw answers and for its answers judged under the lenient
and the strict policy of `extraction.checks` (and strict with NER names, the embedded model's
default), and the main ones for each half of the documents: a rule that helps one half only is
noise. --held-out draws only documents that no check was shaped on.

    python bench/extraction_quality.py --docs 40 --seed 2 --held-out   # embedded 1.5B
    python bench/extraction_quality.py --docs 5 --size 0.5b
    python bench/extraction_quality.py --base-url http://127.0.0.1:8000/v1 --model mock   # any server
    python bench/extraction_quality.py --chinese          # chapter 1 of Journey to the West
    python bench/extraction_quality.py --project /tmp/rd10 --gold --docs 10 --seed 2 --held-out
        # a kept `bench/index_embedded.py --redocred 10 --keep /tmp/rd10` index, scored from its cache

--chinese measures chapter 1 of ../shared/data/xiyouji-ch01-07.txt against a gold list of its
main people and places written for this bench (bench/data/xiyouji_ch01_gold.json): recall, and
the extracted "names" that are clauses (over 8 characters, or holding sentence punctuation).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import yaml

from sensegraph.config import load_settings
from sensegraph.index.communities import build_communities
from sensegraph.index.cooccurrence_edges import cooccurrence_edges
from sensegraph.index.extract import ENTITY_COLUMNS, RELATIONSHIP_COLUMNS, ExtractionResult, extract_graph
from sensegraph.index.missed_names import add_missed_names, missed_names
from sensegraph.index.summarize import merge_instances
from sensegraph.llm import Usage, open_cache, open_chat

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "redocred-test" / "test_revised.json"
MAIN_TYPES = ("PER", "ORG", "LOC")
_ARTICLE = re.compile(r"^(the|a|an)\s+")
_NOT_WORD = re.compile(r"[^\w\s]")


def detokenise(sents: list[list[str]]) -> str:
    text = " ".join(" ".join(s) for s in sents)
    text = re.sub(r"\s+([.,;:!?%)\]])", r"\1", text)
    text = re.sub(r"([(\[])\s+", r"\1", text)
    return re.sub(r"\s+(['’]s)\b", r"\1", text).replace(" - ", "-")


def norm(name: str) -> str:
    name = _NOT_WORD.sub(" ", name.casefold())
    return _ARTICLE.sub("", " ".join(name.split()))


def matches(extracted: str, mention: str) -> bool:
    a, b = norm(extracted), norm(mention)
    if not a or not b:
        return False
    if a == b:
        return True
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return len(short) >= 4 and f" {short} " in f" {long} "


# The documents the name checks and the prompt-tune advice were shaped on (docs/quality.md):
# 25 drawn with seed 0, and the 30 "other" documents prompt-tune read (seed 1).
SHAPED_ON = ((25, 0), (30, 1))


def load(docs: int, seed: int, held_out: bool = False) -> list[dict]:
    """`docs` documents drawn with `seed`; with `held_out`, drawn from the documents no rule was
    shaped on (not in SHAPED_ON), so a figure on them is evidence, not a fit."""
    corpus = json.loads(DATA.read_text())
    if held_out:
        shaped = {d["title"] for n, s in SHAPED_ON for d in random.Random(s).sample(corpus, n)}
        corpus = [d for d in corpus if d["title"] not in shaped]
    return random.Random(seed).sample(corpus, docs)


GOLD_TYPES = ("PER", "ORG", "LOC", "TIME", "NUM", "MISC")


def in_text(name: str, text: str) -> bool:
    """Whether the text writes the name (after `norm`: case, punctuation, a leading article)."""
    key = norm(name)
    return bool(key) and f" {key} " in f" {norm(text)} "


def score(doc: dict, names: list[str], pairs: set[frozenset[str]], text: str = "") -> dict[str, float | int]:
    """Counts for one document: gold entities found (main types, all, and per gold type),
    extracted names that are real, the others split into "not annotated" (the text writes the
    name; Re-DocRED does not annotate concepts, roles or common nouns, so these are not all
    wrong) and "invented" (not in the text), and gold relation pairs found."""
    gold = doc["vertexSet"]
    found = [any(matches(n, m["name"]) for n in names for m in entity) for entity in gold]
    main = [f for f, entity in zip(found, gold) if entity[0]["type"] in MAIN_TYPES]
    real = [n for n in names if any(matches(n, m["name"]) for entity in gold for m in entity)]
    others = [n for n in names if n not in real]
    invented = [n for n in others if not in_text(n, text)] if text else []
    # the extracted names standing for each gold entity
    standing = [{n for n in names if any(matches(n, m["name"]) for m in entity)} for entity in gold]
    gold_pairs = {frozenset((r["h"], r["t"])) for r in doc["labels"] if r["h"] != r["t"]}
    joined = 0
    for pair in gold_pairs:
        h, t = tuple(pair)
        if any(frozenset((a, b)) in pairs for a in standing[h] for b in standing[t]):
            joined += 1
    counts: dict[str, float | int] = {
        "gold_main": len(main), "found_main": sum(main), "gold_all": len(gold), "found_all": sum(found),
        "extracted": len(names), "real": len(real), "invented": len(invented),
        "not_annotated": len(others) - len(invented), "gold_pairs": len(gold_pairs), "found_pairs": joined}
    for t in GOLD_TYPES:
        of_type = [f for f, entity in zip(found, gold) if entity[0]["type"] == t]
        counts[f"gold_{t}"], counts[f"found_{t}"] = len(of_type), sum(of_type)
    return counts


def graph_shape(extraction, units: pd.DataFrame, cooccurrence_weight: float = 0.0,
                language: str = "en") -> dict[str, float]:
    """Root communities per 100 entities and the share without a relationship; with
    `cooccurrence_weight` the index's weak co-occurrence edges are added first, as it does."""
    merged = merge_instances(extraction)
    entities = pd.DataFrame([{"id": k, "human_readable_id": n, "title": e.title, "text_unit_ids": e.text_unit_ids,
                              "aliases": e.aliases, "frequency": len(e.text_unit_ids), "degree": 0}
                             for n, (k, e) in enumerate(merged.entities.items())])
    title = {k: e.title for k, e in merged.entities.items()}
    relationships = pd.DataFrame([{"id": f"r{n}", "human_readable_id": n, "source": title[a], "target": title[b],
                                   "weight": r.weight, "text_unit_ids": r.text_unit_ids}
                                  for n, ((a, b), r) in enumerate(merged.relationships.items())],
                                 columns=["id", "human_readable_id", "source", "target", "weight", "text_unit_ids"])
    if entities.empty:
        return {"entities": 0, "roots_per_100": 0.0, "singletons": 0.0}
    if cooccurrence_weight:
        weak = cooccurrence_edges(entities, relationships, units, weight=cooccurrence_weight, language=language)
        relationships = pd.concat([relationships, weak[relationships.columns]], ignore_index=True)
    comms = build_communities(entities, relationships, max_cluster_size=10, seed=0xDEADBEEF)
    linked = set(relationships["source"]) | set(relationships["target"])
    # an entity without a relationship is a root community of its own (communities.py)
    roots = int((comms["level"] == 0).sum()) if len(comms) else 0
    unlinked = sum(1 for t in entities["title"] if t not in linked)
    return {"entities": len(entities), "roots_per_100": 100 * roots / len(entities),
            "singletons": unlinked / len(entities)}


async def extract(settings, units: pd.DataFrame):
    cache = open_cache(settings)
    llm = open_chat(settings, cache=cache)
    try:
        extraction = await extract_graph(units, llm, settings=settings, language="en")
        return await add_missed_names(extraction, units, settings=settings, language="en"), llm.usage
    finally:
        await llm.aclose()
        if cache is not None:
            cache.close()


def judged(settings, checks, ner):
    """The settings with the name checks of a policy ("off", "lenient", "strict"; True = as
    configured, False = off) and NER as given: how one cache of answers is judged raw, under
    each policy, or with NER names added."""
    ex = settings.extraction
    policy = ex.checks if checks is True else "off" if checks in (False, "ner-only") else checks
    return settings.model_copy(update={"extraction": ex.model_copy(update={"checks": policy, "ner": ner})})


XIYOUJI = DATA.parents[1] / "xiyouji-ch01-07.txt"
CHINESE_GOLD = Path(__file__).resolve().parent / "data" / "xiyouji_ch01_gold.json"
# A Chinese "entity" this long, or holding sentence punctuation, is a clause, not a name.
CLAUSE_CHARS = 8
_CLAUSE_PUNCTUATION = re.compile(r"[，。；：！？、“”]")


def chinese(settings) -> None:
    """Chapter 1 of Journey to the West against bench/data/xiyouji_ch01_gold.json: recall of
    its people and places (an extracted name matches when it holds a name or alias, or is held
    by one, of at least 2 characters), and the names that are clauses."""
    from sensegraph.index.text_units import make_text_units

    text = XIYOUJI.read_text(encoding="utf-8")
    chapter = text[:text.index("第二回")]
    docs = pd.DataFrame({"id": ["ch01"], "title": ["第一回"], "text": [chapter]})
    units = make_text_units(docs, size=settings.chunks.size, overlap=settings.chunks.overlap)
    gold = json.loads(CHINESE_GOLD.read_text(encoding="utf-8"))["entities"]
    for label, checks in (("raw answers", False), ("checked", True)):
        run_settings = judged(settings, checks, settings.extraction.ner)
        t0 = time.perf_counter()
        cache = open_cache(run_settings)
        llm = open_chat(run_settings, cache=cache)

        async def run(llm=llm, run_settings=run_settings):
            try:
                return await extract_graph(units, llm, settings=run_settings, language="zh")
            finally:
                await llm.aclose()

        extraction = asyncio.run(run())
        if cache is not None:
            cache.close()
        names = sorted(set(extraction.entities["title"].astype(str)))
        found = [e for e in gold if any(len(a) >= 2 and (a in n or n in a) and len(n) >= 2
                                        for a in [e["name"], *e["aliases"]] for n in names)]
        clauses = [n for n in names if len(n) > CLAUSE_CHARS or _CLAUSE_PUNCTUATION.search(n)]
        real = [n for n in names if any(len(n) >= 2 and (a in n or n in a) for e in gold
                                        for a in [e["name"], *e["aliases"]])]
        calls = llm.usage.total()
        st = extraction.stats
        print(f"Journey to the West, chapter 1, {label}: {len(units)} text units, {calls.calls} calls "
              f"(+{calls.cache_hits} cached), {time.perf_counter() - t0:.0f} s; failed units: {len(extraction.failed)}")
        print(f"  recall of the gold list   {len(found) / len(gold):.2f}  ({len(found)}/{len(gold)}); "
              f"missed: {', '.join(e['name'] for e in gold if e not in found) or 'none'}")
        print(f"  names on the gold list    {len(real)}/{len(names)} extracted names")
        print(f"  clause-like names         {len(clauses)}" + (f": {', '.join(clauses[:8])}" if clauses else ""))
        print(f"  dropped: ungrounded {st['names_ungrounded']}, clauses {st['names_clause']}, "
              f"relationships {st['relationships_dropped']}")


def by_document(units: pd.DataFrame, docs: list[dict]) -> dict[str, str]:
    """Which drawn document each text unit of a project comes from ("doc{i}"), for a project
    whose input files are those documents (bench/index_embedded.py --redocred): a unit belongs
    to the document whose text holds the unit's first words past the title line."""
    texts = [norm(d["title"] + " " + detokenise(d["sents"])) for d in docs]
    out = {}
    for uid, text in zip(units["id"], units["text"]):
        head = " ".join(norm(str(text)).split()[:12])
        hits = [i for i, t in enumerate(texts) if head and head in t]
        if len(hits) != 1:
            raise SystemExit(f"text unit {uid} is in {len(hits)} of the drawn documents: give the --docs, "
                             "--seed and --held-out the project was made with")
        out[uid] = f"doc{hits[0]}"
    return out


def project(root: Path, docs: list[dict] | None = None) -> None:
    """The graph shape of an indexed project, its answers judged raw / checked / with NER (the
    extraction answers come from the project's cache: an index already built costs no call).
    With `docs` (the Re-DocRED documents the project indexed) its answers are also scored
    against their gold, both halves, as the main run scores its own."""
    from sensegraph.language import resolve_language
    from sensegraph.store.tables import read_table

    settings = load_settings(root, env={})
    units = read_table(root / "output", "text_units")[["id", "text"]]
    language = resolve_language(settings.language, units["text"])
    rows = {}
    for label, checks, ner in (("raw", False, False), ("checked", True, False), ("ner", True, settings.extraction.ner)):
        run_settings = judged(settings, checks, ner)

        async def run(run_settings=run_settings):
            cache = open_cache(run_settings)
            llm = open_chat(run_settings, cache=cache)
            try:
                ex = await extract_graph(units, llm, settings=run_settings, language=language)
                return await add_missed_names(ex, units, settings=run_settings, language=language), llm.usage
            finally:
                await llm.aclose()
                if cache is not None:
                    cache.close()

        extraction, usage = asyncio.run(run())
        if docs is not None:
            doc_of = by_document(units, docs)
            scored = dataclasses.replace(
                extraction,
                entities=extraction.entities.assign(text_unit_id=extraction.entities["text_unit_id"].map(doc_of)),
                relationships=extraction.relationships.assign(
                    text_unit_id=extraction.relationships["text_unit_id"].map(doc_of)))
            half = len(docs) // 2
            got = [measure(d, units, scored, 0.0, offset=a, shape=False)
                   for d, a in ((docs, 0), (docs[:half], 0), (docs[half:], half))]
            print(f"{label}: " + "; ".join(f"{title.strip()} {got[0][key]} (halves {got[1][key].split(' ')[0]} / "
                                            f"{got[2][key].split(' ')[0]})" for key, title in ROWS
                                            if key in HALF_ROWS))
        shape = graph_shape(extraction, units, settings.communities.cooccurrence_weight if checks else 0.0, language)
        calls = usage.total()
        rows[label] = shape
        print(f"{label}: {calls.calls} calls (+{calls.cache_hits} cached); {shape['entities']} entities, "
              f"{shape['roots_per_100']:.1f} root communities per 100 entities "
              f"({round(shape['roots_per_100'] * shape['entities'] / 100)} roots), "
              f"{shape['singletons']:.2f} without an edge; stats: "
              + ", ".join(f"{k} {extraction.stats.get(k, 0)}" for k in
                          ("names_ungrounded", "names_generic", "names_clause", "relationships_dropped",
                           "names_from_ner")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", action="store_true",
                    help="draw only from documents no check was shaped on (not the seed-0 25 nor prompt-tune's 30)")
    ap.add_argument("--size", choices=["1.5b", "0.5b"], default="1.5b", help="the embedded chat model")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server instead of the embedded model")
    ap.add_argument("--model", default="", help="its model name")
    ap.add_argument("--prompts", default=None, help="a project folder whose prompts/ (e.g. from prompt-tune) to use")
    ap.add_argument("--workdir", default="/tmp/sensegraph-redocred")
    ap.add_argument("--chinese", action="store_true", help="chapter 1 of Journey to the West against our gold list instead")
    ap.add_argument("--project", default=None,
                    help="an indexed project instead: its text units, settings and cache; graph shape, and with --gold its scores")
    ap.add_argument("--gold", action="store_true",
                    help="with --project made by index_embedded.py --redocred N: also score its answers against "
                         "the gold of the documents --docs N --seed S --held-out draws (the ones it indexed)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a setting for this run, e.g. local.parallel=1 (give --workdir apart: "
                         "the cache does not know it)")
    args = ap.parse_args()
    docs = load(args.docs, args.seed, args.held_out)
    root = Path(args.prompts) if args.prompts else Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    chat = ({"provider": "openai", "base_url": args.base_url, "model": args.model or "model", "api_key": "none"}
            if args.base_url else {})
    overrides = {"local": {"size": args.size}, "chat": chat, "cache": {"dir": str(Path(args.workdir) / "cache")}}
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, field = key.partition(".")
        overrides.setdefault(section, {})[field] = yaml.safe_load(value)
    settings = load_settings(root, overrides=overrides, env={})
    if args.chinese:
        chinese(settings)
        return
    if args.project:
        project(Path(args.project), docs if args.gold else None)
        return
    units = pd.DataFrame({"id": [f"doc{i}" for i in range(len(docs))], "text": [detokenise(d["sents"]) for d in docs]})
    model = f"{args.model} at {args.base_url}" if args.base_url else f"embedded {args.size}"
    # The same answers judged four times (every judging after the first is all cache hits): as
    # the model gave them (no checks, no NER names, no weak edges), under the lenient and the
    # strict policy, and strict with the names NER finds added (the default for a small model).
    columns, halves = {}, {}
    for label, policy, ner in COLUMNS:
        run_settings = judged(settings, policy, ner)
        t0 = time.perf_counter()
        if policy == "ner-only":  # what spaCy alone names: the baseline the precision figure flatters
            extraction, usage = ner_alone(run_settings, units), Usage()
        else:
            extraction, usage = asyncio.run(extract(run_settings, units))
        weight = settings.communities.cooccurrence_weight if policy != "off" else 0.0
        columns[label] = measure(docs, units, extraction, weight)
        half = len(docs) // 2
        halves[label] = [measure(docs[a:b], units.iloc[a:b], extraction, weight, offset=a, shape=False)
                         for a, b in ((0, half), (half, len(docs)))]
        calls = usage.total()
        print(f"{label}: {calls.calls} calls (+{calls.cache_hits} cached), {time.perf_counter() - t0:.0f} s, "
              f"{calls.prompt_tokens} prompt / {calls.completion_tokens} completion tokens; "
              f"failed units: {len(extraction.failed)}")
    print(f"\nRe-DocRED test, {len(docs)} documents (seed {args.seed}{', held out' if args.held_out else ''}), "
          f"{model}, prompts from {args.prompts or 'the package'}")
    labels = [c[0] for c in COLUMNS]
    print("| " + " | ".join([f"{'':40}"] + [f"{x:>18}" for x in labels]) + " |")
    print("|" + "-" * 42 + "|" + "|".join("-" * 19 + ":" for _ in labels) + "|")
    for key, title in ROWS:
        print("| " + " | ".join([f"{title:40}"] + [f"{columns[x][key]:>18}" for x in labels]) + " |")
    print(f"\nHalves (documents 1-{len(docs) // 2} / {len(docs) // 2 + 1}-{len(docs)}):")
    print("| " + " | ".join([f"{'':40}"] + [f"{x:>26}" for x in labels]) + " |")
    print("|" + "-" * 42 + "|" + "|".join("-" * 27 + ":" for _ in labels) + "|")
    for key, title in [r for r in ROWS if r[0] in HALF_ROWS]:
        print("| " + " | ".join([f"{title:40}"] + [f"{halves[x][0][key].split(' ')[0]} / {halves[x][1][key].split(' ')[0]}"
                                                    .rjust(26) for x in labels]) + " |")


# (column, extraction.checks, extraction.ner)
COLUMNS = [("raw answers", "off", False), ("lenient", "lenient", False), ("strict", "strict", False),
           ("strict + NER names", "strict", True), ("spaCy NER alone", "ner-only", True)]


def ner_alone(settings, units: pd.DataFrame) -> ExtractionResult:
    """The names spaCy's NER finds in each unit, typed as the index types them, and nothing else."""
    none = pd.DataFrame(columns=ENTITY_COLUMNS)
    found = missed_names(units, none, entity_types=list(settings.extraction.entity_types))
    return ExtractionResult(found, pd.DataFrame(columns=RELATIONSHIP_COLUMNS), pd.DataFrame(), failed=[],
                            stats={"names_from_ner": len(found)})
ROWS = [("recall_main", "entity recall PER/ORG/LOC"), ("precision_main", "precision (matches a gold mention)"),
        ("invented", "invented (name not in the text)"), ("not_annotated", "in the text, not annotated"),
        ("recall_all", "entity recall, all types"),
        *[(f"recall_{t}", f"  recall {t}") for t in GOLD_TYPES],
        ("relation_recall", "relation recall (gold pairs joined)"),
        ("entities", "entities in the graph"), ("roots_per_100", "root communities per 100 entities"),
        ("singletons", "share without an edge"), ("dropped", "records dropped by the checks"),
        ("added", "names added from NER")]
HALF_ROWS = {"recall_main", "precision_main", "invented", "not_annotated", "relation_recall"}


def measure(docs: list[dict], units: pd.DataFrame, extraction, cooccurrence_weight: float, offset: int = 0,
            shape: bool = True) -> dict[str, str]:
    ents, rels = extraction.entities, extraction.relationships
    total: Counter = Counter()
    for i, doc in enumerate(docs):
        unit = f"doc{i + offset}"
        names = sorted(set(ents.loc[ents["text_unit_id"] == unit, "title"].astype(str)))
        mine = rels[rels["text_unit_id"] == unit]
        pairs = {frozenset((str(s), str(t))) for s, t in zip(mine["source"], mine["target"])}
        total.update(score(doc, names, pairs, detokenise(doc["sents"])))
    st = extraction.stats
    dropped = {k: st.get(k, 0) for k in ("names_ungrounded", "names_generic", "names_clause", "example_leaks",
                                         "relationships_dropped")}

    def share(a: str, b: str) -> str:
        return f"{total[a] / max(1, total[b]):.2f} ({total[a]}/{total[b]})"

    out = {"recall_main": share("found_main", "gold_main"), "recall_all": share("found_all", "gold_all"),
           "precision_main": share("real", "extracted"), "invented": share("invented", "extracted"),
           "not_annotated": share("not_annotated", "extracted"),
           "relation_recall": share("found_pairs", "gold_pairs"),
           **{f"recall_{t}": share(f"found_{t}", f"gold_{t}") for t in GOLD_TYPES},
           "dropped": " ".join(f"{k.split('_')[-1]}:{v}" for k, v in dropped.items() if v) or "0",
           "added": str(st.get("names_from_ner", 0))}
    if shape:
        g = graph_shape(extraction, units, cooccurrence_weight)
        out.update({"entities": str(g["entities"]), "roots_per_100": f"{g['roots_per_100']:.1f}",
                    "singletons": f"{g['singletons']:.2f}"})
    return out


if __name__ == "__main__":
    main()
