"""The `sensegraph` command. Thin: parses flags, calls the library, shows progress."""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .config import SETTINGS_FILE, SettingsError, load_settings

console = Console(stderr=True)
out = Console()

ROOT_OPTION = click.option("--root", "-r", default=".", show_default=True, type=click.Path(file_okay=False),
                           help="Project folder (holds settings.yaml, input/, output/, cache/).")


def _fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    sys.exit(code)


def _settings(root: str, **overrides):
    try:
        return load_settings(root, overrides=overrides or None)
    except SettingsError as exc:
        _fail(str(exc))


BUDGET_EXIT = 3  # the run stopped at its spending budget; rerunning continues it


def budget_options(f):
    """--budget-tokens / --budget-cost, shared by `index` and `update`."""
    f = click.option("--budget-cost", type=click.FloatRange(min=0), default=None, metavar="X",
                     help="Stop cleanly once this run has spent X (money, at chat.price_per_1k_*; "
                          "0 = no limit). Default: chat.budget_cost.")(f)
    return click.option("--budget-tokens", type=click.IntRange(min=0), default=None, metavar="N",
                        help="Stop cleanly once this run's chat calls have used N prompt + completion "
                             "tokens (0 = no limit). Default: chat.budget_tokens.")(f)


def _budget_overrides(budget_tokens: int | None, budget_cost: float | None) -> dict:
    chat = {k: v for k, v in (("budget_tokens", budget_tokens), ("budget_cost", budget_cost)) if v is not None}
    return {"chat": chat} if chat else {}


@contextmanager
def progress_bars():
    """A bar factory for the pipeline: bar(description, total) -> advance(n)."""
    progress = Progress(TextColumn("[bold]{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
                        transient=False)

    def bar(description: str, total: int):
        task = progress.add_task(description, total=total)
        return lambda n=1: progress.advance(task, n)

    with progress:
        yield bar


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sensegraph")
def main() -> None:
    """sensegraph: GraphRAG on your own documents, offline by default.

    \b
    Typical use:
      sensegraph init --root myproject      # settings.yaml, .env, input/, prompts/
      cp *.txt myproject/input/
      sensegraph index --root myproject     # build the graph index
      sensegraph doctor --root myproject    # check the configured models
      sensegraph query "What are the main themes?" --root myproject

    Try `sensegraph demo` to index a small built-in corpus with the embedded model.
    """


@main.command()
@ROOT_OPTION
@click.option("--force", is_flag=True, help="Overwrite settings.yaml, .env and prompts if they exist.")
def init(root: str, force: bool) -> None:
    """Create a project: commented settings.yaml, .env template, input/ and editable prompts/.

    Every prompt is written in English (prompts/en) and Chinese (prompts/zh); edit them to tune
    extraction and reports for your domain (e.g. the few-shot examples in examples_graph.txt).
    """
    from .project import init_project

    try:
        written = init_project(Path(root), force=force)
    except FileExistsError as exc:
        _fail(str(exc))
    console.print(f"Created project in [bold]{Path(root).resolve()}[/]: " + ", ".join(written))
    console.print("Next: put documents in input/ and run `sensegraph index" + (f" --root {root}" if root != "." else "") + "`.")


@main.command()
@ROOT_OPTION
def doctor(root: str) -> None:
    """Call the configured chat and embedding models once and report what answered.

    Prints the endpoint reached, latency, prompt and generation tokens/s, and whether structured
    (JSON-schema) output works. With no settings this checks the embedded local models.
    """
    from .llm.doctor import print_report, run_doctor

    settings = _settings(root)
    checks = asyncio.run(run_doctor(settings))
    print_report(checks)
    if not all(c.ok for c in checks):
        sys.exit(1)


@main.command()
@ROOT_OPTION
@click.option("--dry-run", is_flag=True, help="Estimate LLM calls, tokens and cost; call nothing.")
@click.option("--no-cache", is_flag=True, help="Ignore the answer cache for this run (every call is made again).")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 even if some items failed after every retry (they are recorded in stats.json).")
@budget_options
def index(root: str, dry_run: bool, no_cache: bool, allow_partial: bool, budget_tokens: int | None,
          budget_cost: float | None) -> None:
    """Build the graph index from the documents in input/ into output/.

    Steps: documents -> text units -> entities, relationships (and claims) with gleaning ->
    merged descriptions -> hierarchical Leiden communities -> community reports (bottom-up) ->
    embeddings. Interrupt at any time: a rerun skips finished steps and takes finished LLM calls
    from the cache. Items that fail after every retry are named, and the exit code is 1.

    With a spending budget (--budget-tokens, --budget-cost or chat.budget_* in settings.yaml),
    once it is used up no further call is sent and the run stops at the end of the current
    step. Rerun to continue: finished calls come from the cache and cost nothing, and the
    budget applies to each run anew.

    \b
    Exit codes: 0 done; 1 items failed after every retry; 2 bad settings or input;
    3 stopped at the spending budget (rerun to continue).
    """
    settings = _settings(root, **_budget_overrides(budget_tokens, budget_cost))
    if dry_run:
        from .index.estimate import estimate_index, print_estimate

        try:
            est = estimate_index(settings)
            print_estimate(est, settings, out)
        except ValueError as exc:
            _fail(str(exc))
        _print_budget_fit(est, settings)
        return
    result = _run_index(settings, no_cache=no_cache, allow_partial=allow_partial)
    _print_summary(result)


def _print_budget_fit(est, settings) -> None:
    """After the --dry-run estimate: does it fit the budget, or what share of it does the budget cover?"""
    c = settings.chat
    t = est.total()
    limits = []
    if c.budget_tokens:
        limits.append(("chat.budget_tokens", c.budget_tokens, t.prompt_tokens + t.completion_tokens, "{:,.0f} tokens"))
    if c.budget_cost:
        cost = (t.prompt_tokens * c.price_per_1k_prompt + t.completion_tokens * c.price_per_1k_completion) / 1000
        limits.append(("chat.budget_cost", c.budget_cost, cost, "{:.2f}"))
    for name, budget, need, fmt in limits:
        if need <= budget:
            out.print(f"Budget: the estimated {fmt.format(need)} fit within {name} ({fmt.format(budget)}).")
        else:
            out.print(f"Budget: {name} ({fmt.format(budget)}) covers roughly {budget / need:.0%} of the estimated "
                      f"{fmt.format(need)}: the run would stop part-way, and finishing would take about "
                      f"{math.ceil(need / budget)} runs (each rerun continues from the cache with a fresh budget).")


def _run_index(settings, *, no_cache: bool = False, allow_partial: bool = False, run=None):
    from .index.documents import InputError
    from .index.pipeline import BudgetStopped, IndexFailed, run_index
    from .llm import BudgetReached, LLMError
    from .llm.doctor import preflight

    run_index = run or run_index

    # A wrong key, URL or model name would otherwise show only after every retry of every item.
    problems = asyncio.run(preflight(settings))
    if problems:
        _fail("\n".join(problems))
    try:
        with progress_bars() as bar:
            return asyncio.run(run_index(settings, bar=bar, log=lambda m: console.print(m, highlight=False),
                                         cache=False if no_cache else None, allow_partial=allow_partial))
    except (InputError, SettingsError) as exc:
        _fail(str(exc))
    except IndexFailed as exc:
        _fail(str(exc), code=1)
    except BudgetStopped as exc:
        # Not an error: the run did what it was allowed to; the message says how to continue.
        console.print(str(exc), style="yellow", highlight=False, markup=False)
        sys.exit(BUDGET_EXIT)
    except BudgetReached as exc:
        _fail(str(exc), code=BUDGET_EXIT)
    except LLMError as exc:
        _fail(str(exc), code=1)


def _print_summary(result) -> None:
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
    table.add_row("LLM calls", f"{total['calls']} (+{total['cache_hits']} from cache)")
    cached = total.get("cached_prompt_tokens", 0)
    table.add_row("tokens", f"{total['prompt_tokens']:,} prompt"
                  + (f" ({cached:,} from the server's prompt cache)" if cached else "")
                  + f", {total['completion_tokens']:,} completion")
    if "cost" in total:
        table.add_row("cost", f"{total['cost']:.4f}")
    table.add_row("wall time", f"{sum(s.get('seconds', 0) for s in stats['steps'].values()):.1f} s")
    out.print(table)
    if result.failures:
        console.print(f"[yellow]partial index: {json.dumps(result.failures)}[/]")


@main.command()
@ROOT_OPTION
@click.option("--remove", multiple=True, metavar="FILE",
              help="Take FILE (path relative to input/) out of the corpus; it is moved to output/_work/removed/. "
                   "Repeatable. Deleting the file from input/ yourself does the same.")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 even if some items failed after every retry (they are recorded in stats.json).")
@budget_options
def update(root: str, remove: tuple[str, ...], allow_partial: bool, budget_tokens: int | None,
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

    from .index.update import UpdateError, run_update

    settings = _settings(root, **_budget_overrides(budget_tokens, budget_cost))
    try:
        result = _run_index(settings, allow_partial=allow_partial,
                            run=functools.partial(run_update, remove=list(remove)))
    except UpdateError as exc:
        _fail(str(exc))
    _print_summary(result)
    u = result.stats.get("update", {})
    d = u.get("documents", {})
    if d:
        console.print(f"documents: {len(d['new'])} new, {len(d['changed'])} changed, {len(d['deleted'])} deleted; "
                      f"text units extracted: {u.get('text_units', {}).get('extracted', 0)}; "
                      f"entities +{u['entities']['added']} -{u['entities']['removed']} "
                      f"~{u['entities']['resummarised']} re-summarised; reports regenerated: "
                      f"{u['community_reports']['regenerated']} of {u['community_reports']['written']}",
                      highlight=False)


@main.command()
@ROOT_OPTION
@click.option("--dry-run", is_flag=True, help="List the merges it would make; change nothing.")
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Resolve this index folder (e.g. Microsoft GraphRAG's output; implies --dry-run).")
@click.option("--limit", type=int, default=50, show_default=True, help="Merges to list.")
@click.option("--json", "as_json", is_flag=True, help="Print the merges as JSON.")
def resolve(root: str, dry_run: bool, index_dir: str | None, limit: int, as_json: bool) -> None:
    """Entity resolution: merge entities that are one thing under several names.

    Candidates come cheaply from name similarity, description embeddings and shared
    neighbours; only ambiguous pairs (and any pair of different types) are asked to the chat
    model, as a yes/no. Merged entities keep every alias and all their text units. Without
    --dry-run the index is rebuilt from the merged graph (communities, reports, embeddings);
    set `resolution.enabled: true` in settings.yaml to keep merging in later index/update runs.
    """
    from .index.resolve import print_merges, resolve_index

    settings = _settings(root)
    try:
        result = asyncio.run(resolve_index(settings, index_dir=index_dir, dry_run=dry_run or bool(index_dir),
                                           log=lambda m: console.print(m, highlight=False)))
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    print_merges(result, out, limit=limit, as_json=as_json)
    if not (dry_run or index_dir):
        index_result = _run_index(settings.model_copy(update={"resolution": settings.resolution.model_copy(
            update={"enabled": True})}))
        _print_summary(index_result)
        if not settings.resolution.enabled:
            console.print("note: resolution.enabled is false in settings.yaml, so the next `index` or `update` "
                          "will undo these merges; set it to true to keep them.", highlight=False)


@main.command()
@ROOT_OPTION
@click.option("--format", "fmt", type=click.Choice(["graphml", "gexf", "neo4j", "cypher"]), default="graphml",
              show_default=True, help="graphml/gexf: Gephi, yEd, networkx; neo4j: CSV files for "
                                      "neo4j-admin database import; cypher: one .cypher script.")
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Export this index folder instead of the project's output/.")
@click.option("--out", "-o", "dest", type=click.Path(), default=None,
              help="File (graphml, gexf, cypher) or folder (neo4j). Default: output/export/.")
def export(root: str, fmt: str, index_dir: str | None, dest: str | None) -> None:
    """Write the entity graph for other tools, with community levels as attributes.

    \b
    sensegraph export --format graphml        # output/export/graph.graphml (Gephi, yEd)
    sensegraph export --format gexf           # output/export/graph.gexf
    sensegraph export --format neo4j          # output/export/neo4j/*.csv + import.sh
    sensegraph export --format cypher         # output/export/graph.cypher (cypher-shell < file)
    """
    from .export import export_index

    settings = _settings(root)
    folder = Path(index_dir) if index_dir else settings.path(settings.output_dir)
    try:
        written = export_index(folder, fmt, Path(dest) if dest else None)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    for p in written:
        out.print(str(p))


METHOD_HELP = ("global: map-reduce over community reports at --level (whole-corpus questions); "
               "local: an entity's neighbourhood (questions about specific things); "
               "drift: global priming + local follow-ups; basic: vector search over text (baseline); "
               "text: map-reduce over all source text (baseline).")


@main.command()
@click.argument("question")
@ROOT_OPTION
@click.option("--method", "-m", type=click.Choice(["global", "local", "drift", "basic", "text"]),
              default="global", show_default=True, help=METHOD_HELP)
@click.option("--level", "-l", type=click.IntRange(min=0), default=None,
              help="Community level for global search: 0 = root (C0, broad and cheap), higher = more "
                   "detailed and more calls. Default: query.level in settings.yaml (2).")
@click.option("--dynamic", is_flag=True, help="Global search: rate reports from the root down and map only the "
                                              "relevant branches (fewer tokens on focused questions).")
@click.option("--response-type", default=None,
              help='Shape of the answer, e.g. "single sentence", "list of 3-7 points" '
                   '(default: query.response_type, "multiple paragraphs").')
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Query this index folder instead of the project's output/ (e.g. one written by "
                   "Microsoft GraphRAG); settings still come from --root.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: answer, citations, cited records, the full context, usage, stats.")
@click.option("--stream", is_flag=True, help="Print the answer as it is generated.")
@click.option("--no-cache", is_flag=True, help="Ignore the answer cache (every call is made again).")
def query(question: str, root: str, method: str, level: int | None, dynamic: bool, response_type: str | None,
          index_dir: str | None, as_json: bool, stream: bool, no_cache: bool) -> None:
    """Answer QUESTION from the index, with citations such as [Data: Reports (3, 17)].

    \b
    Examples:
      sensegraph query "What are the main themes?"                     # global, level 2
      sensegraph query "What are the main themes?" --level 0           # root reports: cheapest
      sensegraph query "Who is Maria Okafor?" -m local --stream
      sensegraph query "..." -m global --dynamic --json > answer.json
      sensegraph query "..." --index ./ms-graphrag/output -m local     # a Microsoft GraphRAG index

    The answer goes to stdout; the cited records and the cost (calls, tokens) to stderr.
    """
    from .llm import BudgetReached, LLMError
    from .llm.embedded import EmbeddedModelError
    from .query import IndexNotFound, Searcher

    settings = _settings(root)
    if dynamic and method != "global":
        _fail("--dynamic works with --method global only")
    if stream and as_json:
        _fail("choose --stream or --json, not both")
    on_token = _print_piece if stream else None

    async def run():
        searcher = Searcher.open(settings, index_dir, cache=False if no_cache else None,
                                 log=lambda m: console.print(m, style="dim", highlight=False))
        try:
            return await searcher.query(question, method, level=level, dynamic=dynamic,
                                        response_type=response_type, on_token=on_token)
        finally:
            await searcher.aclose()

    try:
        with console.status(f"{method} search…", spinner="dots") if not stream else _nothing():
            result = asyncio.run(run())
    except (IndexNotFound, ValueError) as exc:
        _fail(str(exc))
    except BudgetReached as exc:
        _fail(f"{exc}; raise chat.budget_tokens / budget_cost in settings.yaml (0 = no limit)", code=BUDGET_EXIT)
    except (LLMError, EmbeddedModelError) as exc:
        _fail(str(exc), code=1)
    if as_json:
        out.print_json(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
        return
    if stream:
        sys.stdout.write("\n")
    else:
        click.echo(result.answer)
    _print_query_footer(result)


@contextmanager
def _nothing():
    yield


def _print_piece(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _print_query_footer(result) -> None:
    names = {"Reports": "title", "Entities": "title", "Relationships": None, "Claims": "description",
             "Sources": "text"}
    for kind, records in result.cited.items():
        shown = []
        for r in records[:8]:
            if kind == "Relationships":
                label = f"{r.get('source')} — {r.get('target')}"
            else:
                label = str(r.get(names[kind]) or "")
            label = " ".join(label.split()).lstrip(" ,.;:")
            shown.append(f"{r['ref']}: {label[:60]}{'…' if len(label) > 60 else ''}")
        more = f" (+{len(records) - 8} more)" if len(records) > 8 else ""
        console.print(f"[bold]{kind}[/] " + "; ".join(shown) + more, highlight=False)
    if result.invalid_citations:
        console.print(f"[yellow]removed citations of records that were not in the context: "
                      f"{json.dumps(result.invalid_citations)}[/]")
    u, st = result.usage, result.stats
    parts = [f"{result.method}"]
    if "level" in st:
        parts.append(f"level {st['level']}")
    if "dynamic" in st:
        parts.append(f"dynamic: {st['dynamic']['rated']} rated, {st['dynamic']['kept']} kept")
    if "context_units" in st:
        parts.append(f"{st['context_units']} context units, {st['context_tokens']:,} tokens")
    if "map_calls" in st:
        parts.append(f"{st['map_calls']} map + {st.get('reduce_calls', 0)} reduce calls")
    parts.append(f"{u['calls']} LLM calls (+{u['cache_hits']} cached), "
                 f"{u['prompt_tokens']:,} prompt"
                 + (f" ({u['cached_prompt_tokens']:,} server-cached)" if u.get("cached_prompt_tokens") else "")
                 + f" + {u['completion_tokens']:,} completion tokens")
    if "cost" in u:
        parts.append(f"cost {u['cost']:.4f}")
    console.print("[dim]" + " · ".join(parts) + "[/]", highlight=False)
    skipped = set(u.get("budget_skipped", []))
    unsent = [f for f in result.failures if f in skipped]
    failed = [f for f in result.failures if f not in skipped]
    if failed:
        console.print(f"[yellow]{len(failed)} calls failed after every retry and are missing from "
                      f"this answer: {', '.join(failed)}[/]", highlight=False)
    if unsent:
        console.print(f"[yellow]{len(unsent)} calls were not sent because the spending budget "
                      f"(chat.budget_tokens / chat.budget_cost) is used up, and are missing from this answer: "
                      f"{', '.join(unsent)}. Raise the budget or set it to 0 for no limit.[/]", highlight=False)


@main.command()
@click.option("--root", "-r", default="sensegraph-demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the demo project.")
@click.option("--small", is_flag=True, help="Use the 0.5B embedded model (faster, weaker).")
def demo(root: str, small: bool) -> None:
    """Index a small built-in corpus with the embedded model and show what came out.

    Needs no API key and no network. Creates a project folder (default ./sensegraph-demo),
    indexes the corpus shipped inside sensegraph, and prints entities, relationships,
    communities per level and the root-level report titles. A rerun costs no LLM calls.
    """
    from .project import DEMO_DIR, init_project

    path = Path(root)
    if not (path / SETTINGS_FILE).exists():
        init_project(path, force=False, demo=True)
    (path / "input").mkdir(parents=True, exist_ok=True)
    for f in DEMO_DIR.glob("*.txt"):
        shutil.copy(f, path / "input" / f.name)
    overrides = {"local": {"size": "0.5b"}} if small else {}
    settings = _settings(root, **overrides)
    console.print(f"Indexing the demo corpus in [bold]{path.resolve()}[/] with the "
                  f"{'embedded ' + settings.local.size if settings.chat.provider == 'local' else settings.chat.model} model…")
    result = _run_index(settings)
    _print_summary(result)
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
    from .query import Searcher

    async def run() -> None:
        searcher = Searcher.open(settings)
        try:
            for method, question in DEMO_QUESTIONS:
                out.print(f"\n[bold]$ sensegraph query {question!r} --method {method}[/]")
                result = await searcher.query(question, method, level=0 if method == "global" else None,
                                              on_token=_print_piece)
                sys.stdout.write("\n")
                _print_query_footer(result)
        finally:
            await searcher.aclose()

    asyncio.run(run())


@main.command()
@ROOT_OPTION
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Serve this index folder instead of the project's output/ (settings still come from --root).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the index: set --api-key too.")
@click.option("--port", "-p", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", envvar="SENSEGRAPH_API_KEY", default=None,
              help="Require this key (header X-API-Key or Authorization: Bearer) on every API call; "
                   "also read from $SENSEGRAPH_API_KEY.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="Allow browser pages from this origin to call the API (repeatable). Default: none.")
@click.option("--max-body", default=1_000_000, show_default=True, type=click.IntRange(1024),
              help="Largest request body accepted, in bytes.")
def serve(root: str, index_dir: str | None, host: str, port: int, api_key: str | None,
          cors_origins: tuple[str, ...], max_body: int) -> None:
    """Browse the index in a web page and query it over HTTP.

    \b
    Opens http://127.0.0.1:8000/ : root-level communities as cards, drill down through
    sub-communities to entities and source text, a graph view, and a question box whose
    citations link to the cited records. Also serves:
      /api/...                 JSON: communities, reports, entities, relationships, text units, queries
      /v1/chat/completions     OpenAI-compatible (models sensegraph-global, sensegraph-local, ...)
      /docs                    the API reference
    \b
    Examples:
      sensegraph serve --root myproject
      sensegraph serve --root myproject --host 0.0.0.0 --api-key "$(openssl rand -hex 16)"
    """
    try:
        import uvicorn

        from .server import create_app
    except ImportError as exc:
        _fail(f"`sensegraph serve` needs the serve extra ({exc.name} is missing): pip install 'sensegraph[serve]'")
    from .query import IndexNotFound

    settings = _settings(root)
    folder = index_dir or settings.path(settings.output_dir)
    try:
        app = create_app(folder, settings, api_key=api_key, cors_origins=cors_origins, max_body_bytes=max_body)
    except IndexNotFound as exc:
        _fail(str(exc))
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach this "
                      "port can read the index and spend model calls[/]", highlight=False)
    console.print(f"sensegraph explorer on [bold]http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/[/] "
                  f"(index {folder}; API docs at /docs; Ctrl+C to stop)", highlight=False)
    uvicorn.run(app, host=host, port=port, log_level="warning")


# `sensegraph eval ...` (paper section 3); its commands import their modules lazily.
from .evaluate.commands import eval_group  # noqa: E402

main.add_command(eval_group)


if __name__ == "__main__":
    main()
