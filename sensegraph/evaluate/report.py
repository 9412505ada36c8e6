"""The evaluation report: Markdown, PNG figures and a JSON of every number, computed from the
stored JSONL files only (no LLM call), so it can be rebuilt at any time for free.

Figures follow the paper's Figure 2: one heatmap per criterion, cell = win rate (%) of the
row condition over the column condition; the diagonal is shown as the expected 50.
Tables follow its Tables 3-4: mean number of claims, and mean number of claim clusters per
distance threshold, per condition.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .answers import answered_conditions
from .claims import THRESHOLDS, agreement
from .judge import CRITERIA, judgements_frame, majority_labels, position_bias, win_rates
from .store import EvalStore

ALPHA = 0.05


def compute(store: EvalStore, conditions: list[str] | None = None) -> dict[str, Any]:
    """Every number of the report, from the stored results."""
    conditions = conditions or answered_conditions(store)
    questions = store.rows("questions")
    answers = store.done("answers")
    jdf = judgements_frame(list(store.done("judgements").values()))
    jdf = jdf[jdf["a"].isin(conditions) & jdf["b"].isin(conditions)] if len(jdf) else jdf
    claim_rows = list(store.done("claims").values())
    out: dict[str, Any] = {"questions": len(questions), "conditions": conditions}

    per_cond = []
    for c in conditions:
        rows = [r for (q, cc), r in answers.items() if cc == c]
        if not rows:
            continue
        per_cond.append({
            "condition": c, "answers": len(rows),
            "context_tokens": float(np.mean([r.get("context_tokens", 0) for r in rows])),
            "context_units": float(np.mean([r.get("context_units", 0) for r in rows])),
            "llm_calls": float(np.mean([(r.get("usage") or {}).get("calls", 0) + (r.get("usage") or {}).get("cache_hits", 0)
                                        for r in rows])),
            "answer_words": float(np.mean([len(str(r.get("answer", "")).split()) for r in rows])),
        })
    out["answers"] = per_cond

    criteria = [c for c in CRITERIA if len(jdf) and c in set(jdf["criterion"])]
    out["criteria"] = criteria
    out["repeats"] = int(jdf["repeat"].max() + 1) if len(jdf) else 0
    out["judgements"] = len(jdf)
    out["win_rates"] = {}
    out["holm_tests"] = {}  # per criterion: the number of pairs the Holm correction ran over
    for crit in criteria:
        m = win_rates(jdf, crit, conditions)
        out["win_rates"][crit] = {k: _matrix(m[k]) for k in ("rate", "p", "p_raw", "n")}
        out["holm_tests"][crit] = len(m["tests"])
    out["position_bias"] = position_bias(jdf).to_dict("records")

    if claim_rows:
        table3, table4 = [], []
        for c in conditions:
            rows = [r for r in claim_rows if r["condition"] == c]
            if not rows:
                continue
            n = np.array([r["n_claims"] for r in rows], dtype=float)
            table3.append({"condition": c, "answers": len(rows), "mean_claims": float(n.mean()),
                           "sd": float(n.std(ddof=1)) if len(n) > 1 else 0.0})
            thresholds = sorted({float(t) for r in rows for t in r["clusters"]})
            table4.append({"condition": c, **{f"{t:g}": float(np.mean([r["clusters"][str(t)] for r in rows
                                                                         if str(t) in r["clusters"]]))
                                              for t in thresholds}})
        out["claims"] = table3
        out["clusters"] = table4
        thresholds = tuple(sorted({float(t) for r in claim_rows for t in r["clusters"]})) or THRESHOLDS
        out["agreement"] = agreement(claim_rows, majority_labels(jdf), thresholds) if len(jdf) else []

    runs = store.rows("runs")
    made = [r for r in runs if r["step"] == "questions"]
    out["question_problems"] = made[-1].get("failures", []) if made else []
    cost: dict[str, dict[str, float]] = {}
    for r in runs:
        s = cost.setdefault(r["step"], {"runs": 0, "seconds": 0.0, "calls": 0, "cache_hits": 0,
                                        "prompt_tokens": 0, "completion_tokens": 0})
        s["runs"] += 1
        for k in ("seconds", "calls", "cache_hits", "prompt_tokens", "completion_tokens"):
            s[k] += r.get(k, 0) or 0
    out["cost"] = cost
    out["failures"] = {kind: [_failure(kind, r) for r in store.errors(kind)]
                       for kind in ("answers", "judgements", "claims")}
    return out


def _failure(kind: str, r: dict) -> str:
    if kind == "judgements":
        what = f"{r['question_id']} {r['a']}-vs-{r['b']} {r['criterion']} r{r.get('repeat', 0) + 1}"
    else:
        what = f"{r['question_id']} {r['condition']}"
    return f"{what}: {r['error']}"


def _pairs(tests: dict[str, int]) -> str:
    """The pairs a Holm correction ran over, e.g. "the 3 pairs" ("the pairs" when criteria differ)."""
    counts = set(tests.values())
    if len(counts) != 1:
        return "the pairs"
    n = counts.pop()
    return f"the {n} pair{'s' * (n != 1)}"


def _matrix(df: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    return {str(r): {str(c): (None if pd.isna(v) else float(v)) for c, v in row.items()} for r, row in df.iterrows()}


def _frame(m: dict[str, dict[str, float | None]]) -> pd.DataFrame:
    return pd.DataFrame(m).T.astype(float)


# -- figures -------------------------------------------------------------------------------------
def heatmaps(results: dict[str, Any], folder: Path) -> list[Path]:
    """winrates.png (all criteria side by side, as Figure 2) and one PNG per criterion."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    criteria = results["criteria"]
    if not criteria:
        return []
    written = []

    def draw(ax, crit: str) -> None:
        rate = _frame(results["win_rates"][crit]["rate"]) * 100
        p = _frame(results["win_rates"][crit]["p"])
        shown = rate.copy()
        for c in shown.index:
            shown.loc[c, c] = 50.0  # self-comparison: the expected 50%, as in the paper
        ax.imshow(shown.to_numpy(), cmap="RdYlGn", vmin=0, vmax=100)
        labels = list(shown.index)
        ax.set_xticks(range(len(labels)), labels, rotation=45 if max(map(len, labels)) > 4 else 0)
        ax.set_yticks(range(len(labels)), labels)
        for i, r in enumerate(labels):
            for j, c in enumerate(labels):
                v = shown.loc[r, c]
                if math.isnan(v):
                    continue
                star = "*" if i != j and not math.isnan(p.loc[r, c]) and p.loc[r, c] < ALPHA else ""
                ax.text(j, i, f"{v:.0f}{star}", ha="center", va="center", fontsize=9,
                        fontweight="bold" if star else "normal")
        ax.set_title(crit.capitalize())

    fig, axes = plt.subplots(1, len(criteria), figsize=(3.2 * len(criteria) + 0.5, 3.6), squeeze=False)
    for ax, crit in zip(axes[0], criteria):
        draw(ax, crit)
    fig.suptitle(f"Win rate (%) of row over column; * Holm-adjusted p < {ALPHA}", fontsize=10)
    fig.tight_layout()
    path = folder / "winrates.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    written.append(path)
    for crit in criteria:
        fig, ax = plt.subplots(figsize=(4, 3.6))
        draw(ax, crit)
        fig.tight_layout()
        path = folder / f"winrate_{crit}.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        written.append(path)
    return written


def claim_figure(results: dict[str, Any], folder: Path) -> list[Path]:
    """claims.png: mean claims per condition (Table 3) and mean clusters per threshold (Table 4)."""
    if not results.get("claims"):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    names = [c["condition"] for c in results["claims"]]
    left.bar(names, [c["mean_claims"] for c in results["claims"]], color="#4c72b0")
    left.set_title("Comprehensiveness: mean claims")
    for row in results["clusters"]:
        ts = [k for k in row if k != "condition"]
        right.plot([float(t) for t in ts], [row[t] for t in ts], marker="o", label=row["condition"])
    right.set_title("Diversity: mean clusters")
    right.set_xlabel("distance threshold (1 − ROUGE-L)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "claims.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return [path]


# -- markdown ------------------------------------------------------------------------------------
def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "–" if math.isnan(v) else f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(results: dict[str, Any], figures: list[Path], folder: Path, name: str) -> str:
    conds = results["conditions"]
    out = [f"# Evaluation `{name}`", "",
           f"{results['questions']} questions · conditions: {', '.join(conds)} · "
           f"{results['judgements']} judgements ({results['repeats']} "
           f"repeat{'s' * (results['repeats'] != 1)} per comparison)", ""]
    for problem in results.get("question_problems", []):
        out += [f"- question generation: {problem}"]
    if results.get("question_problems"):
        out.append("")
    if results["answers"]:
        out += ["## Answers", "", _md_table(
            ["condition", "answers", "context tokens (mean)", "context units (mean)", "LLM calls / answer", "answer words"],
            [[a["condition"], a["answers"], a["context_tokens"], a["context_units"], a["llm_calls"], a["answer_words"]]
             for a in results["answers"]]), ""]
    if results["criteria"]:
        out += ["## Win rates (LLM judge)", "",
                "Cell = how often the row condition beat the column condition (%), ties counted as half, "
                "mean over repeats then over questions. `*` = significant after Holm correction over "
                f"{_pairs(results['holm_tests'])} of each criterion (Wilcoxon signed-rank on per-question "
                f"scores, p < {ALPHA}).", ""]
        for f in figures[:1]:
            out += [f"![win rates]({f.relative_to(folder).as_posix()})", ""]
        for crit in results["criteria"]:
            rate = _frame(results["win_rates"][crit]["rate"]) * 100
            p = _frame(results["win_rates"][crit]["p"])
            rows = []
            for r in conds:
                row: list[Any] = [f"**{r}**"]
                for c in conds:
                    v = rate.loc[r, c] if r in rate.index and c in rate.columns else float("nan")
                    if r == c or math.isnan(v):
                        row.append("–")
                    else:
                        row.append(f"{v:.0f}" + ("*" if p.loc[r, c] < ALPHA else "") + f" (p={p.loc[r, c]:.3g})")
                rows.append(row)
            out += [f"### {crit.capitalize()}", "", _md_table(["row beats column"] + conds, rows), ""]
    if results["position_bias"]:
        out += ["## Position bias", "",
                "Share of verdicts for the answer shown first, second, or a tie. An unbiased judge picks "
                "first and second equally often; on A/A (identical answers) it should say tie.", "",
                _md_table(["comparisons", "criterion", "first", "second", "tie", "n"],
                          [[b["kind"], b["criterion"], b["first"], b["second"], b["tie"], b["n"]]
                           for b in results["position_bias"]]), ""]
    if results.get("claims"):
        out += ["## Claim-based metrics", "", "![claims](figures/claims.png)", "", "### Comprehensiveness: mean number of distinct claims per answer", "",
                _md_table(["condition", "answers", "mean claims", "sd"],
                          [[c["condition"], c["answers"], c["mean_claims"], c["sd"]] for c in results["claims"]]), ""]
        keys = [k for k in results["clusters"][0] if k != "condition"] if results["clusters"] else []
        out += ["### Diversity: mean number of claim clusters per distance threshold", "",
                "Agglomerative clustering, complete linkage, distance 1 − ROUGE-L F1.", "",
                _md_table(["condition"] + [f"t={k}" for k in keys],
                          [[c["condition"]] + [c[k] for k in keys] for c in results["clusters"]]), ""]
        if results.get("agreement"):
            out += ["### Agreement with the judge", "",
                    "How often the claim-based winner of a pair equals the judge's majority label "
                    "(pairs where either is a tie are excluded).", "",
                    _md_table(["criterion", "claim metric", "agree", "compared", "agreement"],
                              [[a["criterion"], a["metric"], a["agree"], a["compared"], a["agreement"]]
                               for a in results["agreement"]]), ""]
    if results["cost"]:
        out += ["## Cost", "", _md_table(
            ["step", "runs", "wall time (s)", "LLM calls", "cache hits", "prompt tokens", "completion tokens"],
            [[k, v["runs"], v["seconds"], int(v["calls"]), int(v["cache_hits"]), int(v["prompt_tokens"]),
              int(v["completion_tokens"])] for k, v in results["cost"].items()]), ""]
    failed = {k: v for k, v in results["failures"].items() if v}
    if failed:
        out += ["## Failures (retried by the next run)", ""]
        for kind, items in failed.items():
            out += [f"- {kind}: {len(items)}"] + [f"  - {x}" for x in items[:20]]
        out.append("")
    return "\n".join(out)


def write_report(store: EvalStore, conditions: list[str] | None = None) -> dict[str, Any]:
    """report.md, results.json and figures/*.png in the evaluation folder; no LLM call."""
    results = compute(store, conditions)
    figures = heatmaps(results, store.figures) + claim_figure(results, store.figures)
    name = store.folder.name
    (store.folder / "report.md").write_text(markdown(results, figures, store.folder, name), encoding="utf-8")
    (store.folder / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str),
                                               encoding="utf-8")
    return {"report": store.folder / "report.md", "results": store.folder / "results.json",
            "figures": figures, "data": results}
