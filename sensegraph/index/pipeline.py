"""The indexing pipeline: the paper's steps in order, with checkpoints and stats.

Each step reads tables and writes tables, through the step runner (steps.py): a step is skipped
when nothing it reads changed since its last complete run (its tables are read back); inside a
step, finished LLM calls come from the cache. So an interrupted run, rerun, repeats no paid work.
The functions below the pipeline adapt each paper step to the runner: they take exactly what the
step reads, as keyword arguments, and return its tables.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import Settings
from ..language import language_note, resolve_language
from ..llm import ChatClient, StepUsage, Usage, open_cache, open_chat, open_embedder
from ..store.tables import TABLES, write_json_atomic, write_table
from . import (community_reports, communities, documents, embed, extract, missed_names, ray_data, resolve,
               summarize, text_units)
from .cooccurrence_edges import cooccurrence_edges
from .numbering import WORK_DIR, Numbering
from .steps import Output, Steps

# Bar(description, total) -> advance(n)
BarFactory = Callable[[str, int], Callable[[int], None]]
# Pipeline steps that call models, and the usage step names each one's calls are recorded under.
LLM_STEPS = {"extract": ("extract", "claims"), "summarize": ("summarize", "resolve"),
             "community_reports": ("community_reports",), "embed": ("embed",)}
# Steps a spending budget can stop, the usage step names of their items, and what the items are.
BUDGET_STEPS = {"extract": (("extract", "claims"), "text units"),
                "summarize": (("summarize",), "entity and relationship descriptions"),
                "community_reports": (("community_reports",), "community reports")}


class IndexFailed(RuntimeError):
    """Some items failed after every retry; the message lists them all."""

    def __init__(self, failures: dict[str, list[str]], stats_path: Path, command: str = "sensegraph index",
                 outages: dict[str, str] | None = None):
        self.failures = failures
        lines = [f"  {step}: {len(ids)} failed: {', '.join(map(str, ids[:20]))}{' …' if len(ids) > 20 else ''}"
                 for step, ids in failures.items() if ids]
        # A model with no server left is the reason for most of them: say so, and which servers.
        lines += [f"  {why}" for why in (outages or {}).values()]
        super().__init__("indexing finished with failures (every failed item is listed in "
                         f"{stats_path}):\n" + "\n".join(lines) +
                         f"\nRerun `{command}` to retry only these (finished work comes from the cache), "
                         "or pass --allow-partial to accept the gap.")


class BudgetStopped(RuntimeError):
    """The run reached its spending budget (chat.budget_tokens / budget_cost) and stopped between
    steps; the message says where and how to continue. stats.json has `"stopped": "budget"`."""

    def __init__(self, message: str, stats: dict[str, Any]):
        self.stats = stats
        super().__init__(message)


@dataclass
class IndexResult:
    output_dir: Path
    tables: dict[str, pd.DataFrame]
    stats: dict[str, Any]
    failures: dict[str, list[str]] = field(default_factory=dict)


def _no_bar(description: str, total: int) -> Callable[[int], None]:
    return lambda n=1: None


INSTANCES = {"entity_instances": WORK_DIR, "relationship_instances": WORK_DIR, "claim_instances": WORK_DIR,
             "extracted_units": WORK_DIR}  # intermediate tables, kept so unchanged units are not redone
ELEMENTS = {"entities": "", "relationships": "", "covariates": ""}
CONCEPTS = {"concept_instances": WORK_DIR}


async def run_index(settings: Settings, *, bar: BarFactory = _no_bar, log: Callable[[str], None] = print,
                    cache: bool | None = None, allow_partial: bool = False, keep_numbers: bool = False,
                    command: str = "sensegraph index") -> IndexResult:
    """Build or resume the index in output/. `keep_numbers` (`sensegraph update`, and every run
    on an index that was updated) keeps the human-readable ids of rows that existed."""
    out = settings.path(settings.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    numbering = Numbering(out) if keep_numbers or Numbering.kept_in(out) else None
    stats: dict[str, Any] = {"steps": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    failures: dict[str, list[str]] = {}
    async with _models(settings, cache, log) as (usage, llm, embedder, background):
        steps = Steps(settings, out, stats, before_write=_budget_check(llm, out, stats, failures, command))
        # 1. documents -> 2. text units (no LLM; cheap, always recomputed to see input changes)
        docs = (await steps.run("documents", _documents, checkpoint=False, extra={"log": log})).tables["documents"]
        language = stats["language"] = resolve_language(settings.language, docs["text"])
        if note := language_note(language):  # Japanese: the English prompts, asking for Japanese
            log(f"warning: {note}")
            stats["language_note"] = note
        if settings.index_method == "lazy":
            from .concepts import check_language

            check_language(language)  # a language the lazy index cannot read fails before any work
        units = (await steps.run("text_units", _text_units, checkpoint=False, documents=docs)).tables["text_units"]
        # Each vector table is embedded from when its table is known: text units alongside
        # extraction, entities alongside the reports, a lazy index's concepts once its graph is
        # built (embed.EmbeddingRun).
        # On Ray Data (with an embedding server) the workers embed each table and this writes it.
        embed_figures: dict[str, int] = {}
        vectors = embed.EmbeddingRun(embedder, out, elsewhere=functools.partial(
            ray_data.embed_on_ray, settings=settings, usage=usage, figures=embed_figures)
            if ray_data.enabled(settings) and not ray_data.local_embeddings(settings) else None)
        background(vectors.task)
        vectors.add("text_units", units)
        if settings.index_method == "lazy":  # LazyGraphRAG: concepts by NLP instead of 3-4, no reports
            from .concepts import SPACY_DISTRIBUTION
            from .cooccurrence import few_concepts_note

            found = await steps.run("concepts", _concepts, writes=CONCEPTS, units=units, language=language,
                                    documents=docs[["id", "title"]], libraries=("spacy", SPACY_DISTRIBUTION, "jieba"))
            elements = (await steps.run("concept_graph", _concept_graph, writes=ELEMENTS, units=units,
                                        language=language, numbering=numbering, **found.tables)).tables
            if note := few_concepts_note(found.tables["concept_instances"], elements["entities"], units,
                                         settings=settings):  # a tiny corpus: say why, and what to do
                log(f"warning: {note}")
                stats["concepts_note"] = note
            # Local search walks from the concepts a question resembles: embedded here, not
            # while the first question waits (minutes on a large corpus).
            vectors.add("entities", elements["entities"], lazy=True)
        else:
            # 3. element instances: one extraction per text unit, plus gleaning; which checks
            # of the names applied, and why, is part of the run's record
            policy, why = settings.check_policy()
            stats["extraction_checks"] = {"policy": policy, "why": why,
                                          "ner": missed_names.enabled(settings, language)}
            work = await steps.run("extract", _extract, writes=INSTANCES, reuse=True, units=units, llm=llm,
                                   language=language, extra={"advance": bar("extract", len(units))})
            _warn_if_empty(units, work, log)
            # 4. element summaries: entities, relationships, claims (covariates)
            # The embedder is read only by entity resolution: without it, a new embedding model
            # must not rerun the summaries.
            elements = (await steps.run("summarize", _summarize, writes=ELEMENTS, units=units, llm=llm,
                                        embedder=embedder if settings.resolution.enabled else None,
                                        language=language, numbering=numbering,
                                        **{n: work.tables[n] for n in INSTANCES if n != "extracted_units"},
                                        extra={"bar": bar})).tables
            del work  # the instance tables (on disk under _work) are not read again: free them
            vectors.add("entities", elements["entities"])
        docs, units = _link_text_units(docs, units, numbering, **elements)
        write_table(docs, out, "documents")
        write_table(units, out, "text_units")
        # 5. communities: hierarchical Leiden, every level a complete partition
        comms = (await steps.run("communities", _communities, writes={"communities": ""}, numbering=numbering,
                                 libraries=("graspologic-native",),
                                 entities=elements["entities"], relationships=elements["relationships"],
                                 lazy=settings.index_method == "lazy")).tables["communities"]
        # 6. community reports, bottom-up (a lazy index has none: its LLM work waits for a question)
        reports = (await steps.run("community_reports", _reports, writes={"community_reports": ""},
                                   communities=comms, llm=llm, language=language, **elements,
                                   lazy=settings.index_method == "lazy", extra={"bar": bar}
                                   )).tables["community_reports"]
        # 7. embeddings for search
        tables = {"documents": docs, "text_units": units, **elements, "communities": comms,
                  "community_reports": reports}
        # (a lazy index searches its text units and its concepts: it has no reports)
        searched = tables if settings.index_method == "standard" else {"text_units": units,
                                                                       "entities": elements["entities"]}
        await steps.run("embed", _embed, checkpoint=False, tables=searched, embedder=embedder,
                        extra={"run": vectors, "out": out, "bar": bar, "figures": embed_figures})
        if numbering is not None:
            numbering.save(tables)
        stats_path = _finish_stats(stats, usage, failures, out)
    if stats["failures"] and not allow_partial:
        raise IndexFailed(stats["failures"], stats_path, command, stats.get("outages"))
    return IndexResult(out, tables, stats, stats["failures"])


# How long a thread that wants the interpreter waits before the running one must hand it over.
SWITCH_INTERVAL = 0.0005


@contextmanager
def _responsive_loop() -> Iterator[None]:
    """For the run, nothing holds the event loop for long: every answer that arrives while it
    is held waits, so a pause costs every request in flight at once. Both settings are the
    process's, and are put back when the run ends.

    - The switch interval: the loop shares the interpreter with the index's worker threads
      (the weak edges computed beside the summary calls, long contexts counted beside the
      reports). At Python's default of 5 ms a busy thread kept the loop waiting up to 5 ms at
      each wake-up; in the first 1.5 s of the summaries only one request was in flight of 25
      allowed. At 0.5 ms the loop is back within half a millisecond; with no thread busy
      nothing changes.
    - The objects alive when the run starts (the libraries' modules, classes and caches: a
      million of them once pandas, pyarrow and openai are imported) are frozen out of the
      cyclic garbage collector. Each full collection scanned them all, ~100 ms with the loop
      standing still, several times a step. Unfrozen at the end, so whatever of them becomes
      garbage later is still collected."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_INTERVAL))
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        sys.setswitchinterval(before)


@asynccontextmanager
async def _models(settings: Settings, cache: bool | None, log: Callable[[str], None] = print):
    """(usage, chat client, embedder, background): `background(task)` registers a task to cancel
    if the run ends early. Everything is closed also on an exception or a cancellation (Ctrl-C)."""
    usage = Usage(settings.chat.price_per_1k_prompt, settings.chat.price_per_1k_completion,
                  settings.embedding.price_per_1k_prompt)
    answer_cache = open_cache(settings, cache)
    llm = open_chat(settings, cache=answer_cache, usage=usage)
    embedder = open_embedder(settings, cache=answer_cache, usage=usage)
    # Outage notices (a server refused, every server out) go where the run's messages go.
    llm.endpoints.log = embedder.endpoints.log = log
    workers = None
    tasks: list[asyncio.Task] = []

    def background(task: asyncio.Task | None) -> asyncio.Task | None:
        if task is not None:
            tasks.append(task)
        return task
    try:
        if settings.ray.address:  # the uncached calls go to the cluster's workers; the rest stays here
            from ..llm.ray_workers import RayWorkers

            workers = RayWorkers(settings, settings.ray.address, settings.ray.workers)  # blocks while it connects
            llm.workers = embedder.workers = workers
            usage.pools = {"chat": workers.pool("chat"), "embedding": workers.pool("embedding")}
        with _responsive_loop():
            yield usage, llm, embedder, background
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await llm.aclose()
        await embedder.aclose()
        if workers is not None:
            await workers.aclose()
        if answer_cache is not None:
            answer_cache.close()


def _budget_check(llm: ChatClient, out: Path, stats: dict[str, Any], failures: dict[str, list[str]],
                  command: str) -> Callable[[str, Output], None]:
    """What the runner calls between computing a step and writing its tables: record its failed
    items, and stop the run if the spending budget is used up. A step cut short writes none of
    its tables (those of the last complete run stay), and no later step runs on its output."""
    items: dict[str, int] = {}  # items of each budgeted step run so far

    def check(step: str, output: Output) -> None:
        failures[step] = output.failed
        if step in BUDGET_STEPS:
            items[step] = output.items
            if llm.budget_reached:
                raise _budget_stop(step, llm, out, stats, failures, items, command)
    return check


# -- the steps, as the runner calls them -----------------------------------------------------------

def _documents(*, settings: Settings, log: Callable[[str], None]) -> Output:
    docs = documents.load_documents(settings, warn=lambda m: log(f"warning: {m}"))
    return Output({"documents": docs}, stats={"documents": len(docs)})


def _text_units(*, documents: pd.DataFrame, settings: Settings) -> Output:
    units = text_units.make_text_units(documents, size=settings.chunks.size, overlap=settings.chunks.overlap)
    units = units.reset_index(drop=True)
    return Output({"text_units": units}, stats={"text_units": len(units), "tokens": int(units["n_tokens"].sum())})


async def _extract(*, units: pd.DataFrame, llm: ChatClient, language: str, settings: Settings,
                   advance: Callable[[int], None], previous: dict[str, pd.DataFrame] | None) -> Output:
    """Extraction of the units that have no instances from a previous run with the same
    settings, prompts and model (all of them on a first run); the others keep theirs."""
    ids = [str(i) for i in units["id"]]
    done = set(map(str, previous["extracted_units"]["id"])) & set(ids) if previous else set()
    todo = units[[i not in done for i in ids]] if done else units  # (no copy of the texts on a first run)
    if done:
        advance(len(done))
    ray_figures: dict[str, Any] = {}
    if ray_data.enabled(settings):  # the workers extract and write partitions; this merges them
        fresh, ray_figures = await asyncio.to_thread(ray_data.extract_on_ray, todo, settings=settings,
                                                     language=language, advance=advance, usage=llm.usage)
    else:
        fresh = await extract.extract_graph(todo, llm, settings=settings, language=language, advance=advance)
    fresh = await missed_names.add_missed_names(fresh, todo, settings=settings, language=language)
    tables = {"extracted_units": pd.DataFrame({"id": [i for i in ids if i in done or i not in fresh.failed]})}
    position = {u: n for n, u in enumerate(ids)}
    for name, new in zip(INSTANCES, (fresh.entities, fresh.relationships, fresh.claims)):
        if not done:  # every unit extracted now: the rows are in unit order already
            tables[name] = new
            continue
        old = previous[name] if previous else new.iloc[:0]
        old = old[old["text_unit_id"].astype(str).isin(done)]
        both = pd.concat([df for df in (old, new) if not df.empty] or [new], ignore_index=True)
        # A fresh extraction lists instances in text-unit order, then as the model gave them;
        # merging takes the first seen on ties, so kept and new instances must be in that order.
        order = both["text_unit_id"].astype(str).map(position)
        tables[name] = both.iloc[order.argsort(kind="stable")].reset_index(drop=True)[new.columns]
    stats = {**fresh.stats, "units": len(ids), "reused_units": len(done), "extracted_units": len(todo),
             "reused": previous is not None, **({"ray_data": ray_figures} if ray_figures else {}),
             **{n: len(tables[n]) for n in ("entity_instances", "relationship_instances", "claim_instances")}}
    return Output(tables, failed=list(fresh.failed), items=len(ids), stats=stats)


async def _concepts(*, units: pd.DataFrame, documents: pd.DataFrame, language: str, settings: Settings) -> Output:
    from . import concepts

    # In a thread: the NLP pipeline holds a core for minutes, while the text-unit embeddings
    # started beside it (embed.EmbeddingRun) can use the other one.
    found = await asyncio.to_thread(concepts.concept_instances, units, language=language, settings=settings)
    if settings.concepts.document_titles:
        named = {d: concepts.title_name(t) for d, t in zip(documents["id"].astype(str), documents["title"])}
        found = concepts.with_title_subjects(found, units, {d: n for d, n in named.items() if n})
    return Output({"concept_instances": found}, stats={"concept_instances": len(found)})


def _concept_graph(*, concept_instances: pd.DataFrame, units: pd.DataFrame, language: str,
                   numbering: Numbering | None, settings: Settings) -> Output:
    from . import cooccurrence

    entities, relationships = cooccurrence.concept_graph(concept_instances, units, settings=settings,
                                                         language=language)
    covariates = pd.DataFrame(columns=TABLES["covariates"])  # claims come at query time
    if numbering is not None:
        entities, relationships = numbering.renumber(entities, "entities"), numbering.renumber(relationships,
                                                                                               "relationships")
    return Output({"entities": entities, "relationships": relationships, "covariates": covariates},
                  stats={"entities": len(entities), "relationships": len(relationships)})


async def _summarize(*, entity_instances: pd.DataFrame, relationship_instances: pd.DataFrame,
                     claim_instances: pd.DataFrame, units: pd.DataFrame, llm: ChatClient, embedder: Any,
                     language: str, numbering: Numbering | None, settings: Settings, bar: BarFactory) -> Output:
    extraction = extract.ExtractionResult(entity_instances, relationship_instances, claim_instances, failed=[])
    graph = summarize.merge_instances(extraction)
    n_items = graph.size
    weight = settings.communities.cooccurrence_weight
    early: asyncio.Future | None = None
    if weight > 0 and not settings.resolution.enabled:
        # The weak edges need names and units, not descriptions: computed in a thread while the
        # summary calls are in flight, so the step's wall time is that of its calls. (After
        # resolution they must wait: it renames and merges entities.)
        shape_entities, shape_relationships = summarize.graph_shape(graph)
        early = asyncio.ensure_future(asyncio.to_thread(cooccurrence_edges, shape_entities, shape_relationships,
                                                        units, weight=weight, language=language))
    ray_figures: dict[str, int] = {}
    elsewhere = functools.partial(ray_data.summarize_on_ray, settings=settings, language=language, usage=llm.usage,
                                  figures=ray_figures) if ray_data.enabled(settings) else None
    entities, relationships, covariates, failed = await summarize.summarize_graph(
        extraction, units, llm, settings=settings, language=language, advance=bar("summarize", n_items), graph=graph,
        elsewhere=elsewhere)
    del graph
    stats: dict[str, Any] = {"ray_data": ray_figures} if ray_figures else {}
    # opt-in: merge duplicate entities (resolve.py); not once the budget is used up
    if settings.resolution.enabled and not llm.budget_reached:
        entities, relationships, covariates, stats["resolution"], unresolved = await resolve.resolve_in_pipeline(
            entities, relationships, covariates, llm, embedder, settings=settings, language=language)
        failed = [*failed, *unresolved]  # failed items of this step: reported, and the rerun redoes it
    relationships = relationships.assign(co_occurrence=False)
    if weight > 0:
        # with resolution, after it, so the weak edges join the final entities
        weak = await early if early is not None else cooccurrence_edges(entities, relationships, units,
                                                                         weight=weight, language=language)
        relationships = pd.concat([relationships, weak], ignore_index=True) if len(weak) else relationships
        stats["cooccurrence_edges"] = len(weak)
    if numbering is not None:
        entities, relationships, covariates = (numbering.renumber(df, n) for df, n in (
            (entities, "entities"), (relationships, "relationships"), (covariates, "covariates")))
    stats.update(entities=len(entities), relationships=len(relationships), claims=len(covariates),
                 # named only by relationships, with a name that says nothing of its type
                 entities_untyped=int((entities["type"] == summarize.UNKNOWN_TYPE).sum()))
    return Output({"entities": entities, "relationships": relationships, "covariates": covariates},
                  failed=list(failed), items=n_items, stats=stats)


def _communities(*, entities: pd.DataFrame, relationships: pd.DataFrame, numbering: Numbering | None,
                 lazy: bool, settings: Settings) -> Output:
    comms = communities.build_communities(entities, relationships, max_cluster_size=settings.communities.max_cluster_size,
                                          seed=settings.communities.seed)
    if numbering is not None:
        comms = numbering.communities(comms)
    if lazy:
        comms = communities.titles_from_members(comms, entities)
    return Output({"communities": comms},
                  stats={"per_level": {int(k): int(v) for k, v in comms.groupby("level").size().items()}})


async def _reports(*, communities: pd.DataFrame, entities: pd.DataFrame, relationships: pd.DataFrame,
                   covariates: pd.DataFrame, llm: ChatClient, language: str, lazy: bool, settings: Settings,
                   bar: BarFactory) -> Output:
    if lazy:  # an empty table, so every tool that opens an index finds one
        return Output({"community_reports": pd.DataFrame(columns=TABLES["community_reports"])}, stats={"reports": 0})
    checks: dict[str, int] = {}  # what the checks of the answers dropped (report_checks.py)
    ray_figures: dict[str, int] = {}
    # On Ray Data each level is one dataset whose workers write the reports; this merges them.
    elsewhere = functools.partial(ray_data.reports_on_ray, tables=(communities, entities, relationships, covariates),
                                  settings=settings, language=language, usage=llm.usage,
                                  figures=ray_figures) if ray_data.enabled(settings) else None
    reports, failed = await community_reports.write_reports(communities, entities, relationships, covariates, llm,
                                                            settings=settings, language=language,
                                                            advance=bar("community reports", len(communities)),
                                                            counts=checks, elsewhere=elsewhere)
    return Output({"community_reports": reports}, failed=[str(f) for f in failed], items=len(communities),
                  stats={"reports": len(reports), "checks": checks, **({"ray_data": ray_figures} if ray_figures else {})})


async def _embed(*, tables: dict[str, pd.DataFrame], embedder: Any, run: embed.EmbeddingRun, out: Path,
                 bar: BarFactory, settings: Settings, figures: dict[str, int]) -> Output:
    # The tables `run` was given earlier (text units, entities) are embedded already or in flight.
    vectors, failed = await embed.embed_tables(tables, embedder, out, run=run,
                                               advance=bar("embeddings", embed.embedding_count(tables)))
    return Output({}, failed=failed, stats={"vectors": vectors, **({"ray_data": figures} if figures else {})})


def _warn_if_empty(units: pd.DataFrame, work: Output, log: Callable[[str], None]) -> None:
    if len(units) and work.tables["entity_instances"].empty and not work.failed:
        # Not an error (the index still serves basic search), but almost always a sign of a
        # model that cannot follow the extraction prompt, or of prompts that do not fit.
        log(f"warning: no entities were extracted from any of the {len(units)} text units; "
            "the graph, communities and reports are empty. Check the chat model "
            "(`sensegraph doctor`) and prompts/*/extract_graph.txt")


def _finish_stats(stats: dict[str, Any], usage: Usage, failures: dict[str, list[str]], out: Path) -> Path:
    stats["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    _add_usage(stats, usage, failures)
    stats["failures"] = {k: v for k, v in failures.items() if v}
    stats["partial"] = bool(stats["failures"])
    stats_path = out / "stats.json"
    write_json_atomic(stats_path, stats)
    return stats_path


def _add_usage(stats: dict[str, Any], usage: Usage, failures: dict[str, list[str]]) -> None:
    stats["llm"] = usage.as_dict()
    if report := usage.endpoint_report():  # a model served by several endpoints: what each did
        stats["endpoints"] = report
    if outages := usage.outages():  # calls that failed because no server of their model answered
        stats["outages"] = outages
    for step, entry in stats["steps"].items():
        # Usage is recorded under the pipeline's step names; claims are part of extraction.
        # A step that made no call still reports zeros, so stats.json keeps one shape.
        step_usage = StepUsage()
        for name in LLM_STEPS.get(step, ()):
            step_usage.add(usage.steps.get(name, StepUsage()))
        if step in LLM_STEPS:
            entry.update(calls=step_usage.calls, cache_hits=step_usage.cache_hits,
                         prompt_tokens=step_usage.prompt_tokens, completion_tokens=step_usage.completion_tokens,
                         cached_prompt_tokens=step_usage.cached_prompt_tokens, retries=step_usage.retries)
        entry["failures"] = failures.get(step, [])


def _budget_stop(step: str, llm: ChatClient, out: Path, stats: dict[str, Any], failures: dict[str, list[str]],
                 items: dict[str, int], command: str) -> BudgetStopped:
    """Write stats.json for a run stopped by its budget during `step`; the exception to raise."""
    usage, chat = llm.usage, llm.settings
    counts = {}
    for name, n in items.items():
        not_done = failures.get(name, [])
        # Items the client recorded as real failures; every other item not done was skipped.
        real = {i for u in BUDGET_STEPS[name][0] for i in usage.steps.get(u, StepUsage()).failures}
        failed = min(len(not_done), len(real))
        counts[name] = {"items": n, "done": n - len(not_done), "skipped": len(not_done) - failed, "failed": failed}
    _add_usage(stats, usage, failures)
    stats["stopped"] = "budget"
    stats["budget"] = {"limit": llm.budget_limit(), "step": step, "budget_tokens": chat.budget_tokens,
                       "budget_cost": chat.budget_cost, "spent_tokens": usage.chat_tokens(),
                       "spent_cost": round(usage.cost(), 6), "steps": counts}
    # Skipped items stay listed as not done: `sensegraph update` retries the text units listed here.
    stats["failures"] = {k: v for k, v in failures.items() if v}
    stats["partial"] = True
    stats_path = out / "stats.json"
    write_json_atomic(stats_path, stats)
    c = counts[step]
    failed = f", {c['failed']} failed" if c["failed"] else ""
    flag = "--budget-tokens" if llm.budget_limit() == "budget_tokens" else "--budget-cost"
    message = (
        f"Stopped: {llm.describe_budget()}.\n"
        f"The limit was reached during {step}: {c['done']} of {c['items']} {BUDGET_STEPS[step][1]} done, "
        f"{c['skipped']} skipped{failed}. Later steps did not run (details in {stats_path}).\n"
        "Nothing finished is lost: every answer received is in the cache.\n"
        f"To continue, rerun `{command}`, optionally with a larger {flag} (or 0 for no limit); "
        "finished calls come from the cache and cost nothing.")
    return BudgetStopped(message, stats)


def _link_text_units(docs: pd.DataFrame, units: pd.DataFrame, numbering: Numbering | None, *,
                     entities: pd.DataFrame, relationships: pd.DataFrame,
                     covariates: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Documents and text units learn which elements they gave rise to."""
    by_doc = units.groupby("document_id")["id"].apply(list)
    docs = docs.copy()
    docs["text_unit_ids"] = [by_doc.get(d, []) for d in docs["id"]]
    units = units.copy()
    links: dict[str, dict[str, list[str]]] = {c: {} for c in ("entity_ids", "relationship_ids")}
    for col, df in (("entity_ids", entities), ("relationship_ids", relationships)):
        for eid, tus in zip(df["id"], df["text_unit_ids"]):
            for tu in tus:
                links[col].setdefault(tu, []).append(eid)
    cov: dict[str, list[str]] = {}
    for cid, tu in zip(covariates.get("id", []), covariates.get("text_unit_id", [])):
        cov.setdefault(tu, []).append(cid)
    units["entity_ids"] = [links["entity_ids"].get(t, []) for t in units["id"]]
    units["relationship_ids"] = [links["relationship_ids"].get(t, []) for t in units["id"]]
    units["covariate_ids"] = [cov.get(t, []) for t in units["id"]]
    if numbering is not None:
        return numbering.renumber(docs, "documents"), numbering.renumber(units, "text_units")
    return docs, units
