"""The indexing pipeline: the paper's steps in order, with checkpoints and stats.

Each step reads tables and writes tables. A step whose inputs and settings are unchanged since
its last successful run is skipped (its tables are read back); inside a step, finished LLM calls
come from the cache. So an interrupted run, rerun, repeats no paid work.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import Settings
from ..language import resolve_language
from ..llm import ChatClient, StepUsage, Usage, open_cache, open_chat, open_embedder
from ..store.tables import read_table, write_json_atomic, write_table
from . import community_reports, communities, documents, embed, extract, resolve, summarize, text_units

# Bar(description, total) -> advance(n)
BarFactory = Callable[[str, int], Callable[[int], None]]
STATE_FILE = "state.json"
# Pipeline steps that call models, and the usage step names each one's calls are recorded under.
LLM_STEPS = {"extract": ("extract", "claims"), "summarize": ("summarize", "resolve"),
             "community_reports": ("community_reports",), "embed": ("embed",)}
WORK_DIR = "_work"  # intermediate tables (extraction instances), kept for incremental updates
# Steps a spending budget can stop, the usage step names of their items, and what the items are.
BUDGET_STEPS = {"extract": (("extract", "claims"), "text units"),
                "summarize": (("summarize",), "entity and relationship descriptions"),
                "community_reports": (("community_reports",), "community reports")}


class IndexFailed(RuntimeError):
    """Some items failed after every retry; the message lists them all."""

    def __init__(self, failures: dict[str, list[str]], stats_path: Path):
        self.failures = failures
        lines = [f"  {step}: {len(ids)} failed: {', '.join(map(str, ids[:20]))}{' …' if len(ids) > 20 else ''}"
                 for step, ids in failures.items() if ids]
        super().__init__("indexing finished with failures (every failed item is listed in "
                         f"{stats_path}):\n" + "\n".join(lines) +
                         "\nRerun `sensegraph index` to retry only these (finished work comes from the cache), "
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


def _fingerprint(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _ids_fingerprint(df: pd.DataFrame, *columns: str) -> str:
    h = hashlib.sha256()
    for col in columns or ("id",):
        for v in df[col].astype(str):
            h.update(v.encode())
            h.update(b"\x1f")
    return h.hexdigest()[:32]


class _Checkpoints:
    """Remembers, per step, the fingerprint of the inputs its stored tables were made from."""

    def __init__(self, output_dir: Path):
        self.path = output_dir / STATE_FILE
        self.state: dict[str, str] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, step: str, fingerprint: str, tables: list[Path]) -> bool:
        return self.state.get(step) == fingerprint and all(p.exists() for p in tables)

    def mark(self, step: str, fingerprint: str) -> None:
        self.state[step] = fingerprint
        write_json_atomic(self.path, self.state)


def extract_fingerprint(settings: Settings, units: pd.DataFrame, language: str) -> str:
    """What the extraction of `units` depends on: their ids, the settings, model and prompts."""
    model_id = (settings.chat.provider, settings.chat.model, settings.local.size if settings.chat.provider == "local" else "")
    return _fingerprint(_ids_fingerprint(units), settings.extraction.model_dump(), language, model_id,
                        _prompt_fingerprint(settings, language, ["extract_graph", "glean_check",
                                                                 "glean_continue", "examples_graph",
                                                                 "extract_claims"]))


async def run_index(settings: Settings, *, bar: BarFactory = _no_bar, log: Callable[[str], None] = print,
                    cache: bool | None = None, allow_partial: bool = False, hooks: Any = None) -> IndexResult:
    """Build or resume the index. `hooks` (see update.UpdateHooks) lets `sensegraph update` reuse
    the previous extraction and keep human-readable ids stable; every other step is the same."""
    out = settings.path(settings.output_dir)
    work = out / WORK_DIR
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = _Checkpoints(out)
    usage = Usage(settings.chat.price_per_1k_prompt, settings.chat.price_per_1k_completion,
                  settings.embedding.price_per_1k_prompt)
    answer_cache = open_cache(settings, cache)
    llm = open_chat(settings, cache=answer_cache, usage=usage)
    embedder = open_embedder(settings, cache=answer_cache, usage=usage)
    prefetch: asyncio.Task | None = None
    try:
        stats: dict[str, Any] = {"steps": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        failures: dict[str, list[str]] = {}
        budget_items: dict[str, int] = {}  # items of each budgeted step run so far

        def stop_if_budget(step: str, items: int, not_done: list[str]) -> None:
            # Only between steps: a step cut short is not marked done and no later step runs on
            # its partial output; the rerun takes its finished calls from the cache.
            budget_items[step] = items
            if llm.budget_reached:
                raise _budget_stop(step, llm, out, stats, {**failures, step: list(not_done)}, budget_items,
                                   "sensegraph update" if hooks is not None else "sensegraph index")

        @contextmanager
        def timed(step: str):
            t0 = time.perf_counter()
            entry: dict[str, Any] = {}
            stats["steps"][step] = entry
            yield entry
            entry["seconds"] = round(time.perf_counter() - t0, 3)

        # 1. documents -> 2. text units (no LLM; cheap, always recomputed to see input changes)
        with timed("documents") as st:
            docs = documents.load_documents(settings, warn=lambda m: log(f"warning: {m}"))
            st["documents"] = len(docs)
        language = resolve_language(settings.language, docs["text"])
        stats["language"] = language
        with timed("text_units") as st:
            units = text_units.make_text_units(docs, size=settings.chunks.size, overlap=settings.chunks.overlap)
            units = units.reset_index(drop=True)
            by_doc = units.groupby("document_id")["id"].apply(list)
            docs["text_unit_ids"] = [by_doc.get(d, []) for d in docs["id"]]
            st["text_units"] = len(units)
            st["tokens"] = int(units["n_tokens"].sum())
        # Text-unit vectors are computed alongside extraction (into the cache), not after it.
        prefetch = embed.prefetch_text_units(units, embedder)

        # 3. extraction of element instances (one call per text unit, plus gleaning)
        fp_extract = extract_fingerprint(settings, units, language)
        inst_paths = [work / f"{n}.parquet" for n in ("entity_instances", "relationship_instances", "claim_instances")]
        with timed("extract") as st:
            if checkpoints.done("extract", fp_extract, inst_paths):
                extraction = extract.ExtractionResult(
                    *(pd.read_parquet(p) for p in inst_paths), failed=[])
                st["skipped"] = True
            else:
                extract_fn = hooks.extract if hooks is not None else extract.extract_graph
                extraction = await extract_fn(units, llm, settings=settings, language=language,
                                              advance=bar("extract", len(units)))
                work.mkdir(parents=True, exist_ok=True)
                for p, df in zip(inst_paths, (extraction.entities, extraction.relationships, extraction.claims)):
                    write_table(df, p.parent, p.stem)  # not a known table: no column check
                # After writing: `sensegraph update` reuses these instances and retries the
                # units stats.json lists as not done.
                stop_if_budget("extract", extraction.stats.get("units", len(units)), extraction.failed)
                if not extraction.failed:
                    checkpoints.mark("extract", fp_extract)
            failures["extract"] = list(extraction.failed)
            if len(units) and extraction.entities.empty and not extraction.failed:
                # Not an error (the index still serves basic search), but almost always a sign of
                # a model that cannot follow the extraction prompt, or of prompts that do not fit.
                log(f"warning: no entities were extracted from any of the {len(units)} text units; "
                    "the graph, communities and reports are empty. Check the chat model "
                    "(`sensegraph doctor`) and prompts/*/extract_graph.txt")
            st.update(entity_instances=len(extraction.entities), relationship_instances=len(extraction.relationships),
                      claim_instances=len(extraction.claims))

        # 4. merge + summarise into entities, relationships, claims (covariates)
        fp_summary = _fingerprint(fp_extract, _ids_fingerprint(extraction.entities, "title", "description"),
                                  _ids_fingerprint(extraction.relationships, "source", "target", "description"),
                                  settings.summarize.model_dump(), settings.summary_input_tokens(),
                                  _prompt_fingerprint(settings, language, ["summarize_descriptions"]),
                                  *resolve.fingerprint_parts(settings, language))
        with timed("summarize") as st:
            names = ["entities", "relationships", "covariates"]
            if checkpoints.done("summarize", fp_summary, [out / f"{n}.parquet" for n in names]):
                entities, relationships, covariates = (read_table(out, n) for n in names)
                st["skipped"] = True
            else:
                n_items = summarize.merge_instances(extraction).size
                entities, relationships, covariates, failed = await summarize.summarize_graph(
                    extraction, units, llm, settings=settings, language=language, advance=bar("summarize", n_items))
                failures["summarize"] = list(failed)
                # opt-in: merge duplicate entities (resolve.py); not once the budget is used up
                if settings.resolution.enabled and not llm.budget_reached:
                    entities, relationships, covariates, st["resolution"] = await resolve.resolve_in_pipeline(
                        entities, relationships, covariates, llm, embedder, settings=settings, language=language)
                # Before writing: the tables of the last complete run stay as they were.
                stop_if_budget("summarize", n_items, failed)
                if hooks is not None:
                    entities, relationships, covariates = hooks.elements(entities, relationships, covariates)
                for name, df in zip(names, (entities, relationships, covariates)):
                    write_table(df, out, name)
                if not failed:
                    checkpoints.mark("summarize", fp_summary)
            st.update(entities=len(entities), relationships=len(relationships), claims=len(covariates))

        # text units and documents learn which elements they gave rise to
        units = _link_text_units(units, entities, relationships, covariates)
        if hooks is not None:
            docs, units = hooks.units(docs, units)
        write_table(docs, out, "documents")
        write_table(units, out, "text_units")

        # 5. communities (hierarchical Leiden), every level a complete partition
        fp_comm = _fingerprint(fp_summary, _ids_fingerprint(entities), _ids_fingerprint(relationships, "id", "weight"),
                               settings.communities.model_dump())
        with timed("communities") as st:
            if checkpoints.done("communities", fp_comm, [out / "communities.parquet"]):
                comms = read_table(out, "communities")
                st["skipped"] = True
            else:
                comms = communities.build_communities(entities, relationships,
                                                      max_cluster_size=settings.communities.max_cluster_size,
                                                      seed=settings.communities.seed)
                if hooks is not None:
                    comms = hooks.communities(comms)
                write_table(comms, out, "communities")
                checkpoints.mark("communities", fp_comm)
            st["per_level"] = {int(k): int(v) for k, v in comms.groupby("level").size().items()}

        # 6. community reports, bottom-up
        fp_reports = _fingerprint(fp_comm, _ids_fingerprint(comms), _ids_fingerprint(entities, "id", "description"),
                                  settings.reports.model_dump(), settings.report_input_tokens(),
                                  _prompt_fingerprint(settings, language, ["community_report"]))
        with timed("community_reports") as st:
            if checkpoints.done("community_reports", fp_reports, [out / "community_reports.parquet"]):
                reports = read_table(out, "community_reports")
                st["skipped"] = True
            else:
                reports, failed = await community_reports.write_reports(
                    comms, entities, relationships, covariates, llm, settings=settings, language=language,
                    advance=bar("community reports", len(comms)))
                failures["community_reports"] = [str(f) for f in failed]
                stop_if_budget("community_reports", len(comms), failures["community_reports"])
                write_table(reports, out, "community_reports")
                if not failed:
                    checkpoints.mark("community_reports", fp_reports)
            st["reports"] = len(reports)

        # 7. embeddings for search
        tables = {"documents": docs, "text_units": units, "entities": entities, "relationships": relationships,
                  "covariates": covariates, "communities": comms, "community_reports": reports}
        with timed("embed") as st:
            if prefetch is not None:
                await prefetch
            st["vectors"], failures["embed"] = await embed.embed_tables(
                tables, embedder, out, advance=bar("embeddings", embed.embedding_count(tables)))

        stats["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        _add_usage(stats, usage, failures)
        if hooks is not None:
            stats["update"] = hooks.report(tables, stats)
        failures = {k: v for k, v in failures.items() if v}
        stats["failures"] = failures
        stats["partial"] = bool(failures)
        stats_path = out / "stats.json"
        write_json_atomic(stats_path, stats)
    finally:
        # Also on an exception or a cancellation (Ctrl-C): close connections and the cache.
        if prefetch is not None and not prefetch.done():
            prefetch.cancel()
            await asyncio.gather(prefetch, return_exceptions=True)
        await llm.aclose()
        await embedder.aclose()
        if answer_cache is not None:
            answer_cache.close()
    if failures and not allow_partial:
        raise IndexFailed(failures, stats_path)
    return IndexResult(out, tables, stats, failures)


def _add_usage(stats: dict[str, Any], usage: Usage, failures: dict[str, list[str]]) -> None:
    stats["llm"] = usage.as_dict()
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


def _prompt_fingerprint(settings: Settings, language: str, names: list[str]) -> str:
    from ..prompts import load_prompt

    texts = []
    for n in names:
        try:
            texts.append(load_prompt(n, language, settings.root))
        except FileNotFoundError:
            texts.append("")
    return _fingerprint(texts)


def _link_text_units(units: pd.DataFrame, entities: pd.DataFrame, relationships: pd.DataFrame,
                     covariates: pd.DataFrame) -> pd.DataFrame:
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
    return units
