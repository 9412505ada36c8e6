"""`sensegraph prompt-tune`: domain, entity types and few-shot examples from the user's corpus;
shows the diff of every file it would change, then writes them."""
from __future__ import annotations

import asyncio

import click
from rich.table import Table
from rich.text import Text

from .common import BUDGET_EXIT, ROOT_OPTION, console, fail, log, out, settings_for


@click.command("prompt-tune")
@ROOT_OPTION
@click.option("--sample", "sample", type=click.IntRange(min=1, max=100), default=8, show_default=True,
              help="Text units the model reads to propose the domain and entity types (seeded, spread over "
                   "the documents).")
@click.option("--examples", "examples", type=click.IntRange(min=1, max=3), default=2, show_default=True,
              help="Few-shot examples to write, each from one sampled passage (they are part of every "
                   "extraction prompt, so each costs tokens on every text unit).")
@click.option("--dry-run", is_flag=True, help="Show the calls and tokens it would spend; call nothing, write nothing.")
@click.option("--yes", "-y", is_flag=True, help="Write the changes without asking.")
def prompt_tune_command(root: str, sample: int, examples: int, dry_run: bool, yes: bool) -> None:
    """Adapt the extraction prompts to your corpus, before `sensegraph index`.

    The chat model reads a sample of your text units and proposes the domain and the entity
    types; then, from real passages of the sample, it writes few-shot examples with those
    types, in the corpus language (a Chinese corpus gets prompts/zh/; a Japanese one the
    prompts/en/ it uses). Every example entity must be written in its passage, or it is
    dropped. It changes, after showing their diff:

    \b
      prompts/<lang>/examples_graph.txt   the few-shot examples
      prompts/<lang>/extract_graph.txt    a first line naming the domain
      settings.yaml                       extraction.entity_types (other lines and comments kept)

    A rerun on the same input takes every answer from the cache (no call). To go back to the
    defaults, delete those two prompt files and restore entity_types.

    \b
    Exit codes: 0 done (or nothing to change); 1 the model's answers were unusable or a call
    failed after its retries; 2 bad settings or input, or the chat model unreachable;
    3 stopped at the spending budget.
    """
    from .. import prompt_tune as pt
    from ..index.documents import InputError

    settings = settings_for(root)
    if dry_run:
        try:
            est = pt.estimate(settings, sample=sample, examples=examples, warn=lambda m: log(f"warning: {m}"))
        except InputError as exc:
            fail(str(exc))
        print_estimate(est, settings)
        return

    from ..llm import BudgetReached, LLMError, Usage, open_cache, open_chat
    from ..llm.doctor import preflight
    from ..llm.embedded import EmbeddedModelError

    problems = asyncio.run(preflight(settings, sections=("chat",)))
    if problems:
        fail("\n".join(problems))
    chat = settings.chat
    llm = open_chat(settings, cache=open_cache(settings), usage=Usage(chat.price_per_1k_prompt,
                                                                      chat.price_per_1k_completion))

    async def run():
        try:
            return await pt.tune(settings, llm, sample=sample, examples=examples,
                                 warn=lambda m: log(f"warning: {m}"))
        finally:
            await llm.aclose()

    try:
        with console.status("asking the chat model…", spinner="dots"):
            plan = asyncio.run(run())
    except InputError as exc:
        fail(str(exc))
    except BudgetReached as exc:
        fail(f"{exc}; raise chat.budget_tokens / budget_cost in settings.yaml (0 = no limit), then rerun: "
             "finished calls come from the cache", code=BUDGET_EXIT)
    except (LLMError, EmbeddedModelError) as exc:
        fail(f"{exc}\nNothing written. Rerun to retry: finished calls come from the cache.", code=1)
    except pt.TuneError as exc:
        fail(str(exc), code=1)
    finally:
        if llm.cache is not None:
            llm.cache.close()
    print_plan(plan, llm.usage)
    if not plan.changes:
        out.print("The project's prompts and entity types already match: nothing to change.", soft_wrap=True)
        return
    for change in plan.changes:
        print_diff(change.diff())
    if not yes and not click.confirm(f"Write {len(plan.changes)} file(s)?", default=True, err=True):
        out.print("Nothing written.")
        return
    for path in pt.write_changes(plan):
        out.print(f"wrote {path}", highlight=False, soft_wrap=True)
    written = settings_for(root).extraction.entity_types
    if list(written) != plan.entity_types:
        console.print(f"[yellow]warning:[/] the settings still read entity_types {written} "
                      "(a SENSEGRAPH_EXTRACTION__ENTITY_TYPES variable overrides settings.yaml)", highlight=False, soft_wrap=True)
    out.print(f"Next: sensegraph index --root {root}   (the extraction reruns with the new prompts; "
              f"`sensegraph index --root {root} --dry-run` shows its cost)", highlight=False, soft_wrap=True)


def print_plan(plan, usage) -> None:
    out.print(f"Domain: {plan.domain or '-'}", highlight=False, soft_wrap=True)
    out.print(f"Entity types: {', '.join(plan.entity_types)}   (were: {', '.join(plan.previous_types)})",
              highlight=False, soft_wrap=True)
    if plan.refused_types:
        out.print("Refused entity types: " + "; ".join(f"{raw!r} ({why})" for raw, why in plan.refused_types),
                  highlight=False, soft_wrap=True, markup=False)
    table = Table(title=f"Few-shot examples ({plan.language}), from {len(plan.sample.units)} sampled text units "
                        f"of {plan.sample.documents} documents")
    for col in ("text unit", "entities", "relationships", "dropped"):
        table.add_column(col)
    for ex in plan.examples:
        table.add_row(ex.unit_id[:12], str(len(ex.entities)), str(len(ex.relationships)),
                      ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in ex.dropped.items()) or "-")
    for uid, why in plan.skipped_examples:
        table.add_row(uid[:12], "not used", "", why)
    out.print(table)
    for note in plan.notes:
        out.print(f"note: {note}", highlight=False, soft_wrap=True)
    t = usage.total()
    truncated = sum(usage.step(s).truncated for s in ("tune_types", "tune_examples"))
    console.print(f"LLM: {t.calls} calls (+{t.cache_hits} from cache), {t.prompt_tokens:,} prompt + "
                  f"{t.completion_tokens:,} completion tokens"
                  + (f", {usage.cost():.4f}" if usage.cost() else "")
                  + (f"; {truncated} answer list(s) longer than allowed, cut" if truncated else ""), highlight=False, soft_wrap=True)


def print_diff(diff: str) -> None:
    styles = {"+": "green", "-": "red", "@": "cyan"}
    for line in diff.splitlines():
        style = "bold" if line.startswith(("+++", "---")) else styles.get(line[:1], "")
        out.print(Text(line, style=style), soft_wrap=True)


def print_estimate(est, settings) -> None:
    c = settings.chat
    out.print(f"Dry run: {est.documents} documents, {est.text_units} text units, {est.sampled} sampled "
              f"({est.language})", highlight=False, soft_wrap=True)
    calls = f"{est.calls}" + (f" (up to {est.max_calls} if examples fail their checks)" if est.max_calls > est.calls else "")
    out.print(f"LLM calls: {calls}; tokens: ~{est.prompt_tokens:,} prompt + ~{est.completion_tokens:,} completion "
              f"({est.basis})", highlight=False, soft_wrap=True)
    if c.price_per_1k_prompt or c.price_per_1k_completion:
        cost = (est.prompt_tokens * c.price_per_1k_prompt + est.completion_tokens * c.price_per_1k_completion) / 1000
        out.print(f"Estimated cost: {cost:.4f} (chat.price_per_1k_* in settings.yaml)", highlight=False, soft_wrap=True)
    else:
        out.print("Set chat.price_per_1k_prompt and price_per_1k_completion to see a cost estimate.")
    out.print("Answers already in the cache cost nothing: a rerun on the same input makes no call.", soft_wrap=True)
