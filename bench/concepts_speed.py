"""Speed of the lazy index's NLP: concept extraction and the co-occurrence graph, no LLM.

Reads the first N podcast transcripts (../shared/data/podcast/transcripts.zip, sorted by name,
as bench/index_overhead.py does), cuts them into text units as the index does (600/100 tokens),
runs sensegraph.index.concepts.concept_instances and cooccurrence.concept_graph, and prints
corpus and unit tokens per second, concepts found, peak RSS, and the time extrapolated to the
whole corpus (1,669 transcripts, ~1.07M tokens). The model load is timed apart.

    python bench/concepts_speed.py                  # first 300 transcripts (a minute or two)
    python bench/concepts_speed.py --limit 0        # the whole corpus
    python bench/concepts_speed.py --n-process 2    # spaCy in two processes
    python bench/concepts_speed.py --components     # + seconds per spaCy component (full pipeline)
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "data" / "podcast" / "transcripts.zip"
CORPUS_TOKENS = 1_070_000  # the whole podcast corpus (cl100k), the lazy index goal's scale
GOAL_SECONDS = 6 * 60      # of the 15-minute lazy index, for concepts of the whole corpus


def read_transcripts(limit: int) -> pd.DataFrame:
    from sensegraph.store.tables import content_id

    with zipfile.ZipFile(CORPUS) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".txt"))
        if limit:
            names = names[:limit]
        texts = [z.read(n).decode("utf-8", errors="replace") for n in names]
    return pd.DataFrame({"id": [content_id("document", n) for n in names], "human_readable_id": range(len(names)),
                         "title": [Path(n).name for n in names], "text": texts})


def components(texts: list[str]) -> dict[str, float]:
    """Seconds per component of the whole English pipeline (parser and attribute ruler included)."""
    import importlib

    from sensegraph.index.concepts import SPACY_PACKAGE, verify_english_pipeline

    verify_english_pipeline()
    nlp = importlib.import_module(SPACY_PACKAGE).load()
    nlp.enable_pipe("senter")
    t = time.perf_counter()
    docs = [nlp.make_doc(x) for x in texts]
    out = {"tokenizer": time.perf_counter() - t}
    for name, proc in nlp.pipeline:
        t = time.perf_counter()
        docs = list(proc.pipe(docs, batch_size=32))
        out[name] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=300, help="first N transcripts (0 = all 1,669)")
    ap.add_argument("--n-process", type=int, default=1, help="spaCy processes (nlp.pipe n_process)")
    ap.add_argument("--components", action="store_true", help="also time each spaCy component")
    args = ap.parse_args()
    if not CORPUS.exists():
        sys.exit(f"corpus not found: {CORPUS}")

    from sensegraph.config import Settings
    from sensegraph.index import concepts, cooccurrence
    from sensegraph.index.text_units import make_text_units

    settings = Settings()
    docs = read_transcripts(args.limit)
    units = make_text_units(docs, size=settings.chunks.size, overlap=settings.chunks.overlap)
    from sensegraph.tokens import count_tokens

    corpus_tokens = sum(count_tokens(t) for t in docs["text"])
    unit_tokens = int(units["n_tokens"].sum())

    t0 = time.perf_counter()
    concepts.english_pipeline()
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    found = concepts.concept_instances(units, language="en", settings=settings, n_process=args.n_process)
    extract = time.perf_counter() - t0
    t0 = time.perf_counter()
    entities, relationships = cooccurrence.concept_graph(found, units, settings=settings, language="en")
    graph = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # n_process > 1: the workers

    per_token = extract / corpus_tokens
    rows = [
        ("transcripts / text units", f"{len(docs)} / {len(units)}"),
        ("tokens: corpus / in units (overlap counted twice)", f"{corpus_tokens:,} / {unit_tokens:,}"),
        ("pipeline load (hash check + spaCy)", f"{load:.1f} s"),
        (f"concept extraction (n_process={args.n_process})",
         f"{extract:.1f} s = {corpus_tokens / extract:,.0f} corpus tokens/s ({unit_tokens / extract:,.0f} unit tokens/s)"),
        ("concept instances / distinct keys", f"{len(found):,} / {found['key'].nunique():,}"),
        ("co-occurrence graph", f"{graph:.1f} s: {len(entities):,} entities, {len(relationships):,} relationships"),
        ("peak RSS", f"{rss:.0f} MB" + (f" (largest worker {child_rss:.0f} MB)" if args.n_process > 1 else "")),
        (f"extrapolated to {CORPUS_TOKENS:,} tokens",
         f"extraction {per_token * CORPUS_TOKENS / 60:.1f} min (goal < {GOAL_SECONDS / 60:.0f} min), "
         f"+ load {load:.0f} s"),
    ]
    w = max(len(k) for k, _ in rows)
    print(f"\nlazy index concepts, first {len(docs)} podcast transcripts")
    print("-" * (w + 60))
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("-" * (w + 60))
    print("types:", ", ".join(f"{t} {n}" for t, n in entities["type"].value_counts().items()))
    top = entities.sort_values("frequency", ascending=False).head(15)
    print("most frequent concepts:", ", ".join(f"{t} ({f})" for t, f in zip(top["title"], top["frequency"])))
    if args.components:
        times = components(list(units["text"]))
        total = sum(times.values())
        print("full pipeline per component (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items())
              + f"; total {total:.1f}; the lazy index runs without parser and attribute_ruler "
              f"({(times.get('parser', 0) + times.get('attribute_ruler', 0)) / total:.0%} of it)")


if __name__ == "__main__":
    main()
