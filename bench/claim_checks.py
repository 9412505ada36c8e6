"""Lazy search's claim checks (query/lazy_search.py: `grounded`, `contradicted`) against claims a
good model would write, on documents the checks were not shaped on. No model is called.

Re-DocRED's gold relations (../shared/data/redocred-test) become question-and-claim pairs framed
the way an answer is framed: "Where is Ealing located?" / "Ealing is located in London." For
every pair, three claims are checked against the document's text:

- true: the gold fact as stated; a check that drops it loses what a good model found;
- invented: the same claim with the tail swapped for a name of the same type from another
  document that this one never writes; a check that keeps it lets an invention through;
- denied: the true claim negated ("... is not located in London."); it should be caught.

Printed per half of the documents (1-250 / 251-500): the share kept, dropped and caught, with
the grounding counted over the claim's own terms (the question's words are framing, the
default) and over all its terms (as before stop 47), and the negation rule as it is (what a
negation governs) and as it was (a negation anywhere in the matching sentence).

    python bench/claim_checks.py
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from sensegraph.query.lazy_search import _NEGATION, contradicted, grounded
from sensegraph.query.passages import sentences, terms

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "redocred-test" / "test_revised.json"

# relation: (question, claim, denied claim); {h} and {t} are the head's and tail's first mention
TEMPLATES = {
    "P131": ("Where is {h} located?", "{h} is located in {t}.", "{h} is not located in {t}."),
    "P17": ("Which country is {h} in?", "{h} is in {t}.", "{h} is not in {t}."),
    "P27": ("What is the citizenship of {h}?", "{h} is a citizen of {t}.", "{h} is not a citizen of {t}."),
    "P150": ("What does {h} contain?", "{h} contains {t}.", "{h} does not contain {t}."),
    "P577": ("When was {h} published?", "{h} was published in {t}.", "{h} was not published in {t}."),
    "P175": ("Who performed {h}?", "{h} was performed by {t}.", "{h} was not performed by {t}."),
    "P569": ("When was {h} born?", "{h} was born on {t}.", "{h} was not born on {t}."),
    "P570": ("When did {h} die?", "{h} died on {t}.", "{h} did not die on {t}."),
    "P571": ("When was {h} founded?", "{h} was founded in {t}.", "{h} was never founded in {t}."),
    "P161": ("Who starred in {h}?", "{t} starred in {h}.", "{t} never starred in {h}."),
    "P264": ("Which record label released {h}?", "{h} was released by {t}.", "{h} wasn't released by {t}."),
    "P463": ("What is {h} a member of?", "{h} is a member of {t}.", "{h} is no member of {t}."),
    "P495": ("Which country does {h} come from?", "{h} comes from {t}.", "{h} does not come from {t}."),
}


def cases(docs: list[dict], seed: int) -> list[dict]:
    rng = random.Random(seed)
    by_type: dict[str, list[str]] = {}
    for d in docs:
        for v in d["vertexSet"]:
            by_type.setdefault(v[0]["type"], []).append(v[0]["name"])
    out = []
    for n, d in enumerate(docs):
        text = " ".join(" ".join(s) for s in d["sents"])
        for label in d["labels"]:
            if label["r"] not in TEMPLATES:
                continue
            head, tail = d["vertexSet"][label["h"]][0], d["vertexSet"][label["t"]][0]
            question, claim, denied = TEMPLATES[label["r"]]
            others = [x for x in by_type[tail["type"]] if x.lower() not in text.lower()]
            other = rng.choice(others) if others else None
            out.append({"doc": n, "text": text, "question": question.format(h=head["name"]),
                        "true": claim.format(h=head["name"], t=tail["name"]),
                        "invented": claim.format(h=head["name"], t=other) if other else None,
                        "denied": denied.format(h=head["name"], t=tail["name"])})
    return out


def sentence_wide(claim: str, cited: str) -> bool:
    """The negation rule before stop 47, for comparison: a negation on one side and none on the
    other anywhere in the claim's matching sentence."""
    words = set(terms(claim))
    best = max(sentences(cited, 10_000), key=lambda s: len(words & set(terms(s))), default="")
    return len(words & set(terms(best))) >= 2 and bool(_NEGATION.search(claim)) != bool(_NEGATION.search(best))


def kept(claim: str, case: dict, share: float, framed: bool) -> bool:
    return (grounded(claim, case["text"], share, case["question"] if framed else "")
            and not contradicted(claim, case["text"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--share", type=float, default=0.5, help="lazy.claim_grounding")
    ap.add_argument("--seed", type=int, default=1, help="the swapped names of the invented claims")
    args = ap.parse_args()
    docs = json.loads(DATA.read_text())
    all_cases = cases(docs, args.seed)
    halves = {"1-250": [c for c in all_cases if c["doc"] < 250], "251-500": [c for c in all_cases if c["doc"] >= 250]}
    print(f"Re-DocRED test, {len(all_cases)} gold facts of {len(TEMPLATES)} relations, lazy.claim_grounding {args.share}")
    print("| documents | facts | grounding over | true kept | invented dropped |")
    print("|---|---:|---|---:|---:|")
    for name, cs in halves.items():
        invented = [c for c in cs if c["invented"]]
        for framed in (True, False):
            true = sum(kept(c["true"], c, args.share, framed) for c in cs) / len(cs)
            dropped = sum(not kept(c["invented"], c, args.share, framed) for c in invented) / len(invented)
            print(f"| {name} | {len(cs)} | {'own terms' if framed else 'all terms'} | {true:.3f} | {dropped:.3f} |")
    print("\n| documents | negation rule | denied caught | true flagged |")
    print("|---|---|---:|---:|")
    for name, cs in halves.items():
        caught = sum(contradicted(c["denied"], c["text"]) == "negation" for c in cs) / len(cs)
        flagged = sum(contradicted(c["true"], c["text"]) == "negation" for c in cs) / len(cs)
        print(f"| {name} | what a negation governs | {caught:.3f} | {flagged:.3f} |")
        caught = sum(sentence_wide(c["denied"], c["text"]) for c in cs) / len(cs)
        flagged = sum(sentence_wide(c["true"], c["text"]) for c in cs) / len(cs)
        print(f"| {name} | anywhere in the sentence | {caught:.3f} | {flagged:.3f} |")


if __name__ == "__main__":
    main()
