"""What one global question costs: lazy search at budgets 100/500/1500 against global search at C1
and C2, on Microsoft GraphRAG's index of *A Christmas Carol* (../shared/data/msgraphrag-christmas-
carol-index), with the settings of a hosted model (8,000-token context, the chat relevance tester).

The LLM is tests/mock_llm.py in its own process with `--yes-rate`: its yes/no fields say yes at
that rate and its id fields cite rows of the prompt's tables, so relevance tests find relevant
units and the search deepens as it would with a real model (with the plain mock every verdict
is "no" and lazy search would stop after the first barren communities, understating its cost).
Tokens are counted as the mock reports them (4 characters a token), the same for every method.
The cache is off, so every call is made.

    python bench/lazy_query_cost.py
    python bench/lazy_query_cost.py --yes-rate 0.5 --budgets 100,500
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from mock_process import mock_server_process

from sensegraph.config import load_settings
from sensegraph.query import Searcher

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT.parent / "shared" / "data" / "msgraphrag-christmas-carol-index"
QUESTION = "What are the main themes of the story, and how do the characters embody them?"
BLOG = "LazyGraphRAG blog: global answers comparable to GraphRAG global search at >700x lower query cost"


def settings_for(root: Path, base_url: str):
    endpoint = (f"  provider: openai\n  model: mock\n  base_url: {base_url}\n  api_key: x\n"
                "  concurrency: 16\n  retry_base_seconds: 0.01\n")
    (root / "settings.yaml").write_text("chat:\n" + endpoint + "embedding:\n" + endpoint + "  batch_size: 64\n"
                                        "cache:\n  enabled: false\nlazy:\n  tester: chat\n")
    return load_settings(root, env={})


async def measure(settings, conditions: list[tuple[str, str, dict]]) -> list[dict]:
    rows = []
    for name, method, options in conditions:
        searcher = Searcher.open(settings, INDEX, cache=False)
        try:
            r = await searcher.query(QUESTION, method, **options)
        finally:
            await searcher.aclose()
        u = r.usage
        rows.append({"condition": name, "calls": u["calls"], "prompt": u["prompt_tokens"],
                     "completion": u["completion_tokens"], "tokens": u["prompt_tokens"] + u["completion_tokens"],
                     "tests": r.stats.get("tests_used", ""), "relevant": r.stats.get("relevant_units", ""),
                     "answer_chars": len(r.answer), "failures": len(r.failures)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="100,500,1500")
    ap.add_argument("--yes-rate", type=float, default=0.3, help="share of relevance verdicts the mock answers yes")
    args = ap.parse_args()
    if not INDEX.exists():
        sys.exit(f"Microsoft's index is not at {INDEX}")
    budgets = [int(b) for b in args.budgets.split(",") if b]
    conditions = [("C1", "global", {"level": 1}), ("C2", "global", {"level": 2})]
    conditions += [(f"Z{b}", "lazy", {"budget": b}) for b in budgets]
    with tempfile.TemporaryDirectory() as tmp, mock_server_process(0.0, "--yes-rate", str(args.yes_rate)) as mock:
        settings = settings_for(Path(tmp), mock.base_url)
        rows = asyncio.run(measure(settings, conditions))
    c2 = next(r["tokens"] for r in rows if r["condition"] == "C2")
    print(f"\nOne global question on A Christmas Carol (Microsoft's index), hosted-model settings, "
          f"mock LLM (yes-rate {args.yes_rate})")
    print(f"{'condition':<10}{'calls':>7}{'prompt tok':>12}{'completion':>12}{'total':>10}{'of C2':>8}"
          f"{'tests':>7}{'relevant':>9}{'failures':>9}")
    for r in rows:
        print(f"{r['condition']:<10}{r['calls']:>7}{r['prompt']:>12,}{r['completion']:>12,}{r['tokens']:>10,}"
              f"{r['tokens'] / c2:>8.1%}{r['tests']!s:>7}{r['relevant']!s:>9}{r['failures']:>9}")
    print(f"aim: Z100 <= 10% of C2's tokens. {BLOG}.")


if __name__ == "__main__":
    main()
