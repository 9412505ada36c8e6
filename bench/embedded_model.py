"""Benchmark the embedded chat models: first-use setup, load time, prompt and generation speed.

    python bench/embedded_model.py            # both sizes
    python bench/embedded_model.py 0.5b       # one size

For each size: join + verify the parts into an empty temporary model folder (the first-use
cost; the part files are usually in the OS page cache already, so this is the warm-disk figure),
check that a second call trusts the sidecar, start the llama.cpp server, then send one
extraction-sized request (~600-token passage, exactly 300 generated tokens via ignore_eos)
and print llama.cpp's own prompt and generation speeds.
"""
from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from sensegraph.config import LocalModelSettings
from sensegraph.llm import embedded
from sensegraph.tokens import count_tokens, truncate

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "christmas-carol.txt"
PASSAGE_TOKENS = 600
GENERATED_TOKENS = 300


def passage() -> str:
    if DATA.exists():
        text = DATA.read_text(encoding="utf-8")
        start = text.find("Marley was dead")
        text = text[start if start >= 0 else 0:]
    else:
        text = ("Ebenezer Scrooge ran a counting-house in London with his clerk Bob Cratchit. " * 200)
    return truncate(text, PASSAGE_TOKENS)


def bench(size: str, text: str) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory(prefix="sensegraph-bench-") as folder:
        local = LocalModelSettings(size=size, model_dir=folder, parallel=1, context_per_slot=4096)
        t0 = time.perf_counter()
        embedded.model_path(local)
        setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        embedded.model_path(local)
        again = time.perf_counter() - t0
        base, alias = embedded.ensure_server(local)
        load = embedded.TIMINGS[size]["load_s"]
        messages = [
            {"role": "system", "content": "You extract entities from text. For each person, place and "
                                          "organization, write its name, type and a one-line description."},
            {"role": "user", "content": text},
        ]
        t0 = time.perf_counter()
        reply = httpx.post(f"{base}/chat/completions", timeout=600, json={
            "model": alias, "messages": messages, "max_tokens": GENERATED_TOKENS, "temperature": 0,
            "ignore_eos": True, "cache_prompt": False,
        }).json()
        wall = time.perf_counter() - t0
        timings = reply.get("timings", {})
        embedded.stop_servers()
        gc.collect()
    return {
        "size": size, "alias": alias, "setup_s": setup, "sidecar_s": again, "load_s": load,
        "prompt_tokens": timings.get("prompt_n", 0), "prompt_tps": timings.get("prompt_per_second", 0.0),
        "generated_tokens": timings.get("predicted_n", 0), "gen_tps": timings.get("predicted_per_second", 0.0),
        "request_s": wall,
    }


def main(argv: list[str]) -> None:
    sizes = argv or ["0.5b", "1.5b"]
    text = passage()
    console = Console(width=max(130, Console().width))
    console.print(f"passage: {count_tokens(text)} cl100k tokens; {GENERATED_TOKENS} generated tokens; "
                  f"threads: {os.cpu_count()}")
    table = Table(title="embedded chat model")
    # setup = first-use join + verify into an empty folder; reuse = a later model_path() (sidecar)
    for col in ("size", "model", "setup s", "reuse s", "load s",
                "prompt tok", "prompt tok/s", "gen tok", "gen tok/s", "request s"):
        table.add_column(col, justify="right")
    for size in sizes:
        r = bench(size, text)
        table.add_row(r["size"], r["alias"], f"{r['setup_s']:.2f}", f"{r['sidecar_s']:.3f}", f"{r['load_s']:.2f}",
                      str(r["prompt_tokens"]), f"{r['prompt_tps']:.1f}", str(r["generated_tokens"]),
                      f"{r['gen_tps']:.1f}", f"{r['request_s']:.1f}")
    console.print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
