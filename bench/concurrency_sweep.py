"""How well indexing keeps the LLM busy: a concurrency sweep against a mock with real latency.

For each concurrency, indexes the first --limit podcast transcripts from scratch (cache off)
against tests/mock_llm.py answering after --latency seconds, and prints the requests per second
achieved over the whole run (every step, embeddings included) against the ideal, concurrency /
latency: the rate if every connection were busy from the first call to the last. The shortfall
is the idle tail at step boundaries, the sequential chains inside a step (a unit's gleaning, a
report waiting for its sub-reports) and the client's own CPU.

    python bench/concurrency_sweep.py                         # 200 transcripts, 300 ms, 1 5 10 25 50
    python bench/concurrency_sweep.py --limit 1669 --concurrency 25   # the whole corpus
    python bench/concurrency_sweep.py --concurrency 25 --answer-scale 3   # a mock 3x as verbose
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_overhead import CORPUS, extract_corpus, write_settings  # noqa: E402
from mock_process import mock_server_process  # noqa: E402

WORKER = Path(__file__).resolve().parent / "index_overhead.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=200, help="first N transcripts (1669 = all)")
    ap.add_argument("--latency", type=float, default=0.3, help="mock seconds per answer")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 5, 10, 25, 50])
    ap.add_argument("--answer-scale", type=float, default=1.0,
                    help="the mock's answers this many times longer (more sentences and list items)")
    args = ap.parse_args()
    if not CORPUS.exists():
        sys.exit(f"corpus not found: {CORPUS}")
    rows = []
    with mock_server_process(args.latency, answer_scale=args.answer_scale) as server:
        for c in args.concurrency:
            tmp = Path(tempfile.mkdtemp(prefix="sg-sweep-"))
            try:
                n_docs = extract_corpus(tmp / "input", args.limit)
                write_settings(tmp, server.base_url, c)
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, str(WORKER), "--worker", str(tmp)], capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr[-3000:])
                    sys.exit(f"worker failed at concurrency {c}")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r["outer"] = time.perf_counter() - t0
                r["concurrency"] = c
                rows.append(r)
                print(f"  concurrency {c}: {r['wall']:.1f} s, {r['requests']} requests", flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{n_docs} podcast transcripts, mock latency {args.latency * 1000:.0f} ms, cache off"
          + (f", answers x{args.answer_scale:g}" if args.answer_scale != 1.0 else ""))
    head = f"{'concurrency':>11} {'wall s':>8} {'requests':>9} {'req/s':>8} {'ideal':>8} {'share':>6} " \
           f"{'CPU ms/req':>10} {'peak RSS MB':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ideal = r["concurrency"] / args.latency
        rate = r["requests"] / r["wall"]
        print(f"{r['concurrency']:>11} {r['wall']:>8.1f} {r['requests']:>9} {rate:>8.1f} {ideal:>8.1f} "
              f"{rate / ideal:>6.2f} {1000 * r['cpu'] / max(1, r['requests']):>10.2f} {r['peak_rss_mb']:>11.0f}")
    print("\nper step at the highest concurrency (s, calls): " + ", ".join(
        f"{k} {v['seconds']:.1f}s/{v['calls'] or 0}" for k, v in rows[-1]["steps"].items()))


if __name__ == "__main__":
    main()
