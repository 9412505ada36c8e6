"""`sensegraph index --dry-run`: how many calls and tokens a run would spend, calling nothing.

Extraction is counted exactly from the text units and the prompts. Later steps depend on what
extraction finds, so they are estimated from ratios (entities and relationships per text unit,
share of elements needing a summary, community size) and labelled as estimates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from ..config import Settings
from ..language import resolve_language
from ..prompts import load_prompt
from ..tokens import count_tokens
from . import documents, text_units

# Ratios seen on narrative corpora with GPT-4-class and small local models alike; rough.
ENTITIES_PER_UNIT = 8
RELATIONSHIPS_PER_UNIT = 7
SHARE_NEEDING_SUMMARY = 0.35
GLEAN_YES_SHARE = 0.5  # share of gleaning checks answered "yes, something was missed"
COMPLETION_PER_INPUT_TOKEN = 0.8


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

    def total(self) -> StepEstimate:
        t = StepEstimate()
        for s in self.steps.values():
            t.calls += s.calls
            t.prompt_tokens += s.prompt_tokens
            t.completion_tokens += s.completion_tokens
        return t


def estimate_index(settings: Settings) -> Estimate:
    docs = documents.load_documents(settings, warn=lambda m: None)
    units = text_units.make_text_units(docs, size=settings.chunks.size, overlap=settings.chunks.overlap)
    language = resolve_language(settings.language, docs["text"])
    est = Estimate(len(docs), len(units), int(units["n_tokens"].sum()))
    ex = settings.extraction
    base = count_tokens(load_prompt("extract_graph", language, settings.root)) + \
        count_tokens(load_prompt("examples_graph", language, settings.root))
    glean_prompt = count_tokens(load_prompt("glean_check", language, settings.root))
    step = StepEstimate()
    for n in units["n_tokens"]:
        completion = min(ex.max_tokens, int(n * COMPLETION_PER_INPUT_TOKEN) + 50)
        step.calls += 1
        step.prompt_tokens += base + n
        step.completion_tokens += completion
        history = base + n + completion
        for _ in range(ex.max_gleanings):
            step.calls += 1  # the yes/no check
            step.prompt_tokens += history + glean_prompt
            step.completion_tokens += 5
            step.calls += GLEAN_YES_SHARE
            step.prompt_tokens += int(GLEAN_YES_SHARE * (history + glean_prompt))
            step.completion_tokens += int(GLEAN_YES_SHARE * completion / 2)
            history += glean_prompt + completion // 2
    step.calls = int(round(step.calls))
    est.steps["extract"] = step
    if ex.claims:
        est.steps["claims"] = StepEstimate(len(units), step.prompt_tokens // max(1, 1 + ex.max_gleanings),
                                           step.completion_tokens // 2)
    n_elements = len(units) * (ENTITIES_PER_UNIT + RELATIONSHIPS_PER_UNIT)
    summaries = int(n_elements * SHARE_NEEDING_SUMMARY)
    est.steps["summarize"] = StepEstimate(summaries, summaries * 250, summaries * min(150, settings.summarize.max_tokens))
    n_entities = len(units) * ENTITIES_PER_UNIT
    n_communities = max(1, int(n_entities / max(2, settings.communities.max_cluster_size / 2) * 1.3))
    report_prompt = min(settings.reports.max_input_tokens, 2500)
    est.steps["community_reports"] = StepEstimate(n_communities, n_communities * report_prompt,
                                       n_communities * min(settings.reports.max_tokens, 900))
    est.steps["extract"].exact = True
    return est


def print_estimate(est: Estimate, settings: Settings, console: Console) -> None:
    table = Table(title=f"Dry run: {est.documents} documents, {est.text_units} text units, {est.tokens:,} tokens")
    for col in ("step", "calls", "prompt tokens", "completion tokens", "basis"):
        table.add_column(col, justify="right" if col not in ("step", "basis") else "left")
    for name, s in est.steps.items():
        table.add_row(name, f"{s.calls:,}", f"{s.prompt_tokens:,}", f"{s.completion_tokens:,}",
                      "text units × prompts" if s.exact else "estimate from typical ratios")
    t = est.total()
    table.add_row("total", f"{t.calls:,}", f"{t.prompt_tokens:,}", f"{t.completion_tokens:,}", "")
    console.print(table)
    c = settings.chat
    if c.price_per_1k_prompt or c.price_per_1k_completion:
        cost = (t.prompt_tokens * c.price_per_1k_prompt + t.completion_tokens * c.price_per_1k_completion) / 1000
        console.print(f"Estimated cost: {cost:.2f} (chat.price_per_1k_* in settings.yaml)")
    else:
        console.print("Set chat.price_per_1k_prompt and price_per_1k_completion to see a cost estimate.")
    console.print("Embeddings: one per text unit, entity and report (the local embedder costs nothing).")
