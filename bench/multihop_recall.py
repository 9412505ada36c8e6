"""Multi-hop retrieval on 2WikiMultihopQA: does the context hold every gold passage?

Indexes ../shared/data/2wiki-dev/corpus.jsonl (328 passages, one document each, titled by the
passage title) and asks its 50 questions (36 multi-hop). For each retrieval method and each
number of text units k, it prints the share of questions whose k units include every passage
named in `supporting_titles` ("all evidence", the figure fast-graphrag publishes: vector RAG 0.42,
LightRAG 0.45, GraphRAG 0.73, fast-graphrag 0.93 with gpt-4o-mini), overall and for the
multi-hop questions, and the retrieval time per question.

Methods:
- basic: the k text units nearest to the question (vector RAG, the paper's SS);
- lazy: the units lazy search found relevant under its budget of relevance tests, best-ranked
  first, at most k (it may find fewer: then those are its context).

The lazy index needs no chat model; lazy search asks it for subqueries (and, with the chat
tester, for the relevance verdicts). The project is kept in --workdir, so a rerun reuses the
index and every cached answer.

    python bench/multihop_recall.py                       # embedded 1.5B model, all 50 questions
    python bench/multihop_recall.py --size 0.5b --limit 10   # quick
    python bench/multihop_recall.py --budget 50 --tester embedding
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from sensegraph.config import load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.llm import open_chat
from sensegraph.query import Searcher
from sensegraph.query.answer import Query
from sensegraph.query.lazy_search import retrieve

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "2wiki-dev"
PUBLISHED = "published (gpt-4o-mini, 101 questions): vector 0.42, LightRAG 0.45, GraphRAG 0.73, fast-graphrag 0.93"


def project(workdir: Path, args: argparse.Namespace):
    (workdir / "input").mkdir(parents=True, exist_ok=True)
    link = workdir / "input" / "corpus.jsonl"
    if not link.exists():
        link.symlink_to(DATA / "corpus.jsonl")  # read in place, never copied
    (workdir / "settings.yaml").write_text(
        f"index_method: lazy\nlocal:\n  size: {args.size}\n"
        f"lazy:\n  budget: {args.budget}\n  tester: {args.tester}\n")
    return load_settings(workdir, env={})


async def measure(settings, questions: list[dict], ks: list[int]) -> dict:
    searcher = Searcher.open(settings)
    index = searcher.index
    units = index.text_units
    docs = index.tables["documents"]
    title_of_doc = dict(zip(docs["id"], docs["title"]))
    title_of_unit = {u: title_of_doc[d] for u, d in zip(units["id"], units["document_id"])}
    vectors = await index.vectors("text_units", searcher.embedder)
    llm = open_chat(settings, cache=searcher.cache)
    rows: dict[str, list[dict]] = {"basic": [], "lazy": []}
    try:
        for n, item in enumerate(questions):
            gold = set(item["supporting_titles"])
            t0 = time.perf_counter()
            qv = (await searcher.embedder.embed([item["question"]], kind="query", step="embed"))[0]
            hits = [title_of_unit[i] for i, _ in vectors.search(qv, k=max(ks))]
            rows["basic"].append({"found": hits, "seconds": time.perf_counter() - t0})
            t0 = time.perf_counter()
            q = Query(item["question"], settings, index, llm, searcher.embedder)
            failures: list[str] = []
            _, ranking, search = await retrieve(q, settings.lazy.budget, failures)
            relevant = sorted(search.relevant(), key=lambda t: -float(ranking.score[t.row]))
            found = [title_of_unit[units.iloc[t.row]["id"]] for t in relevant]
            rows["lazy"].append({"found": found, "seconds": time.perf_counter() - t0, "tests": search.used,
                                 "failures": failures})
            print(f"  {n + 1}/{len(questions)} basic {len(gold & set(hits[:max(ks)]))}/{len(gold)}, "
                  f"lazy {len(gold & set(found[:max(ks)]))}/{len(gold)} ({search.used} tests, "
                  f"{len(found)} relevant)", flush=True)
    finally:
        await llm.aclose()
        await searcher.aclose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/sensegraph-2wiki")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions only")
    ap.add_argument("--size", choices=["1.5b", "0.5b"], default="1.5b", help="the embedded chat model")
    ap.add_argument("--budget", type=int, default=100, help="lazy search's relevance tests per question")
    ap.add_argument("--tester", choices=["auto", "chat", "embedding"], default="auto")
    ap.add_argument("--k", default="5,10", help="text units in the context")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    questions = json.loads((DATA / "questions.json").read_text())[: args.limit]
    settings = project(Path(args.workdir), args)
    t0 = time.perf_counter()
    result = asyncio.run(run_index(settings, log=lambda m: None))
    print(f"lazy index: {len(result.tables['text_units'])} text units, {len(result.tables['entities'])} concepts, "
          f"{time.perf_counter() - t0:.0f} s")
    rows = asyncio.run(measure(settings, questions, ks))
    multi = [i for i, q in enumerate(questions) if q["multihop"]]
    print(f"\n2WikiMultihopQA, {len(questions)} questions ({len(multi)} multi-hop), embedded {args.size}, "
          f"lazy budget {args.budget}, tester {args.tester}")
    print(f"{'method':<8}{'k':>4}{'all evidence':>14}{'multi-hop':>11}{'s/question':>12}")
    for method, rs in rows.items():
        for k in ks:
            ok = [set(q["supporting_titles"]) <= set(r["found"][:k]) for q, r in zip(questions, rs)]
            share = sum(ok) / len(ok)
            share_multi = sum(ok[i] for i in multi) / len(multi) if multi else 0.0
            seconds = sum(r["seconds"] for r in rs) / len(rs)
            print(f"{method:<8}{k:>4}{share:>14.2f}{share_multi:>11.2f}{seconds:>12.2f}")
    print(PUBLISHED)


if __name__ == "__main__":
    main()
