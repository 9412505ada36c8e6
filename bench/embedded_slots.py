"""Aggregate throughput of the embedded llama.cpp server at 1, 2 and 4 parallel slots.

llama.cpp decodes the requests of all busy slots together (continuous batching), so on a CPU
more slots trade per-request speed for aggregate tokens/s, until the cores are saturated. This
bench sends the same extraction-sized work at each slot count and prints what a whole index
run cares about: aggregate prompt and generation tokens/s, and the wall time of the batch.

    python bench/embedded_slots.py                  # 1.5b (the default model), slots 1 2 4
    python bench/embedded_slots.py --size 0.5b --slots 1 2 4 8 --requests 8

Work per request: a distinct ~600-token passage of christmas-carol.txt (so no prompt prefix is
shared between requests) under an extraction-like instruction, and exactly --generate tokens
(ignore_eos), at temperature 0. Requests are sent with as many in flight as there are slots.
The machine should be otherwise idle: another model run on the same cores halves every figure.

    python bench/embedded_slots.py --schema         # as indexing decodes: the extraction schema

With --schema each request decodes as extraction does: under the extraction JSON schema, with
sensegraph's repeat penalty, until the JSON is complete (at most --generate tokens), so the
generated lengths differ and the aggregate generated tokens/s is the figure to compare.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from sensegraph.config import LocalModelSettings
from sensegraph.llm import embedded
from sensegraph.tokens import count_tokens, truncate

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "christmas-carol.txt"
INSTRUCTION = ("You extract entities from text. For each person, place and organization, write its name, "
               "type and a one-line description, then the relationships between them.")


def passages(n: int, tokens: int) -> list[str]:
    if DATA.exists():
        text = DATA.read_text(encoding="utf-8")
        text = text[max(0, text.find("Marley was dead")):]
    else:
        text = " ".join(f"Scrooge met clerk number {i} in the counting-house on a cold evening." for i in range(4000))
    out, rest = [], text
    for _ in range(n):
        piece = truncate(rest, tokens)
        out.append(piece)
        rest = rest[len(piece):]
    return out


def schema_options(local: LocalModelSettings) -> dict:
    """What an extraction request adds: the JSON schema and the repeat penalty (as sensegraph.llm sends them)."""
    from sensegraph.config import ExtractionSettings
    from sensegraph.index.extract import graph_schema
    from sensegraph.llm.client import strict_schema

    ex = ExtractionSettings()
    model = graph_schema(ex.entity_types, ex.max_entities, ex.max_relationships)
    return {"response_format": {"type": "json_schema", "json_schema": {
                "name": model.__name__, "schema": strict_schema(model), "strict": True}},
            "repeat_penalty": local.repeat_penalty, "repeat_last_n": 1024}


async def run_batch(base: str, alias: str, texts: list[str], slots: int, generate: int,
                    extra: dict | None = None) -> dict[str, float]:
    gate = asyncio.Semaphore(slots)
    timings: list[dict] = []

    async def one(client: httpx.AsyncClient, text: str) -> None:
        async with gate:
            body = {"model": alias, "max_tokens": generate, "temperature": 0, "cache_prompt": False,
                    "messages": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": text}]}
            body.update(extra or {"ignore_eos": True})
            r = await client.post(f"{base}/chat/completions", json=body)
            r.raise_for_status()
            timings.append(r.json().get("timings", {}))

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=3600) as client:
        await asyncio.gather(*(one(client, t) for t in texts))
    wall = time.perf_counter() - t0
    prompt = sum(t.get("prompt_n", 0) for t in timings)
    gen = sum(t.get("predicted_n", 0) for t in timings)
    return {"wall": wall, "prompt": prompt, "gen": gen,
            "per_request_gen_tps": sum(t.get("predicted_per_second", 0) for t in timings) / max(1, len(timings)),
            "per_request_prompt_tps": sum(t.get("prompt_per_second", 0) for t in timings) / max(1, len(timings))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1.5b", choices=["1.5b", "0.5b"])
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--requests", type=int, default=8, help="requests per slot count (same passages each time)")
    ap.add_argument("--generate", type=int, default=200, help="generated tokens per request")
    ap.add_argument("--passage-tokens", type=int, default=600)
    ap.add_argument("--context-per-slot", type=int, default=4096)
    ap.add_argument("--schema", action="store_true",
                    help="decode under the extraction JSON schema with the repeat penalty, as indexing does")
    args = ap.parse_args()
    if args.schema and args.generate == 200:
        args.generate = 1500  # room for a whole extraction answer

    texts = passages(args.requests, args.passage_tokens)
    console = Console(width=max(120, Console().width))
    console.print(f"{args.size}: {args.requests} requests of ~{count_tokens(texts[0])} cl100k passage tokens, "
                  + (f"up to {args.generate} generated tokens under the extraction schema; " if args.schema else
                     f"{args.generate} generated tokens each; ") + f"{os.cpu_count()} cores; "
                  f"context per slot {args.context_per_slot}")
    table = Table(title=f"embedded {args.size}: aggregate throughput by parallel slots"
                        + (" (extraction JSON schema)" if args.schema else ""))
    for col in ("slots", "wall s", "prompt tok", "agg prompt tok/s", "gen tok", "agg gen tok/s",
                "per-request gen tok/s", "agg gen vs first"):
        table.add_column(col, justify="right")
    first_rate = None
    for slots in args.slots:
        local = LocalModelSettings(size=args.size, parallel=slots, context_per_slot=args.context_per_slot)
        base, alias = embedded.ensure_server(local)
        extra = schema_options(local) if args.schema else None
        r = asyncio.run(run_batch(base, alias, texts, slots, args.generate, extra))
        embedded.stop_servers()
        gc.collect()
        first_rate = first_rate or r["gen"] / r["wall"]
        table.add_row(str(slots), f"{r['wall']:.1f}", str(r["prompt"]), f"{r['prompt'] / r['wall']:.1f}",
                      str(r["gen"]), f"{r['gen'] / r['wall']:.1f}", f"{r['per_request_gen_tps']:.1f}",
                      f"{r['gen'] / r['wall'] / first_rate:.2f}x")
        console.print(f"  slots {slots}: {r['wall']:.1f} s")
    console.print(table)
    console.print("agg = tokens of all requests / wall time of the batch; a request's prompt and generation "
                  "phases overlap with other requests', so the two aggregate rates share the same wall time.")


if __name__ == "__main__":
    main()
