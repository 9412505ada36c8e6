"""Relevance testers against gold relevance: which one tells the passages a question needs?

Lazy search spends its budget on relevance tests of text units (sensegraph/query/lazy_search.py).
This bench scores the testers on 2WikiMultihopQA, where the gold is known: the 6,119-passage
corpus of ../shared/data/2wiki-corpus, indexed lazily as bench/multihop_recall.py does it (one
passage a text unit; the same --workdir reuses that index), and the questions of
../shared/data/2wiki-dev/questions.json, every gold passage of which is in the corpus.

Per question, lazy search's own first steps run: the chat model's subqueries and the units
ranked by similarity to the question, the expansion and the subqueries. The test set is every
gold passage (positives) and the --negatives best-ranked other passages (hard negatives: what
a search tests first) plus --random others drawn at random. Each tester rates the same set, in
rank order, with the same plan:

- embedding: lazy search's no-call tester (relevant when the similarity stands out from the
  corpus's, `lazy.embedding_z`; or near the best unit, `lazy.embedding_margin`);
- yesno: one call per unit, the model's probability of answering "yes" (its first token's
  log-probabilities); precision and recall at several P(yes) thresholds from the same answers;
- pick: the model lists the units of a call that help (at most a quarter of them);
- chat: the chat model rates each unit 0-3 through its best passage (`lazy.snippet_tokens`),
  up to 24 units a call; precision and recall for each threshold 1, 2, 3 come from the same
  answers. --snippets gives the passage sizes to try (each a run of its own).

Printed per tester: precision, recall and F1 over the tested units (and per half of the
questions: a difference that shows in one half only is noise), calls, prompt and completion
tokens, and seconds per 100 tests. Answers are cached in the project: a rerun is free.

    python bench/relevance_tester.py --questions 20                    # embedded 1.5B
    python bench/relevance_tester.py --questions 10 --size 0.5b --snippets 60,120
    python bench/relevance_tester.py --base-url http://127.0.0.1:8000/v1 --model mock
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

from sensegraph.config import load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.llm import open_chat
from sensegraph.query import Searcher
from sensegraph.query.answer import Query
from sensegraph.query.lazy_search import Node, chat_tester, embedding_tester, plan_question, rank_units

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS = SHARED / "2wiki-corpus"
QUESTIONS = SHARED / "2wiki-dev" / "questions.json"


def project(workdir: Path, size: str, chat: dict, snippet: int) -> Path:
    """The lazy index of the 2Wiki corpus (bench/multihop_recall.py's folder layout)."""
    root = workdir / f"2wiki-corpus-lazy-{size}-all"
    (root / "input").mkdir(parents=True, exist_ok=True)
    link = root / "input" / "corpus.jsonl"
    if not link.exists():
        link.symlink_to(CORPUS / "corpus.jsonl")
    if not (root / "settings.yaml").exists():
        (root / "settings.yaml").write_text(f"index_method: lazy\nlocal:\n  size: {size}\n"
                                            "query:\n  context_tokens: 8000\n")
    return root


def settings_for(root: Path, size: str, chat: dict, snippet: int, tester: str, form: str = "scores",
                 per_call: int = 24):
    return load_settings(root, overrides={"local": {"size": size}, "chat": chat,
                                          "lazy": {"snippet_tokens": snippet, "tester": tester,
                                                   "test_format": form, "units_per_call": per_call}}, env={})


def test_set(units, gold_titles: set[str], title_of_unit: dict[str, str], score, negatives: int, drawn: int,
             rng: random.Random) -> list[int]:
    """Rows to test: every gold unit, the best-ranked others and some drawn at random, in rank order."""
    ids = units["id"].tolist()
    gold = [r for r, u in enumerate(ids) if title_of_unit[u] in gold_titles]
    others = [r for r in sorted(range(len(ids)), key=lambda r: -float(score[r])) if r not in set(gold)]
    hard = others[:negatives]
    rest = others[negatives:]
    chosen = set(gold) | set(hard) | set(rng.sample(rest, min(drawn, len(rest))))
    return sorted(chosen, key=lambda r: (-float(score[r]), r))


async def measure(settings, questions: list[dict], args) -> dict:
    searcher = Searcher.open(settings)
    index = searcher.index
    units = index.text_units
    docs = index.tables["documents"]
    title_of_doc = dict(zip(docs["id"], docs["title"]))
    title_of_unit = {u: title_of_doc[d] for u, d in zip(units["id"], units["document_id"])}
    await index.vectors("text_units", searcher.embedder)
    llm = open_chat(settings, cache=searcher.cache)
    rng = random.Random(args.seed)
    rows: list[dict] = []
    try:
        for n, item in enumerate(questions):
            q = Query(item["question"], settings, index, llm, searcher.embedder)
            plan = await plan_question(q, [])
            ranking = await rank_units(q, plan)
            gold_titles = set(item["supporting_titles"])
            tested = test_set(units, gold_titles, title_of_unit, ranking.score, args.negatives, args.random, rng)
            positive = {r for r in tested if title_of_unit[units.iloc[r]["id"]] in gold_titles}
            wave = [(Node(0, 0, [], tested), tested)]
            before = llm.usage.total()
            t0 = time.perf_counter()
            if settings.lazy.tester == "embedding":
                verdicts = await embedding_tester(q, plan, ranking, wave, [])
            else:
                verdicts = await chat_tester(q, plan, ranking, wave, [])
            seconds = time.perf_counter() - t0
            after = llm.usage.total()
            rows.append({"question": item["question"],
                         "titles": {r: title_of_unit[units.iloc[r]["id"]] for r in tested},
                         "positive": positive, "tested": tested, "scores": {r: v[1] for r, v in verdicts.items()},
                         "p": dict(plan.yes), "sim": {r: float(ranking.score[r]) for r in tested},
                         "z": {r: float((ranking.score[r] - ranking.score.mean()) / max(ranking.score.std(), 1e-9))
                               for r in tested},
                         "relevant": {r for r, v in verdicts.items() if v[0]}, "seconds": seconds,
                         "calls": after.calls - before.calls, "cached": after.cache_hits - before.cache_hits,
                         "prompt": after.prompt_tokens - before.prompt_tokens,
                         "completion": after.completion_tokens - before.completion_tokens})
            print(f"  {n + 1}/{len(questions)} {len(tested)} tested, {len(positive)} gold; "
                  f"{len(positive & rows[-1]['relevant'])} gold and {len(rows[-1]['relevant'] - positive)} others "
                  f"relevant; {seconds:.0f} s", flush=True)
    finally:
        await llm.aclose()
        await searcher.aclose()
    return {"rows": rows}


def auc(rows: list[dict], key: str) -> float:
    """Within each question, the chance that a gold passage scores above a non-gold one (ties
    half), averaged over the questions: how well a score orders the tests, whatever the cut."""
    values = []
    for r in rows:
        pos = [r[key].get(u, 0.0) for u in r["positive"]]
        neg = [r[key].get(u, 0.0) for u in r["tested"] if u not in r["positive"]]
        if pos and neg:
            values.append(sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg)))
    return sum(values) / len(values) if values else 0.0


def scores(rows: list[dict], threshold: float | None, key: str = "scores") -> dict[str, float]:
    tp = fp = fn = 0
    for r in rows:
        relevant = r["relevant"] if threshold is None else {u for u, s in r[key].items() if s >= threshold}
        tp += len(relevant & r["positive"])
        fp += len(relevant - r["positive"])
        fn += len(r["positive"] - relevant)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


YES_CUTS = [0.1, 0.3, 0.5, 0.7, 0.9]  # the yes-no tester's P(yes) thresholds reported


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/sg2wiki", help="where bench/multihop_recall.py --corpus keeps the index")
    ap.add_argument("--questions", type=int, default=20, help="how many of the 50 questions")
    ap.add_argument("--first", type=int, default=1,
                    help="the first question measured (1-based): 11 holds out the ten the prompts were read against")
    ap.add_argument("--negatives", type=int, default=20, help="best-ranked non-gold passages tested per question")
    ap.add_argument("--random", type=int, default=10, help="random non-gold passages tested per question")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=["1.5b", "0.5b"], default="1.5b", help="the embedded chat model")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server instead of the embedded model")
    ap.add_argument("--model", default="", help="its model name")
    ap.add_argument("--dump", default=None, help="write every verdict (question, unit title, gold, verdict) as JSON")
    ap.add_argument("--per-call", type=int, default=24, help="lazy.units_per_call: units one test call reads")
    ap.add_argument("--snippets", default="120", help="lazy.snippet_tokens values for the chat tester")
    ap.add_argument("--testers", default="embedding,chat",
                    help="embedding, chat (0-3 scores per unit), pick (the model lists the units that help) and "
                         "yesno (one call per unit: the model's P(yes))")
    args = ap.parse_args()
    questions = json.loads(QUESTIONS.read_text())[args.first - 1: args.first - 1 + args.questions]
    chat = ({"provider": "openai", "base_url": args.base_url, "model": args.model or "model", "api_key": "none"}
            if args.base_url else {})
    root = project(Path(args.workdir), args.size, chat, 120)
    t0 = time.perf_counter()
    asyncio.run(run_index(settings_for(root, args.size, chat, 120, "embedding"), log=lambda m: None))
    print(f"lazy index of {CORPUS} in {root}: {time.perf_counter() - t0:.0f} s")
    model = f"{args.model} at {args.base_url}" if args.base_url else f"embedded {args.size}"
    results = []
    for tester in args.testers.split(","):
        for snippet in ([120] if tester == "embedding" else [int(x) for x in args.snippets.split(",")]):
            label = tester if tester == "embedding" else f"{tester}, {snippet}-token passages"
            print(f"\n{label}:")
            settings = settings_for(root, args.size, chat, snippet, "embedding" if tester == "embedding" else "chat",
                                    tester if tester in ("pick", "yesno", "answers") else "scores", args.per_call)
            results.append((label, tester, asyncio.run(measure(settings, questions, args))["rows"]))
    half = len(questions) // 2
    if args.dump:
        Path(args.dump).write_text(json.dumps([
            {"tester": label, "questions": [
                {"question": r["question"], "tests": [
                    {"title": r["titles"][u], "gold": u in r["positive"], "relevant": u in r["relevant"],
                     "score": r["scores"].get(u), "p_yes": r["p"].get(u), "similarity": round(r["sim"][u], 4),
                     "z": round(r["z"][u], 3)}
                    for u in r["tested"]]} for r in rows]} for label, _, rows in results], indent=1))
    print(f"\n2WikiMultihopQA, questions {args.first}-{args.first + len(questions) - 1}, {model}: every gold passage, the "
          f"{args.negatives} best-ranked others and {args.random} random others per question")
    print("| tester | relevant at | precision | recall | F1 | F1 halves | calls | prompt tok | completion tok "
          "| s / 100 tests |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, tester, rows in results:
        if tester == "yesno":
            print(f"(ordering, AUC per question: P(yes) {auc(rows, 'p'):.2f} "
                  f"({auc(rows[:half], 'p'):.2f} / {auc(rows[half:], 'p'):.2f}); the embedding similarity "
                  f"{auc(rows, 'sim'):.2f} ({auc(rows[:half], 'sim'):.2f} / {auc(rows[half:], 'sim'):.2f}))")
        tests = sum(len(r["tested"]) for r in rows)
        calls = sum(r["calls"] for r in rows)
        prompt = sum(r["prompt"] for r in rows)
        completion = sum(r["completion"] for r in rows)
        seconds = sum(r["seconds"] for r in rows)
        cached = sum(r["cached"] for r in rows)
        thresholds = ([None] if tester == "embedding" else [2] if tester == "pick"
                      else YES_CUTS if tester == "yesno" else [2] if tester == "answers" else [1, 2, 3])
        key = "p" if tester == "yesno" else "scores"
        for threshold in thresholds:
            s = scores(rows, threshold, key)
            h = [scores(part, threshold, key)["f1"] for part in (rows[:half], rows[half:])]
            per100 = f"{100 * seconds / tests:.1f}" + (" (cached)" if cached and not calls else "")
            at = ("z / margin" if threshold is None else "listed" if tester == "pick"
                  else "answer found in it" if tester == "answers"
                  else f"P(yes) >= {threshold}" if tester == "yesno" else f"score >= {threshold}")
            print(f"| {label} | {at} | "
                  f"{s['precision']:.2f} | {s['recall']:.2f} | {s['f1']:.2f} | {h[0]:.2f} / {h[1]:.2f} | {calls} | "
                  f"{prompt} | {completion} | {per100} |")


if __name__ == "__main__":
    main()
