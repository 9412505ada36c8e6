"""Kill `sensegraph index` with SIGKILL at seeded random moments and rerun it: is work lost?

Indexes a small corpus (the three documents of tests/test_pipeline.py, 40-token text units,
claims on: ~130 LLM requests) against the mock server (tests/mock_llm.py, in a thread, with
latency), first uninterrupted, then in a fresh project with at least --kills SIGKILLs spread
over every step (plus two during start-up), each followed by a rerun; after each kill every
parquet table, JSON file and the answer cache is read back. Prints per seed and in total: the
LLM requests of both, the extra requests of the interrupted runs, the requests in flight at the
kills (as the server saw them) and lost (answer never stored, from the cache), the requests
wasted (asked although their answer was already cached), the extra requests that lost ones do
not explain, and whether the final tables equal the uninterrupted run's.

    python bench/kill_index.py                      # 12 kills per seed, seeds 0..2
    python bench/kill_index.py --kills 20 --seeds 5 --latency 0.1
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kill_harness import SETTINGS, cli_env, reference_run, run_with_kills  # noqa: E402
from mock_llm import start_mock_server  # noqa: E402
from test_pipeline import DOCS, snapshot, write_docs  # noqa: E402


def one(seed: int, kills: int, latency: float, work: Path) -> dict:
    ref, project = work / f"ref-{seed}", work / f"killed-{seed}"
    write_docs(ref, DOCS)
    write_docs(project, DOCS)
    with start_mock_server(latency=latency) as server:
        env = cli_env(server.base_url, **SETTINGS)
        reference = reference_run(ref, server, env)
        report = run_with_kills(project, server, env, reference=reference, kills=kills, seed=seed,
                                latency=latency)
    out = report.as_dict()
    out["seed"] = seed
    out["tables_identical"] = snapshot(project / "output") == snapshot(ref / "output")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.05)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sensegraph-kill-"))
    try:
        rows = [one(seed, args.kills, args.latency, work) for seed in range(args.seeds)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        print(json.dumps(r))
    keys = ("runs", "kills", "reference_requests", "interrupted_requests", "extra_requests", "in_flight_at_kills",
            "lost_at_kills", "wasted", "beyond_in_flight")
    total = {k: sum(r[k] for r in rows) for k in keys}
    total["extra_percent"] = round(100 * total["extra_requests"] / max(1, total["reference_requests"]), 2)
    total["beyond_in_flight_percent"] = round(100 * total["beyond_in_flight"] / max(1, total["reference_requests"]), 2)
    total["all_tables_identical"] = all(r["tables_identical"] for r in rows)
    total["all_exit_codes_zero"] = all(c == 0 for r in rows for c in r["exit_codes"])
    print("total", json.dumps(total))

if __name__ == "__main__":
    main()
