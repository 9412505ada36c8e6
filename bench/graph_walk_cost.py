"""What the graph walk of local search costs on a large index: graph build (once per opened
index) and one personalised PageRank (per question), without the embedding lookups that every
local question pays anyway.

Seeds are the entities named in each question (the walk's named seeds) plus a few random text
units, so no embedding model is needed. Prints nodes, edges, build time and the median and
worst walk time over the questions.

    python bench/graph_walk_cost.py /tmp/lazy-podcast/output      # any index folder
    python bench/graph_walk_cost.py OUTPUT --questions "Who is Kevin Scott?" "What is AI?"
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sensegraph.query.data import GraphIndex
from sensegraph.query.graph_walk import build_graph, pagerank
from sensegraph.query.names import named_entities

QUESTIONS = [
    "What do the guests say about artificial intelligence and the future of work?",
    "How does Microsoft think about open source?",
    "Which companies are mentioned together with OpenAI?",
    "What did Kevin Scott say about education?",
    "How do the guests describe climate change and energy?",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="an index folder (output/ of a sensegraph project, or Microsoft's)")
    ap.add_argument("--questions", nargs="*", default=QUESTIONS)
    ap.add_argument("--damping", type=float, default=0.5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    index = GraphIndex.load(args.output)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph = build_graph(index)
    build = time.perf_counter() - t0
    print(f"{args.output}: {len(graph.entity_ids):,} entities, {len(graph.unit_ids):,} text units, "
          f"{graph.edges:,} directed edges; tables loaded in {load:.2f} s, walk graph built in {build:.2f} s")
    rng = np.random.default_rng(0)
    n = len(graph.entity_ids)
    times, names, iterations = [], [], []
    for question in args.questions:
        t0 = time.perf_counter()
        named = named_entities(index.entities, question)
        restart = np.zeros(graph.size)
        row = {e: i for i, e in enumerate(graph.entity_ids)}
        for e in named:
            restart[row[e]] = 1.0
        for u in rng.choice(len(graph.unit_ids), size=min(5, len(graph.unit_ids)), replace=False):
            restart[n + u] = 0.2
        names.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pagerank(graph, restart, args.damping)
        times.append(time.perf_counter() - t0)
        iterations.append(len(named))
    print(f"per question: name matching median {1000 * statistics.median(names):.1f} ms, "
          f"walk median {1000 * statistics.median(times):.1f} ms, worst {1000 * max(times):.1f} ms "
          f"({len(args.questions)} questions, {statistics.mean(iterations):.1f} named entities on average)")


if __name__ == "__main__":
    main()
