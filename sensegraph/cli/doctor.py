"""`sensegraph doctor`: call each configured model once and show what answered, as a table."""
from __future__ import annotations

import asyncio
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .common import ROOT_OPTION, out, settings_for


@click.command("doctor")
@ROOT_OPTION
@click.option("--rejected", type=click.IntRange(min=1), default=None, metavar="N",
              help="Instead of calling the models, show the last N answers this project's runs "
                   "rejected and retried (not valid for their schema, cut off at max_tokens, empty), "
                   "with the reason: what to read when a step retries or fails.")
def doctor_command(root: str, rejected: int | None) -> None:
    """Call the configured chat and embedding models once and report what answered.

    Prints the endpoint reached, latency, prompt and generation tokens/s, and whether structured
    (JSON-schema) output works. With no settings this checks the embedded local models.
    """
    from ..llm.doctor import run_doctor

    settings = settings_for(root)
    if rejected is not None:
        print_rejected(settings, rejected, out)
        return
    checks = asyncio.run(run_doctor(settings))
    print_checks(checks, out)
    if not all(c.ok for c in checks):
        sys.exit(1)


def print_checks(checks, console: Console) -> None:
    """One row per check (what happened, its figures, latency), then which failed."""
    table = Table(title="sensegraph doctor", show_lines=True)
    table.add_column("check")
    table.add_column("", justify="center")
    table.add_column("what happened", overflow="fold")
    table.add_column("latency", justify="right")
    for c in checks:
        detail = escape(c.detail)
        if c.figures:
            detail += "\n" + "  ".join(f"[dim]{escape(k)}[/dim] {escape(str(v))}"
                                       for k, v in c.figures.items() if v is not None)
        latency = f"{c.latency_s:.2f}s" if c.latency_s is not None else ""
        table.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]FAIL[/red]", detail, latency)
    console.print(table)
    failed = [c for c in checks if not c.ok]
    if failed:
        console.print(f"[red]{len(failed)} of {len(checks)} checks failed.[/red] Fix the first one first.")
    else:
        console.print("[green]All checks passed.[/green]")


REPLY_CHARS = 600  # of a rejected answer shown: its start and its end (where a cut-off one stopped)


def print_rejected(settings, limit: int, console: Console) -> None:
    """The newest rejected answers kept in the project's cache, newest first."""
    import datetime

    from ..llm import open_cache

    path = settings.path(settings.cache.dir) / "llm.sqlite"
    if not path.exists():
        console.print(f"No cache at {path}: nothing was asked in this project yet (or cache.enabled is off).")
        return
    cache = open_cache(settings, enabled=True)
    try:
        rows = cache.rejected(limit)
    finally:
        cache.close()
    if not rows:
        console.print("No rejected answers: every answer so far was used as it came.")
        return
    for r in rows:
        at = datetime.datetime.fromtimestamp(r["at"]).strftime("%Y-%m-%d %H:%M:%S")
        reply = r["reply"]
        if len(reply) > REPLY_CHARS:
            reply = f"{reply[:REPLY_CHARS // 2]}\n[... {len(reply) - REPLY_CHARS:,} characters ...]\n{reply[-REPLY_CHARS // 2:]}"
        console.print(f"[bold]{at}[/bold] {escape(r['model'])} · {escape(r['step'])}"
                      + (f" · {escape(r['item'])}" if r["item"] else ""))
        console.print(f"  [red]{escape(r['reason'])}[/red]")
        console.print(escape(reply) if reply else "[dim](empty)[/dim]", highlight=False)
        console.print()
    console.print(f"{len(rows)} rejected answer(s) shown, newest first (kept in {path}, table rejected).")
