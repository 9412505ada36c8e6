"""Claim-based metrics (paper section 3.4 / appendix): comprehensiveness = number of distinct
atomic factual claims in an answer; diversity = number of clusters those claims form under
agglomerative clustering with complete linkage on the distance 1 - ROUGE-L F1, at several
distance thresholds.

Extraction follows the Claimify recipe in one structured call per answer: the answer is split
into numbered sentences (citations removed), the model selects the sentences with verifiable
content and decomposes them into simple, self-contained claims. Claims are then deduplicated
per answer (same words after normalisation, or ROUGE-L F1 >= DUPLICATE).
"""
from __future__ import annotations

import asyncio
import functools
import re
import time
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ..language import detect_language
from ..llm.client import ChatClient, LLMError
from ..prompts import load_prompt, render, to_messages
from .store import Bar, EvalStore, no_bar, usage_totals

THRESHOLDS = (0.5, 0.6, 0.7, 0.8)
DUPLICATE = 0.9  # ROUGE-L F1 at or above which two claims of one answer count as one
MAX_CLAIMS = 80
ROUNDING = 1e-9  # far below the smallest gap between two ROUGE-L distances of short claims

_CITATION = re.compile(r"\[(?:Data|数据)[:：][^\]]*\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9*•-])|(?<=[。！？；])|\n+")
_HAN = re.compile(r"[\u4e00-\u9fff]")


class Extracted(BaseModel):
    selected: list[int]  # numbers of the sentences with verifiable content
    # maxItems guides the model; a longer list from a server without schema support is cut.
    claims: list[str] = Field(json_schema_extra={"maxItems": MAX_CLAIMS})


def sentences(answer: str) -> list[str]:
    """The answer's sentences without citations, headings marks or list bullets."""
    text = re.sub(r"[ \t]+([.,;:!?])", r"\1", _CITATION.sub("", answer))
    out = []
    for s in _SENTENCE_END.split(text):
        s = re.sub(r"^\s*(?:#+|[-*•]|\d+[.)])\s*", "", s or "").strip(" *_")
        if len(s) > 3:
            out.append(s)
    return out


class _Tokenizer:
    """rouge-score's default tokenizer keeps only [a-z0-9]; Chinese claims would be empty.
    Han characters count as one token each, other text as the default lowercase words."""

    def tokenize(self, text: str) -> list[str]:
        from rouge_score import tokenize

        if _HAN.search(text):
            return re.findall(r"[\u4e00-\u9fff]|[a-z0-9]+", text.lower())
        return tokenize.tokenize(text, None)


@functools.lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Tokenizer())


def rouge_l(a: str, b: str) -> float:
    return _scorer().score(a, b)["rougeL"].fmeasure


def distance_matrix(claims: list[str]) -> np.ndarray:
    """1 - ROUGE-L F1 between every two claims (symmetric, zero diagonal)."""
    n = len(claims)
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            d[i, j] = d[j, i] = 1.0 - rouge_l(claims[i], claims[j])
    return d


def _normal(claim: str) -> str:
    return " ".join(re.findall(r"\w+", claim.casefold()))


def deduplicate(claims: list[str], threshold: float = DUPLICATE) -> list[str]:
    """Claims in order, dropping any that repeats an earlier one (normalised words equal, or
    ROUGE-L F1 >= threshold)."""
    kept: list[str] = []
    seen: set[str] = set()
    for c in claims:
        norm = _normal(c)
        if not norm or norm in seen:
            continue
        if any(rouge_l(c, k) >= threshold for k in kept):
            continue
        seen.add(norm)
        kept.append(c.strip())
    return kept


def cluster_counts(claims: list[str], thresholds: tuple[float, ...] = THRESHOLDS) -> dict[float, int]:
    """Number of clusters at each distance threshold: agglomerative, complete linkage on
    1 - ROUGE-L; two groups merge while their complete-linkage distance is at most the
    threshold, as the paper defines it (distance <= t)."""
    if len(claims) < 2:
        return {t: len(claims) for t in thresholds}
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    z = linkage(squareform(distance_matrix(claims), checks=False), method="complete")
    # fcluster merges at distance <= t. A distance is 1 - a ratio of small token counts in
    # floating point (1 - 0.7 is 0.30000000000000004), so a pair exactly at t mathematically may
    # land a hair above it: allow for that rounding.
    return {t: int(len(set(fcluster(z, t + ROUNDING, criterion="distance")))) for t in thresholds}


def extraction_messages(question: str, answer: str, root: str | None = None) -> tuple[list[dict[str, str]], list[str]]:
    sents = sentences(answer)
    numbered = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(sents))
    language = detect_language([answer or question])
    prompt = render(load_prompt("eval_claims", language, root), question=question, sentences=numbered)
    return to_messages(prompt), sents


async def run_claims(llm: ChatClient, store: EvalStore, conditions: list[str], *, limit: int | None = None,
                     thresholds: tuple[float, ...] = THRESHOLDS, max_tokens: int = 1500, root: str | None = None,
                     bar: Bar = no_bar, dry_run: bool = False, log=lambda m: None) -> dict[str, Any]:
    """Extract, deduplicate and cluster the claims of every stored answer not done yet."""
    started = time.monotonic()
    questions = store.questions(limit)
    answers = store.done("answers")
    done = store.done("claims")
    todo = [(q, c) for q in questions for c in conditions
            if (q["id"], c) in answers and (q["id"], c) not in done]
    estimate = {"answers": len(todo), "llm_calls_estimate": len(todo)}
    if dry_run:
        return {"estimate": estimate}
    log(f"extracting claims from {len(todo)} answers")
    advance = bar("claims", len(todo))
    failures: list[str] = []

    async def one(q: dict, c: str) -> None:
        row = {"question_id": q["id"], "condition": c}
        messages, sents = extraction_messages(q["question"], answers[(q["id"], c)]["answer"], root)
        try:
            if not sents:
                raw: list[str] = []
                selected: list[int] = []
            else:
                reply = await llm.structured(messages, Extracted, step="eval_claims", item=f"{q['id']} {c}",
                                             max_tokens=max_tokens)
                raw, selected = reply.claims[:MAX_CLAIMS], [i for i in reply.selected if 1 <= i <= len(sents)]
        except LLMError as exc:
            failures.append(str(exc))
            store.append("claims", {**row, "error": str(exc)})
            advance()
            return
        # ROUGE on up to MAX_CLAIMS^2 pairs is CPU work; keep the event loop free for the LLM calls.
        claims = await asyncio.to_thread(deduplicate, raw)
        counts = await asyncio.to_thread(cluster_counts, claims, thresholds)
        store.append("claims", {**row, "sentences": len(sents), "selected": selected, "raw_claims": len(raw),
                                "claims": claims, "n_claims": len(claims),
                                "clusters": {str(t): n for t, n in counts.items()}})
        advance()

    await asyncio.gather(*(one(q, c) for q, c in todo))
    run = store.record_run("claims", started, usage_totals(llm.usage), items=len(todo), failures=failures)
    return {"estimate": estimate, "run": run}


def claim_winner(x: float, y: float, a: str, b: str) -> str:
    return a if x > y else b if y > x else "tie"


def agreement(claim_rows: list[dict[str, Any]], majority: dict[tuple, str],
              thresholds: tuple[float, ...] = THRESHOLDS) -> list[dict[str, Any]]:
    """How often the claim-based winner of a pair equals the judge's majority label, ties on
    either side excluded (as in the paper): comprehensiveness vs claim counts, diversity vs
    cluster counts at each threshold."""
    by = {(r["question_id"], r["condition"]): r for r in claim_rows}
    metrics = [("comprehensiveness", "claims", lambda r: r["n_claims"])]
    metrics += [("diversity", f"clusters@{t:g}", lambda r, t=t: r["clusters"][str(t)]) for t in thresholds]
    out = []
    for criterion, metric, value in metrics:
        agree = total = 0
        for (qid, a, b, crit), label in majority.items():
            if crit != criterion or label == "tie" or (qid, a) not in by or (qid, b) not in by:
                continue
            w = claim_winner(value(by[(qid, a)]), value(by[(qid, b)]), a, b)
            if w == "tie":
                continue
            total += 1
            agree += w == label
        out.append({"criterion": criterion, "metric": metric, "agree": agree, "compared": total,
                    "agreement": agree / total if total else float("nan")})
    return out
