"""A perfect extractor through a whole default index: what do the name checks take from it?

Reads ../shared/data/redocred-test/test_revised.json (Re-DocRED test: 500 Wikipedia documents,
every entity mention with its type, relations as head/tail/Wikidata id) and writes --docs of
them (all by default; fewer drawn with --seed) as the input of a fresh project per policy, one
document per line of a jsonl file, the text built as bench/extraction_quality.py builds it.
Then `sensegraph index` runs in a subprocess, as a user runs it, against the mock server of
tests/mock_llm.py (provider openai, model "mock"), whose `responder` hook plays a perfect
extractor: each extraction call gets the gold annotation of the document its prompt holds,

- every gold entity one record: its name as the text writes it (the first mention, in text
  order, whose detokenised words occur verbatim in the text), its type mapped onto the six
  configured types (PER person, ORG organization, LOC location, TIME time, NUM number, MISC
  misc), the sentence of that mention as its description;
- every gold relation one record between the two names, described by the relation's Wikidata
  label and its evidence sentences, strength 8;
- gleaning's "were entities missed?" answered no;

and every other call (summaries, community reports, embeddings) the mock's usual answer. One
document is one text unit (chunks of 1200 tokens, no overlap; checked), and the schema's
maxItems is raised (100 entities, 200 relationships) above the largest document's counts, so
nothing is cut before the checks. For each policy of `extraction.checks` (strict, lenient, off;
auto is lenient here: "mock" states no size) the final tables are compared with the gold:

- entities kept: gold entities with an entity row whose title or an alias equals the given name
  after case folding and whitespace collapsing, and whose text units hold the document's unit
  (the looser match of bench/extraction_quality.py, punctuation and articles dropped, is shown
  beside it when it differs);
- typed as given: kept, and the row's type is the type the extractor gave (a share of all the
  gold entities, as the other columns);
- relations kept: gold relations with a relationships row (co_occurrence False) joining the two
  entities' titles, either direction, from the document's unit;

per gold type and in all, with the extract step's counters from stats.json and, per policy,
every lost or retyped name with its gold type and why: the verdict of extract.py's own name
check on that unit, a type taken from the name's value (a year, an amount), or the majority
type of instances merged under one name (the same name in other documents, or two gold
entities of one document with one name). A run of all 500 documents takes about a minute per
policy on two cores (the timings are printed).

    python bench/extraction_oracle.py                         # all 500 documents, 3 policies
    python bench/extraction_oracle.py --docs 100 --seed 1
    python bench/extraction_oracle.py --policies strict --workdir /tmp/oracle --keep-cache
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from extraction_quality import DATA, detokenise, norm  # noqa: E402
from mock_llm import start_mock_server  # noqa: E402

from sensegraph.config import load_settings  # noqa: E402
from sensegraph.index import missed_names  # noqa: E402
from sensegraph.index.extract import _NameCheck, _type_key, example_names  # noqa: E402
from sensegraph.index.grounding import value_type  # noqa: E402
from sensegraph.prompts import load_prompt  # noqa: E402
from sensegraph.store.tables import read_table  # noqa: E402

GOLD_TYPES = ("PER", "ORG", "LOC", "TIME", "NUM", "MISC")
TYPE_OF = {"PER": "person", "ORG": "organization", "LOC": "location", "TIME": "time", "NUM": "number",
           "MISC": "misc"}
STRENGTH = 8
MAX_ENTITIES, MAX_RELATIONSHIPS = 100, 200
CHUNK_TOKENS = 1200
COUNTERS = ("entity_instances", "relationship_instances", "names_ungrounded", "names_generic", "names_clause",
            "example_leaks", "relationships_dropped", "types_from_value", "types_mapped", "types_to_catch_all")

# The Wikidata labels of the 96 DocRED relations.
RELATIONS = {
    "P6": "head of government", "P17": "country", "P19": "place of birth", "P20": "place of death",
    "P22": "father", "P25": "mother", "P26": "spouse", "P27": "country of citizenship", "P30": "continent",
    "P31": "instance of", "P35": "head of state", "P36": "capital", "P37": "official language",
    "P39": "position held", "P40": "child", "P50": "author", "P54": "member of sports team",
    "P57": "director", "P58": "screenwriter", "P69": "educated at", "P86": "composer",
    "P102": "member of political party", "P108": "employer", "P112": "founded by", "P118": "league",
    "P123": "publisher", "P127": "owned by", "P131": "located in the administrative territorial entity",
    "P136": "genre", "P137": "operator", "P140": "religion", "P150": "contains administrative territorial entity",
    "P155": "follows", "P156": "followed by", "P159": "headquarters location", "P161": "cast member",
    "P162": "producer", "P166": "award received", "P170": "creator", "P171": "parent taxon",
    "P172": "ethnic group", "P175": "performer", "P176": "manufacturer", "P178": "developer", "P179": "series",
    "P190": "sister city", "P194": "legislative body", "P205": "basin country",
    "P206": "located in or next to body of water", "P241": "military branch", "P264": "record label",
    "P272": "production company", "P276": "location", "P279": "subclass of", "P355": "subsidiary",
    "P361": "part of", "P364": "original language of work", "P400": "platform", "P403": "mouth of the watercourse",
    "P449": "original network", "P463": "member of", "P488": "chairperson", "P495": "country of origin",
    "P527": "has part", "P551": "residence", "P569": "date of birth", "P570": "date of death",
    "P571": "inception", "P576": "dissolved, abolished or demolished", "P577": "publication date",
    "P580": "start time", "P582": "end time", "P585": "point in time", "P607": "conflict", "P674": "characters",
    "P676": "lyrics by", "P706": "located on terrain feature", "P710": "participant", "P737": "influenced by",
    "P740": "location of formation", "P749": "parent organization", "P800": "notable work",
    "P807": "separated from", "P840": "narrative location", "P937": "work location",
    "P1001": "applies to jurisdiction", "P1056": "product or material produced", "P1198": "unemployment rate",
    "P1336": "territory claimed by", "P1344": "participant in", "P1365": "replaces", "P1366": "replaced by",
    "P1376": "capital of", "P1412": "languages spoken, written or signed", "P1441": "present in work",
    "P3373": "sibling",
}


# -- the gold, as a perfect extractor gives it --------------------------------------------------------

@dataclass
class GoldEntity:
    name: str        # as the text writes it
    gold_type: str   # PER, ORG ...
    type: str        # the configured type given
    description: str


@dataclass
class GoldRelation:
    head: int
    tail: int
    relation: str    # Wikidata id
    description: str


@dataclass
class GoldDoc:
    title: str
    text: str
    entities: list[GoldEntity]
    relations: list[GoldRelation]
    not_verbatim: int = 0        # entities none of whose mentions occur verbatim in the text
    names_not_verbatim: int = 0  # mentions whose `name` field does not occur verbatim

    def answer(self) -> dict[str, Any]:
        return {"entities": [{"name": e.name, "type": e.type, "description": e.description} for e in self.entities],
                "relationships": [{"source": self.entities[r.head].name, "target": self.entities[r.tail].name,
                                   "description": r.description, "strength": STRENGTH} for r in self.relations]}


def gold_doc(doc: dict) -> GoldDoc:
    sents = doc["sents"]
    text = detokenise(sents)
    sentence = [detokenise([s]) for s in sents]
    out = GoldDoc(doc["title"], text, [], [])
    for mentions in doc["vertexSet"]:
        ordered = sorted(mentions, key=lambda m: (m["sent_id"], m["pos"][0]))
        forms = [detokenise([sents[m["sent_id"]][m["pos"][0]:m["pos"][1]]]) for m in ordered]
        verbatim = [i for i, f in enumerate(forms) if f in text]
        out.not_verbatim += not verbatim
        out.names_not_verbatim += sum(m["name"] not in text for m in mentions)
        first = verbatim[0] if verbatim else 0
        gold_type = Counter(m["type"] for m in mentions).most_common(1)[0][0]
        out.entities.append(GoldEntity(" ".join(forms[first].split()), gold_type, TYPE_OF[gold_type],
                                       sentence[ordered[first]["sent_id"]]))
    for r in doc["labels"]:
        h, t = out.entities[r["h"]].name, out.entities[r["t"]].name
        evidence = " ".join(sentence[i] for i in sorted(set(r.get("evidence") or [])))
        label = RELATIONS.get(r["r"], r["r"])
        out.relations.append(GoldRelation(r["h"], r["t"], r["r"],
                                          f"{t} is the {label} of {h}." + (f" {evidence}" if evidence else "")))
    return out


class Oracle:
    """The mock's `responder` hook: the gold annotation for each extraction call."""

    def __init__(self, docs: list[GoldDoc]):
        self.by_text = {d.text: d for d in docs}
        self.docs = docs
        self.calls: Counter[str] = Counter()
        self.unmatched: list[str] = []
        self.max_items: dict[str, int] = {}
        self.types: list[str] = []
        self.cut: list[str] = []  # documents whose gold exceeds the schema's maxItems

    def _doc(self, body: dict) -> GoldDoc | None:
        user = next((m.get("content") or "" for m in body.get("messages") or [] if m.get("role") == "user"), "")
        m = re.search(r'"""\n(.*)\n"""', user, re.DOTALL)
        if m and m.group(1) in self.by_text:
            return self.by_text[m.group(1)]
        held = [d for d in self.docs if d.text in user]
        return max(held, key=lambda d: len(d.text)) if held else None

    def __call__(self, body: dict) -> str | None:
        # The client sends json_schema requests (the mock accepts them), named after the model.
        rf = body.get("response_format") or {}
        spec = rf.get("json_schema") or {}
        name = spec.get("name")
        if name == "GleanCheck":
            self.calls["glean_check"] += 1
            return json.dumps({"missed": False})
        if name != "ExtractedGraph":
            return None  # summaries, reports, claims ...: the mock's usual answer
        if any(m.get("role") == "assistant" for m in body.get("messages") or []):
            self.calls["gleaning"] += 1  # never asked: the check says nothing was missed
            return json.dumps({"entities": [], "relationships": []})
        schema = spec.get("schema") or {}
        props = schema.get("properties") or {}
        for part in ("entities", "relationships"):
            self.max_items[part] = int((props.get(part) or {}).get("maxItems") or 0)
        entity = (props.get("entities") or {}).get("items") or {}
        entity = (schema.get("$defs") or {}).get(entity.get("$ref", "").rsplit("/", 1)[-1], entity)
        self.types = list(((entity.get("properties") or {}).get("type") or {}).get("enum") or self.types)
        doc = self._doc(body)
        if doc is None:
            self.unmatched.append(body["messages"][-1]["content"][:80])
            return json.dumps({"entities": [], "relationships": []})
        self.calls["extract"] += 1
        answer = doc.answer()
        if any(self.max_items[k] and len(answer[k]) > self.max_items[k] for k in answer):
            self.cut.append(doc.title)
        return json.dumps(answer, ensure_ascii=False)


# -- one policy ---------------------------------------------------------------------------------------

def write_project(root: Path, docs: list[GoldDoc], base_url: str, policy: str, keep_cache: bool) -> None:
    if root.exists():
        for child in root.iterdir():
            if not (keep_cache and child.name == "cache"):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    (root / "input").mkdir(parents=True, exist_ok=True)
    with open(root / "input" / "redocred.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"title": d.title, "text": d.text}, ensure_ascii=False) + "\n")
    model = {"provider": "openai", "base_url": base_url, "model": "mock", "api_key": "none", "concurrency": 16,
             "retry_base_seconds": 0.05}
    settings = {"chat": model, "embedding": dict(model), "chunks": {"size": CHUNK_TOKENS, "overlap": 0},
                "extraction": {"entity_types": list(TYPE_OF.values()), "checks": policy,
                               "max_entities": MAX_ENTITIES, "max_relationships": MAX_RELATIONSHIPS}}
    # JSON is YAML: the settings file a user would write, in its plainest form
    (root / "settings.yaml").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def run_index(root: Path) -> tuple[list[str], float]:
    cmd = [sys.executable, "-m", "sensegraph.cli", "index", "--root", str(root)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSEGRAPH_")}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return cmd, seconds


@dataclass
class Outcome:
    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # gold type -> counts
    lost: list[tuple[str, str, str, str]] = field(default_factory=list)     # name, gold type, doc, reason
    retyped: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # + the row's type
    lost_relations: Counter = field(default_factory=Counter)                 # reason -> count
    loose_only: int = 0  # gold entities found only by the looser match
    relations: int = 0        # every gold relation once (the rows per type count it per endpoint type)
    relations_kept: int = 0


def key(name: str) -> str:
    """Names compared as the brief of this bench says: case folded, whitespace collapsed."""
    return " ".join(str(name).split()).casefold()


def name_check(text: str, examples: frozenset[str], settings) -> Any:
    """extract.py's own check of one unit's names, as the extract step built it."""
    policy = settings.check_policy()[0]
    fields = {f.name for f in dataclasses.fields(_NameCheck)}
    if "concept_types" in fields:
        return _NameCheck(text, examples, policy,
                          frozenset(_type_key(t) for t in settings.extraction.concept_types))
    return _NameCheck(text, examples, policy)


def verdict(check: Any, name: str, typ: str) -> str:
    try:
        return check.verdict(name, typ)
    except TypeError:  # a check that does not look at the type
        return check.verdict(name)


def compare(root: Path, docs: list[GoldDoc], settings) -> tuple[Outcome, dict[str, Any]]:
    out_dir = root / "output"
    documents = read_table(out_dir, "documents")
    units = read_table(out_dir, "text_units")
    entities = read_table(out_dir, "entities")
    relationships = read_table(out_dir, "relationships")
    # the extract step's rows, before merging: where a name or a type was lost
    instances = pd.read_parquet(out_dir / "_work" / "entity_instances.parquet")
    rel_instances = pd.read_parquet(out_dir / "_work" / "relationship_instances.parquet")
    stats = json.loads((out_dir / "stats.json").read_text())
    doc_id = dict(zip(documents["title"], documents["id"]))
    unit_of: dict[str, tuple[str, str]] = {}
    per_doc = Counter(units["document_id"])
    for uid, did, text in zip(units["id"], units["document_id"], units["text"]):
        unit_of[did] = (str(uid), str(text))
    bad = [d.title for d in docs if per_doc[doc_id[d.title]] != 1 or unit_of[doc_id[d.title]][1] != d.text]
    if bad:
        sys.exit(f"{len(bad)} documents are not exactly one text unit equal to their text, e.g. {bad[:3]}")

    rows: dict[str, list[dict]] = defaultdict(list)   # title or alias -> entity rows
    loose: dict[str, list[dict]] = defaultdict(list)
    for row in entities.to_dict("records"):
        for n in [row["title"], *(row.get("aliases") or [])]:
            rows[key(n)].append(row)
            loose[norm(n)].append(row)
    linked: dict[frozenset, set[str]] = defaultdict(set)
    weak = relationships["co_occurrence"] if "co_occurrence" in relationships else [False] * len(relationships)
    for s, t, units_, co in zip(relationships["source"], relationships["target"], relationships["text_unit_ids"], weak):
        if not co:
            linked[frozenset((key(s), key(t)))].update(map(str, units_))
    typed_in: dict[tuple[str, str], list[str]] = defaultdict(list)  # (unit, name) -> instance types
    types_of: dict[str, Counter] = defaultdict(Counter)              # name -> instance types, all units
    for title, typ, unit in zip(instances["title"], instances["type"], instances["text_unit_id"]):
        typed_in[(str(unit), key(title))].append(str(typ))
        types_of[key(title)][str(typ)] += 1
    edges_in = {(str(u), frozenset((key(s), key(t))))
                for s, t, u in zip(rel_instances["source"], rel_instances["target"], rel_instances["text_unit_id"])}

    examples = frozenset(example_names(load_prompt("examples_graph", "en", str(root))))
    o = Outcome()
    for d in docs:
        unit, text = unit_of[doc_id[d.title]]
        check = name_check(text, examples, settings)
        names = Counter(key(e.name) for e in d.entities)
        found: list[dict | None] = []
        for e in d.entities:
            c = o.counts[e.gold_type]
            c["entities"] += 1
            row = next((r for r in rows.get(key(e.name), []) if unit in map(str, r["text_unit_ids"])), None)
            found.append(row)
            given = typed_in.get((unit, key(e.name)), [])
            if row is None:
                if any(unit in map(str, r["text_unit_ids"]) for r in loose.get(norm(e.name), [])):
                    o.loose_only += 1
                    c["kept_loose"] += 1
                why = verdict(check, e.name, e.type) or (
                    "extracted, then lost after the extract step" if given else "not extracted (no verdict)")
                o.lost.append((e.name, e.gold_type, d.title, why))
                continue
            c["kept"] += 1
            c["kept_loose"] += 1
            if row["type"] == e.type:
                c["typed"] += 1
                continue
            if given and e.type not in given:
                value = value_type(e.name)
                why = (f"extract step typed it {given[0]}" +
                       (f" (types_from_value: the name reads as a {value})" if value else ""))
            elif names[key(e.name)] > 1:
                why = "another gold entity of the document has this name: one entity, the majority type"
            else:
                why = "the majority type of the instances merged under this name in all documents"
            why += " (" + ", ".join(f"{t} {n}" for t, n in types_of[key(e.name)].most_common()) + ")"
            o.retyped.append((e.name, e.gold_type, d.title, row["type"], why))
        for r in d.relations:
            types = {d.entities[r.head].gold_type, d.entities[r.tail].gold_type}
            for t in types:
                o.counts[t]["relations"] += 1
            o.relations += 1
            h, t = found[r.head], found[r.tail]
            if h is not None and t is not None and unit in linked.get(frozenset((key(h["title"]), key(t["title"]))), ()):
                for t_ in types:
                    o.counts[t_]["relations_kept"] += 1
                o.relations_kept += 1
                continue
            a, b = d.entities[r.head], d.entities[r.tail]
            reasons = [x for x in (verdict(check, a.name, a.type), verdict(check, b.name, b.type)) if x]
            if key(a.name) == key(b.name):
                o.lost_relations["self_loops (the two entities have one name)"] += 1
            elif reasons:
                o.lost_relations["relationships_dropped: an endpoint is " + "/".join(sorted(set(reasons)))] += 1
            elif (unit, frozenset((key(a.name), key(b.name)))) in edges_in:
                o.lost_relations["extracted, then lost after the extract step"] += 1
            else:
                o.lost_relations["not extracted (no verdict)"] += 1
    return o, stats


# -- report ---------------------------------------------------------------------------------------------

def share(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "-"


def table(results: dict[str, tuple[Outcome, dict[str, Any]]]) -> None:
    print("| policy | gold type | entities | kept | typed as given | relations | relations kept |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for policy, (o, _) in results.items():
        total: Counter = Counter()
        for t in GOLD_TYPES:
            c = o.counts[t]
            total.update({k: v for k, v in c.items() if k not in ("relations", "relations_kept")})
            print(f"| {policy} | {t} | {c['entities']} | {share(c['kept'], c['entities'])} | "
                  f"{share(c['typed'], c['entities'])} | {c['relations']} | {share(c['relations_kept'], c['relations'])} |")
        print(f"| {policy} | **all** | {total['entities']} | **{share(total['kept'], total['entities'])}** | "
              f"**{share(total['typed'], total['entities'])}** | {o.relations} | "
              f"**{share(o.relations_kept, o.relations)}** |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=500, help="documents (all 500 by default)")
    ap.add_argument("--seed", type=int, default=0, help="which documents, when fewer than all")
    ap.add_argument("--workdir", default="/tmp/sensegraph-oracle")
    ap.add_argument("--policies", default="strict,lenient,off", help="extraction.checks values, comma-separated")
    ap.add_argument("--keep-cache", action="store_true",
                    help="keep each project's answer cache from an earlier run (faster; timings then are not a first run's)")
    args = ap.parse_args()
    corpus = json.loads(DATA.read_text())
    picked = corpus if args.docs >= len(corpus) else random.Random(args.seed).sample(corpus, args.docs)
    docs = [gold_doc(d) for d in picked]
    n_ent = sum(len(d.entities) for d in docs)
    print(f"Re-DocRED test: {len(docs)} documents (seed {args.seed}), {n_ent} gold entities, "
          f"{sum(len(d.relations) for d in docs)} gold relations; most per document: "
          f"{max(len(d.entities) for d in docs)} entities, {max(len(d.relations) for d in docs)} relations; "
          f"entities with no mention verbatim in the text: {sum(d.not_verbatim for d in docs)}; "
          f"mentions whose `name` field is not verbatim: {sum(d.names_not_verbatim for d in docs)}")
    oracle = Oracle(docs)
    results: dict[str, tuple[Outcome, dict[str, Any]]] = {}
    timings: dict[str, float] = {}
    with start_mock_server(fast_vectors=True, responder=oracle) as server:
        for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
            root = Path(args.workdir) / policy
            write_project(root, docs, server.base_url, policy, args.keep_cache)
            settings = load_settings(root, env={})
            chosen, why = settings.check_policy()
            print(f"\n[{policy}] check_policy(): {chosen} ({why}); extraction.ner = {settings.extraction.ner!r}, "
                  f"names from NER on: {missed_names.enabled(settings, 'en')}")
            oracle.calls.clear()
            cmd, seconds = run_index(root)
            timings[policy] = seconds
            print(f"[{policy}] $ {' '.join(cmd)}   # {seconds:.1f} s; oracle answered {dict(oracle.calls)}; "
                  f"schema maxItems {oracle.max_items}, types {oracle.types}")
            if oracle.unmatched or oracle.cut:
                sys.exit(f"extraction prompts of no document: {oracle.unmatched[:3]}; cut by maxItems: {oracle.cut[:3]}")
            if sorted(oracle.types) != sorted(TYPE_OF.values()):
                sys.exit(f"the schema's types {oracle.types} are not the configured six")
            o, stats = compare(root, docs, settings)
            results[policy] = (o, stats)
            steps = stats.get("steps", {})
            print(f"[{policy}] step seconds: " + ", ".join(
                f"{k} {v.get('seconds', 0):.1f}" for k, v in steps.items() if isinstance(v, dict)))
    print()
    table(results)
    print("\n| policy | " + " | ".join(COUNTERS) + " |")
    print("|---|" + "---:|" * len(COUNTERS))
    for policy, (_, stats) in results.items():
        ex = stats.get("steps", {}).get("extract") or {}
        print(f"| {policy} | " + " | ".join(str(ex.get(k, "-")) for k in COUNTERS) + " |")
    for policy, (o, stats) in results.items():
        applied = stats.get("extraction_checks")
        print(f"\n### {policy}: {len(o.lost)} gold entities lost, {len(o.retyped)} retyped"
              + (f", {o.loose_only} found only by the looser match" if o.loose_only else "")
              + (f"; stats.json extraction_checks: {applied}" if applied else ""))
        why = Counter((reason, gold_type) for _, gold_type, _, reason in o.lost)
        why.update((reason.split(" (")[0], f"{gold_type} retyped") for _, gold_type, _, _, reason in o.retyped)
        for (reason, gold_type), n in sorted(why.items(), key=lambda x: -x[1]):
            print(f"  {n:4} {gold_type:13} {reason}")
        for name, gold_type, title, reason in o.lost:
            print(f"- lost {name!r} ({gold_type}, {title}): {reason}")
        for name, gold_type, title, typ, reason in o.retyped:
            print(f"- retyped {name!r} ({gold_type} -> {typ}, {title}): {reason}")
        for reason, n in o.lost_relations.most_common():
            print(f"- relations lost: {n} ({reason})")
    print("\ntimings: " + ", ".join(f"{p} {s:.1f} s" for p, s in timings.items()))


if __name__ == "__main__":
    main()
