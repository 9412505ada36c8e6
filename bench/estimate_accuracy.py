"""How good is `--dry-run` on indexes it was not fitted to? Ratios per run, their mean, leave-one-out errors.

    python bench/estimate_accuracy.py /tmp/run1 /tmp/run2 /tmp/run3 ...

Each argument is a project indexed from an empty cache (e.g. kept by `bench/index_embedded.py
--keep DIR`), all with the same model class. For each run the script prints the ratios that
sensegraph/index/estimate.py uses (entities per unit, summaries per element, reports per
entity, ...), then their mean over the runs, then for every run the estimate made with
(a) the ratios now in estimate.py, (b) the mean of all runs, and (c) the mean of the *other*
runs: (c) is the honest out-of-sample figure. Errors are (estimate − actual) / actual.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sensegraph.config import load_settings
from sensegraph.index import estimate

STEPS = ("extract", "summarize", "community_reports")


def actual(folder: Path) -> tuple[int, int, int]:
    steps = json.loads((folder / "output" / "stats.json").read_text())["steps"]
    got = [0, 0, 0]  # measured_ratios, called first, refused stats of a run that skipped a step
    for name in STEPS:
        s = steps.get(name, {})
        got[0] += s.get("calls", 0) + s.get("cache_hits", 0)
        got[1] += s.get("prompt_tokens", 0)
        got[2] += s.get("completion_tokens", 0)
    return got[0], got[1], got[2]


def predicted(folder: Path, ratios: dict[str, float] | None) -> tuple[int, int, int]:
    t = estimate.estimate_index(load_settings(folder), ratios or None).total()
    return t.calls, t.prompt_tokens, t.completion_tokens


def mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def err(est: int, act: int) -> str:
    return f"{(est - act) / act:+.0%}" if act else "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("projects", nargs="+", type=Path)
    args = ap.parse_args()
    console = Console(width=max(160, Console().width))
    runs = []
    for folder in args.projects:
        runs.append((folder, estimate.measured_ratios(folder), actual(folder)))

    keys = list(runs[0][1])
    table = Table(title="Measured ratios per run")
    table.add_column("ratio")
    for folder, _, _ in runs:
        table.add_column(folder.name, justify="right")
    table.add_column("mean", justify="right")
    pooled = mean([r for _, r, _ in runs])
    for k in keys:
        table.add_row(k, *[f"{r[k]:.3f}" for _, r, _ in runs], f"{pooled[k]:.3f}")
    console.print(table)
    console.print("Mean, for estimate.RATIOS: " + json.dumps({k: round(v, 3) for k, v in pooled.items()}))

    table = Table(title="Estimate against actual (calls / prompt tokens / completion tokens; error of calls, of all tokens)")
    for col in ("run", "actual", "current ratios", "err", "mean of all", "err", "mean of others", "err"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for i, (folder, _, act) in enumerate(runs):
        others = [r for j, (_, r, _) in enumerate(runs) if j != i]
        cells = [folder.name, f"{act[0]} / {act[1]:,} / {act[2]:,}"]
        for ratios in ({}, pooled, mean(others) if others else None):
            if ratios is None:
                cells += ["–", ""]
                continue
            est = predicted(folder, ratios)
            cells += [f"{est[0]} / {est[1]:,} / {est[2]:,}",
                      f"{err(est[0], act[0])}, {err(est[1] + est[2], act[1] + act[2])}"]
        table.add_row(*cells)
    console.print(table)


if __name__ == "__main__":
    main()
