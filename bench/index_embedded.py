"""A whole index from scratch with the embedded model: wall time, and the --dry-run estimate against the actual.

    python bench/index_embedded.py                                   # operation-dulce.txt, 1.5B, 2 slots
    python bench/index_embedded.py --parallel 4                      # the same on 4 slots
    python bench/index_embedded.py --code /tmp/before                # another checkout's code (before/after)
    python bench/index_embedded.py --corpus ../shared/data/christmas-carol.txt --lines 0:400
    python bench/index_embedded.py --redocred 10 --keep /tmp/redocred10   # 10 held-out Re-DocRED documents
    python bench/index_embedded.py --again /tmp/redocred10               # rerun a kept project (cache on)
    python bench/index_embedded.py --redocred 10 --settings 'extraction:\n  descriptions: short'   # with settings

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


def make_project(folder: Path, corpus: Path, lines: str | None, size: str, parallel: int,
                 redocred: int = 0, seed: int = 2, extra: str = "") -> None:
    (folder / "input").mkdir(parents=True)
    if redocred:
        # Held-out documents (no extraction check was shaped on them), one file each, as a
        # user's folder of short articles would be.
        from extraction_quality import detokenise, load
        for i, doc in enumerate(load(redocred, seed, held_out=True)):
            (folder / "input" / f"{i:02d}.txt").write_text(doc["title"] + "\n\n" + detokenise(doc["sents"]),
                                                            encoding="utf-8")
    else:
        text = corpus.read_text(encoding="utf-8")
        if lines:
            a, b = (int(x) if x else None for x in lines.split(":"))
            text = "\n".join(text.splitlines()[a:b])
        (folder / "input" / corpus.name).write_text(text, encoding="utf-8")
    (folder / "settings.yaml").write_text(
        f"chat:\n  provider: local\nlocal:\n  size: {size}\n  parallel: {parallel}\n"
        "embedding:\n  provider: local\n" + (extra.replace("\\n", "\n") + "\n" if extra else ""), encoding="utf-8")


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
        # (in the project folder: `python -c` puts its working directory first on sys.path, so
        # run from this checkout it imported this checkout's code whatever --code said)
        rc = subprocess.call(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    return time.perf_counter() - t0, rc


def hierarchy(console: Console, out: Path) -> None:
    """Where the report step's calls go: communities per level, the copies carried down from a
    parent (they reuse its report), the reports written, their size in entities, and their length."""
    import pandas as pd

    from sensegraph.tokens import count_tokens

    comms = pd.read_parquet(out / "communities.parquet")
    reports = pd.read_parquet(out / "community_reports.parquet")
    entities = pd.read_parquet(out / "entities.parquet")
    table = Table(title=f"Hierarchy: {len(entities)} entities, {len(comms)} communities")
    for col in ("level", "communities", "carried", "reports written", "entities per written (1 / 2 / 3+)",
                "report tokens (mean)"):
        table.add_column(col, justify="right")
    carried = comms["carried"] if "carried" in comms.columns else pd.Series(False, index=comms.index)
    for level, group in comms.groupby("level"):
        own = group[~carried.loc[group.index].astype(bool)]
        written = reports[reports["community"].isin(own["community"])] if "community" in reports else reports.iloc[0:0]
        sizes = own[own["community"].isin(written["community"])]["entity_ids"].map(len)
        tokens = written["full_content"].map(count_tokens).mean() if len(written) else 0
        table.add_row(str(level), str(len(group)), str(int(carried.loc[group.index].sum())), str(len(written)),
                      f"{(sizes == 1).sum()} / {(sizes == 2).sum()} / {(sizes >= 3).sum()}", f"{tokens:.0f}")
    console.print(table)


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
    ap.add_argument("--redocred", type=int, default=0, metavar="N",
                    help="index N held-out Re-DocRED test documents (one file each) instead of --corpus")
    ap.add_argument("--seed", type=int, default=2, help="which Re-DocRED documents --redocred draws")
    ap.add_argument("--settings", default="", metavar="YAML",
                    help=r"more settings.yaml lines for the new project, e.g. 'extraction:\n  descriptions: short'")
    ap.add_argument("--again", type=Path, metavar="PROJECT",
                    help="rerun `sensegraph index` on a kept project (its cache on): what a code change reruns")
    args = ap.parse_args()
    if not args.corpus.exists():
        sys.exit(f"{args.corpus} not found: pass --corpus, or run from a checkout beside ../shared/data")
    console = Console(width=max(150, Console().width))  # the table is wide; logs are not terminals
    holder = None
    if args.again:
        folder = args.again
    elif args.keep:
        folder = args.keep
        if folder.exists():
            sys.exit(f"{folder} exists: --keep needs a new folder, so the cache starts empty")
    else:
        holder = tempfile.TemporaryDirectory(prefix="sensegraph-index-embedded-")
        folder = Path(holder.name) / "project"
    if not args.again:
        make_project(folder, args.corpus, args.lines, args.size, args.parallel, args.redocred, args.seed,
                     args.settings)
    estimate = dry_run(folder)
    log = folder / "index.log"
    name = (f"the project {folder} again" if args.again else
            f"{args.redocred} Re-DocRED documents" if args.redocred else args.corpus.name)
    console.print(f"Indexing {name} with the embedded {args.size} model on {args.parallel} slots"
                  f"{' using ' + args.code if args.code else ''}; progress in {log}")
    seconds, rc = run_index(folder, args.code, log)
    stats = json.loads((folder / "output" / "stats.json").read_text()) if (folder / "output" / "stats.json").exists() else {}
    steps = stats.get("steps", {})

    table = Table(title=f"{name}: {args.size}, {args.parallel} slots, wall {seconds / 60:.1f} min"
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
        hierarchy(console, folder / "output")
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
