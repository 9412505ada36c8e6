"""`sensegraph eval ...`: the evaluation of paper section 3 as commands. Thin: flags in,
library calls out. Heavy imports stay inside the commands so `sensegraph --help` stays fast."""
from __future__ import annotations

import asyncio
import json
import sys

import click

from .common import console, fail, progress_bars, settings_for

NAME_OPTION = click.option("--name", "-n", "name", default="default", show_default=True,
                           help="Evaluation name: results live in <root>/evaluation/<name>/.")
LIMIT_OPTION = click.option("--limit", type=click.IntRange(min=1), default=None,
                            help="Only the first N questions (a quick slice).")
DRY_RUN_OPTION = click.option("--dry-run", is_flag=True, help="Print the estimate of LLM calls and stop.")
NO_CACHE_OPTION = click.option("--no-cache", is_flag=True, help="Ignore the LLM answer cache (calls are made again).")
CONDITIONS_OPTION = click.option(
    "--conditions", "-c", "conditions", multiple=True,
    help="Conditions, comma-separated or repeated: C0..C3, Cmax, C2+dyn, TS, SS, Z<budget> (lazy search, "
         "e.g. Z100, Z500), other=C2@../proj2. Default: every condition with stored answers.")


def _root_option(f):
    return click.option("--root", "-r", default=".", show_default=True, type=click.Path(file_okay=False),
                        help="Project folder (settings.yaml, output/).")(f)


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for x in values for v in x.split(",") if v.strip()]


def _ctx(root: str, name: str, no_cache: bool = False):
    from ..evaluate.store import EvalStore

    settings = settings_for(root)
    return settings, EvalStore.for_project(settings, name)


def _chat(settings, no_cache: bool):
    from ..llm import Usage, open_cache, open_chat

    chat = settings.chat
    return open_chat(settings, cache=open_cache(settings, False if no_cache else None),
                     usage=Usage(chat.price_per_1k_prompt, chat.price_per_1k_completion))


def _log(message: str) -> None:
    console.print(message, highlight=False, soft_wrap=True)


def _print_estimate(what: str, estimate: dict) -> None:
    _log(f"[bold]{what} estimate:[/] " + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in estimate.items()))


def _print_run(run: dict) -> None:
    msg = (f"{run['step']}: {run.get('items', 0)} items in {run['seconds']:.1f} s, {run['calls']} LLM calls "
           f"(+{run['cache_hits']} cached), {run['prompt_tokens']:,} prompt + {run['completion_tokens']:,} "
           "completion tokens")
    _log(msg)
    if run.get("failures"):
        _log(f"[yellow]{len(run['failures'])} items failed after every retry (stored; the next run retries "
             f"them):[/] " + "; ".join(run["failures"][:5]))


def _conditions_for(store, given: tuple[str, ...]) -> list[str]:
    from ..evaluate.answers import answered_conditions

    conds = _split(given) or answered_conditions(store)
    if not conds:
        fail("no answers stored yet: run `sensegraph eval answer --conditions C0,C1,TS,SS` first")
    return conds


def _need(*modules: str) -> None:
    """The eval extra's libraries, with the install command when one is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"this command needs {', '.join(missing)}: pip install 'sensegraph[eval]'")


def _run(coro):
    from ..llm import LLMError

    try:
        return asyncio.run(coro)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    except LLMError as exc:
        fail(str(exc), code=1)


@click.group("eval", context_settings={"help_option_names": ["-h", "--help"]})
def eval_group() -> None:
    """Compare query conditions on your own corpus (paper section 3).

    \b
    Steps (each resumable; a rerun of finished work makes no LLM call):
      sensegraph eval questions --description "Transcripts of a tech podcast" -K 5 -N 5 -M 5
      sensegraph eval answer --conditions C0,C1,C2,C3,TS,SS
      sensegraph eval judge --repeats 5          # win rates on 4 criteria, counterbalanced
      sensegraph eval claims                     # claim counts and ROUGE-L clusters
      sensegraph eval report                     # report.md + figures/*.png, no LLM call
    or all at once: sensegraph eval run --conditions C0,C3,TS,SS --limit 10

    Results live in <root>/evaluation/<name>/ (JSONL).
    """


@eval_group.command("questions")
@_root_option
@NAME_OPTION
@click.option("--description", "-d", default=None,
              help="A short description of the corpus (who wrote it, what it is about). Default: the titles "
                   "and summaries of the index's root community reports.")
@click.option("--description-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Read the description from this file.")
@click.option("-K", "--personas", "k", type=click.IntRange(min=1), default=5, show_default=True, help="Users (personas).")
@click.option("-N", "--tasks", "n", type=click.IntRange(min=1), default=5, show_default=True, help="Tasks per user.")
@click.option("-M", "--per-task", "m", type=click.IntRange(min=1), default=5, show_default=True,
              help="Questions per (user, task).")
@click.option("--from", "from_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Load questions from a CSV (column question or question_text) or JSONL file instead.")
@click.option("--force", is_flag=True, help="Replace stored questions (only before any answer is stored).")
@DRY_RUN_OPTION
@NO_CACHE_OPTION
def questions_cmd(root, name, description, description_file, k, n, m, from_file, force, dry_run, no_cache):
    """Write K×N×M global questions (paper: 5×5×5 = 125), or load them from a file.

    \b
    Examples:
      sensegraph eval questions -d "News articles about health policy" -K 2 -N 2 -M 2
      sensegraph eval questions --from ../shared/data/podcast/questions.csv
    """
    from ..evaluate.questions import corpus_description, estimate_question_calls, generate_questions, load_questions

    settings, store = _ctx(root, name)
    if store.path("questions").exists() and not force:
        n_stored = len(store.rows("questions"))
        _log(f"{n_stored} questions already in {store.path('questions')} (use --force to replace them)")
        return
    if force and store.path("answers").exists():
        # Stored answers and judgements are keyed by question id; new questions under old ids
        # would silently mix two question sets.
        fail(f"{store.folder} already has answers to these questions; start a new evaluation with --name")
    if from_file:
        try:
            rows = load_questions(from_file)
        except ValueError as exc:
            fail(str(exc))
        if not dry_run:
            store.write_all("questions", rows)
        _log(f"loaded {len(rows)} questions into {store.path('questions')}")
        return
    _print_estimate("questions", {"questions": k * n * m, "llm_calls": estimate_question_calls(k, n, m)})
    if dry_run:
        return
    if description_file:
        from pathlib import Path

        description = Path(description_file).read_text(encoding="utf-8")
    if not description:
        try:
            description = corpus_description(settings)
        except FileNotFoundError as exc:
            fail(str(exc))
        _log(f"[dim]corpus description from the index:\n{description}[/]")
    import time

    from ..evaluate.store import usage_totals

    started = time.monotonic()
    llm = _chat(settings, no_cache)

    async def go():
        try:
            with progress_bars() as bar:
                return await generate_questions(llm, description, k=k, n=n, m=m, root=settings.root, bar=bar)
        finally:
            await llm.aclose()

    rows, problems = _run(go())
    if rows:
        store.write_all("questions", rows)
    run = store.record_run("questions", started, usage_totals(llm.usage), items=len(rows), failures=problems,
                           k=k, n=n, m=m, description=description)
    _print_run(run)
    _log(f"{len(rows)} questions in {store.path('questions')}")
    if problems:
        sys.exit(1)


@eval_group.command("answer")
@_root_option
@NAME_OPTION
@click.option("--conditions", "-c", "conditions", multiple=True, required=True,
              help="Comma-separated or repeated: C0..C9, Cmax (deepest level), C2+dyn (dynamic selection), TS "
                   "(text summarisation), SS (vector RAG), local, drift, or NAME=SPEC@PROJECT to run SPEC on "
                   "another project (e.g. big=C2@../proj-gpt4o).")
@LIMIT_OPTION
@click.option("--context-tokens", type=click.IntRange(min=500), default=None,
              help="One context budget for every condition (default: query.context_tokens of each project).")
@click.option("--parallel", type=click.IntRange(min=1), default=2, show_default=True, help="Questions answered at once.")
@DRY_RUN_OPTION
@NO_CACHE_OPTION
def answer_cmd(root, name, conditions, limit, context_tokens, parallel, dry_run, no_cache):
    """Answer every question under each condition; keeps answer, context size and usage."""
    from ..evaluate.answers import parse_condition, run_answers

    settings, store = _ctx(root, name)
    try:
        conds = [parse_condition(c) for c in _split(conditions)]
    except ValueError as exc:
        fail(str(exc))
    out = _run(run_answers(settings, store, conds, limit=limit, context_tokens=context_tokens, parallel=parallel,
                           cache=False if no_cache else None, dry_run=True))
    for c in out["conditions"]:
        _log(f"  {c.label}: {c.describe()}")
    _print_estimate("answer", out["estimate"])
    labels = [c.label for c in out["conditions"]]
    if dry_run:
        return labels
    with progress_bars() as bar:
        out = _run(run_answers(settings, store, conds, limit=limit, context_tokens=context_tokens, parallel=parallel,
                               cache=False if no_cache else None, bar=bar))
    _print_run(out["run"])
    return labels


@eval_group.command("judge")
@_root_option
@NAME_OPTION
@CONDITIONS_OPTION
@click.option("--repeats", "-R", type=click.IntRange(min=1), default=5, show_default=True,
              help="Times each comparison is judged (answer order alternates).")
@click.option("--criteria", default=",".join(("comprehensiveness", "diversity", "empowerment", "directness")),
              show_default=True, help="Comma-separated subset of the four criteria.")
@click.option("--aa", is_flag=True, help="A/A mode: judge each condition against itself (checks position bias).")
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.5, show_default=True,
              help="Judge sampling temperature (repeats need some randomness to differ).")
@LIMIT_OPTION
@DRY_RUN_OPTION
@NO_CACHE_OPTION
def judge_cmd(root, name, conditions, repeats, criteria, aa, temperature, limit, dry_run, no_cache):
    """Pairwise LLM judge on comprehensiveness, diversity, empowerment and directness."""
    from ..evaluate.judge import CRITERIA, run_judge

    settings, store = _ctx(root, name)
    conds = _conditions_for(store, conditions)
    crits = tuple(_split((criteria,)))
    bad = [c for c in crits if c not in CRITERIA]
    if bad:
        fail(f"unknown criteria {', '.join(bad)}; choose from {', '.join(CRITERIA)}")
    if len(conds) < 2 and not aa:
        fail("judging needs two conditions (or --aa to judge one against itself)")
    kw = dict(repeats=repeats, criteria=crits, aa=aa, limit=limit, temperature=temperature, root=settings.root)
    est = _run(run_judge(None, store, conds, dry_run=True, **kw))["estimate"]
    _print_estimate("judge", est)
    if dry_run:
        return
    llm = _chat(settings, no_cache)

    async def go(bar):
        try:
            # One lane per local server slot, so each slot keeps one pair's answers cached.
            lanes = settings.local.parallel if settings.chat.provider == "local" else None
            return await run_judge(llm, store, conds, bar=bar, log=_log, lanes=lanes, **kw)
        finally:
            await llm.aclose()

    with progress_bars() as bar:
        out = _run(go(bar))
    _print_run(out["run"])


@eval_group.command("claims")
@_root_option
@NAME_OPTION
@CONDITIONS_OPTION
@click.option("--thresholds", default="0.5,0.6,0.7,0.8", show_default=True,
              help="Distance thresholds (1 - ROUGE-L) at which claim clusters are counted.")
@LIMIT_OPTION
@DRY_RUN_OPTION
@NO_CACHE_OPTION
def claims_cmd(root, name, conditions, thresholds, limit, dry_run, no_cache):
    """Extract atomic claims per answer; count claims and ROUGE-L claim clusters."""
    _need("rouge_score", "scipy")
    from ..evaluate.claims import run_claims

    settings, store = _ctx(root, name)
    conds = _conditions_for(store, conditions)
    try:
        ts = tuple(sorted(float(t) for t in _split((thresholds,))))
    except ValueError:
        fail(f"--thresholds: numbers between 0 and 1, e.g. 0.5,0.6 (got {thresholds!r})")
    est = _run(run_claims(None, store, conds, limit=limit, thresholds=ts, dry_run=True))["estimate"]
    _print_estimate("claims", est)
    if dry_run:
        return
    llm = _chat(settings, no_cache)

    async def go(bar):
        try:
            return await run_claims(llm, store, conds, limit=limit, thresholds=ts, root=settings.root, bar=bar, log=_log)
        finally:
            await llm.aclose()

    with progress_bars() as bar:
        out = _run(go(bar))
    _print_run(out["run"])


@eval_group.command("report")
@_root_option
@NAME_OPTION
@CONDITIONS_OPTION
@click.option("--json", "as_json", is_flag=True, help="Also print every number as JSON on stdout.")
def report_cmd(root, name, conditions, as_json):
    """Write report.md, results.json and figures/*.png from the stored results (no LLM call)."""
    _need("scipy", "statsmodels", "matplotlib")
    from ..evaluate.report import write_report

    settings, store = _ctx(root, name)
    conds = _conditions_for(store, conditions)
    out = write_report(store, conds)
    _log(f"wrote {out['report']}, {out['results']} and {len(out['figures'])} figures in {store.figures}")
    if as_json:
        click.echo(json.dumps(out["data"], indent=1, ensure_ascii=False, default=str))
    else:
        click.echo(out["report"].read_text(encoding="utf-8"))


@eval_group.command("run")
@_root_option
@NAME_OPTION
@click.option("--conditions", "-c", "conditions", multiple=True, required=True,
              help="As for `eval answer`, e.g. C0,Cmax,TS,SS.")
@click.option("--description", "-d", default=None, help="Corpus description for question generation.")
@click.option("-K", "--personas", "k", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("-N", "--tasks", "n", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("-M", "--per-task", "m", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--repeats", "-R", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--context-tokens", type=click.IntRange(min=500), default=None)
@LIMIT_OPTION
@DRY_RUN_OPTION
@click.pass_context
def run_cmd(ctx, root, name, conditions, description, k, n, m, repeats, context_tokens, limit, dry_run):
    """Every step in order: questions (if none stored), answer, judge, claims, report.

    Prints the estimate of LLM calls of the whole run first; --dry-run stops there.
    """
    from ..evaluate.answers import calls_per_question, parse_condition
    from ..evaluate.questions import estimate_question_calls

    settings, store = _ctx(root, name)
    try:
        conds = [parse_condition(c) for c in _split(conditions)]
        per_q = calls_per_question(settings, conds, context_tokens)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    have = store.path("questions").exists()
    n_q = len(store.rows("questions")) if have else k * n * m
    n_q = min(n_q, limit) if limit else n_q
    c = len(per_q)
    est = {"questions": n_q, "conditions": ",".join(per_q),
           "question calls": 0 if have else estimate_question_calls(k, n, m),
           "answer calls": n_q * sum(per_q.values()),
           "judge calls": f"{n_q} questions × {c * (c - 1) // 2} pairs × 4 criteria × {repeats} repeats = "
                          f"{n_q * (c * (c - 1) // 2) * 4 * repeats}",
           "claim calls": n_q * c}
    _log("[bold]estimate (before cache hits and stored results):[/] " +
         "; ".join(f"{key}: {v}" for key, v in est.items()))
    if dry_run:
        return
    if not have:
        try:
            ctx.invoke(questions_cmd, root=root, name=name, description=description, description_file=None, k=k,
                       n=n, m=m, from_file=None, force=False, dry_run=False, no_cache=False)
        except SystemExit as exc:  # a shortfall of questions is reported; go on with those written
            if exc.code and not store.path("questions").exists():
                raise
    # The labels as answered (Cmax -> C<deepest level>), so later steps use exactly these.
    labels = ctx.invoke(answer_cmd, root=root, name=name, conditions=conditions, limit=limit,
                        context_tokens=context_tokens, parallel=2, dry_run=False, no_cache=False)
    joined = (",".join(labels),)
    if len(labels) > 1:
        ctx.invoke(judge_cmd, root=root, name=name, conditions=joined, repeats=repeats,
                   criteria="comprehensiveness,diversity,empowerment,directness", aa=False, temperature=0.5,
                   limit=limit, dry_run=False, no_cache=False)
    ctx.invoke(claims_cmd, root=root, name=name, conditions=joined, thresholds="0.5,0.6,0.7,0.8",
               limit=limit, dry_run=False, no_cache=False)
    ctx.invoke(report_cmd, root=root, name=name, conditions=joined, as_json=False)
