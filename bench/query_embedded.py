"""Wall time and tokens of one query per method with the project's configured model.

    python bench/query_embedded.py --root /path/to/indexed/project [--cache]

Meant for the embedded model over an index of operation-dulce.txt: global at C0 and at the
deepest level, local, DRIFT and basic; over a lazy index (no reports): lazy search (at --budget)
and basic. The answer cache is off by default so every call is really made (pass --cache to
reuse earlier answers). Prints a table and then the answers.

    python bench/query_embedded.py --root /tmp/lazy-podcast --methods lazy --global-question "..."
"""
from __future__ import annotations

import argparse
import asyncio
import time

from sensegraph.config import load_settings
from sensegraph.query import Searcher

GLOBAL_Q = "What are the main themes of this story?"
LOCAL_Q = "Who is Alex Mercer and what does he do?"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--cache", action="store_true", help="use the answer cache (default: every call is made)")
    ap.add_argument("--global-question", default=GLOBAL_Q)
    ap.add_argument("--local-question", default=LOCAL_Q)
    ap.add_argument("--methods", default=None,
                    help="comma-separated of c0, cmax, local, drift, basic, lazy (lazy asks the global question); "
                         "default: all but lazy, or lazy and basic on an index without reports")
    ap.add_argument("--budget", type=int, default=None, help="lazy search's relevance tests (default lazy.budget)")
    args = ap.parse_args()
    settings = load_settings(args.root)
    searcher = Searcher.open(settings, cache=args.cache)
    deepest = searcher.index.max_level()
    every = {"c0": ("global C0", args.global_question, "global", {"level": 0}),
             "cmax": (f"global C{deepest}", args.global_question, "global", {"level": deepest}),
             "local": ("local", args.local_question, "local", {}), "drift": ("drift", args.local_question, "drift", {}),
             "basic": ("basic", args.local_question, "basic", {}),
             "lazy": ("lazy", args.global_question, "lazy", {"budget": args.budget})}
    lazy_index = searcher.index.reports.empty
    chosen = args.methods.split(",") if args.methods else (["lazy", "basic"] if lazy_index else
                                                             ["c0", "cmax", "local", "drift", "basic"])
    runs = [every[m] for m in chosen]
    # Starting the model server and loading the embedder are paid before the clock runs.
    if settings.chat.provider == "local":
        from sensegraph.llm.embedded import ensure_server

        ensure_server(settings.local)
    await searcher.embedder.embed(["warm up"], kind="query")
    rows, answers = [], []
    try:
        for name, question, method, options in runs:
            t0 = time.perf_counter()
            r = await searcher.query(question, method, **options)
            wall = time.perf_counter() - t0
            u = r.usage
            rows.append((name, wall, u["calls"], u["prompt_tokens"], u["completion_tokens"], r.context.tokens,
                         r.stats.get("map_calls", "")))
            notes = {k: r.stats[k] for k in ("follow_ups_answered", "points", "points_scored_zero", "tester",
                                             "tests_used", "relevant_units", "communities_visited", "claims",
                                             "stopped") if k in r.stats}
            answers.append((name, question, r.answer, r.citations, r.invalid_citations, notes, r.failures))
    finally:
        await searcher.aclose()
    model = settings.local.size if settings.chat.provider == "local" else settings.chat.model
    print(f"model: {model}   index: {searcher.index.output_dir}   context budget: {settings.query_context_tokens()}")
    print(f"{'query':<12}{'wall s':>8}{'calls':>7}{'prompt tok':>12}{'compl tok':>11}{'context tok':>13}{'map':>5}")
    for name, wall, calls, pt, ct, ctx, maps in rows:
        print(f"{name:<12}{wall:>8.1f}{calls:>7}{pt:>12,}{ct:>11,}{ctx:>13,}{maps!s:>5}")
    for name, question, answer, cited, invalid, notes, failures in answers:
        print(f"\n=== {name}: {question}\n{answer}\ncited: {cited}   removed (not in context): {invalid}"
              f"   {notes}   failed calls: {failures or 'none'}")


if __name__ == "__main__":
    asyncio.run(main())
