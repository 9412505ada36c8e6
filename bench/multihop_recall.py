"""Multi-hop retrieval on 2WikiMultihopQA: does the context hold every gold passage?

Indexes ../shared/data/2wiki-dev/corpus.jsonl (328 passages, one document each, titled by the
passage title) and asks its 50 questions (36 multi-hop). For each retrieval method and each
number of text units k, it prints the share of questions whose first k units include every
passage named in `supporting_titles` ("all evidence", the figure fast-graphrag publishes: vector
RAG 0.42, LightRAG 0.45, GraphRAG 0.73, fast-graphrag 0.93 with gpt-4o-mini), overall and for
the multi-hop questions, and the retrieval time per question (question embedding included).

Methods (all but lazy make no chat call at query time):
- basic: the k text units nearest to the question (vector RAG, the paper's SS);
- local: local search's Sources with `local_retrieval: neighbourhood` (the units of the matched
  entities, one hop: what GraphRAG's local search does);
- walk: local search's Sources with `local_retrieval: walk` (personalised PageRank over entities
  and text units, query/graph_walk.py);
- lazy (with --lazy): the units lazy search found relevant under its budget, best-ranked first.

--index standard builds the paper's index with the chat model (hours for all 328 passages with
the embedded 1.5B model on 2 cores); --index lazy builds the no-LLM concept index in a minute.
--limit N takes the first N questions and a corpus of their gold passages plus randomly drawn
others (seeded), 328·N/50 passages in all, so a quick run keeps the full run's distractor share.
Each configuration has its own project folder under --workdir: a rerun reuses the index and
every cached answer, so it is free.

    python bench/multihop_recall.py --index lazy                        # a minute, no chat call
    python bench/multihop_recall.py --index standard --size 0.5b --limit 10 --gleanings 0 --max-items 12
    python bench/multihop_recall.py --index standard                    # the full run, hours
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import yaml

from sensegraph.config import load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.llm import open_chat
from sensegraph.query import Searcher
from sensegraph.query.answer import Query
from sensegraph.query.lazy_search import retrieve
from sensegraph.query.local_search import local_context

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "2wiki-dev"
PUBLISHED = "published (gpt-4o-mini, 101 questions): vector 0.42, LightRAG 0.45, GraphRAG 0.73, fast-graphrag 0.93"


def corpus_for(questions: list[dict], limit: int | None, corpus: Path = DATA) -> list[str]:
    """Corpus lines: all of them, or the gold passages of the chosen questions plus drawn others."""
    lines = (corpus / "corpus.jsonl").read_text().splitlines()
    if limit is None:
        return lines
    gold = {t for q in questions for t in q["supporting_titles"]}
    mine = [l for l in lines if json.loads(l)["title"] in gold]
    others = [l for l in lines if json.loads(l)["title"] not in gold]
    want = max(len(mine), round(len(lines) * limit / 50))
    drawn = random.Random(0).sample(others, min(len(others), want - len(mine)))
    return sorted(mine + drawn)


def project(args: argparse.Namespace, questions: list[dict]):
    corpus = Path(args.corpus)
    name = (("" if corpus == DATA else f"{corpus.name}-") + f"{args.index}-{args.size}-{args.limit or 'all'}" + (f"-g{args.gleanings}" if args.gleanings is not None else "")
            + (f"-m{args.max_items}" if args.max_items else ""))
    workdir = Path(args.workdir) / name
    (workdir / "input").mkdir(parents=True, exist_ok=True)
    if args.limit is None:
        link = workdir / "input" / "corpus.jsonl"
        if not link.exists():
            link.symlink_to(corpus.resolve() / "corpus.jsonl")  # read in place
    else:  # a subset of the corpus lives in the scratch project only
        (workdir / "input" / "corpus.jsonl").write_text("\n".join(corpus_for(questions, args.limit, corpus)) + "\n")
    extraction = {**({"max_gleanings": args.gleanings} if args.gleanings is not None else {}),
                  **({"max_entities": args.max_items, "max_relationships": args.max_items} if args.max_items else {})}
    gleanings = ("extraction:\n" + "".join(f"  {k}: {v}\n" for k, v in extraction.items())) if extraction else ""
    (workdir / "settings.yaml").write_text(
        f"index_method: {args.index}\nlocal:\n  size: {args.size}\n{gleanings}"
        # a context wide enough that Sources holds more than the largest k
        "query:\n  context_tokens: 8000\n"
        f"lazy:\n  budget: {args.budget}\n  tester: {args.tester}\n")
    overrides: dict = {}
    for item in args.set:  # section.key=value, e.g. reports.max_tokens=500 (not part of the folder name)
        key, value = item.split("=", 1)
        section, field = key.split(".", 1)
        overrides.setdefault(section, {})[field] = yaml.safe_load(value)
    return load_settings(workdir, overrides=overrides or None, env={})


async def measure(settings, questions: list[dict], ks: list[int], lazy: bool) -> dict:
    searcher = Searcher.open(settings)
    index = searcher.index
    units = index.text_units
    docs = index.tables["documents"]
    title_of_doc = dict(zip(docs["id"], docs["title"]))
    title_of_unit = {u: title_of_doc[d] for u, d in zip(units["id"], units["document_id"])}
    vectors = await index.vectors("text_units", searcher.embedder)
    t0, c0 = time.perf_counter(), time.process_time()
    await index.vectors("entities", searcher.embedder)  # once, outside the timed part
    # what the first local question waits for (0 once on disk); CPU seconds too (every thread of
    # the process), which another job on the machine does not inflate as it does the wall time
    first_wait = (time.perf_counter() - t0, time.process_time() - c0)
    llm = open_chat(settings, cache=searcher.cache)
    methods = ["basic", "local", "walk"] + (["lazy"] if lazy else [])
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    try:
        for n, item in enumerate(questions):
            gold = set(item["supporting_titles"])
            t0 = time.perf_counter()
            qv = (await searcher.embedder.embed([item["question"]], kind="query", step="embed"))[0]
            hits = [title_of_unit[i] for i, _ in vectors.search(qv, k=max(ks))]
            rows["basic"].append({"found": hits, "seconds": time.perf_counter() - t0})
            for method, retrieval in (("local", "neighbourhood"), ("walk", "walk")):
                s = settings.model_copy(update={"query": settings.query.model_copy(update={"local_retrieval": retrieval})})
                q = Query(item["question"], s, index, llm, searcher.embedder)
                t0 = time.perf_counter()
                context = await local_context(q, item["question"])
                sources = next((sec for sec in context.sections if sec.kind == "Sources"), None)
                found = [title_of_unit[r["id"]] for r in sources.records] if sources else []
                rows[method].append({"found": found, "seconds": time.perf_counter() - t0})
            if lazy:
                t0 = time.perf_counter()
                q = Query(item["question"], settings, index, llm, searcher.embedder)
                failures: list[str] = []
                _, ranking, search = await retrieve(q, settings.lazy.budget, failures)
                relevant = sorted(search.relevant(), key=lambda t: -float(ranking.score[t.row]))
                found = [title_of_unit[units.iloc[t.row]["id"]] for t in relevant]
                rows["lazy"].append({"found": found, "seconds": time.perf_counter() - t0, "failures": failures})
            k = max(ks)
            print(f"  {n + 1}/{len(questions)} " + ", ".join(
                f"{m} {len(gold & set(rows[m][-1]['found'][:k]))}/{len(gold)}" for m in methods), flush=True)
    finally:
        await llm.aclose()
        await searcher.aclose()
    rows["_first_wait"] = first_wait  # type: ignore[assignment]
    return rows


def recall(gold: set[str], found: list[str], k: int) -> float:
    """HippoRAG's recall@k: the share of the gold passages among the first k."""
    return len(gold & set(found[:k])) / len(gold)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/sensegraph-2wiki", help="one project folder per configuration under it")
    ap.add_argument("--index", choices=["lazy", "standard"], default="lazy")
    ap.add_argument("--corpus", default=str(DATA),
                    help="a folder with corpus.jsonl holding every gold passage of the 50 questions, e.g. "
                         "../shared/data/2wiki-corpus (6,119 passages); default 2wiki-dev (328)")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions (and a corpus cut to match)")
    ap.add_argument("--questions", default=str(DATA / "questions.json"),
                    help="questions.json (question, supporting_titles, multihop), e.g. held-out ones from "
                         "bench/twohop_questions.py")
    ap.add_argument("--size", choices=["1.5b", "0.5b"], default="1.5b", help="the embedded chat model")
    ap.add_argument("--gleanings", type=int, default=None, help="extraction.max_gleanings (default: the setting's)")
    ap.add_argument("--max-items", type=int, default=None,
                    help="extraction.max_entities and max_relationships (a ~100-token passage needs few; "
                         "fewer means shorter answers from a small model)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="any other setting, e.g. reports.max_tokens=500 (steps it does not touch stay cached)")
    ap.add_argument("--lazy", action="store_true", help="also measure lazy search (chat calls for subqueries)")
    ap.add_argument("--budget", type=int, default=100, help="lazy search's relevance tests per question")
    ap.add_argument("--tester", choices=["auto", "chat", "embedding"], default="auto")
    ap.add_argument("--k", default="2,5,10", help="text units in the context")
    ap.add_argument("--dump", default=None, help="write each method's units per question (titles) to this JSON file")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    questions = json.loads(Path(args.questions).read_text())[: args.limit]
    settings = project(args, questions)
    t0, c0 = time.perf_counter(), time.process_time()
    result = asyncio.run(run_index(settings, log=lambda m: None))
    tables = result.tables
    print(f"{args.index} index in {settings.root}: {len(tables['text_units'])} text units, "
          f"{len(tables['entities'])} entities, {len(tables['relationships'])} relationships, "
          f"{time.perf_counter() - t0:.0f} s ({time.process_time() - c0:.0f} CPU s)")
    rows = asyncio.run(measure(settings, questions, ks, args.lazy))
    first_wait = rows.pop("_first_wait")
    multi = [i for i, q in enumerate(questions) if q["multihop"]]
    half = len(questions) // 2
    chats = args.index == "standard" or args.lazy or settings.query.walk_fact_filter
    model = f"embedded {args.size}" if chats else "no chat model"
    print(f"\n2WikiMultihopQA, {len(questions)} questions ({len(multi)} multi-hop), {args.index} index, {model}"
          + (f", lazy budget {args.budget}, tester {args.tester}" if args.lazy else "")
          + "".join(f", {x}" for x in args.set))
    print(f"the first local question waited {first_wait[0]:.1f} s ({first_wait[1]:.1f} CPU s) "
          "for the entity (concept) vectors")
    # Halves: a difference that shows in one half only is noise.
    print(f"{'method':<8}{'k':>4}{'all evidence':>14}{'multi-hop':>11}{'recall@k':>10}"
          f"{f'halves 1-{half}/{half + 1}-{len(questions)} (all ev., recall)':>44}{'ms/question':>13}")
    for method, rs in rows.items():
        for k in ks:
            ok = [set(q["supporting_titles"]) <= set(r["found"][:k]) for q, r in zip(questions, rs)]
            rec = [recall(set(q["supporting_titles"]), r["found"], k) for q, r in zip(questions, rs)]
            share = sum(ok) / len(ok)
            share_multi = sum(ok[i] for i in multi) / len(multi) if multi else 0.0
            halves = " / ".join(f"{sum(ok[a:b]) / max(1, b - a):.2f} {sum(rec[a:b]) / max(1, b - a):.3f}"
                                for a, b in ((0, half), (half, len(questions))))
            ms = 1000 * sum(r["seconds"] for r in rs) / len(rs)
            print(f"{method:<8}{k:>4}{share:>14.2f}{share_multi:>11.2f}{sum(rec) / len(rec):>10.3f}{halves:>44}{ms:>13.1f}")
    print(PUBLISHED)
    if args.dump:
        Path(args.dump).write_text(json.dumps({m: [r["found"][:max(ks)] for r in rs] for m, rs in rows.items()}))


if __name__ == "__main__":
    main()
