"""How far sensegraph's offline token counts (tiktoken cl100k_base) are from the embedded Qwen2.5
tokenizer, on the shared corpora. Prints one row per corpus.

    python bench/token_accuracy.py [--size 0.5b]
"""
from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

from sensegraph.config import LocalModelSettings
from sensegraph.llm.embedded import ensure_server
from sensegraph.tokens import count_tokens

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def qwen_count(base_url: str, text: str) -> int:
    req = urllib.request.Request(base_url.removesuffix("/v1") + "/tokenize", method="POST",
                                 data=json.dumps({"content": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return len(json.load(r)["tokens"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="0.5b", choices=["0.5b", "1.5b"])
    args = ap.parse_args()
    base_url, alias = ensure_server(LocalModelSettings(size=args.size, parallel=1))
    print(f"{'corpus':<26}{'chars':>10}{'cl100k':>10}{'qwen2.5':>10}{'cl100k/qwen':>13}")
    for name in ("operation-dulce.txt", "christmas-carol.txt", "xiyouji-ch01-07.txt"):
        text = (DATA / name).read_text(encoding="utf-8")
        a, b = count_tokens(text), qwen_count(base_url, text)
        print(f"{name:<26}{len(text):>10,}{a:>10,}{b:>10,}{a / b:>13.3f}")


if __name__ == "__main__":
    main()
