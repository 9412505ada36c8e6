"""Extraction speed of the embedded model under different server settings (`local.*`): the
same documents, the same requests, each configuration from an empty cache on a server of its own.

Draws --docs held-out Re-DocRED documents (as bench/extraction_quality.py does, one text unit
each), and for each configuration starts the embedded server afresh, runs sensegraph's own
extraction step on them (the extraction call and its gleaning check, as the index sends them)
and prints the wall time, the calls, the completion tokens per second, and how many units'
answers came out the same as the first configuration's (entity names, types and relationship
pairs). Configurations run in turn, then again in reverse order (--rounds 2), so a machine that
speeds up or slows down during the run favours none; the table gives each one's median.

    python bench/extraction_speed.py --docs 2 --configs parallel=2,parallel=1
    python bench/extraction_speed.py --size 0.5b --docs 2 --rounds 1 --configs parallel=2,parallel=2+repeat_penalty=1.0

A configuration is KEY=VALUE[+KEY=VALUE...] of the `local` section. Run it alone on the
machine: two embedded-model jobs slow each other several times over.

Speculative decoding (llama.cpp's n-gram drafts, no draft model) was measured with this bench's
first version and not kept (docs/performance.md; `git show 56d4492`).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extraction_quality import detokenise, load  # noqa: E402

from sensegraph.config import load_settings  # noqa: E402
from sensegraph.index.extract import extract_graph  # noqa: E402
from sensegraph.llm import embedded, open_cache, open_chat  # noqa: E402


def parse(config: str) -> dict:
    """`parallel=1+repeat_penalty=1.0` as the `local` settings it gives."""
    out: dict = {}
    for item in config.split("+"):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: give a configuration as KEY=VALUE[+KEY=VALUE...], e.g. parallel=1")
        out[key.strip()] = yaml.safe_load(value)
    return out


async def run_once(settings, units: pd.DataFrame):
    cache = open_cache(settings)
    llm = open_chat(settings, cache=cache)
    try:
        extraction = await extract_graph(units, llm, settings=settings, language="en")
        return extraction, llm.usage.total()
    finally:
        await llm.aclose()
        if cache is not None:
            cache.close()


def signature(extraction, unit_id: str) -> tuple:
    """What a unit's answers say: entity names and types, relationship pairs (sorted)."""
    ents = extraction.entities
    rels = extraction.relationships
    e = ents[ents["text_unit_id"] == unit_id] if "text_unit_id" in ents else ents.iloc[0:0]
    r = rels[rels["text_unit_id"] == unit_id] if "text_unit_id" in rels else rels.iloc[0:0]
    return (tuple(sorted(zip(e["title"], e["type"]))), tuple(sorted(zip(r["source"], r["target"]))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--size", choices=["1.5b", "0.5b"], default="1.5b")
    ap.add_argument("--configs", default="parallel=2,parallel=1")
    ap.add_argument("--rounds", type=int, default=2, help="1: each configuration once; 2: and again in reverse")
    args = ap.parse_args()
    docs = load(args.docs, args.seed, held_out=True)
    units = pd.DataFrame({"id": [f"doc{i}" for i in range(len(docs))], "text": [detokenise(d["sents"]) for d in docs]})
    configs = args.configs.split(",")
    order = configs + (configs[::-1] if args.rounds > 1 else [])
    seconds: dict[str, list[float]] = {c: [] for c in configs}
    tokens: dict[str, list[int]] = {c: [] for c in configs}
    calls: dict[str, int] = {}
    sigs: dict[str, list[tuple]] = {}
    for config in order:
        with tempfile.TemporaryDirectory(prefix="sensegraph-speed-") as root:
            settings = load_settings(Path(root), overrides={
                "local": {"size": args.size, **parse(config)}, "cache": {"dir": str(Path(root) / "cache")}}, env={})
            t0 = time.perf_counter()
            extraction, usage = asyncio.run(run_once(settings, units))
            took = time.perf_counter() - t0
            embedded.stop_servers()  # each configuration starts its own server; free this one's memory
        seconds[config].append(took)
        tokens[config].append(usage.completion_tokens)
        calls[config] = usage.calls
        sigs.setdefault(config, [signature(extraction, u) for u in units["id"]])
        print(f"{config}: {took:.0f} s, {usage.calls} calls, {usage.completion_tokens} completion tokens, "
              f"failed units {len(extraction.failed)}", flush=True)
    base = configs[0]
    print(f"\n{len(docs)} held-out Re-DocRED documents (seed {args.seed}), embedded {args.size}, "
          f"{args.rounds} round(s); median seconds")
    print("| configuration | seconds | vs first | calls | completion tokens (median) | tokens/s | same answers as first |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        s = statistics.median(seconds[c])
        written = sum(tokens[c]) / sum(seconds[c])  # each run's tokens over its own seconds, pooled
        same = sum(a == b for a, b in zip(sigs[c], sigs[base]))
        print(f"| {c} | {s:.0f} | {statistics.median(seconds[base]) / s:.2f}x | {calls[c]} | {statistics.median(tokens[c]):.0f} | "
              f"{written:.1f} | {same} / {len(units)} |")


if __name__ == "__main__":
    main()
