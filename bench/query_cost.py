"""Query cost per condition: the paper's Table 2 (Edge et al. 2024) on the podcast corpus.

Indexes the podcast corpus (../shared/data/podcast/transcripts.zip, 1,669 parts, ~1M tokens)
against tests/mock_llm.py in its own process (reused from --workdir when an index is already
there), then runs one real global query per condition through `Searcher.query` — C0..C3
(community reports at levels 0..3) and TS (the same map-reduce over source text units) — and
prints per condition: context units, context tokens, their share of TS tokens and the map calls.
The context budget is the settings' default for a hosted model (8000 tokens), as in the paper.

It also prints the community counts per level and how many entities each level's projected
report set covers (asserted: every entity exactly once at every level), and with --dynamic,
dynamic community selection at the deepest level against static global search on a few of
the corpus's questions (questions.csv).

    python bench/query_cost.py                         # index once into /tmp, then measure
    python bench/query_cost.py --dynamic --questions 3
    python bench/query_cost.py --workdir /tmp/podcast-idx --limit 200   # a smaller corpus
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import sys
import time
from collections import Counter
from pathlib import Path

from index_overhead import CORPUS, extract_corpus, write_settings
from mock_process import mock_server_process

from sensegraph.config import Settings, load_settings
from sensegraph.query import GraphIndex, IndexNotFound, Searcher
from sensegraph.query.data import list_ids
from sensegraph.query.global_search import project_reports

QUESTIONS = CORPUS.parent / "questions.csv"
LEVELS = (0, 1, 2, 3)
# Table 2 of the paper, podcast column, as ranges of "fewer tokens than TS".
PAPER = "paper (podcast): C0 needs >97% fewer tokens than TS; C3 26-33% fewer"
# A global question for the per-condition runs: the cost does not depend on it (every unit
# at the level is mapped), only the answer does.
TABLE_QUESTION = "What are the main themes discussed across the podcast episodes?"


# -- the index ------------------------------------------------------------------------------------
def ensure_index(workdir: Path, base_url: str, args: argparse.Namespace, log=print) -> Settings:
    """Settings pointing at the running mock; the index is built only when none is complete."""
    write_settings(workdir, base_url, concurrency=25)
    # The transcript parts are 616-652 tokens: 600-token chunks would split each in two, while
    # the paper's TS condition maps the 1,669 parts themselves.
    with (workdir / "settings.yaml").open("a") as f:
        f.write(f"chunks:\n  size: {args.chunk_size}\n  overlap: 100\n"
                f"query:\n  dynamic_threshold: {args.threshold}\n")
    settings = load_settings(workdir, env={})
    try:
        index = GraphIndex.load(settings.path(settings.output_dir))
        log(f"reusing the index in {workdir / settings.output_dir} ({len(index.text_units)} text units; "
            f"delete the folder to rebuild with other chunk settings)")
        return settings
    except IndexNotFound:
        pass
    from sensegraph.index.pipeline import run_index

    n = extract_corpus(workdir / settings.input.dir, args.limit)
    log(f"indexing {n} transcripts into {workdir} against the mock (once; later runs reuse it) ...")
    t0 = time.perf_counter()
    result = asyncio.run(run_index(settings, cache=False, allow_partial=True, log=lambda m: None))
    failed = sum(len(v) for v in result.stats["failures"].values())
    log(f"indexed in {time.perf_counter() - t0:.0f} s ({failed} failed items)")
    return settings


# -- structure: communities and entity coverage per level ----------------------------------------
def coverage(index: GraphIndex) -> list[dict]:
    """Per level: communities, reports, projected reports and how often each entity is covered."""
    members = {int(c): list_ids(e) for c, e in zip(index.communities["community"], index.communities["entity_ids"])}
    all_entities = set(index.entities["id"])
    rows = []
    for level in range(index.max_level() + 1):
        projected = project_reports(index.reports, index.communities, level)
        counts = Counter(e for c in projected["community"] for e in members.get(int(c), []))
        rows.append({
            "level": level,
            "communities": int((index.communities["level"] == level).sum()),
            "reports": int((index.reports["level"] == level).sum()),
            "projected": len(projected),
            "covered": len(all_entities & counts.keys()),
            "twice": sum(1 for n in counts.values() if n > 1),
            "entities": len(all_entities),
        })
    return rows


def print_coverage(rows: list[dict]) -> None:
    print("\nCommunities and entity coverage per level (projected report set = what global search maps)")
    print(f"{'level':>5} {'communities':>11} {'reports':>8} {'projected':>9} {'entities covered':>17} {'twice+':>7}")
    for r in rows:
        print(f"{r['level']:>5} {r['communities']:>11} {r['reports']:>8} {r['projected']:>9} "
              f"{str(r['covered']) + ' / ' + str(r['entities']):>17} {r['twice']:>7}")
    bad = [r["level"] for r in rows if r["covered"] != r["entities"] or r["twice"]]
    assert not bad, f"levels {bad} do not cover every entity exactly once"
    print("check: every level covers every entity exactly once - OK")


# -- Table 2 -------------------------------------------------------------------------------------
async def conditions(searcher: Searcher) -> list[dict]:
    """One real query per condition; the figures are the query's own stats."""
    deepest = searcher.index.max_level()
    out = []
    for level in LEVELS:
        if level > deepest:
            out.append({"condition": f"C{level}", "missing": True})
            continue
        r = await searcher.query(TABLE_QUESTION, "global", level=level)
        out.append({"condition": f"C{level}", **r.stats, "prompt_tokens": r.usage["prompt_tokens"]})
    r = await searcher.query(TABLE_QUESTION, "text")
    out.append({"condition": "TS", **r.stats, "prompt_tokens": r.usage["prompt_tokens"]})
    return out


def print_conditions(rows: list[dict], budget: int) -> None:
    ts = next(r for r in rows if r["condition"] == "TS")["context_tokens"]
    print(f"\nTable 2: context per global query (budget {budget} tokens per map call, cl100k tokens)")
    print(f"{'cond':<5} {'units':>6} {'context tokens':>15} {'% of TS':>8} {'fewer than TS':>14} "
          f"{'tokens/unit':>12} {'map calls':>10} {'reduce':>7}")
    for r in rows:
        if r.get("missing"):
            print(f"{r['condition']:<5} (the index has no level {r['condition'][1:]})")
            continue
        share = 100 * r["context_tokens"] / ts
        print(f"{r['condition']:<5} {r['context_units']:>6} {r['context_tokens']:>15,} {share:>7.1f}% "
              f"{100 - share:>13.1f}% {r['context_tokens'] / max(1, r['context_units']):>12.0f} "
              f"{r['map_calls']:>10} {r['reduce_calls']:>7}")
    print(PAPER)
    print("note: units and map calls are structural; report tokens are not comparable with the paper's: the "
          "mock writes reports of ~100 tokens where a real model writes up to reports.max_tokens (1,500).")


# -- dynamic selection ---------------------------------------------------------------------------
def questions(n: int) -> list[str]:
    with QUESTIONS.open(encoding="utf-8-sig", newline="") as f:
        return [row["question_text"] for row in csv.DictReader(f)][:n]


async def dynamic(searcher: Searcher, qs: list[str]) -> list[dict]:
    level = searcher.index.max_level()
    out = []
    for q in qs:
        static = await searcher.query(q, "global", level=level)
        dyn = await searcher.query(q, "global", level=level, dynamic=True)
        sel = dyn.stats["dynamic"]
        out.append({
            "question": q, "level": level, "threshold": searcher.settings.query.dynamic_threshold, "rated": sel["rated"], "relevant": sel["relevant"],
            "kept": sel["kept"], "fallback": sel.get("fallback", False), "static_reports": static.stats["reports"],
            "static_prompt": static.usage["prompt_tokens"], "dynamic_prompt": dyn.usage["prompt_tokens"],
            "rate_prompt": dyn.usage["steps"].get("rate", {}).get("prompt_tokens", 0),
            "static_maps": static.stats["map_calls"], "dynamic_maps": dyn.stats["map_calls"],
        })
    return out


def print_dynamic(rows: list[dict]) -> None:
    level = rows[0]["level"]
    print(f"\nDynamic community selection at level {level} vs static global at the same level")
    print(f"{'#':>2} {'rated':>6} {'relevant':>9} {'kept':>5} {'static':>7} {'maps dyn/static':>16} "
          f"{'prompt tokens dyn (rating) / static':>36} {'ratio':>6}")
    for i, r in enumerate(rows, 1):
        tokens = f"{r['dynamic_prompt']:,} ({r['rate_prompt']:,}) / {r['static_prompt']:,}"
        print(f"{i:>2} {r['rated']:>6} {r['relevant']:>9} {r['kept']:>5} {r['static_reports']:>7} "
              f"{str(r['dynamic_maps']) + ' / ' + str(r['static_maps']):>16} {tokens:>36} "
              f"{r['dynamic_prompt'] / max(1, r['static_prompt']):>6.2f}")
    for i, r in enumerate(rows, 1):
        print(f"  {i}. {r['question']}" + ("  [no report kept: fell back to the whole level]" if r["fallback"] else ""))
    print(f"note: the mock's relevance ratings are pseudo-random (a hash of the request; 1-10 clamped to 0-5, "
          f"never 0), so the kept counts only illustrate the mechanism (threshold {rows[0]['threshold']}: "
          f"--threshold 4 prunes); with a real model they depend on the question.")
    print("note: prompt tokens are as the server reports them (the mock counts characters / 4), "
          "including the rating calls.")


# -- main ----------------------------------------------------------------------------------------
async def measure(settings: Settings, args: argparse.Namespace) -> None:
    searcher = Searcher.open(settings, cache=False)
    try:
        index = searcher.index
        print(f"\nindex: {len(index.text_units)} text units, {len(index.entities)} entities, "
              f"{len(index.relationships)} relationships, {len(index.communities)} communities, "
              f"{len(index.reports)} reports, levels 0-{index.max_level()}")
        print_coverage(coverage(index))
        t0 = time.perf_counter()
        rows = await conditions(searcher)
        print_conditions(rows, settings.query_context_tokens())
        print(f"({sum(not r.get('missing') for r in rows)} queries against the mock in {time.perf_counter() - t0:.0f} s)")
        if args.dynamic:
            print_dynamic(await dynamic(searcher, questions(args.questions)))
    finally:
        await searcher.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sensegraph-query-cost"),
                    help="project folder holding the podcast index (built there if absent)")
    ap.add_argument("--limit", type=int, default=None, help="index only the first N transcripts")
    ap.add_argument("--dynamic", action="store_true", help="also compare dynamic selection with static global")
    ap.add_argument("--questions", type=int, default=3, help="questions for --dynamic (from questions.csv)")
    ap.add_argument("--chunk-size", type=int, default=700, help="text unit size when the index is built")
    ap.add_argument("--threshold", type=int, default=1,
                    help="query.dynamic_threshold (the settings' default is 1; the mock rates 1-5)")
    args = ap.parse_args()
    if not CORPUS.exists():
        sys.exit(f"corpus not found: {CORPUS}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    with mock_server_process() as server:
        settings = ensure_index(args.workdir, server.base_url, args)
        asyncio.run(measure(settings, args))


if __name__ == "__main__":
    main()
