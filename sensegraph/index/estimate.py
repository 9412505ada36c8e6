"""`sensegraph index --dry-run`: how many calls and tokens a run would spend, calling nothing.

Extraction prompts are counted exactly from the text units and the prompts. Later steps depend
on what extraction finds, so they are estimated from ratios measured on real indexes, one set
for small local models and one for hosted GPT-4-class models (see RATIOS), and labelled so.
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

# What extraction finds decides the cost of every later step, and it depends on the model more
# than on the text: a small local model finds about as many entities per text unit as GPT-4
# but half the relationships, never asks for a gleaning round, and leaves most entities in
# communities of one (which cost no call). So the ratios are kept per model class, each
# measured on a real index of a narrative text:
#   local:  sensegraph + Qwen2.5-1.5B on operation-dulce.txt (10 units of ~570 tokens)
#   hosted: Microsoft GraphRAG + GPT-4-class on A Christmas Carol (42 units of ~1,200 tokens)
# Extraction prompts are counted exactly; the rest is as good as these ratios.
RATIOS = {
    "local": {"entities_per_unit": 11.7, "relationships_per_unit": 9.7,
              "summaries_per_element": 0.117,  # summarise calls / merged entities+relationships
              "glean_yes_share": 0.0,  # share of gleaning checks answered "something was missed"
              "reports_per_entity": 0.094,  # LLM-written reports (not single-entity ones)
              "report_context_tokens": 550, "summary_completion": 60, "completion_per_input_token": 0.8},
    "hosted": {"entities_per_unit": 12.6, "relationships_per_unit": 23.3,
               "summaries_per_element": 0.105, "glean_yes_share": 0.3, "reports_per_entity": 0.23,
               "report_context_tokens": 2000, "summary_completion": 120, "completion_per_input_token": 0.8},
}
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
    r = RATIOS["local" if settings.chat.provider == "local" else "hosted"]
    step = StepEstimate()
    for n in units["n_tokens"]:
        completion = min(ex.max_tokens, int(n * r["completion_per_input_token"]) + 50)
        step.calls += 1
        step.prompt_tokens += base + n
        step.completion_tokens += completion
        history = base + n + completion
        go_on = 1.0  # share of units still gleaning in this round
        for _ in range(ex.max_gleanings):
            step.calls += go_on  # the yes/no check
            step.prompt_tokens += int(go_on * (history + glean_prompt))
            step.completion_tokens += int(go_on * 5)
            go_on *= r["glean_yes_share"]
            step.calls += go_on  # the continuation
            step.prompt_tokens += int(go_on * (history + glean_prompt))
            step.completion_tokens += int(go_on * completion / 2)
            history += glean_prompt + completion // 2
    step.calls = int(round(step.calls))
    est.steps["extract"] = step
    if ex.claims:
        est.steps["claims"] = StepEstimate(len(units), step.prompt_tokens // max(1, 1 + ex.max_gleanings),
                                           step.completion_tokens // 2)
    n_entities = len(units) * r["entities_per_unit"]
    n_elements = n_entities + len(units) * r["relationships_per_unit"]
    summaries = int(round(n_elements * r["summaries_per_element"]))
    summary_prompt = count_tokens(load_prompt("summarize_descriptions", language, settings.root)) + \
        DESCRIPTIONS_PER_SUMMARY * 40
    est.steps["summarize"] = StepEstimate(summaries, summaries * summary_prompt,
                                          summaries * min(r["summary_completion"], settings.summarize.max_tokens))
    n_reports = max(1, int(round(n_entities * r["reports_per_entity"])))
    report_prompt = count_tokens(load_prompt("community_report", language, settings.root)) + \
        min(settings.report_input_tokens(), r["report_context_tokens"])
    est.steps["community_reports"] = StepEstimate(n_reports, n_reports * report_prompt,
                                                  n_reports * min(settings.reports.max_tokens, 900))
    est.steps["extract"].exact = True
    return est


def print_estimate(est: Estimate, settings: Settings, console: Console) -> None:
    table = Table(title=f"Dry run: {est.documents} documents, {est.text_units} text units, {est.tokens:,} tokens")
    for col in ("step", "calls", "prompt tokens", "completion tokens", "basis"):
        table.add_column(col, justify="right" if col not in ("step", "basis") else "left")
    for name, s in est.steps.items():
        table.add_row(name, f"{s.calls:,}", f"{s.prompt_tokens:,}", f"{s.completion_tokens:,}",
                      "text units × prompts" if s.exact else "ratios from a measured index")
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
