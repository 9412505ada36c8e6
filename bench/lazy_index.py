"""A lazy index of the podcast corpus, offline, as a user would build it: wall time, peak RSS, chat
calls (must be 0), and the time of each step, the text-unit embeddings among them (what a plain
vector RAG index of the same corpus costs: the embedding is the same, so that step's time is the
"basic vector embedding time" to compare with).

Reads ../shared/data/podcast/transcripts.zip (1,669 parts, ~1.07M tokens), runs
`run_index` with `index_method: lazy` and the embedded defaults (local embeddings; the
chat model is never started) in a fresh subprocess and a new project (an empty cache), so every
step is done, as on a first run.

    python bench/lazy_index.py                   # the whole corpus
    python bench/lazy_index.py --limit 200       # the first 200 transcripts
    python bench/lazy_index.py --keep /tmp/lazy-podcast   # keep the project (for query benches)
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from index_overhead import extract_corpus

GOAL_MINUTES = 10.0  # issue 28
GOAL_RSS_MB = 2048.0


def worker(root: str) -> None:
    import asyncio

    from sensegraph.config import load_settings
    from sensegraph.index.pipeline import run_index

    settings = load_settings(root, env={})
    t0 = time.perf_counter()
    result = asyncio.run(run_index(settings, allow_partial=True, log=lambda m: None))
    wall = time.perf_counter() - t0
    usage = result.stats["llm"]
    chat_calls = usage["total"]["calls"] - usage.get("embed", {}).get("calls", 0)
    print(json.dumps({
        "wall": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "chat_calls": chat_calls, "embedding_batches": usage.get("embed", {}).get("calls", 0),
        "steps": {k: v.get("seconds") for k, v in result.stats["steps"].items()},
        "tokens": result.stats["steps"]["text_units"].get("tokens", 0),
        "documents": len(result.tables["documents"]), "text_units": len(result.tables["text_units"]),
        "entities": len(result.tables["entities"]), "relationships": len(result.tables["relationships"]),
        "communities": {int(k): int(v) for k, v in result.tables["communities"].groupby("level").size().items()},
        "failures": result.stats["failures"],
    }), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="first N transcripts only")
    ap.add_argument("--keep", default=None, help="build the project here and keep it")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lazy-podcast-"))
    if root.exists() and args.keep:
        shutil.rmtree(root)
    n = extract_corpus(root / "input", args.limit)
    (root / "settings.yaml").write_text("index_method: lazy\n")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", str(root)], capture_output=True, text=True)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = m["steps"]
    print(f"\nsensegraph lazy index of the podcast corpus ({n} transcripts), 2 cores, offline")
    print("-" * 78)
    print(f"{'documents / text units / tokens':<40}{m['documents']:,} / {m['text_units']:,} / {m['tokens']:,}")
    print(f"{'concepts (entities) / co-occurrences':<40}{m['entities']:,} / {m['relationships']:,}")
    print(f"{'communities per level':<40}{m['communities']}")
    print(f"{'chat calls (must be 0)':<40}{m['chat_calls']}")
    print(f"{'wall time (index) / incl. start-up':<40}{m['wall'] / 60:.1f} min / {total / 60:.1f} min")
    print(f"{'peak RSS':<40}{m['peak_rss_mb']:,.0f} MB")
    for name, sec in steps.items():
        print(f"  {name:<38}{sec:>8.1f} s")
    print(f"{'text-unit embeddings (= vector RAG)':<40}{steps.get('embed', 0) / 60:.1f} min")
    print(f"{'everything but the embeddings':<40}{(m['wall'] - steps.get('embed', 0)) / 60:.1f} min")
    print("-" * 78)
    print(f"aim: <= {GOAL_MINUTES:.0f} min and <= {GOAL_RSS_MB / 1024:.0f} GB for the whole corpus; failures: "
          f"{m['failures'] or 'none'}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"project kept in {root}")


if __name__ == "__main__":
    main()
