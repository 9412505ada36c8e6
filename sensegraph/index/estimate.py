"""`sensegraph index --dry-run`: how many calls and tokens a run would spend, calling nothing.

Extraction prompts are counted exactly from the text units and the prompts. Later steps depend
on what extraction finds, so they are estimated from ratios measured on real indexes, one set
for small local models and one for hosted GPT-4-class models (see RATIOS), and labelled so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..config import Settings, load_settings
from ..language import resolve_language
from ..prompts import load_prompt
from ..tokens import count_tokens
from . import documents, text_units

# What extraction finds decides the cost of every later step, and it depends on the model more
# than on the text: a small local model writes ~2 completion tokens of JSON per input token,
# never asks for a gleaning round, and leaves most entities in communities of one (which cost
# no call). So the ratios are kept per model class, each measured on real indexes made from an
# empty cache (bench/estimate_accuracy.py prints them for finished runs). The estimate uses
# their mean; the runs' spread is printed beside it, because the same model on the same text
# finds a different graph each run (on operation-dulce.txt: 33 to 40 summary calls, 7 to 16
# reports).
RATIO_KEYS = (
    "entities_per_unit", "relationships_per_unit",
    "summaries_per_element",  # summarise calls / merged entities + relationships
    "glean_yes_share",  # share of gleaning checks answered "something was missed"
    "reports_per_entity",  # LLM-written reports (single-entity communities cost no call)
    "report_context_tokens", "report_completion", "summary_completion",
    "completion_per_input_token",  # extraction answer tokens per text-unit token, past a 50-token frame
)
_RUNS = {  # one row per measured index, values in the order of RATIO_KEYS
    "local": {  # sensegraph + Qwen2.5-1.5B on the embedded server, 10 units of ~480-570 tokens each
        "operation-dulce.txt, 2 slots": (12.1, 8.9, 0.19, 0.0, 0.083, 629, 451, 52, 1.973),
        "operation-dulce.txt, 2 slots, code of 77a3a84": (10.7, 9.9, 0.18, 0.0, 0.112, 699, 350, 55, 1.896),
        "operation-dulce.txt, 4 slots": (13.3, 9.0, 0.148, 0.0, 0.12, 469, 327, 59, 1.832),
        "operation-dulce.txt, 1 slot": (14.2, 10.5, 0.162, 0.0, 0.049, 803, 356, 52, 2.405),
        "christmas-carol.txt stave one, 10 documents": (13.5, 9.5, 0.087, 0.0, 0.022, 141, 241, 58, 1.987),
    },
    "hosted": {  # Microsoft GraphRAG + GPT-4-class, 42 units of ~1,200 tokens
        "christmas-carol.txt, Microsoft's published index": (12.6, 23.3, 0.105, 0.3, 0.23, 2000, 900, 120, 0.8),
    },
}
MEASURED: dict[str, dict[str, dict[str, float]]] = {
    kind: {name: dict(zip(RATIO_KEYS, row, strict=True)) for name, row in runs.items()} for kind, runs in _RUNS.items()}
RATIOS = {kind: {k: sum(r[k] for r in runs.values()) / len(runs) for k in RATIO_KEYS}
          for kind, runs in MEASURED.items()}
DESCRIPTIONS_PER_SUMMARY = 3  # descriptions folded into one summary call, ~40 tokens each


@dataclass
class StepEstimate:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    exact: bool = False


@dataclass
class Estimate:
    documents: int = 0
    text_units: int = 0
    tokens: int = 0
    steps: dict[str, StepEstimate] = field(default_factory=dict)
    # The lowest and highest totals had the corpus behaved like each measured index (None with one)
    spread: tuple[StepEstimate, StepEstimate] | None = None
    basis: str = ""

    def total(self) -> StepEstimate:
        t = StepEstimate()
        for s in self.steps.values():
            t.calls += s.calls
            t.prompt_tokens += s.prompt_tokens
            t.completion_tokens += s.completion_tokens
        return t


@dataclass
class _Sizes:
    """Token counts of the prompts, counted once and reused for every set of ratios."""
    extract: int
    glean: int
    summarize: int
    report: int


def estimate_index(settings: Settings, ratios: dict[str, float] | None = None) -> Estimate:
    """Calls and tokens of a full index of the project's input, with the measured ratios' mean
    (or the given ratios) and, for the mean, the spread over the measured indexes. For a lazy
    index, its NLP packages are checked first (ConceptError), before any document is read."""
    if settings.index_method == "lazy":
        from .concepts import check_nlp

        check_nlp(settings.language)
    docs = documents.load_documents(settings, warn=lambda m: None)
    units = text_units.make_text_units(docs, size=settings.chunks.size, overlap=settings.chunks.overlap)
    language = resolve_language(settings.language, docs["text"])
    sizes = _Sizes(
        extract=count_tokens(load_prompt("extract_graph", language, settings.root))
        + count_tokens(load_prompt("examples_graph", language, settings.root)),
        glean=count_tokens(load_prompt("glean_check", language, settings.root)),
        summarize=count_tokens(load_prompt("summarize_descriptions", language, settings.root)),
        report=count_tokens(load_prompt("community_report", language, settings.root)))
    kind = "local" if settings.chat.provider == "local" else "hosted"
    n_tokens = [int(n) for n in units["n_tokens"]]
    est = Estimate(len(docs), len(units), sum(n_tokens))
    if settings.index_method == "lazy":
        est.basis = "lazy index: no chat call (NLP concepts; the LLM works at query time)"
        return est
    est.steps = _steps(n_tokens, sizes, settings, ratios or RATIOS[kind])
    n = len(MEASURED[kind])
    est.basis = ("given ratios" if ratios is not None else
                 f"ratios, mean of {n} indexes" if n > 1 else "ratios of a measured index")
    if ratios is None and n > 1:
        totals = [Estimate(steps=_steps(n_tokens, sizes, settings, r)).total() for r in MEASURED[kind].values()]
        by_tokens = sorted(totals, key=lambda t: t.prompt_tokens + t.completion_tokens)
        est.spread = (StepEstimate(min(t.calls for t in totals), by_tokens[0].prompt_tokens, by_tokens[0].completion_tokens),
                      StepEstimate(max(t.calls for t in totals), by_tokens[-1].prompt_tokens, by_tokens[-1].completion_tokens))
    return est


def _steps(n_tokens: list[int], sizes: _Sizes, settings: Settings, r: dict[str, float]) -> dict[str, StepEstimate]:
    ex = settings.extraction
    calls = 0.0
    step = StepEstimate(exact=True)
    for n in n_tokens:
        completion = min(ex.max_tokens, int(n * r["completion_per_input_token"]) + 50)
        calls += 1
        step.prompt_tokens += sizes.extract + n
        step.completion_tokens += completion
        history = sizes.extract + n + completion
        go_on = 1.0  # share of units still gleaning in this round
        for _ in range(ex.max_gleanings):
            calls += go_on  # the yes/no check
            step.prompt_tokens += int(go_on * (history + sizes.glean))
            step.completion_tokens += int(go_on * 5)
            go_on *= r["glean_yes_share"]
            calls += go_on  # the continuation
            step.prompt_tokens += int(go_on * (history + sizes.glean))
            step.completion_tokens += int(go_on * completion / 2)
            history += sizes.glean + completion // 2
    step.calls = int(round(calls))
    steps = {"extract": step}
    if ex.claims:
        steps["claims"] = StepEstimate(len(n_tokens), step.prompt_tokens // max(1, 1 + ex.max_gleanings),
                                       step.completion_tokens // 2)
    n_entities = len(n_tokens) * r["entities_per_unit"]
    n_elements = n_entities + len(n_tokens) * r["relationships_per_unit"]
    summaries = int(round(n_elements * r["summaries_per_element"]))
    summary_prompt = sizes.summarize + DESCRIPTIONS_PER_SUMMARY * 40
    steps["summarize"] = StepEstimate(summaries, summaries * summary_prompt,
                                      int(summaries * min(r["summary_completion"], settings.summarize.max_tokens)))
    n_reports = max(1, int(round(n_entities * r["reports_per_entity"])))
    report_prompt = sizes.report + int(min(settings.report_input_tokens(), r["report_context_tokens"]))
    steps["community_reports"] = StepEstimate(
        n_reports, n_reports * report_prompt, int(n_reports * min(settings.reports.max_tokens, r["report_completion"])))
    return steps


def measured_ratios(root: str | Path) -> dict[str, float]:
    """The ratios of MEASURED, read from a project indexed from an empty cache (its stats.json and tables)."""
    settings = load_settings(root)
    out = settings.path(settings.output_dir)
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    steps = stats["steps"]
    for name in ("extract", "summarize", "community_reports"):
        if steps.get(name, {}).get("skipped"):
            raise ValueError(f"{out}/stats.json: step {name} was skipped in the last run; "
                             "the ratios need the stats of a run that did every step")
    units, tokens = steps["text_units"]["text_units"], steps["text_units"]["tokens"]
    ents = len(pd.read_parquet(out / "entities.parquet", columns=["id"]))
    rels = len(pd.read_parquet(out / "relationships.parquet", columns=["id"]))
    n = {k: steps[k].get("calls", 0) + steps[k].get("cache_hits", 0)
         for k in ("extract", "summarize", "community_reports")}
    # Exact for max_gleanings <= 1 (the default); with more rounds the later checks count as
    # continuations, which overstates the share a little.
    checks = units if settings.extraction.max_gleanings else 0
    continuations = max(0, n["extract"] - units - checks)
    language = stats.get("language") or "en"
    report_template = count_tokens(load_prompt("community_report", language, settings.root))
    reports = steps["community_reports"]
    return {
        "entities_per_unit": ents / units, "relationships_per_unit": rels / units,
        "summaries_per_element": n["summarize"] / max(1, ents + rels),
        "glean_yes_share": continuations / checks if checks else 0.0,
        "reports_per_entity": n["community_reports"] / max(1, ents),
        "report_context_tokens": max(0.0, reports["prompt_tokens"] / max(1, n["community_reports"]) - report_template),
        "report_completion": reports["completion_tokens"] / max(1, n["community_reports"]),
        "summary_completion": steps["summarize"]["completion_tokens"] / max(1, n["summarize"]),
        # as _steps counts them: 50 tokens of JSON frame per answer, ~5 per yes/no gleaning check
        "completion_per_input_token": max(0, steps["extract"]["completion_tokens"] - 5 * checks - 50 * units) / tokens,
    }

