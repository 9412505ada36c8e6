"""Held-out two-hop questions for bench/multihop_recall.py, written from the 2Wiki corpus itself.

The 50 questions of ../shared/data/2wiki-dev are the ones the walk's rules were read from; a gain
measured on them alone is no evidence. This script writes other questions of 2WikiMultihopQA's
compositional kind from the 6,119-passage corpus: a passage whose opening says that X was
"directed by Y" (or "composed by", "son of", "daughter of", "married to") where Y is the title
of another passage gives "Where was the director of film X born?" (...), with the gold passages
X and Y. Passages that are gold for any of the 50 questions are left out, as X and as Y. The
questions are drawn with a fixed seed, so the file is the same on every run.

    python bench/twohop_questions.py /tmp/twohop.json --count 100
    python bench/multihop_recall.py --corpus ../shared/data/2wiki-corpus --questions /tmp/twohop.json
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NAME = r"([A-Z][\w.'\- ]+?)(?=,|\.\s|;| and | from | based | who | in \d| \()"
# (pattern in a passage's opening, question about X, whose second hop is Y's own passage)
TEMPLATES = [
    (re.compile(r"\bdirected by " + NAME), "Where was the director of film {x} born?"),
    (re.compile(r"\bcomposed by " + NAME), "What nationality is the composer of {x}?"),
    (re.compile(r"\b(?:son|daughter) of " + NAME), "When was the parent of {x} born?"),
    (re.compile(r"\b(?:married to|wife of|husband of) " + NAME), "Where did the spouse of {x} die?"),
]
OPENING = 300  # characters: the relation a question asks about is stated where an article begins


def _bare(title: str) -> str:
    return re.sub(r"\s*\([^()]*\)\s*$", "", title).strip()


def questions(corpus: Path, dev: Path, count: int, seed: int = 0) -> list[dict]:
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    held = {t for q in json.loads(dev.read_text()) for t in q["supporting_titles"]}
    title_of: dict[str, str] = {}
    for r in rows:
        title_of.setdefault(_bare(r["title"]), r["title"])
    found = []
    for r in rows:
        if r["title"] in held:
            continue
        for pattern, question in TEMPLATES:
            m = pattern.search(r["text"][:OPENING])
            y = title_of.get(m.group(1).strip()) if m else None
            if y and y != r["title"] and y not in held:
                found.append({"question": question.format(x=_bare(r["title"])),
                              "supporting_titles": [r["title"], y], "multihop": True})
                break
    random.Random(seed).shuffle(found)
    return found[:count]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="questions.json to write")
    ap.add_argument("--corpus", default=str(DATA / "2wiki-corpus" / "corpus.jsonl"))
    ap.add_argument("--dev", default=str(DATA / "2wiki-dev" / "questions.json"), help="questions to hold out")
    ap.add_argument("--count", type=int, default=100)
    args = ap.parse_args()
    out = questions(Path(args.corpus), Path(args.dev), args.count)
    Path(args.output).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    kinds = {}
    for q in out:
        kinds[q["question"].split(" of ")[0]] = kinds.get(q["question"].split(" of ")[0], 0) + 1
    print(f"{len(out)} questions written to {args.output}: {kinds}")


if __name__ == "__main__":
    main()
