"""The LLM steps as Ray Data pipelines (`sensegraph index --ray ADDRESS --ray-data`): the workers
do the per-item work, the driver only merges.

With `--ray` alone the driver builds every prompt, checks the cache, parses every answer and
sends only the HTTP request to a worker (llm/ray_workers.py): one driver core caps the run near
200-300 calls/s. Here each step that calls a model is a `ray.data` dataset of partitions mapped
by a pool of actors:
- extraction: consecutive runs of `ray.partition_units` text units (extract_on_ray);
- description summaries: runs of the merged entities and relationships that have several
  descriptions (summarize_on_ray);
- community reports: one dataset per level, deepest first, since a community's context may
  read its sub-communities' reports (reports_on_ray; clustering and the order stay here). The
  graph goes to the object store once per level; each actor builds the same
  community_reports.Writer from it that one process uses;
- embeddings: runs of batches of one table's texts (embed_on_ray). The embedded local embedder
  is not sent: it computes on this machine's cores, which local actors would only share.
The driver writes each partition's items to `<ray.data_path>/inputs/<step>~<driver>~<run>/<key>.parquet`
and the dataset holds only those paths, so the items are not held twice on the driver (once in
its tables, once in the dataset it sends); the folder is removed when the step ends, or by the
next run on the same host when its driver was killed (_inputs_folder). Each actor
reads its partition's items, owns a client (chat or embedding) with its own answer cache and
the outage model of endpoints.py (one process's), renders the prompts, makes and checks the
calls exactly as a single process does, writes the partition's tables as parquet and hands the
driver back one row: the partition, its failed items, its counts and its usage. The driver then reads the
partitions' tables in order and concatenates them.

Checkpoints, and where the answers live (the choice the design had to make):
- A finished partition is a folder `<ray.data_path>/<step>/<key>/` (parquet files, then
  `done.json` written last). `<key>` hashes the partition's items with everything that decides
  its answers (the code, the step's and the model's settings, the model, the language, the
  prompts; for reports the whole graph and the reports below), so a rerun skips every partition whose folder is complete and
  nothing it reads has changed; a changed setting gives new keys, never a stale partition.
- The partitions carry the answers that matter: a node lost after a partition finished costs
  nothing, whoever reads it next. The answer cache is per node
  (`<data_path>/answers/<node id>.sqlite`), because SQLite's WAL needs every process of a file on
  one host and a shared filesystem does not give that; a partition cut short by a dead worker
  is redone, its finished calls from that node's cache when it runs there again, else asked
  again: at most one partition per worker is ever asked twice.
- `ray.data_path` must be a folder every node can read and write: the default (the project's
  cache folder) is right for one machine; a cluster needs a shared filesystem path. Each actor
  reads back a file the driver wrote there before it makes a call (Worker.blind).

What is the same as a single process: the tables and vectors. Extraction of a unit reads only
that unit, rows come out in unit order, and a partition is a run of consecutive units, so
concatenating the partitions in order gives the single-process tables; a report reads only its
community's elements and the reports below, which a level-by-level run has written (one process
runs by dependency, with the same prompts). tests/test_ray.py checks it on a real local
cluster. The spaCy pass that adds missed names is split: the workers find spaCy's names in
their units (the costly half, written as a partition table) and the driver matches them against
the merged instances (a name's type may come from what the model called it in other units).
Entity resolution and clustering stay on the driver.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import Settings
from ..llm import Cache, LLMError, open_chat, open_embedder
from ..llm.ray_workers import RayUnavailable, one_line, shares
from ..llm.usage import StepUsage, Usage
from ..prompts import load_prompt
from ..store.tables import TableError, read_parts, read_table, write_json_atomic, write_table
from . import community_reports, extract, missed_names, report_checks, summarize
from .concepts import ConceptError
from .steps import code_fingerprint

# Partitions an actor works on at once: while one waits on its last, slowest units, the next
# keeps the actor's share of the servers busy (one at a time left a quarter of it idle).
PARTITIONS_PER_ACTOR = 2
# How often an actor tells the budget's ledger what it spent and learns what the others did:
# the most of the other actors' spending a budget check can miss.
BUDGET_REPORT_EVERY = 0.1
INSTANCES = ("entity_instances", "relationship_instances", "claim_instances")
SPANS = "name_spans"  # spaCy's names per unit, for the missed-names pass (missed_names.name_spans)
DONE = "done.json"
PROBE = "probe"  # in a step's inputs folder: the token the actors read back (Worker.blind)
logger = logging.getLogger(__name__)


def enabled(settings: Settings) -> bool:
    """Whether extraction and summaries run as Ray Data pipelines (read without recording: see _run)."""
    ray = _raw_settings(settings).ray
    return bool(ray.address and ray.data)


def data_path(settings: Settings) -> Path:
    """Where partitions and the workers' answer caches go."""
    return settings.path(settings.ray.data_path or os.path.join(settings.cache.dir, "ray-data"))


def _fingerprint(**parts: Any) -> str:
    """A hash of everything besides its items that decides a partition's tables."""
    blob = json.dumps({"code": code_fingerprint(), **parts}, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _key(fingerprint: str, content: Any) -> str:
    """A partition's folder name: its items' content under the fingerprint of what reads them."""
    h = hashlib.sha256(fingerprint.encode())
    h.update(json.dumps(content, ensure_ascii=False).encode())
    return h.hexdigest()[:32]


def _chat_identity(settings: Settings) -> dict[str, Any]:
    """What of the chat settings decides an answer (as the answer cache's key has it)."""
    return {"chat": {k: v for k, v in settings.chat.model_dump(mode="json").items()
                     if k in ("provider", "model", "temperature", "structured_output", "extra_body", "api_version")},
            "endpoint_models": [e.model for e in (settings.chat.endpoints or []) if e.model],
            "local": settings.local.size if settings.chat.provider == "local" else None}


def _finished(folder: Path) -> dict[str, Any] | None:
    """The partition's record if it is complete and lost no unit (a partition with failed units
    is asked again: its finished calls come from the node's cache)."""
    try:
        done = json.loads((folder / DONE).read_text())
    except (OSError, ValueError):
        return None
    return done if not done.get("failed") else None


class Worker:
    """A Ray Data actor: whole partitions of one kind ("extract": rows key, ids, texts;
    "summarize": rows key, names, descriptions), each written under `<root>/<kind>/<key>/`."""

    def __init__(self, kind: str, settings_json: str, chats: list[str], slots: Any, language: str,
                 prompts: dict[str, str], root: str, probe: tuple[str, str], ledger: Any = None,
                 tables: list[Any] | None = None):
        import ray

        from ..config import ChatSettings, EmbeddingSettings

        # Whether this node sees the driver's files under data_path (the probe _run wrote). An
        # actor that does not would write its partitions where the driver never reads them: it
        # makes no call and answers each partition with its node's address instead, which stops
        # the run (_run). Checked here, by the actors that do the work, because a separate task
        # per node starts Ray worker processes at every step and cost a tenth of the throughput.
        self.blind = "" if _sees(*probe) else ray.util.get_node_ip_address()
        if self.blind:
            return

        # The actors are alike to Ray Data; each takes the next share of the servers' limits
        # (a restarted actor the share of the one it replaces, give or take), so that together
        # they never send a server more than its settings allow. (`chats`: the embedding
        # section's shares for "embed".)
        section, model = ("embedding", EmbeddingSettings) if kind == "embed" else ("chat", ChatSettings)
        share = model.model_validate_json(chats[ray.get(slots.take.remote()) % len(chats)])
        self.settings = Settings.model_validate_json(settings_json).model_copy(update={section: share})
        self.kind, self.language, self.prompts, self.root = kind, language, prompts, Path(root)
        node = ray.get_runtime_context().get_node_id()
        self.cache = Cache(self.root / "answers" / f"{node}.sqlite")
        # One client for the actor's life, made on the actor's event loop at its first call, so
        # that an endpoint found out stays out for the next partitions too (endpoints.py).
        self.llm: Any = None
        # A spending budget: this actor's spending (its partitions', running and finished), what
        # of it the ledger was told, and the ledger's last total, everyone's (Worker._report).
        self.ledger = ledger
        self.running: list[Usage] = []
        self.finished = (0, 0.0)
        self.reported = (0, 0.0)
        self.total = (0, 0.0)
        self.reporter: asyncio.Task | None = None
        # Reports: the graph every community's context is packed from, from the object store
        # (`tables` holds its reference: a reference at the top level would be one per actor).
        self.writer = None
        if kind == "reports":
            communities, entities, relationships, covariates, today = ray.get(tables[0])
            self.writer = community_reports.writer(communities, entities, relationships, covariates,
                                                   settings=self.settings, language=language, today=today)

    async def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        # Async: the actor runs PARTITIONS_PER_ACTOR partitions at once on one event loop, so its
        # share of the servers stays busy while one partition waits on its slowest item.
        if self.blind:
            return pd.DataFrame({"key": ["" for _ in batch["input"]], "record": [json.dumps({"blind": self.blind})
                                                                              for _ in batch["input"]]})
        if self.llm is None:
            self.llm = open_embedder(self.settings, cache=self.cache) if self.kind == "embed" else \
                open_chat(self.settings, cache=self.cache)
            if self.ledger is not None:
                self.llm.spent_elsewhere = self._elsewhere
                self.reporter = asyncio.create_task(self._report())
        return pd.DataFrame([await self._partition(_read_input(Path(path))) for path in batch["input"]])

    def _own(self) -> tuple[int, float]:
        """This actor's chat spending so far."""
        return (self.finished[0] + sum(u.chat_tokens() for u in self.running),
                self.finished[1] + sum(u.cost() for u in self.running))

    def _elsewhere(self, mine: Usage) -> tuple[int, float]:
        """What the budget counts besides the partition whose usage is `mine`: everyone's spending
        the ledger knows, and this actor's since it last told it."""
        own = self._own()
        return (self.total[0] - self.reported[0] + own[0] - mine.chat_tokens(),
                self.total[1] - self.reported[1] + own[1] - mine.cost())

    async def _report(self) -> None:
        """Every BUDGET_REPORT_EVERY seconds: tell the ledger what this actor spent since last
        time and learn everyone's total. A budget check therefore misses at most that long of
        the other actors' spending (and, as in one process, the calls in flight)."""
        while True:
            now = self._own()
            self.total = await self.ledger.add.remote(now[0] - self.reported[0], now[1] - self.reported[1])
            self.reported = now
            await asyncio.sleep(BUDGET_REPORT_EVERY)

    async def _partition(self, row: dict[str, Any]) -> dict[str, Any]:
        s = self.settings
        # A view of the actor's client (same servers, limits, cache and outage state) that
        # counts this partition's usage apart from the partitions running beside it.
        llm = copy.copy(self.llm)
        section = s.embedding if self.kind == "embed" else s.chat
        llm.usage = usage = Usage(section.price_per_1k_prompt, section.price_per_1k_completion)
        self.running.append(usage)
        try:
            return await self._work(row, llm, usage)
        finally:
            self.running.remove(usage)
            self.finished = (self.finished[0] + usage.chat_tokens(), self.finished[1] + usage.cost())

    async def _work(self, row: dict[str, Any], llm: Any, usage: Usage) -> dict[str, Any]:
        s, key = self.settings, row["key"]
        usage.pools["embedding" if self.kind == "embed" else "chat"] = llm.endpoints
        if self.kind == "embed":
            ids, texts, size, first = list(row["ids"]), list(row["texts"]), s.embedding.batch_size, int(row["first"])
            spans = [(first + n, a) for n, a in enumerate(range(0, len(ids), size))]

            async def one(a: int) -> Any:
                try:
                    return await llm.embed(texts[a:a + size], kind="passage", step="embed")
                except LLMError:
                    return None
            done = await asyncio.gather(*(one(a) for _, a in spans))
            kept = [(n, a, v) for (n, a), v in zip(spans, done) if v is not None]
            tables = {"vectors": pd.DataFrame({
                "batch": [n for n, a, v in kept for _ in range(len(v))],
                "id": [i for n, a, v in kept for i in ids[a:a + len(v)]],
                "vector": [vector.astype("float32").tobytes() for n, a, v in kept for vector in v]})}
            record = {"items": len(ids), "failed": [[n, *ids[a:a + size]] for (n, a), v in zip(spans, done) if v is None]}
        elif self.kind == "extract":
            units = pd.DataFrame({"id": list(row["ids"]), "text": list(row["texts"])})
            result = await extract.extract_graph(units, llm, settings=s, language=self.language,
                                                 prompts=self.prompts)
            tables = dict(zip(INSTANCES, (result.entities, result.relationships, result.claims)))
            record = {"items": len(units), "failed": result.failed, "stats": result.stats,
                      "self_loops": result.self_loops, "empty_names": result.empty_names}
            if missed_names.enabled(s, self.language):
                # spaCy's half of the missed-names pass, per unit, so the driver only matches.
                # A node without spaCy leaves it to the driver (extract_on_ray says so).
                try:
                    tables[SPANS] = await asyncio.to_thread(missed_names.name_spans, list(units["id"]),
                                                            list(units["text"]))
                except ConceptError as exc:
                    record["name_spans_error"] = one_line(exc)
        elif self.kind == "reports":
            # A writer of its own per partition (the same graph): two partitions run at once.
            w = dataclasses.replace(self.writer, checks=report_checks.new_counts())
            subs = {int(n): community_reports.Report.model_validate(r) for n, r in json.loads(row["subreports"]).items()}
            numbers = [int(n) for n in row["numbers"]]
            done = await asyncio.gather(*(w.write(w.comms[n], subs, llm) for n in numbers))
            tables = {"reports": pd.DataFrame({"community": numbers,
                                               "report": [d[0].model_dump_json() if d else "" for d in done],
                                               "row": [json.dumps(d[1], ensure_ascii=False) if d else "" for d in done]})}
            record = {"items": len(numbers), "failed": [n for n, d in zip(numbers, done) if d is None],
                      "checks": dict(w.checks)}
        else:
            names = list(row["names"])
            done = await asyncio.gather(*(summarize.summarize_one(n, list(d), llm, s, self.prompts["summarize"])
                                          for n, d in zip(names, row["descriptions"])))
            tables = {"summaries": pd.DataFrame({"description": [d for d, _ in done], "ok": [ok for _, ok in done]})}
            record = {"items": len(names), "failed": [n for n, (_, ok) in zip(names, done) if not ok]}
        record["usage"] = {n: dataclasses.asdict(u) for n, u in usage.steps.items()}
        record["chat"] = self.kind != "embed"  # whose tokens: chat tokens are what a budget counts
        # Written beside the final folder and renamed into place: a reader sees a partition
        # whole or not at all, and a worker killed while writing leaves only a stray folder.
        final = self.root / self.kind / key
        scratch = final.with_name(f"{key}.{uuid.uuid4().hex[:8]}.tmp")
        scratch.mkdir(parents=True)
        for name, table in tables.items():
            write_table(table, scratch, name)
        write_json_atomic(scratch / DONE, record)
        if final.exists():  # an earlier attempt that lost items, or a twin of this partition
            shutil.rmtree(final, ignore_errors=True)
        os.replace(scratch, final)
        return {"key": key, "record": json.dumps(record)}


class _Ledger:
    """The run's chat spending during one step, as its actors report it (Worker._report)."""

    def __init__(self, tokens: int, cost: float) -> None:
        self.tokens, self.cost = tokens, cost

    def add(self, tokens: int, cost: float) -> tuple[int, float]:
        self.tokens += tokens
        self.cost += cost
        return self.tokens, self.cost


class _Slots:
    """Numbers the actors as they start (Ray Data's actors have no index of their own)."""

    def __init__(self) -> None:
        self.next = -1

    def take(self) -> int:
        self.next += 1
        return self.next


def extract_on_ray(units: pd.DataFrame, *, settings: Settings, language: str,
                   advance: Callable[[int], None] | None = None,
                   usage: Usage | None = None) -> tuple[extract.ExtractionResult, dict[str, int]]:
    """extract.extract_graph's result for `units`, computed by a pool of Ray Data actors on the
    cluster `ray.init` connected to (partitions already finished are read, not recomputed), and
    figures for stats.json. The workers' usage is added to `usage`."""
    prompts = extract.extraction_prompts(settings, language)
    # Read through the step's settings recorder, the sections read here become part of the
    # step's own fingerprint too (the workers' reads happen where no recorder sees them).
    fingerprint = _fingerprint(language=language, prompts=prompts, model=_chat_identity(settings),
                               extraction=settings.extraction.model_dump(mode="json"))
    size = _raw_settings(settings).ray.partition_units
    ids, texts = [str(i) for i in units["id"]], [str(t) for t in units["text"]]
    rows = [{"key": _key(fingerprint, [ids[a:a + size], texts[a:a + size]]), "ids": ids[a:a + size],
             "texts": texts[a:a + size]} for a in range(0, len(ids), size)]
    records, reused = _run("extract", rows, settings=settings, language=language, prompts=prompts,
                           advance=advance, usage=usage)
    root = data_path(_raw_settings(settings)) / "extract"
    merged = _merged(root, [r["key"] for r in rows], records)
    figures = {"partitions": len(rows), "partitions_reused": reused}
    if missed_names.enabled(settings, language):
        spans, here, why = [], 0, ""
        for row in rows:
            try:
                spans.append(read_table(root / row["key"], SPANS))
            except TableError:  # a worker without spaCy: found here instead
                spans.append(missed_names.name_spans(row["ids"], row["texts"]))
                here += len(row["ids"])
                why = why or records[row["key"]].get("name_spans_error", "")
        if here:
            logger.warning("spaCy's names of %d text units were found on the driver, not the workers (%s): "
                           "install the spaCy model on every node", here, why or "no spans in their partitions")
        merged = dataclasses.replace(merged, name_spans=pd.concat(spans, ignore_index=True))
        figures["name_spans_on_driver"] = here
    return merged, figures


def summarize_on_ray(items: list[tuple[str, list[str]]], *, settings: Settings, language: str,
                     advance: Callable[[int], None] | None = None, usage: Usage | None = None,
                     figures: dict[str, int] | None = None) -> list[tuple[str, bool]]:
    """summarize.summarize_one's (description, ok) for each (name, descriptions), in order,
    computed by Ray Data actors in partitions of `ray.partition_units` x 4 items (a summary is
    a call or a few, an extraction two or more); `figures` gets the partition counts."""
    template = load_prompt("summarize_descriptions", language, settings.root)
    fingerprint = _fingerprint(language=language, template=template, model=_chat_identity(settings),
                               summarize=settings.summarize.model_dump(mode="json"),
                               input_tokens=settings.summary_input_tokens())
    size = 4 * _raw_settings(settings).ray.partition_units
    chunks = [items[a:a + size] for a in range(0, len(items), size)]
    rows = [{"key": _key(fingerprint, chunk), "names": [n for n, _ in chunk], "descriptions": [d for _, d in chunk]}
            for chunk in chunks]
    records, reused = _run("summarize", rows, settings=settings, language=language,
                           prompts={"summarize": template}, advance=advance, usage=usage)
    root = data_path(_raw_settings(settings)) / "summarize"
    out: list[tuple[str, bool]] = []
    for row in rows:
        table = read_table(root / row["key"], "summaries")
        out.extend(zip(table["description"].astype(str).tolist(), table["ok"].astype(bool).tolist()))
    if figures is not None:
        figures.update(partitions=len(rows), partitions_reused=reused)
    return out


def reports_on_ray(numbers: list[int], subreports: dict[int, Any], *, tables: tuple[pd.DataFrame | None, ...],
                   today: str, settings: Settings, language: str, advance: Callable[[int], None] | None = None,
                   usage: Usage | None = None, figures: dict[str, int] | None = None
                   ) -> tuple[dict[int, tuple[Any, dict] | None], dict[str, int]]:
    """community_reports.Writer.write's result for each community of one level (`numbers`),
    `subreports` holding the reports of the levels below, computed by Ray Data actors in
    partitions of `ray.partition_units` communities; and the answers' check counts. `tables`:
    communities, entities, relationships, covariates, which every actor reads from the object
    store; `figures` gets the partition counts added."""
    import ray

    raw = _raw_settings(settings)
    template = load_prompt("community_report", language, settings.root)
    # Everything a level's reports read besides the communities named and the reports below:
    # the whole graph (hashed once per level), the prompt, the model and the settings.
    graph = hashlib.sha256()
    for table in tables:
        if table is None:
            continue
        graph.update(pd.util.hash_pandas_object(table.astype(str), index=False).values.tobytes())
        graph.update(json.dumps(list(map(str, table.columns))).encode())
    fingerprint = _fingerprint(language=language, template=template, model=_chat_identity(settings), today=today,
                               reports=settings.reports.model_dump(mode="json"),
                               input_tokens=settings.report_input_tokens(), graph=graph.hexdigest())
    size = raw.ray.partition_units
    children = {int(n): [int(c) for c in kids] for n, kids in zip(tables[0]["community"], tables[0]["children"])}
    rows = []
    for a in range(0, len(numbers), size):
        part = numbers[a:a + size]
        # the reports this partition's communities may read: those of their own sub-communities
        wanted = {n for c in part for n in children.get(c, [])}
        subs = {str(n): r.model_dump(mode="json") for n, r in sorted(subreports.items()) if n in wanted}
        rows.append({"key": _key(fingerprint, [part, subs]), "numbers": part,
                     "subreports": json.dumps(subs, ensure_ascii=False)})
    shared = [ray.put((*tables, today))]
    records, reused = _run("reports", rows, settings=settings, language=language, prompts={}, advance=advance,
                           usage=usage, tables=shared)
    root = data_path(raw) / "reports"
    done: dict[int, tuple[Any, dict] | None] = {}
    checks: dict[str, int] = {}
    for row in rows:
        table = read_table(root / row["key"], "reports")
        for n, report, written in zip(table["community"].tolist(), table["report"].tolist(), table["row"].tolist()):
            done[int(n)] = (community_reports.Report.model_validate_json(report), json.loads(written)) if report \
                else None
        for name, value in records[row["key"]].get("checks", {}).items():
            checks[name] = checks.get(name, 0) + value
    if figures is not None:
        figures["partitions"] = figures.get("partitions", 0) + len(rows)
        figures["partitions_reused"] = figures.get("partitions_reused", 0) + reused
    return done, checks


def local_embeddings(settings: Settings) -> bool:
    """Whether the embeddings stay in this process although Ray Data is on: the embedded model
    computes them on this machine's cores (actors beside it would only share those cores)."""
    return _raw_settings(settings).embedding.provider == "local"


def embed_on_ray(name: str, ids: list[str], texts: list[str], *, settings: Settings,
                 advance: Callable[[int], None] | None = None, usage: Usage | None = None,
                 figures: dict[str, int] | None = None) -> tuple[list[tuple[int, list[str], Any]], list[list[str]]]:
    """The passage vectors of `texts` (rows `ids` of table `name`), in batches of
    embedding.batch_size numbered from 0 as embed.EmbeddingRun numbers them, computed by Ray Data
    actors in partitions of `ray.partition_units` batches: (number, ids, vectors) per batch that
    was embedded, and [number, *ids] per batch that failed after retries."""
    import numpy as np

    raw = _raw_settings(settings)
    e = raw.embedding
    fingerprint = _fingerprint(table=name, embedding={"provider": e.provider, "model": e.model,
                                                      "dimensions": e.dimensions, "batch_size": e.batch_size,
                                                      "endpoint_models": [x.model for x in e.endpoints if x.model]})
    step = e.batch_size * raw.ray.partition_units
    rows = [{"key": _key(fingerprint, [ids[a:a + step], texts[a:a + step]]), "first": a // e.batch_size,
             "ids": ids[a:a + step], "texts": texts[a:a + step]} for a in range(0, len(ids), step)]
    records, reused = _run("embed", rows, settings=settings, language="", prompts={}, advance=advance, usage=usage)
    root = data_path(raw) / "embed"
    batches: list[tuple[int, list[str], Any]] = []
    for row in rows:
        table = read_table(root / row["key"], "vectors")
        for number, part in table.groupby("batch", sort=True):
            vectors = np.stack([np.frombuffer(v, dtype=np.float32) for v in part["vector"]])
            batches.append((int(number), part["id"].astype(str).tolist(), vectors))
    if figures is not None:
        figures["partitions"] = figures.get("partitions", 0) + len(rows)
        figures["partitions_reused"] = figures.get("partitions_reused", 0) + reused
    return batches, [b for row in rows for b in records[row["key"]]["failed"]]


def _run(kind: str, rows: list[dict[str, Any]], *, settings: Settings, language: str, prompts: dict[str, str],
         advance: Callable[[int], None] | None, usage: Usage | None,
         tables: list[Any] | None = None) -> tuple[dict[str, dict[str, Any]], int]:
    """Each partition's record: read where it is finished, else computed by the actors (its
    usage added to `usage` as it arrives); and how many were finished already."""
    import ray
    import ray.util.scheduling_strategies

    # The ray section is read from the settings themselves, not through the step's recorder:
    # how the work is spread must not rerun a step whose tables it does not change.
    raw = _raw_settings(settings)
    root = data_path(raw)
    try:
        (root / kind).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unusable(root, exc) from None
    records: dict[str, dict[str, Any]] = {}
    for row in rows:
        if (done := _finished(root / kind / row["key"])) is not None:
            records[row["key"]] = done
            if advance:
                advance(done["items"])
    todo = [row for row in rows if row["key"] not in records]
    if todo:
        context = ray.data.DataContext.get_current()
        # The run's own progress bar counts the items; Ray Data's bars and banners would print
        # over it.
        context.enable_progress_bars = context.print_on_execution_start = False
        # Ray Data's usage telemetry asks a Prometheus server at localhost:9090 after each
        # execution (timeouts where none runs) and reports usage: neither for an offline tool.
        os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")
        workers = min(len(todo), raw.ray.workers or max(1, len([n for n in ray.nodes() if n.get("Alive")])))
        # Each actor's share of every server's concurrency and rate limits, as --ray splits them.
        chats = [c.model_dump_json() for c in shares(raw.embedding if kind == "embed" else raw.chat, workers)
                 if c is not None]
        # On the driver's node: an actor restarted after its node died must still find it (on
        # the node that died, it would die with the actors it numbers).
        here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False)
        slots = ray.remote(num_cpus=0)(_Slots).options(scheduling_strategy=here).remote()
        # A spending budget is the run's: each actor's client counts what the others spent, as
        # the ledger last told it, from what the run had spent when the step began.
        ledger = None
        if kind != "embed" and (raw.chat.budget_tokens or raw.chat.budget_cost):
            spent = (usage.chat_tokens(), usage.cost()) if usage is not None else (0, 0.0)
            ledger = ray.remote(num_cpus=0)(_Ledger).options(scheduling_strategy=here).remote(*spent)
        # The items go by reference: each partition's written where the workers read it, the
        # dataset holding only paths, so the driver keeps no second copy of every text. A folder
        # per run: two runs on one data_path may share a partition, and neither may remove the
        # other's file.
        inputs = _inputs_folder(root / "inputs", kind)
        # Here, before any actor starts, so that one that cannot write there does not die in its
        # constructor; the same file is each actor's test that its node shares the folder.
        token = uuid.uuid4().hex
        try:
            inputs.mkdir(parents=True)
            (inputs / PROBE).write_text(token)
        except OSError as exc:
            shutil.rmtree(inputs, ignore_errors=True)
            raise _unusable(root, exc) from None
        paths = [_write_input(inputs, row) for row in todo]
        ds = ray.data.from_items([{"input": str(path)} for path in paths], override_num_blocks=len(todo))
        # num_cpus=0: an actor mostly waits on servers. (Ray Data spreads actors over the nodes
        # by default, best effort.)
        out = ds.map_batches(Worker, batch_size=1, batch_format="pandas", num_cpus=0,
                             compute=ray.data.ActorPoolStrategy(
                                 size=len(chats), max_concurrent_calls_per_actor=PARTITIONS_PER_ACTOR,
                                 max_tasks_in_flight_per_actor=PARTITIONS_PER_ACTOR),
                             fn_constructor_kwargs={"kind": kind, "settings_json": raw.model_dump_json(),
                                                    "chats": chats, "slots": slots, "language": language,
                                                    "prompts": prompts, "root": str(root),
                                                    "probe": (str(inputs / PROBE), token), "ledger": ledger,
                                                    "tables": tables})
        with _quiet("ray.data"):
            try:
                for row in out.iter_rows():
                    record = json.loads(row["record"])
                    if "blind" in record:
                        raise _NotShared(record["blind"])
                    _record(record, row["key"], records, advance, usage)
            except _NotShared as exc:
                raise RayUnavailable(
                    f"ray.data_path {root} is not shared: the node at {exc} cannot see the files this driver "
                    "writes there. Give a folder every node reads and writes at the same path (a shared "
                    "filesystem mount on a cluster)") from None
            except Exception as exc:  # noqa: BLE001 - Ray's errors carry the workers' whole tracebacks
                # Finished partitions are on disk: a rerun starts from them.
                raise RayUnavailable(f"the Ray Data workers stopped ({kind}): {one_line(exc)}; finished partitions "
                                     f"are kept in {root}, a rerun continues from them") from None
            finally:
                ray.kill(slots)
                if ledger is not None:
                    ray.kill(ledger)
                shutil.rmtree(inputs, ignore_errors=True)
    return records, len(rows) - len(todo)


class _NotShared(Exception):
    """An actor's node does not see the driver's files under data_path (its address)."""


def _unusable(root: Path, exc: OSError) -> RayUnavailable:
    return RayUnavailable(f"ray.data_path {root} cannot be used here ({exc.strerror or exc}): give a folder "
                          "that every node can read and write (a shared filesystem on a cluster)")


def _sees(path: str, token: str) -> bool:
    """On a worker's node: whether the driver's probe file is there, as written."""
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


def _driver_mark() -> str:
    """This process as a folder name can say it: host, PID namespace and PID. (A PID alone
    names no process on a shared filesystem, nor across containers of one host.)"""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux: a run's folders are then never taken for a dead driver's
        namespace = 0
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in socket.gethostname())
    return f"{host}~{namespace}~{os.getpid()}"


def _inputs_folder(parent: Path, kind: str) -> Path:
    """A new folder for one step's inputs, named after the driver that writes it. Folders a
    driver of this host and PID namespace left behind when it was killed (its PID no longer
    runs) are removed first; any other is left alone, since its driver may still be running."""
    mark = _driver_mark()
    host, namespace, _ = mark.split("~")
    if namespace != "0" and parent.is_dir():
        for folder in parent.iterdir():
            parts = folder.name.split("~")
            if len(parts) != 5 or parts[1:3] != [host, namespace] or not parts[3].isdigit():
                continue
            try:
                os.kill(int(parts[3]), 0)
            except ProcessLookupError:
                shutil.rmtree(folder, ignore_errors=True)
            except OSError:  # alive, another user's
                continue
    return parent / f"{kind}~{mark}~{uuid.uuid4().hex[:12]}"


def _write_input(folder: Path, row: dict[str, Any]) -> Path:
    """A partition's items (the row _run was given) as one parquet row for its worker to read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{row['key']}.parquet"
    scratch = path.with_name(f"{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist([row]), scratch)
    os.replace(scratch, path)  # a worker never reads half a file
    return path


def _read_input(path: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()[0]


def _record(record: dict[str, Any], key: str, records: dict[str, dict[str, Any]],
            advance: Callable[[int], None] | None, usage: Usage | None) -> None:
    """A finished partition as it arrives: kept, counted on the progress bar, its usage added."""
    records[key] = record
    if advance:
        advance(record["items"])
    if usage is not None:
        for step, figures in record["usage"].items():
            usage.step(step).add(StepUsage(**figures))
            if record.get("chat", True):
                usage.chat_prompt_tokens += figures["prompt_tokens"]
                usage.chat_completion_tokens += figures["completion_tokens"]


_QUIET = threading.Lock()
_quieted: dict[str, tuple[int, int]] = {}  # logger -> (runs quieting it, its level before the first)


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """A library logger at ERROR while any run needs it so: Ray Data logs each execution's start,
    end and settings at INFO/WARNING, which would print over the run's own progress bar. (Runs
    overlap: the embeddings' pipeline runs beside extraction's; the last one out restores it.)"""
    logger = logging.getLogger(name)
    with _QUIET:
        runs, before = _quieted.get(name, (0, logger.level))
        _quieted[name] = (runs + 1, before)
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        with _QUIET:
            runs, before = _quieted.pop(name)
            if runs > 1:
                _quieted[name] = (runs - 1, before)
            else:
                logger.setLevel(before)


def _merged(root: Path, keys: list[str], records: dict[str, dict[str, Any]]) -> extract.ExtractionResult:
    """The partitions `keys` of `root` (the extraction's folder) as one extraction's result."""
    tables = {n: read_parts([root / k for k in keys], n) for n in INSTANCES}
    stats: dict[str, int] = {}
    for k in keys:
        for name, value in records[k]["stats"].items():
            stats[name] = stats.get(name, 0) + value
    return extract.ExtractionResult(
        entities=tables["entity_instances"], relationships=tables["relationship_instances"],
        claims=tables["claim_instances"], failed=[u for k in keys for u in records[k]["failed"]],
        self_loops=sum(records[k]["self_loops"] for k in keys),
        empty_names=sum(records[k]["empty_names"] for k in keys), stats=stats)


def _raw_settings(settings: Any) -> Settings:
    """The Settings behind a step's settings recorder (the workers need the model itself)."""
    return settings._model if hasattr(settings, "reads") else settings
