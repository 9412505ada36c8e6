"""Pairwise LLM-as-judge (paper section 3.3) and the win-rate matrices of its Figure 2.

For each question, each pair of conditions and each criterion, the judge reads the two answers
and names the better one or a tie, with its reasoning. Every comparison is repeated R times
with the answer order alternated (by question and by repeat, so R=1 is counterbalanced across
questions too); a repeat is a distinct request, so it is sampled anew and cached on its own.
A pair is unordered: it is judged and stored once, in canonical order, however the conditions
were named; the judge sees neither their names nor which answer came from which.

Scoring follows the paper: win = 1, tie = 0.5, loss = 0; a condition's score on a question is
the mean over repeats; the win rate of row over column is the mean over questions.
Significance: Wilcoxon signed-rank on the paired per-question scores, Holm-corrected over the
pairs of one criterion. A/A mode (a condition against itself, identical answers) measures
position bias: an unbiased judge says tie or picks each position equally often.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections import Counter
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel

from ..language import detect_language
from ..llm.client import ChatClient, LLMError
from ..prompts import load_prompt, render, to_messages
from .store import Bar, EvalStore, canonical_judgement, canonical_pair, no_bar, usage_totals

CRITERIA = ("comprehensiveness", "diversity", "empowerment", "directness")
# The paper's definitions (section 3.3); directness is the control: it should favour short,
# focused answers, the opposite of the other three.
DEFINITIONS = {
    "en": {
        "comprehensiveness": "How much detail does the answer provide to cover all aspects and details of the question?",
        "diversity": "How varied and rich is the answer in providing different perspectives and insights on the question?",
        "empowerment": "How well does the answer help the reader understand and make informed judgements about the topic?",
        "directness": "How specifically and clearly does the answer address the question?",
    },
    "zh": {
        "comprehensiveness": "答案提供了多少细节，能否涵盖问题的所有方面和细节？",
        "diversity": "答案在提供关于该问题的不同视角和见解方面有多丰富、多样？",
        "empowerment": "答案在多大程度上帮助读者理解该主题并做出有依据的判断？",
        "directness": "答案对问题的回应有多具体、多清楚？",
    },
}
NAMES = {"en": {c: c for c in CRITERIA},
         "zh": {"comprehensiveness": "全面性", "diversity": "多样性", "empowerment": "赋能性", "directness": "直接性"}}


class Verdict(BaseModel):
    reasoning: str
    winner: Literal["1", "2", "tie"]


def pairs_of(conditions: list[str], aa: bool = False) -> list[tuple[str, str]]:
    """Unordered pairs in the given order; A/A mode pairs each condition with itself."""
    if aa:
        return [(c, c) for c in conditions]
    return list(itertools.combinations(conditions, 2))


def comparison_tag(question_id: str, a: str, b: str, repeat: int) -> str:
    """What the judge is told about a comparison: opaque, so neither a condition's name nor a
    user's label can sway it, yet distinct per repeat so each repeat is its own request."""
    key = json.dumps([question_id, *canonical_pair(a, b), repeat], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def first_is_a(question_index: int, repeat: int) -> bool:
    """Counterbalancing: the answer order alternates with every repeat and every question."""
    return (question_index + repeat) % 2 == 0


def score_of(verdict: str, a_first: bool) -> float:
    """Score of condition a (1 win, 0.5 tie, 0 loss) from a verdict naming a position."""
    if verdict == "tie":
        return 0.5
    return 1.0 if (verdict == "1") == a_first else 0.0


def judge_messages(question: str, first: str, second: str, criterion: str, reference: str,
                   root: str | None = None) -> list[dict[str, str]]:
    language = detect_language([question])
    template = load_prompt("eval_judge", language, root)
    lang = language if language in DEFINITIONS else "en"
    return to_messages(render(template, criterion=NAMES[lang][criterion], definition=DEFINITIONS[lang][criterion],
                              question=question, answer_1=first, answer_2=second, reference=reference))


def estimate_judge_calls(n_questions: int, pairs: int, criteria: int, repeats: int) -> int:
    return n_questions * pairs * criteria * repeats


async def run_judge(llm: ChatClient, store: EvalStore, conditions: list[str], *, repeats: int = 5,
                    criteria: tuple[str, ...] = CRITERIA, aa: bool = False, limit: int | None = None,
                    temperature: float = 0.5, max_tokens: int = 400, root: str | None = None,
                    lanes: int | None = None, bar: Bar = no_bar, dry_run: bool = False,
                    log=lambda m: None) -> dict[str, Any]:
    """Judge every (question, pair, criterion, repeat) not stored yet; rows go to
    judgements.jsonl as they finish. Returns the estimate and the run summary.

    The prompt puts the question and both answers first and the criterion last, and the
    criteria of one (question, pair, repeat) are asked one after another in one lane: the
    server then reuses the cached prompt prefix (llama.cpp slots, OpenAI prompt caching), so
    the answers are read once per repeat instead of once per criterion. `lanes` is how many
    such groups run at once (the local server's slot count; None = as many as the client's
    concurrency allows)."""
    started = time.monotonic()
    questions = store.questions(limit)
    answers = store.done("answers")
    pairs = list(dict.fromkeys(canonical_pair(a, b) for a, b in pairs_of(list(dict.fromkeys(conditions)), aa)))
    done = store.done("judgements")
    todo, missing = [], set()
    for qi, q in enumerate(questions):
        for a, b in pairs:
            if (q["id"], a) not in answers or (q["id"], b) not in answers:
                missing |= {(q["id"], c) for c in (a, b) if (q["id"], c) not in answers}
                continue
            for crit in criteria:
                for r in range(repeats):
                    if (q["id"], a, b, crit, r) not in done:
                        todo.append((qi, q, a, b, crit, r))
    estimate = {"questions": len(questions), "pairs": len(pairs), "criteria": len(criteria), "repeats": repeats,
                "comparisons_total": estimate_judge_calls(len(questions), len(pairs), len(criteria), repeats),
                "llm_calls_estimate": len(todo), "answers_missing": len(missing)}
    if dry_run:
        return {"estimate": estimate}
    if missing:
        log(f"warning: {len(missing)} answers are missing (run `sensegraph eval answer`); their comparisons are skipped")
    log(f"judging {len(todo)} of {estimate['comparisons_total']} comparisons "
        f"({len(questions)} questions × {len(pairs)} pairs × {len(criteria)} criteria × {repeats} repeats)")
    advance = bar("judge", len(todo))
    failures: list[str] = []

    async def one(qi: int, q: dict, a: str, b: str, crit: str, r: int) -> None:
        a_first = first_is_a(qi, r)
        first, second = (a, b) if a_first else (b, a)
        item = f"{q['id']} {a}-vs-{b} {crit} r{r + 1}"  # for our logs and failure lists only
        row = {"question_id": q["id"], "a": a, "b": b, "criterion": crit, "repeat": r, "first": first,
               "a_first": a_first}
        messages = judge_messages(q["question"], answers[(q["id"], first)]["answer"],
                                  answers[(q["id"], second)]["answer"], crit,
                                  reference=comparison_tag(q["id"], a, b, r), root=root)
        try:
            v = await llm.structured(messages, Verdict, step="eval_judge", item=item, max_tokens=max_tokens,
                                     temperature=temperature)
        except LLMError as exc:
            failures.append(str(exc))
            store.append("judgements", {**row, "error": str(exc)})
        else:
            winner = "tie" if v.winner == "tie" else (first if v.winner == "1" else second)
            store.append("judgements", {**row, "verdict": v.winner, "winner": winner,
                                        "score_a": score_of(v.winner, a_first), "reasoning": v.reasoning})
        advance()

    groups: dict[tuple, list[tuple]] = {}
    for t in todo:
        groups.setdefault((t[0], t[2], t[3], t[5]), []).append(t)
    gate = asyncio.Semaphore(lanes or max(1, len(groups)))

    async def lane(items: list[tuple]) -> None:
        async with gate:
            for t in items:
                await one(*t)

    await asyncio.gather(*(lane(items) for items in groups.values()))
    run = store.record_run("judge", started, usage_totals(llm.usage), items=len(todo), failures=failures,
                           conditions=conditions, repeats=repeats, aa=aa)
    return {"estimate": estimate, "run": run}


# -- aggregation ---------------------------------------------------------------------------------
def judgements_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Successful judgements, one row each, every pair in canonical order (so a pair named in
    either order is one pair)."""
    cols = ["question_id", "a", "b", "criterion", "repeat", "first", "a_first", "verdict", "winner", "score_a"]
    df = pd.DataFrame([canonical_judgement(r) for r in rows], columns=cols)
    return df.dropna(subset=["score_a"]) if len(df) else df


def win_rates(df: pd.DataFrame, criterion: str, conditions: list[str]) -> dict[str, Any]:
    """Win-rate matrix (row over column, 0-1), Holm-corrected p-values and question counts for
    one criterion, and `tests`: the pairs the Holm correction ran over. Diagonal: NaN (A/A
    results are reported apart, as position bias). Each unordered pair is one test: the frame
    holds every pair in canonical order (judgements_frame)."""
    from scipy.stats import wilcoxon
    from statsmodels.stats.multitest import multipletests

    rate = pd.DataFrame(np.nan, index=conditions, columns=conditions)
    raw_p = pd.DataFrame(np.nan, index=conditions, columns=conditions)
    count = pd.DataFrame(0, index=conditions, columns=conditions)
    sub = df[(df["criterion"] == criterion) & (df["a"] != df["b"])]
    tests: list[tuple[str, str, float]] = []
    for (a, b), group in sub.groupby(["a", "b"], sort=False):
        if a not in conditions or b not in conditions:
            continue
        per_q = group.groupby("question_id")["score_a"].mean()  # mean over repeats
        rate.loc[a, b], rate.loc[b, a] = per_q.mean(), 1 - per_q.mean()
        count.loc[a, b] = count.loc[b, a] = len(per_q)
        diffs = 2 * per_q.to_numpy() - 1  # score_a - score_b per question
        p = 1.0 if not np.any(diffs) else float(wilcoxon(diffs).pvalue)
        tests.append((a, b, p))
    adjusted = pd.DataFrame(np.nan, index=conditions, columns=conditions)
    if tests:
        holm = multipletests([p for _, _, p in tests], method="holm")[1]
        for (a, b, p), h in zip(tests, holm):
            raw_p.loc[a, b] = raw_p.loc[b, a] = p
            adjusted.loc[a, b] = adjusted.loc[b, a] = h
    return {"rate": rate, "p": adjusted, "p_raw": raw_p, "n": count, "tests": [(a, b) for a, b, _ in tests]}


def position_bias(df: pd.DataFrame) -> pd.DataFrame:
    """Per criterion: how often the judge picked the first answer, the second, or a tie; split
    into A/A comparisons (identical answers) and real pairs."""
    if df.empty:
        return pd.DataFrame(columns=["kind", "criterion", "first", "second", "tie", "n"])
    d = df.assign(kind=np.where(df["a"] == df["b"], "A/A", "pairs"))
    out = []
    for (kind, crit), g in d.groupby(["kind", "criterion"]):
        c = Counter(g["verdict"])
        n = len(g)
        out.append({"kind": kind, "criterion": crit, "first": c["1"] / n, "second": c["2"] / n,
                    "tie": c["tie"] / n, "n": n})
    return pd.DataFrame(out)


def majority_labels(df: pd.DataFrame) -> dict[tuple[str, str, str, str], str]:
    """(question, a, b, criterion) -> the most frequent winner over repeats (a, b or "tie";
    "tie" also when two labels are equally frequent)."""
    out = {}
    for key, g in df[df["a"] != df["b"]].groupby(["question_id", "a", "b", "criterion"]):
        top = Counter(g["winner"]).most_common()
        out[key] = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else "tie"
    return out
