"""What lazy search's budget buys: gold passages found, and what they cost, per budget.

On 2WikiMultihopQA's 6,119-passage corpus (../shared/data/2wiki-corpus, indexed lazily as
bench/multihop_recall.py --corpus does it; the same --workdir reuses that index) the first
--questions of ../shared/data/2wiki-dev/questions.json are answered by lazy search at each
budget of --budgets with the configured chat model (the embedded 1.5B by default), and for each:

- gold recall of the relevant units: the share of the questions' gold passages among the units
  the tester judged relevant; the same for vector search given as many units (the units nearest
  the question, as many as lazy search found relevant for that question), so the two are
  compared at equal context size; precision of the relevant units;
- gold recall of the claims' sources: the share of gold passages among the units the kept claims
  cite (what the answer rests on);
- per question: chat calls, prompt and completion tokens, seconds; relevance tests used.

Each figure is also given per half of the questions. With --podcast, one global question of
../shared/data/podcast/questions.csv is answered per budget over a lazy index of the podcast
transcripts (built on first use, ~1M tokens), with its cost.

Answers are cached in the projects: a rerun is free, and a larger budget reuses the tests of a
smaller one only where they are the same calls (a wave's batch must match exactly).

    python bench/lazy_budget.py --questions 10 --budgets 25,100,500
    python bench/lazy_budget.py --questions 2 --budgets 1500
    python bench/lazy_budget.py --podcast --budgets 100,500 --questions 0
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import time
import zipfile
from pathlib import Path

import yaml
from relevance_tester import CORPUS, QUESTIONS, SHARED, project
from sensegraph.config import load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.llm import open_chat
from sensegraph.query import Searcher
from sensegraph.query.answer import Query
from sensegraph.query.lazy_search import lazy_search, retrieve

PODCAST = SHARED / "podcast"


def settings_for(root: Path, size: str, chat: dict, extra: dict):
    overrides = {"local": {"size": size}, "chat": chat}
    for section, values in extra.items():
        overrides.setdefault(section, {}).update(values)
    return load_settings(root, overrides=overrides, env={})


async def ask(settings, question: str, budget: int, retrieval_only: bool = False) -> tuple[dict, dict]:
    searcher = Searcher.open(settings)
    llm = open_chat(settings, cache=searcher.cache)
    try:
        q = Query(question, settings, searcher.index, llm, searcher.embedder)
        t0 = time.perf_counter()
        if retrieval_only:  # subqueries and tests only: what was found, without claims and answer
            _, _, search = await retrieve(q, budget, [])
            units = q.index.text_units
            stats = {"tests_used": search.used, "claims_used": [],
                     "tested": [{"id": units.iloc[t.row]["id"], "relevant": t.relevant}
                                for t in search.tests.values()]}
        else:
            stats = (await lazy_search(q, budget=budget)).stats
        seconds = time.perf_counter() - t0
        total = llm.usage.total()
        cost = {"seconds": seconds, "calls": total.calls, "cached": total.cache_hits,
                "prompt": total.prompt_tokens, "completion": total.completion_tokens}
        return stats, cost
    finally:
        await llm.aclose()
        await searcher.aclose()


async def nearest(settings, question: str, k: int) -> list[str]:
    """The ids of the k units nearest the question (vector search at lazy search's context size)."""
    searcher = Searcher.open(settings)
    try:
        vectors = await searcher.index.vectors("text_units", searcher.embedder)
        qv = (await searcher.embedder.embed([question], kind="query", step="embed"))[0]
        return [i for i, _ in vectors.search(qv, k=k)] if k else []
    finally:
        await searcher.aclose()


def two_wiki(args, chat: dict) -> None:
    root = project(Path(args.workdir), args.size, chat, 120)
    base = settings_for(root, args.size, chat, {})
    asyncio.run(run_index(base, log=lambda m: None))
    base = settings_for(root, args.size, chat, args.extra)
    questions = json.loads(QUESTIONS.read_text())[args.first - 1: args.first - 1 + args.questions]
    index_units = Searcher.open(base).index
    docs = index_units.tables["documents"]
    title_of_doc = dict(zip(docs["id"], docs["title"]))
    title_of = {u: title_of_doc[d] for u, d in zip(index_units.text_units["id"], index_units.text_units["document_id"])}
    id_of_ref = dict(zip(index_units.text_units["human_readable_id"].astype(int), index_units.text_units["id"]))
    rows: dict[int, list[dict]] = {}
    for budget in args.budgets:
        rows[budget] = []
        print(f"\nbudget {budget}:")
        for n, item in enumerate(questions):
            stats, cost = asyncio.run(ask(base, item["question"], budget, args.retrieval_only))
            gold = set(item["supporting_titles"])
            relevant = [t["id"] for t in stats["tested"] if t["relevant"]]
            cited = {id_of_ref[s] for c in stats["claims_used"] for s in c["sources"] if s in id_of_ref}
            vector = asyncio.run(nearest(base, item["question"], len(relevant)))
            row = {"gold": len(gold), "relevant": len(relevant),
                   "found": len(gold & {title_of[u] for u in relevant}),
                   "true": sum(title_of[u] in gold for u in relevant),
                   "cited": len(gold & {title_of[u] for u in cited}),
                   "vector": len(gold & {title_of[u] for u in vector}),
                   "tests": stats["tests_used"], **cost}
            rows[budget].append(row)
            print(f"  {n + 1}/{len(questions)} tests {row['tests']}, relevant {row['relevant']}: gold "
                  f"{row['found']}/{row['gold']} (vector {row['vector']}), cited {row['cited']}; "
                  f"{row['calls']} calls (+{row['cached']} cached), {row['seconds']:.0f} s", flush=True)
    model = f"{args.model} at {args.base_url}" if args.base_url else f"embedded {args.size}"
    half = len(questions) // 2
    print(f"\n2WikiMultihopQA corpus ({CORPUS.name}, 6,119 passages), questions {args.first}-"
          f"{args.first + len(questions) - 1}, {model}")
    print("| budget | tests | relevant units | gold recall, relevant (halves) | vector, same units (halves) "
          "| precision | gold recall, claims' sources | calls | prompt tok | completion tok | s / question |")
    print("|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")

    def share(rs: list[dict], key: str, of: str = "gold") -> float:
        return sum(r[key] for r in rs) / max(1, sum(r[of] for r in rs))

    for budget, rs in rows.items():
        n = max(1, len(rs))
        halves = (rs[:half], rs[half:])
        print(f"| {budget} | {sum(r['tests'] for r in rs) / n:.0f} | {sum(r['relevant'] for r in rs) / n:.1f} | "
              f"{share(rs, 'found'):.2f} ({share(halves[0], 'found'):.2f} / {share(halves[1], 'found'):.2f}) | "
              f"{share(rs, 'vector'):.2f} ({share(halves[0], 'vector'):.2f} / {share(halves[1], 'vector'):.2f}) | "
              f"{share(rs, 'true', 'relevant'):.2f} | {share(rs, 'cited'):.2f} | "
              f"{sum(r['calls'] for r in rs) / n:.1f} | {sum(r['prompt'] for r in rs) / n:.0f} | "
              f"{sum(r['completion'] for r in rs) / n:.0f} | {sum(r['seconds'] for r in rs) / n:.0f} |")


def podcast(args, chat: dict) -> None:
    root = Path(args.workdir) / f"podcast-lazy-{args.size}"
    (root / "input").mkdir(parents=True, exist_ok=True)
    if not any((root / "input").iterdir()):
        with zipfile.ZipFile(PODCAST / "transcripts.zip") as z:
            for name in z.namelist():
                if name.endswith(".txt"):
                    (root / "input" / Path(name).name).write_bytes(z.read(name))
    if not (root / "settings.yaml").exists():
        (root / "settings.yaml").write_text(f"index_method: lazy\nlocal:\n  size: {args.size}\n")
    settings = settings_for(root, args.size, chat, args.extra)
    t0 = time.perf_counter()
    asyncio.run(run_index(settings, log=lambda m: None))
    print(f"podcast lazy index in {root}: {time.perf_counter() - t0:.0f} s")
    text = (PODCAST / "questions.csv").read_text(encoding="utf-8-sig")
    first = next(csv.DictReader(io.StringIO(text)))
    question = first.get("question_text") or first["question"]  # the shared file's column is question_text
    print(f"question: {question}")
    print("| budget | tests | relevant units | claims kept | calls | prompt tok | completion tok | seconds |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for budget in args.budgets:
        stats, cost = asyncio.run(ask(settings, question, budget))
        print(f"| {budget} | {stats['tests_used']} | {stats['relevant_units']} | {stats['claims_reduced']} | "
              f"{cost['calls']} (+{cost['cached']} cached) | {cost['prompt']} | {cost['completion']} | "
              f"{cost['seconds']:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/sg2wiki", help="where bench/multihop_recall.py --corpus keeps the index")
    ap.add_argument("--questions", type=int, default=10, help="how many of the 50 questions (0: none)")
    ap.add_argument("--first", type=int, default=11,
                    help="the first question (1-based); the prompts were read against questions 1-10")
    ap.add_argument("--budgets", default="25,100,500,1500")
    ap.add_argument("--size", choices=["1.5b", "0.5b"], default="1.5b", help="the embedded chat model")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server instead of the embedded model")
    ap.add_argument("--model", default="", help="its model name")
    ap.add_argument("--podcast", action="store_true", help="also one global podcast question per budget")
    ap.add_argument("--retrieval-only", action="store_true",
                    help="2Wiki: subqueries and relevance tests only (no claims, no answer: the claims column is 0)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a setting for the questions (not the index), e.g. lazy.follow_links=6; repeatable")
    args = ap.parse_args()
    args.extra = {}
    for item in args.set:
        path, _, value = item.partition("=")
        section, _, key = path.partition(".")
        # YAML 1.1 reads on/off as booleans; the settings' on/off choices are words
        args.extra.setdefault(section, {})[key] = value if value in ("on", "off") else yaml.safe_load(value)
    args.budgets = [int(b) for b in args.budgets.split(",")]
    chat = ({"provider": "openai", "base_url": args.base_url, "model": args.model or "model", "api_key": "none"}
            if args.base_url else {})
    if args.questions:
        two_wiki(args, chat)
    if args.podcast:
        podcast(args, chat)


if __name__ == "__main__":
    main()
