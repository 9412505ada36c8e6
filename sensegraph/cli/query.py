"""`sensegraph query`: one question, the answer on stdout, the cited records and cost on stderr."""
from __future__ import annotations

import asyncio
import json
import sys
from contextlib import nullcontext

import click

from .common import BUDGET_EXIT, ROOT_OPTION, console, fail, out, settings_for


class MethodChoice(click.Choice):
    """The query methods of `sensegraph.query.METHODS`, read when first needed: importing the
    query package (pandas, the model clients) at start-up would slow every `sensegraph --help`."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from ..query import METHODS

        return tuple(METHODS)

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ assigns; the registry is the only source
        pass


METHOD_HELP = ("global: map-reduce over community reports at --level (whole-corpus questions); "
               "local: an entity's neighbourhood (questions about specific things); "
               "drift: global priming + local follow-ups; basic: vector search over text (baseline); "
               "text: map-reduce over all source text (baseline); "
               "lazy: relevance tests of text units under --budget, then claims (works on a lazy index, "
               "which has no community reports: global and drift refuse one).")


@click.command("query")
@click.argument("question")
@ROOT_OPTION
@click.option("--method", "-m", type=MethodChoice(), default="global", show_default=True, help=METHOD_HELP)
@click.option("--level", "-l", type=click.IntRange(min=0), default=None,
              help="Community level for global search: 0 = root (C0, broad and cheap), higher = more "
                   "detailed and more calls. Default: query.level in settings.yaml (2).")
@click.option("--dynamic", is_flag=True, help="Global search: rate reports from the root down and map only the "
                                              "relevant branches (fewer tokens on focused questions).")
@click.option("--budget", "-b", type=click.IntRange(min=1), default=None,
              help="Lazy search: relevance tests of text units per question, the knob of its cost and "
                   "depth; presets 100 (cheap), 500, 1500 (thorough). Default: lazy.budget in settings.yaml (100).")
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
def query_command(question: str, root: str, method: str, level: int | None, dynamic: bool, budget: int | None,
                  response_type: str | None, index_dir: str | None, as_json: bool, stream: bool,
                  no_cache: bool) -> None:
    """Answer QUESTION from the index, with citations such as [Data: Reports (3, 17)].

    \b
    Examples:
      sensegraph query "What are the main themes?"                     # global, level 2
      sensegraph query "What are the main themes?" --level 0           # root reports: cheapest
      sensegraph query "Who is Maria Okafor?" -m local --stream
      sensegraph query "..." -m global --dynamic --json > answer.json
      sensegraph query "..." --index ./ms-graphrag/output -m local     # a Microsoft GraphRAG index
      sensegraph query "What are the main themes?" -m lazy --budget 500   # no reports needed

    The answer goes to stdout; the cited records and the cost (calls, tokens) to stderr.
    """
    from ..llm import BudgetReached, LLMError
    from ..llm.embedded import EmbeddedModelError
    from ..query import IndexNotFound, Searcher

    settings = settings_for(root)
    if dynamic and method != "global":
        fail("--dynamic works with --method global only")
    if budget is not None and method != "lazy":
        fail("--budget works with --method lazy only")
    if stream and as_json:
        fail("choose --stream or --json, not both")
    on_token = print_piece if stream else None
    from ..language import detect_language, language_note

    # Answers follow the question's language, so the note is about the question's.
    if note := language_note(detect_language([question])):
        console.print(f"warning: {note}", style="yellow", highlight=False, markup=False, soft_wrap=True)

    async def run():
        searcher = Searcher.open(settings, index_dir, cache=False if no_cache else None,
                                 log=lambda m: console.print(m, style="dim", highlight=False))
        try:
            return await searcher.query(question, method, level=level, dynamic=dynamic, budget=budget,
                                        response_type=response_type, on_token=on_token)
        finally:
            await searcher.aclose()

    try:
        with console.status(f"{method} search…", spinner="dots") if not stream else nullcontext():
            result = asyncio.run(run())
    except (IndexNotFound, ValueError) as exc:
        fail(str(exc))
    except BudgetReached as exc:
        fail(f"{exc}; raise chat.budget_tokens / budget_cost in settings.yaml (0 = no limit)", code=BUDGET_EXIT)
    except (LLMError, EmbeddedModelError) as exc:
        fail(str(exc), code=1)
    if as_json:
        out.print_json(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
        return
    if stream:
        sys.stdout.write("\n")
    else:
        click.echo(result.answer)
    print_footer(result)


def print_piece(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def print_footer(result) -> None:
    """The cited records, the method's figures and the cost; which calls failed or were not sent."""
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
    if "tests_used" in st:  # lazy search
        levels = st.get("levels_reached") or []
        tester = st["tester"] + (f", {st['test_format']}" if st.get("test_format") else "")
        parts.append(f"{st['tests_used']} of {st['budget']} relevance tests ({tester}), "
                     f"{st['relevant_units']} relevant units in {st['relevant_communities']} of "
                     f"{st['communities_visited']} communities visited"
                     + (f", levels {levels[0]}-{levels[-1]}" if len(levels) > 1 else
                        f", level {levels[0]}" if levels else ""))
        parts.append(f"{st['claims']} claims, {st['claims_reduced']} in the answer's context"
                     + (f" ({st['claims_dropped']} dropped: no source in their batch)" if st.get("claims_dropped") else "")
                     + (" · answered from the relevant units" if st.get("answered_from") == "sources" else ""))
    if "context_units" in st:
        parts.append(f"{st['context_units']} context units, {st['context_tokens']:,} tokens")
    if "claim_calls" in st:
        parts.append(f"{st['claim_calls']} claim + {st.get('reduce_calls', 0)} reduce calls")
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
