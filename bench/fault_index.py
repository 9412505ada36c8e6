"""Index through a faulty server: do 30% faults change the tables?

Indexes the three documents of tests/test_pipeline.py (60-token text units, claims on: ~80
distinct requests) once against the fault-free mock server, then once per seed against a mock
that fails 30% of requests, spread evenly over every fault (429 with Retry-After, 500, 503,
hang, drop, truncated, invalid, empty; client timeout 0.5 s so a hang costs little). Prints per
seed the requests, the faulty ones by kind, the retries, and whether every table equals the
fault-free run's.

    python bench/fault_index.py                 # seeds 1..10
    python bench/fault_index.py --seeds 30 --rate 0.5
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from mock_llm import FAULTS, start_mock_server  # noqa: E402
from test_pipeline import DOCS, settings_for, snapshot, write_docs  # noqa: E402

from sensegraph.index.pipeline import run_index  # noqa: E402

SECTIONS = {"chunks": {"size": 60, "overlap": 10}, "extraction": {"claims": True}}


def index(root: Path, server, retries: int = 10):
    settings = settings_for(root, server, max_retries=retries, **SECTIONS)
    for m in (settings.chat, settings.embedding):
        m.timeout = 0.5
    return asyncio.run(run_index(settings, log=lambda m: None, allow_partial=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--rate", type=float, default=0.30)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sensegraph-faults-"))
    try:
        clean = work / "clean"
        write_docs(clean, DOCS)
        with start_mock_server() as server:
            index(clean, server)
            print(json.dumps({"seed": None, "requests": server.stats["requests"]}))
        reference = snapshot(clean / "output")
        identical = 0
        for seed in range(1, args.seeds + 1):
            root = work / f"seed{seed}"
            write_docs(root, DOCS)
            with start_mock_server(faults={f: args.rate / len(FAULTS) for f in FAULTS}, seed=seed) as server:
                result = index(root, server)
                by_fault = server.stats["by_fault"]
            same = snapshot(root / "output") == reference
            identical += same
            faulty = sum(n for f, n in by_fault.items() if f != "ok")
            print(json.dumps({"seed": seed, "requests": sum(by_fault.values()), "faulty": faulty,
                              "faulty_percent": round(100 * faulty / sum(by_fault.values()), 1),
                              "retries": result.stats["llm"]["total"]["retries"], "failures": result.failures,
                              "identical_tables": same, "by_fault": by_fault}))
        print(f"identical tables: {identical} of {args.seeds} runs")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
