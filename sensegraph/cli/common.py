"""What every command shares: the consoles, settings loading, failing with a message, progress
bars, the spending-budget options. Heavy imports stay inside the commands, so `sensegraph
--help` stays fast."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..config import SettingsError, load_settings

console = Console(stderr=True)  # progress, logs, messages
out = Console()  # results (tables, answers) on stdout

ROOT_OPTION = click.option("--root", "-r", default=".", show_default=True, type=click.Path(file_okay=False),
                           help="Project folder (holds settings.yaml, input/, output/, cache/).")
BUDGET_EXIT = 3  # the run stopped at its spending budget; rerunning continues it


def fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    sys.exit(code)


def settings_for(root: str, **overrides):
    try:
        return load_settings(root, overrides=overrides or None)
    except SettingsError as exc:
        fail(str(exc))


def log(message: str) -> None:
    console.print(message, highlight=False)


def budget_options(f):
    """--budget-tokens / --budget-cost, shared by `index` and `update`."""
    f = click.option("--budget-cost", type=click.FloatRange(min=0), default=None, metavar="X",
                     help="Stop cleanly once this run has spent X (money, at chat.price_per_1k_*; "
                          "0 = no limit). Default: chat.budget_cost.")(f)
    return click.option("--budget-tokens", type=click.IntRange(min=0), default=None, metavar="N",
                        help="Stop cleanly once this run's chat calls have used N prompt + completion "
                             "tokens (0 = no limit). Default: chat.budget_tokens.")(f)


def budget_overrides(budget_tokens: int | None, budget_cost: float | None) -> dict:
    chat = {k: v for k, v in (("budget_tokens", budget_tokens), ("budget_cost", budget_cost)) if v is not None}
    return {"chat": chat} if chat else {}


# Where the output is not a terminal (a log file, CI, nohup), rich draws its bars only once,
# when they are done: an hour-long index on a slow laptop said nothing until its end. There a
# step prints a line when its first item is done, at most every PLAIN_EVERY seconds while it
# runs, and when it is done; a step skipped on a rerun (nothing it reads changed) prints none.
PLAIN_EVERY = 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def plain_bar(description: str, total: int):
    """bar(description, total) -> advance(n) as plain progress lines."""
    start = time.monotonic()
    last: float | None = None
    done = 0

    def advance(n: int = 1) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if done < total and last is not None and now - last < PLAIN_EVERY:
            return
        last = now
        line = f"{description}: {done} of {total} ({done / max(total, 1):.0%}), {_duration(now - start)}"
        if 0 < done < total:
            line += f", ~{_duration((now - start) * (total - done) / done)} left"
        log(line)

    return advance


@contextmanager
def progress_bars():
    """A bar factory for the pipeline: bar(description, total) -> advance(n). Live bars on a
    terminal, plain lines elsewhere (`plain_bar`)."""
    if not console.is_terminal:
        yield plain_bar
        return
    progress = Progress(TextColumn("[bold]{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
                        transient=False)

    def bar(description: str, total: int):
        task = progress.add_task(description, total=total)
        return lambda n=1: progress.advance(task, n)

    with progress:
        yield bar
