"""A whole index from scratch with the embedded model: wall time, and the --dry-run estimate against the actual.

    python bench/index_embedded.py                                   # operation-dulce.txt, 1.5B, 2 slots
    python bench/index_embedded.py --parallel 4                      # the same on 4 slots
    python bench/index_embedded.py --code /tmp/before                # another checkout's code (before/after)
    python bench/index_embedded.py --corpus ../shared/data/christmas-carol.txt --lines 0:400

Makes a new project in a temporary folder (empty answer cache), runs `sensegraph index` in a
child process and times it, then prints per step the LLM calls and tokens the run made beside
what `sensegraph index --dry-run` (this checkout's estimator) predicted for the same project.

The run takes the machine for about half an hour on 2 cores: nothing else should be running,
or the wall time says more about the other load than about sensegraph. With --code the child
imports sensegraph from that folder (e.g. `git worktree add /tmp/before <commit>`); the
estimate still comes from this checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sensegraph.index.estimate import measured_ratios

ROOT = Path(__file__).resolve().parents[1]
DULCE = ROOT.parent / "shared" / "data" / "operation-dulce.txt"
STEPS = ("extract", "claims", "summarize", "community_reports")


def make_project(folder: Path, corpus: Path, lines: str | None, size: str, parallel: int) -> None:
    text = corpus.read_text(encoding="utf-8")
    if lines:
        a, b = (int(x) if x else None for x in lines.split(":"))
        text = "\n".join(text.splitlines()[a:b])
    (folder / "input").mkdir(parents=True)
    (folder / "input" / corpus.name).write_text(text, encoding="utf-8")
    (folder / "settings.yaml").write_text(
        f"chat:\n  provider: local\nlocal:\n  size: {size}\n  parallel: {parallel}\n"
        "embedding:\n  provider: local\n", encoding="utf-8")


def dry_run(folder: Path) -> dict[str, tuple[int, int, int]]:
    from sensegraph.config import load_settings
    from sensegraph.index.estimate import estimate_index

    est = estimate_index(load_settings(folder))
    return {name: (s.calls, s.prompt_tokens, s.completion_tokens) for name, s in est.steps.items()}


def run_index(folder: Path, code: str | None, log: Path) -> tuple[float, int]:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-c", "import sys; from sensegraph.cli import main; sys.exit(main())",
           "index", "-r", str(folder)]
    t0 = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.call(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return time.perf_counter() - t0, rc


def off(actual: int, estimate: int) -> str:
    return f"{(estimate - actual) / actual:+.0%}" if actual else "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DULCE)
    ap.add_argument("--lines", help="only lines A:B of the corpus")
    ap.add_argument("--size", default="1.5b", choices=["0.5b", "1.5b"])
    ap.add_argument("--parallel", type=int, default=2, help="llama.cpp server slots")
    ap.add_argument("--code", help="import sensegraph from this folder in the child (another checkout)")
    ap.add_argument("--keep", type=Path, help="make the project here (must not exist) and keep it")
    args = ap.parse_args()
    if not args.corpus.exists():
        sys.exit(f"{args.corpus} not found: pass --corpus, or run from a checkout beside ../shared/data")
    console = Console(width=max(150, Console().width))  # the table is wide; logs are not terminals
    holder = None
    if args.keep:
        folder = args.keep
        if folder.exists():
            sys.exit(f"{folder} exists: --keep needs a new folder, so the cache starts empty")
    else:
        holder = tempfile.TemporaryDirectory(prefix="sensegraph-index-embedded-")
        folder = Path(holder.name) / "project"
    make_project(folder, args.corpus, args.lines, args.size, args.parallel)
    estimate = dry_run(folder)
    log = folder / "index.log"
    console.print(f"Indexing {args.corpus.name} with the embedded {args.size} model on {args.parallel} slots"
                  f"{' using ' + args.code if args.code else ''}; progress in {log}")
    seconds, rc = run_index(folder, args.code, log)
    stats = json.loads((folder / "output" / "stats.json").read_text()) if (folder / "output" / "stats.json").exists() else {}
    steps = stats.get("steps", {})

    table = Table(title=f"{args.corpus.name}: {args.size}, {args.parallel} slots, wall {seconds / 60:.1f} min"
                        f" (exit {rc})")
    for col in ("step", "seconds", "calls", "est.", "off", "prompt tok", "est.", "off",
                "completion tok", "est.", "off", "cached prompt tok"):
        table.add_column(col, justify="left" if col == "step" else "right")
    total = [0] * 7
    for name in STEPS:
        if name not in estimate and name not in steps:
            continue
        s = steps.get(name, {})
        act = (s.get("calls", 0) + s.get("cache_hits", 0), s.get("prompt_tokens", 0), s.get("completion_tokens", 0))
        est = estimate.get(name, (0, 0, 0))
        cached = s.get("cached_prompt_tokens", 0)
        for i in range(3):
            total[2 * i] += act[i]
            total[2 * i + 1] += est[i]
        total[6] += cached
        table.add_row(name, f"{s.get('seconds', 0):.0f}", f"{act[0]:,}", f"{est[0]:,}", off(act[0], est[0]),
                      f"{act[1]:,}", f"{est[1]:,}", off(act[1], est[1]),
                      f"{act[2]:,}", f"{est[2]:,}", off(act[2], est[2]), f"{cached:,}")
    table.add_row("total", f"{seconds:.0f}", f"{total[0]:,}", f"{total[1]:,}", off(total[0], total[1]),
                  f"{total[2]:,}", f"{total[3]:,}", off(total[2], total[3]),
                  f"{total[4]:,}", f"{total[5]:,}", off(total[4], total[5]), f"{total[6]:,}")
    console.print(table)
    for name in ("text_units", "summarize", "communities", "community_reports", "embed"):
        s = steps.get(name, {})
        detail = {k: v for k, v in s.items() if k in ("text_units", "tokens", "entities", "relationships",
                                                      "per_level", "reports", "vectors", "seconds")}
        if detail:
            console.print(f"  {name}: {detail}")
    if rc == 0:
        ratios = measured_ratios(folder)
        console.print("Measured ratios (compare sensegraph/index/estimate.py RATIOS['local']): "
                      + json.dumps({k: round(v, 3) for k, v in ratios.items()}))
    failures = stats.get("failures") or {}
    if failures:
        console.print(f"[yellow]Failed items: {failures}[/yellow]")
    console.print("'off' is (estimate − actual) / actual. Calls count answers taken from the cache too "
                  "(none on a fresh project).")
    if rc != 0:
        console.print(f"[red]sensegraph index exited {rc}; see {log}[/red]")
    if holder is not None and rc != 0:
        keep = Path(tempfile.mkdtemp(prefix="sensegraph-index-embedded-failed-"))
        os.replace(folder, keep / "project")
        console.print(f"Project kept in {keep / 'project'}")


if __name__ == "__main__":
    main()
