"""`sensegraph index`, `update` and `resolve`: build the index, bring it up to date, merge
entities; and what they print (the dry-run estimate, the summary of an index, the merges)."""
from __future__ import annotations

import asyncio
import json
import math
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..config import SettingsError
from .common import (BUDGET_EXIT, ROOT_OPTION, budget_options, budget_overrides, console, fail, log, out,
                     progress_bars, settings_for)


@click.command("index")
@ROOT_OPTION
@click.option("--dry-run", is_flag=True, help="Estimate LLM calls, tokens and cost; call nothing.")
@click.option("--no-cache", is_flag=True, help="Ignore the answer cache for this run (every call is made again).")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 even if some items failed after every retry (they are recorded in stats.json).")
@click.option("--method", "method", type=click.Choice(["standard", "lazy"]), default=None,
              help="standard: the paper's pipeline, the chat model reads every text unit. lazy: concepts "
                   "by NLP and their co-occurrence graph, no chat call; the LLM works at query time "
                   "(`sensegraph query --method lazy`). Default: index_method in settings.yaml.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Make the LLM calls on a running Ray cluster: 'auto' for the one `ray start` began on this "
                   "machine, or HOST:6379. Needs `pip install 'sensegraph[ray]'` and provider openai endpoints "
                   "the nodes can reach. Default: ray.address in settings.yaml (none: no Ray).")
@click.option("--ray-data", "ray_data", is_flag=True, default=None,
              help="With --ray: extraction and description summaries as Ray Data pipelines. The workers render "
                   "the prompts, call, check and parse, and write each finished partition (ray.data_path, a "
                   "folder every node can reach); the driver only merges, and a rerun skips finished "
                   "partitions. Default: ray.data in settings.yaml.")
@budget_options
def index_command(root: str, dry_run: bool, no_cache: bool, allow_partial: bool, method: str | None,
                  ray_address: str | None, ray_data: bool | None, budget_tokens: int | None,
                  budget_cost: float | None) -> None:
    """Build the graph index from the documents in input/ into output/.

    Steps: documents -> text units -> entities, relationships (and claims) with gleaning ->
    merged descriptions -> hierarchical Leiden communities -> community reports (bottom-up) ->
    embeddings. Interrupt at any time: a rerun skips finished steps and takes finished LLM calls
    from the cache. Items that fail after every retry are named, and the exit code is 1.

    With --method lazy (LazyGraphRAG): documents -> text units -> noun phrases and named
    entities by NLP -> co-occurrence graph -> hierarchical Leiden communities -> text-unit
    embeddings; no community reports and no chat call. A lazy index can be upgraded later by
    `sensegraph index --method standard`, which reuses what the two share.

    With a spending budget (--budget-tokens, --budget-cost or chat.budget_* in settings.yaml),
    once it is used up no further call is sent and the run stops at the end of the current
    step. Rerun to continue: finished calls come from the cache and cost nothing, and the
    budget applies to each run anew.

    \b
    Exit codes: 0 done; 1 items failed after every retry; 2 bad settings or input;
    3 stopped at the spending budget (rerun to continue).
    """
    settings = settings_for(root, **budget_overrides(budget_tokens, budget_cost),
                            **({"index_method": method} if method else {}),
                            **({"ray": {**({"address": ray_address} if ray_address else {}),
                                        **({"data": True} if ray_data else {})}}
                               if ray_address or ray_data else {}))
    if dry_run:
        from ..index.concepts import ConceptError
        from ..index.estimate import estimate_index

        try:
            est = estimate_index(settings)
        except (ValueError, ConceptError) as exc:  # (a settings error is a ValueError)
            fail(escape(str(exc)))  # escaped: 'pip install "sensegraph[lazy]"' is no console markup
        print_estimate(est, settings, out)
        print_budget_fit(est, settings)
        return
    result = run_index(settings, no_cache=no_cache, allow_partial=allow_partial)
    print_summary(result)


def print_estimate(est, settings, console: Console) -> None:
    """The --dry-run table: calls and tokens per step, the spread over measured indexes, the cost."""
    table = Table(title=f"Dry run: {est.documents} documents, {est.text_units} text units, {est.tokens:,} tokens")
    for col in ("step", "calls", "prompt tokens", "completion tokens", "basis"):
        table.add_column(col, justify="right" if col not in ("step", "basis") else "left")
    for name, s in est.steps.items():
        table.add_row(name, f"{s.calls:,}", f"{s.prompt_tokens:,}", f"{s.completion_tokens:,}",
                      "prompts counted; answers: " + est.basis if s.exact else est.basis)
    t = est.total()
    table.add_row("total", f"{t.calls:,}", f"{t.prompt_tokens:,}", f"{t.completion_tokens:,}", "")
    console.print(table)
    if not est.steps:
        console.print(est.basis)
    if est.spread:
        lo, hi = est.spread
        console.print(f"Had this corpus behaved like each measured index: {lo.calls:,} to {hi.calls:,} calls, "
                      f"{lo.prompt_tokens + lo.completion_tokens:,} to {hi.prompt_tokens + hi.completion_tokens:,} "
                      "tokens. The graph a model finds differs from run to run, so later steps vary.")
    c = settings.chat
    if c.price_per_1k_prompt or c.price_per_1k_completion:
        console.print(f"Estimated cost: {_cost(t, c):.2f} (chat.price_per_1k_* in settings.yaml)")
    else:
        console.print("Set chat.price_per_1k_prompt and price_per_1k_completion to see a cost estimate.")
    console.print("Embeddings: one per text unit, entity and report (the local embedder costs nothing).")


def print_budget_fit(est, settings) -> None:
    """After the --dry-run estimate: does it fit the budget, or what share of it does the budget cover?"""
    c = settings.chat
    t = est.total()
    limits = []
    if c.budget_tokens:
        limits.append(("chat.budget_tokens", c.budget_tokens, t.prompt_tokens + t.completion_tokens, "{:,.0f} tokens"))
    if c.budget_cost:
        limits.append(("chat.budget_cost", c.budget_cost, _cost(t, c), "{:.2f}"))
    for name, budget, need, fmt in limits:
        if need <= budget:
            out.print(f"Budget: the estimated {fmt.format(need)} fit within {name} ({fmt.format(budget)}).")
        else:
            out.print(f"Budget: {name} ({fmt.format(budget)}) covers roughly {budget / need:.0%} of the estimated "
                      f"{fmt.format(need)}: the run would stop part-way, and finishing would take about "
                      f"{math.ceil(need / budget)} runs (each rerun continues from the cache with a fresh budget).")


def _cost(t, chat) -> float:
    return (t.prompt_tokens * chat.price_per_1k_prompt + t.completion_tokens * chat.price_per_1k_completion) / 1000


def run_index(settings, *, no_cache: bool = False, allow_partial: bool = False, run=None):
    """Check the endpoints, run the index (or `run`, e.g. the update) with progress bars, and
    turn its errors into messages and exit codes."""
    from ..index.concepts import ConceptError
    from ..index.documents import InputError
    from ..index.pipeline import BudgetStopped, IndexFailed
    from ..index.pipeline import run_index as pipeline_run
    from ..llm import BudgetReached, LLMError
    from ..llm.doctor import preflight
    from ..llm.embedded import EmbeddedModelError
    from ..llm.ray_workers import RayUnavailable

    run = run or pipeline_run

    # A wrong key, URL or model name would otherwise show only after every retry of every item;
    # a missing or modified NLP package of the lazy index only after the documents were read.
    problems = asyncio.run(preflight(settings, nlp=True))
    if problems:
        fail(escape("\n".join(problems)))
    try:
        with progress_bars() as bar:
            return asyncio.run(run(settings, bar=bar, log=log, cache=False if no_cache else None,
                                   allow_partial=allow_partial))
    except (InputError, SettingsError, RayUnavailable, ConceptError) as exc:
        fail(escape(str(exc)))
    except IndexFailed as exc:
        fail(str(exc), code=1)
    except BudgetStopped as exc:
        # Not an error: the run did what it was allowed to; the message says how to continue.
        console.print(str(exc), style="yellow", highlight=False, markup=False)
        sys.exit(BUDGET_EXIT)
    except BudgetReached as exc:
        fail(str(exc), code=BUDGET_EXIT)
    except LLMError as exc:
        fail(str(exc), code=1)
    except EmbeddedModelError as exc:  # e.g. a damaged part, found when the model is joined
        fail(escape(str(exc)))


def print_summary(result) -> None:
    t = result.tables
    stats = result.stats
    table = Table(title=f"Index in {result.output_dir}", show_header=False)
    table.add_row("documents", str(len(t["documents"])))
    table.add_row("text units", str(len(t["text_units"])))
    table.add_row("entities", str(len(t["entities"])))
    table.add_row("relationships", str(len(t["relationships"])))
    table.add_row("claims", str(len(t["covariates"])))
    per_level = t["communities"].groupby("level").size()
    table.add_row("communities", ", ".join(f"C{lvl}: {n}" for lvl, n in per_level.items()))
    table.add_row("reports", str(len(t["community_reports"])))
    total = stats["llm"]["total"]
    embed = stats["llm"].get("embed", {})
    chat_calls, chat_hits = total["calls"] - embed.get("calls", 0), total["cache_hits"] - embed.get("cache_hits", 0)
    table.add_row("LLM calls", f"{chat_calls} chat (+{chat_hits} from cache), "
                  f"{embed.get('calls', 0)} embedding batches (+{embed.get('cache_hits', 0)} from cache)")
    cached = total.get("cached_prompt_tokens", 0)
    table.add_row("tokens", f"{total['prompt_tokens']:,} prompt"
                  + (f" ({cached:,} from the server's prompt cache)" if cached else "")
                  + f", {total['completion_tokens']:,} completion")
    if total.get("retries"):
        table.add_row("retries", f"{total['retries']} (server faults, and answers that could not be used: "
                      f"`sensegraph doctor --rejected 10` shows those)")
    if "cost" in total:
        table.add_row("cost", f"{total['cost']:.4f}")
    for kind, servers in stats.get("endpoints", {}).items():
        table.add_row(f"{kind} endpoints", "\n".join(
            f"{name}: {e['requests']} requests, {e['faults']} faults, {e['rate_limited']} rate-limited"
            + (f", out of rotation {e['out_of_rotation']}×" if e["out_of_rotation"] else "")
            for name, e in servers.items()))
    table.add_row("wall time", f"{sum(s.get('seconds', 0) for s in stats['steps'].values()):.1f} s")
    out.print(table)
    if result.failures:
        console.print(f"[yellow]partial index: {json.dumps(result.failures)}[/]")


@click.command("update")
@ROOT_OPTION
@click.option("--remove", multiple=True, metavar="FILE",
              help="Take FILE (path relative to input/) out of the corpus; it is moved to output/_work/removed/. "
                   "Repeatable. Deleting the file from input/ yourself does the same.")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 even if some items failed after every retry (they are recorded in stats.json).")
@budget_options
def update_command(root: str, remove: tuple[str, ...], allow_partial: bool, budget_tokens: int | None,
                   budget_cost: float | None) -> None:
    """Bring the index in line with input/: new, changed and deleted documents.

    Only new text units are extracted; entities and relationships whose instances changed are
    re-summarised, those left without a text unit disappear; the graph is re-clustered and
    only communities whose members, descriptions or sub-reports changed get new reports.
    The result equals a fresh index of the same documents. output/stats.json (section
    "update") says what was recomputed and why. Exit code 3: stopped at the spending budget
    (--budget-tokens / --budget-cost, as for `index`); rerun to continue.
    """
    import functools

    from ..index.update import UpdateError, run_update

    settings = settings_for(root, **budget_overrides(budget_tokens, budget_cost))
    try:
        result = run_index(settings, allow_partial=allow_partial,
                           run=functools.partial(run_update, remove=list(remove)))
    except UpdateError as exc:
        fail(str(exc))
    print_summary(result)
    u = result.stats.get("update", {})
    d = u.get("documents", {})
    if d:
        console.print(f"documents: {len(d['new'])} new, {len(d['changed'])} changed, {len(d['deleted'])} deleted; "
                      f"text units extracted: {u.get('text_units', {}).get('extracted', 0)}; "
                      f"entities +{u['entities']['added']} -{u['entities']['removed']} "
                      f"~{u['entities']['resummarised']} re-summarised; reports regenerated: "
                      f"{u['community_reports']['regenerated']} of {u['community_reports']['written']}"
                      f" (and {u['community_reports'].get('rewritten_from_rows', 0)} rewritten from their rows, no call)",
                      highlight=False)


@click.command("resolve")
@ROOT_OPTION
@click.option("--dry-run", is_flag=True, help="List the merges it would make; change nothing.")
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Resolve this index folder (e.g. Microsoft GraphRAG's output; implies --dry-run).")
@click.option("--limit", type=int, default=50, show_default=True, help="Merges to list.")
@click.option("--json", "as_json", is_flag=True, help="Print the merges as JSON.")
def resolve_command(root: str, dry_run: bool, index_dir: str | None, limit: int, as_json: bool) -> None:
    """Entity resolution: merge entities that are one thing under several names.

    Candidates come cheaply from name similarity, description embeddings and shared
    neighbours; only ambiguous pairs (and any pair of different types) are asked to the chat
    model, as a yes/no. Merged entities keep every alias and all their text units. Without
    --dry-run the index is rebuilt from the merged graph (communities, reports, embeddings);
    set `resolution.enabled: true` in settings.yaml to keep merging in later index/update runs.
    """
    from ..index.resolve import resolve_index

    settings = settings_for(root)
    try:
        result = asyncio.run(resolve_index(settings, index_dir=index_dir, dry_run=dry_run or bool(index_dir),
                                           log=log))
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    print_merges(result, out, limit=limit, as_json=as_json)
    if result.failed and (dry_run or index_dir):  # a partial listing must not pass for a complete one
        fail(f"{len(result.failed)} resolution calls failed after every retry ({', '.join(result.failed[:5])}"
             f"{' …' if len(result.failed) > 5 else ''}); run the command again to retry them", code=1)
    if not (dry_run or index_dir):
        index_result = run_index(settings.model_copy(update={"resolution": settings.resolution.model_copy(
            update={"enabled": True})}))
        print_summary(index_result)
        if not settings.resolution.enabled:
            console.print("note: resolution.enabled is false in settings.yaml, so the next `index` or `update` "
                          "will undo these merges; set it to true to keep them.", highlight=False)


def print_merges(res, console: Console, *, limit: int = 50, as_json: bool = False) -> None:
    """A Resolution's candidates and merges: one summary line and a merge per line, or JSON."""
    from dataclasses import asdict

    if as_json:
        console.print_json(json.dumps({**res.summary(), "merges": res.merges(),
                                       "candidates": [asdict(c) for c in res.candidates]}, ensure_ascii=False))
        return
    s = res.summary()
    console.print(f"{s['candidates']} candidate pairs: {s['auto']} clear, {s['asked']} asked to the model "
                  f"({s['confirmed']} confirmed in all), {s['skipped']} not asked; "
                  f"{s['groups']} merges joining {s['entities_merged']} entities into others", highlight=False)
    for m in res.merges()[:limit]:
        console.print(f"  {m['keep']}  <=  {', '.join(m['merged'])}", highlight=False)
