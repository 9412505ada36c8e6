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
def doctor_command(root: str) -> None:
    """Call the configured chat and embedding models once and report what answered.

    Prints the endpoint reached, latency, prompt and generation tokens/s, and whether structured
    (JSON-schema) output works. With no settings this checks the embedded local models.
    """
    from ..llm.doctor import run_doctor

    settings = settings_for(root)
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
