"""`sensegraph init` (a new project) and `sensegraph demo` (a built-in corpus, indexed and asked)."""
from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import click

from ..config import SETTINGS_FILE
from .common import ROOT_OPTION, console, fail, out, settings_for
from .index import print_summary, run_index
from .query import print_footer, print_piece


@click.command("init")
@ROOT_OPTION
@click.option("--force", is_flag=True, help="Overwrite settings.yaml, .env and prompts if they exist.")
def init_command(root: str, force: bool) -> None:
    """Create a project: commented settings.yaml, .env template, input/ and editable prompts/.

    Every prompt is written in English (prompts/en) and Chinese (prompts/zh); edit them to tune
    extraction and reports for your domain (e.g. the few-shot examples in examples_graph.txt).
    """
    from ..project import init_project

    try:
        written = init_project(Path(root), force=force)
    except FileExistsError as exc:
        fail(str(exc))
    console.print(f"Created project in [bold]{Path(root).resolve()}[/]: " + ", ".join(written))
    console.print("Next: put documents in input/ and run `sensegraph index" + (f" --root {root}" if root != "." else "") + "`.")


@click.command("demo")
@click.option("--root", "-r", default="sensegraph-demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the demo project.")
@click.option("--small", is_flag=True, help="Use the 0.5B embedded model (faster, weaker).")
def demo_command(root: str, small: bool) -> None:
    """Index a small built-in corpus with the embedded model and show what came out.

    Needs no API key and no network. Creates a project folder (default ./sensegraph-demo),
    indexes the corpus shipped inside sensegraph, and prints entities, relationships,
    communities per level and the root-level report titles. A rerun costs no LLM calls.
    """
    from ..project import DEMO_DIR, init_project

    path = Path(root)
    if not (path / SETTINGS_FILE).exists():
        init_project(path, force=False, demo=True)
    (path / "input").mkdir(parents=True, exist_ok=True)
    for f in DEMO_DIR.glob("*.txt"):
        shutil.copy(f, path / "input" / f.name)
    overrides = {"local": {"size": "0.5b"}} if small else {}
    settings = settings_for(root, **overrides)
    console.print(f"Indexing the demo corpus in [bold]{path.resolve()}[/] with the "
                  f"{'embedded ' + settings.local.size if settings.chat.provider == 'local' else settings.chat.model} model…")
    result = run_index(settings)
    print_summary(result)
    ents = result.tables["entities"].sort_values("degree", ascending=False).head(10)
    out.print("[bold]Top entities:[/] " + ", ".join(f"{r.title} ({r.type})" for r in ents.itertuples()))
    rels = result.tables["relationships"].sort_values("weight", ascending=False).head(5)
    out.print("[bold]Strongest relationships:[/] " + "; ".join(f"{r.source} — {r.target}" for r in rels.itertuples()))
    reports = result.tables["community_reports"]
    roots = reports[reports["level"] == 0].sort_values("rank", ascending=False)
    out.print("[bold]Root-level community reports:[/]")
    for r in roots.itertuples():
        out.print(f"  • {r.title}  (rating {r.rank:g})")
    _demo_questions(settings)


DEMO_QUESTIONS = (
    ("global", "What are the main themes of these documents?"),
    ("local", "Who is Einar Lund and what is he involved in?"),
)


def _demo_questions(settings) -> None:
    """End the demo as a user would start: one global and one local question, streamed."""
    from ..query import Searcher

    async def run() -> None:
        searcher = Searcher.open(settings)
        try:
            for method, question in DEMO_QUESTIONS:
                out.print(f"\n[bold]$ sensegraph query {question!r} --method {method}[/]")
                result = await searcher.query(question, method, level=0 if method == "global" else None,
                                              on_token=print_piece)
                sys.stdout.write("\n")
                print_footer(result)
        finally:
            await searcher.aclose()

    asyncio.run(run())
