"""`sensegraph prompt-tune`: extraction prompts adapted to the user's corpus.

From a seeded sample of the project's text units (spread over its documents), one chat call
proposes the corpus's domain and entity types; then a few calls each extract entities and
relationships from one real sampled passage with those types, and the answers become the
few-shot examples of `examples_graph.txt`, in the corpus language (written to the prompts the
index reads for it: prompts/en/ for a Japanese corpus, which has no prompts of its own yet). What the model answers is
checked in code before it is written: types that break the type rule (`_type_key`: one to
three words of letters, no function word but an inner "of"), repeats and types beyond the cap
(servers may ignore maxItems) are refused and named, and an example entity whose name is not written in its passage is dropped,
with the relationships that used it. The result is a plan (a diff per file); nothing is written
until `write_changes`. settings.yaml is edited line by line and keeps every comment (a type no
longer listed whose line had a comment stays as a commented-out line); the comments the edit
could not keep are measured on the two texts and named in the plan's notes.

Every call goes through the one chat client with the answer cache, and the sample and prompts
are a function of the input alone, so a rerun costs no call. The examples keep the exact
format of the packaged file (the extraction step reads the example names back from it to
filter leaked example names from its output).
"""
from __future__ import annotations

import asyncio
import copy
import difflib
import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import BaseModel, Field

from .config import SETTINGS_FILE, Settings
from .index import documents, text_units
from .index.estimate import RATIOS
from .index.extract import clean_name, graph_schema, normalize_name, type_mapper
from .language import language_note, resolve_language
from .llm import BudgetReached, ChatClient, LLMError
from .prompts import PACKAGE_DIR, load_prompt, prompt_language, render, to_messages
from .tokens import count_tokens, truncate

DEFAULT_SAMPLE = 8  # text units the proposal call reads
DEFAULT_EXAMPLES = 2  # few-shot examples written (each one lengthens every extraction prompt)
SEED = 0
MAX_TYPES = 8
PROPOSE_MAX_TOKENS = 400
# The sampled passages of the proposal call together; an embedded model's slot caps it lower.
SAMPLE_TOKENS = 3000
# An example's passage: long enough to hold several names, short because the examples are
# repeated in every extraction call (the packaged example is ~60 tokens of text, ~550 in all).
EXAMPLE_TOKENS = 200
EXAMPLE_MAX_TOKENS = 1500
EXAMPLE_MAX_ENTITIES = 12
EXAMPLE_MAX_RELATIONSHIPS = 15
MIN_EXAMPLE_ENTITIES = 2  # an example with fewer grounded entities teaches little; another passage is tried
# Types that carry no meaning: what a small model answers when it has no better idea.
GENERIC_TYPES = {"unknown", "entity", "entities", "thing", "things", "none", "misc", "miscellaneous", "n_a",
                 "na", "other", "others", "other_entity", "实体", "其他", "未知", "その他", "不明"}
EXAMPLE_LABELS = {"en": ("Example text:", "Answer:"), "zh": ("示例文本：", "回答：")}
# A line of our own at the top of extract_graph.txt; a rerun replaces it rather than adding another.
DOMAIN_LINES = {"en": "Domain of the documents: {domain}.", "zh": "文档领域：{domain}。"}
STEP_TYPES, STEP_EXAMPLES = "tune_types", "tune_examples"


class TuneError(ValueError):
    """The model's answers gave nothing usable (no type, no grounded example); nothing is written."""


class TypeProposal(BaseModel):
    domain: str
    entity_types: list[str] = Field(max_length=MAX_TYPES)


@dataclass
class Sample:
    units: pd.DataFrame  # id, text, document_id, n_tokens, chunk_index: the sampled units, in sampling order
    language: str
    documents: int
    text_units: int


@dataclass
class Example:
    unit_id: str
    text: str  # the passage as shown in the example (trimmed)
    entities: list[dict[str, Any]]
    relationships: list[dict[str, Any]]
    dropped: Counter = field(default_factory=Counter)  # why records of the answer were not kept


@dataclass
class FileChange:
    path: Path
    label: str  # relative to the project root
    old: str  # the text in effect today ("" for a new file)
    new: str
    old_source: str  # where `old` comes from: the project's file, the packaged prompt, or nothing

    def diff(self) -> str:
        before = f"a/{self.label}" if self.old_source == "project" else (
            f"{self.label} (packaged default)" if self.old_source == "packaged" else "/dev/null")
        return "".join(difflib.unified_diff(self.old.splitlines(keepends=True), _ending(self.new).splitlines(keepends=True),
                                            fromfile=before, tofile=f"b/{self.label}"))


@dataclass
class TunePlan:
    root: Path
    language: str
    domain: str
    entity_types: list[str]
    previous_types: list[str]
    examples: list[Example]
    skipped_examples: list[tuple[str, str]]  # (text unit id, why) of passages whose example was not kept
    changes: list[FileChange]
    notes: list[str]
    sample: Sample
    refused_types: list[tuple[str, str]] = field(default_factory=list)  # (what the model wrote, why)


@dataclass
class TuneEstimate:
    documents: int
    text_units: int
    sampled: int
    language: str
    calls: int
    max_calls: int  # when examples fail their checks, further passages are tried
    prompt_tokens: int
    completion_tokens: int
    basis: str


# -- the sample ----------------------------------------------------------------------------------

def sample_units(units: pd.DataFrame, n: int, seed: int = SEED) -> pd.DataFrame:
    """`n` units, taken in turn from the documents (in a seeded order), each document's in a
    seeded order with short units (a document's tail) last; all units if there are no more."""
    rng = random.Random(seed)
    by_doc: dict[str, list[int]] = {}
    for i, d in enumerate(units["document_id"]):
        by_doc.setdefault(str(d), []).append(i)
    longest = int(units["n_tokens"].max()) if len(units) else 0
    short = min(50, longest // 2)
    order = list(by_doc)
    rng.shuffle(order)
    for d in order:
        rng.shuffle(by_doc[d])
        by_doc[d].sort(key=lambda i: int(units["n_tokens"].iloc[i]) < short)  # stable: keeps the shuffle
    picked: list[int] = []
    while len(picked) < min(n, len(units)):
        for d in order:
            if by_doc[d] and len(picked) < n:
                picked.append(by_doc[d].pop(0))
    return units.iloc[picked].reset_index(drop=True)


def load_sample(settings: Settings, n: int = DEFAULT_SAMPLE, seed: int = SEED,
                warn: Callable[[str], None] = lambda m: None) -> Sample:
    """The project's documents cut into text units as `sensegraph index` cuts them, and a sample.
    Raises documents.InputError when input/ holds no document."""
    docs = documents.load_documents(settings, warn=warn)
    units = text_units.make_text_units(docs, size=settings.chunks.size, overlap=settings.chunks.overlap)
    language = resolve_language(settings.language, docs["text"])
    return Sample(sample_units(units, n, seed), language, len(docs), len(units))


def _passage_budget(settings: Settings, n: int) -> int:
    total = SAMPLE_TOKENS
    if settings.chat.provider == "local":  # instructions and the answer share the slot
        total = max(400, min(total, settings.local.context_per_slot - 700 - PROPOSE_MAX_TOKENS))
    return max(50, total // max(1, n))


def proposal_messages(sample: Sample, settings: Settings) -> list[dict[str, str]]:
    per = _passage_budget(settings, len(sample.units))
    label = "Passage" if sample.language != "zh" else "段落"
    passages = "\n\n".join(f"{label} {i}:\n{truncate(str(t).strip(), per)}"
                           for i, t in enumerate(sample.units["text"], 1))
    template = load_prompt("prompt_tune_types", sample.language, settings.root)
    return to_messages(render(template, max_types=MAX_TYPES, passages=passages))


# -- checking what the model proposes ------------------------------------------------------------

def _singular(key: str) -> str:
    for plural, single in (("ies", "y"), ("sses", "ss"), ("s", "")):
        if key.endswith(plural) and not key.endswith("ss") and len(key) > len(plural) + 2:
            return key[: -len(plural)] + single
    return key


# The type rule. A type names a kind of thing ("person", "work of art", "chemical_compound",
# 人物): one to three words of letters (a type in Chinese or Japanese script, which has no spaces:
# one to six characters), none of them a function word, except "of" between two words. What a
# model writes instead of a type, a phrase ("the_main_people_in_the_story"), two types in one
# ("person/organization", "person or group") or a note ("e.g. drug"), breaks one of these.
MAX_TYPE_WORDS = 3
MAX_TYPE_CHARS = 6  # in a script written without spaces
_TYPE_SEPARATORS = re.compile(r"[\s_\-]+")
_UNSPACED = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]")
_NOT_LETTER = re.compile(r"[\W\d_]")
FUNCTION_WORDS = frozenset({
    # articles and determiners
    "a", "an", "the", "some", "any", "each", "every", "all", "such",
    # pronouns
    "i", "me", "my", "you", "your", "he", "him", "his", "she", "her", "it", "its", "we", "us", "our", "they",
    "them", "their", "this", "that", "these", "those", "who", "whom", "whose", "which", "what", "where", "when",
    # conjunctions
    "and", "or", "nor", "but", "vs", "versus", "if",
    # prepositions ("of" only between two words, as in "work of art")
    "of", "in", "on", "at", "by", "for", "from", "to", "with", "within", "without", "about", "into", "onto",
    "over", "under", "between", "among", "as", "than", "like", "per", "via", "through", "during",
    # the verbs of a clause
    "is", "are", "was", "were", "be", "been", "being", "has", "have", "had",
})


def _type_key(raw: str) -> tuple[str, str]:
    """(the type as an identifier, "") or ("", why it is refused), by the type rule."""
    text = str(raw).strip()
    words = [w for w in _TYPE_SEPARATORS.split(text.casefold()) if w]
    if not words:
        return "", "empty"
    for w in words:
        if bad := _NOT_LETTER.search(w):
            return "", f"has {bad.group(0)!r}: a type is letters only, words joined by spaces, '_' or '-'"
    key = "_".join(words)
    if key in GENERIC_TYPES:
        return "", "generic: it says nothing about the kind of thing"
    if _UNSPACED.search(text):
        chars = sum(len(w) for w in words)
        if chars > MAX_TYPE_CHARS:
            return "", f"{chars} characters (at most {MAX_TYPE_CHARS}): a phrase, not a type"
        return key, ""
    if len(words) > MAX_TYPE_WORDS:
        return "", f"{len(words)} words (at most {MAX_TYPE_WORDS}): a phrase, not a type"
    for i, w in enumerate(words):
        if w in FUNCTION_WORDS and not (w == "of" and 0 < i < len(words) - 1):
            return "", f"has {w!r}: a type names a kind of thing, not a phrase"
    return key, ""


def check_types(raw: list[str], cap: int = MAX_TYPES) -> tuple[list[str], list[tuple[str, str]]]:
    """(the usable types, as lowercase identifiers with words joined by "_", at most `cap` in the
    model's order; the refused ones as (what the model wrote, why)). A type is refused by the
    type rule, or as a repeat (also the plural) of an earlier one, or beyond the cap."""
    out: list[str] = []
    refused: list[tuple[str, str]] = []
    seen: dict[str, str] = {}  # a key and its singular -> the kept type it repeats
    for t in raw:
        key, why = _type_key(t)
        if key and (key in seen or _singular(key) in seen):
            why = f"repeats {seen.get(key) or seen[_singular(key)]}"
        elif key and len(out) == cap:
            why = f"beyond the first {cap} types"
        if why:
            refused.append((str(t), why))
            continue
        seen[key] = seen[_singular(key)] = key
        out.append(key)
    return out, refused


def clean_domain(raw: str) -> str:
    """One line, no braces (the prompts' placeholders), no closing stop, at most ~100 characters."""
    text = " ".join(str(raw).replace("{", "").replace("}", "").replace('"""', "").split())
    text = text.strip(" \"'“”「」").rstrip(".。")
    if len(text) > 100:
        text = text[:100].rsplit(" ", 1)[0] if " " in text[:100] else text[:100]
    return text


async def propose(llm: ChatClient, sample: Sample,
                  settings: Settings) -> tuple[str, list[str], list[tuple[str, str]]]:
    """(domain, entity types, refused types with why) from one call over the sample. Raises
    TuneError if no proposed type is usable."""
    answer = await llm.structured(proposal_messages(sample, settings), TypeProposal, step=STEP_TYPES,
                                  item="types", max_tokens=PROPOSE_MAX_TOKENS)
    types, refused = check_types(answer.entity_types)
    if not types:
        why = "; ".join(f"{raw!r}: {reason}" for raw, reason in refused) or "an empty list"
        raise TuneError(f"the chat model proposed no usable entity type ({why}); nothing written")
    return clean_domain(answer.domain), types, refused


# -- few-shot examples ---------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s|$)|[。！？][”’」』）]*")
# A stop after these (or after an initial, "J.") ends no sentence.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "sr", "jr", "gen", "col", "capt", "lt", "sgt", "mt",
                  "no", "vs", "etc", "inc", "co", "ltd", "corp", "dept", "fig", "e.g", "i.e"}


def _sentence_ends(text: str) -> list[int]:
    ends = []
    for m in _SENTENCE_END.finditer(text):
        word = re.search(r"([\w.]+)\W*$", text[: m.start() + 1])
        last = word.group(1).rstrip(".").casefold() if word else ""
        if m.group(0).startswith(".") and (last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())):
            continue
        ends.append(m.end())
    return ends


def example_passage(text: str, max_tokens: int = EXAMPLE_TOKENS, mid_document: bool = False) -> str:
    """The passage an example shows: at most `max_tokens`, ending at a sentence end and (for a
    unit that starts inside its document, `mid_document`) starting after one, when that keeps
    most of it. Triple quotes would close the example's quoting, so they become one."""
    text = str(text).replace('"""', '"').strip()
    if mid_document:
        first = next(iter(_sentence_ends(text)), None)
        if first is not None and first < len(text) * 0.3 and text[first:].strip():
            text = text[first:].strip()
    cut = truncate(text, max_tokens)
    if cut != text:
        ends = _sentence_ends(cut)
        if ends and ends[-1] >= len(cut) * 0.4:
            cut = cut[: ends[-1]]
    return cut.strip()


def example_messages(passage: str, domain: str, types: list[str], language: str,
                     root: str | Path | None) -> list[dict[str, str]]:
    template = load_prompt("prompt_tune_examples", language, root)
    fallback = "这组文档的主题" if language == "zh" else "the subject of the collection"
    return to_messages(render(template, domain=domain or fallback, entity_types=", ".join(types), text=passage))


def _has_letter(name: str) -> bool:
    return re.search(r"[^\W\d_]", name) is not None


def _occurs(key: str, text_key: str) -> bool:
    """`key` in `text_key` (both normalised), as whole words where the name begins or ends with a
    letter or digit of a spaced script ("Ann" is not in "Annabel"); plain substring for Chinese."""
    def edge(ch: str) -> str:
        return r"\w" if ch.isalnum() and ord(ch) < 0x2E80 else ""
    left = f"(?<!{edge(key[0])})" if edge(key[0]) else ""
    right = f"(?!{edge(key[-1])})" if edge(key[-1]) else ""
    return re.search(left + re.escape(key) + right, text_key) is not None


def ground_example(answer: Any, passage: str, types: list[str]) -> tuple[list[dict], list[dict], Counter]:
    """The answer's entities whose name is written in `passage` with a type among `types`
    (variants mapped as extraction maps them), and the relationships between those; a Counter
    of what was dropped and why."""
    map_type = type_mapper(types)
    allowed = set(types)
    text_key = normalize_name(passage)
    dropped: Counter = Counter()
    entities: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for e in answer.entities:
        name = clean_name(e.name)
        key = normalize_name(name)
        if not name or '"' in name or "\\" in name:
            dropped["unusable_name"] += 1  # the example names are read back by a regex on "..."
        elif not _has_letter(name):
            dropped["not_a_name"] += 1  # dates, numbers, amounts
        elif not _occurs(key, text_key):
            dropped["not_in_passage"] += 1
        elif map_type(e.type)[0] not in allowed:
            dropped["type_not_proposed"] += 1
        elif key in names:
            dropped["duplicate"] += 1
        elif not e.description.strip():
            dropped["no_description"] += 1
        else:
            names[key] = name
            entities.append({"name": name, "type": map_type(e.type)[0], "description": " ".join(e.description.split())})
    relationships: list[dict[str, Any]] = []
    pairs: set[tuple[str, str]] = set()
    for r in answer.relationships:
        s, t = normalize_name(r.source), normalize_name(r.target)
        if s not in names or t not in names:
            dropped["relationship_to_dropped_name"] += 1
        elif s == t:
            dropped["self_loop"] += 1
        elif (s, t) in pairs or not r.description.strip():
            dropped["relationship_duplicate_or_empty"] += 1
        else:
            pairs.add((s, t))
            relationships.append({"source": names[s], "target": names[t],
                                  "description": " ".join(r.description.split()),
                                  "strength": min(10, max(1, int(r.strength)))})
    return entities, relationships, dropped


async def write_example(llm: ChatClient, unit_id: str, passage: str, domain: str, types: list[str],
                        language: str, settings: Settings) -> Example:
    schema = graph_schema(types, EXAMPLE_MAX_ENTITIES, EXAMPLE_MAX_RELATIONSHIPS)
    answer = await llm.structured(example_messages(passage, domain, types, language, settings.root), schema,
                                  step=STEP_EXAMPLES, item=unit_id,
                                  max_tokens=min(settings.extraction.max_tokens, EXAMPLE_MAX_TOKENS))
    entities, relationships, dropped = ground_example(answer, passage, types)
    return Example(unit_id, passage, entities, relationships, dropped)


def render_examples(examples: list[Example], language: str) -> str:
    """examples_graph.txt: the packaged file's layout, one block per example."""
    head, answer = EXAMPLE_LABELS.get(language, EXAMPLE_LABELS["en"])

    def listing(key: str, rows: list[dict[str, Any]], close: str) -> str:
        if not rows:
            return f'"{key}": []{close}'
        body = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in rows)
        return f'"{key}": [\n{body}\n ]{close}'

    blocks = [f'{head}\n"""\n{ex.text}\n"""\n{answer}\n'
              f'{{{listing("entities", ex.entities, ",")}\n {listing("relationships", ex.relationships, "}")}'
              for ex in examples]
    return "\n\n".join(blocks) + "\n"


def with_domain(template: str, domain: str, language: str) -> str | None:
    """extract_graph.txt with a first line naming the domain (replacing one written earlier), or
    None when the template lacks its placeholders (a user's own prompt is left alone)."""
    if not domain or not all(p in template for p in ("{entity_types}", "{examples}", "{text}")):
        return None
    line = DOMAIN_LINES.get(language, DOMAIN_LINES["en"])
    prefix = line.split("{domain}")[0]
    body = template
    first, _, rest = body.partition("\n")
    if first.startswith(prefix):
        body = rest.lstrip("\n")
    return line.format(domain=domain) + "\n\n" + body


# -- settings.yaml ---------------------------------------------------------------------------------

_SECTION = re.compile(r"^extraction\s*:\s*(?:#.*)?$")
_KEY = re.compile(r"^(?P<indent>[ \t]+)entity_types\s*:(?P<rest>.*)$")
_ITEM = re.compile(r"^(?P<indent>[ \t]*)-(?:[ \t]+(?P<rest>.*))?$")
_QUOTED = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^']|'')*'""")


@dataclass
class SettingsEdit:
    """settings.yaml with new entity types, and what became of its comments."""

    text: str
    rewritten: bool  # the lines could not be edited: the YAML was written anew from its parsed form
    dropped_comments: list[str]  # comments of the old text that `text` lacks (all of them when rewritten)
    commented_out: list[str]  # types no longer listed whose line had a comment: that line kept, commented out


def _scalar(t: str) -> str:
    plain = not re.search(r"[\s,\[\]{}#:&*!|>'\"%@`]", t)
    try:
        plain = plain and yaml.safe_load(t) == t  # "yes", "null", "2024" would change type
    except yaml.YAMLError:
        plain = False
    return t if plain else json.dumps(t, ensure_ascii=False)


def _comment_start(line: str) -> int | None:
    """Where the comment of one line of YAML begins: a "#" at the start or after a space, outside
    quotes (a quote opens only where a scalar can start, so the "'" of "it's" opens none)."""
    quote, i = "", 0
    while i < len(line):
        ch = line[i]
        if quote:
            if quote == '"' and ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""  # '' inside single quotes closes and reopens: the same for this scan
        elif ch in "'\"" and (i == 0 or line[i - 1] in " \t[{,:-?"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return i
        i += 1
    return None


def _split_comment(rest: str) -> tuple[str, str]:
    """(value, comment) of the text after a key; the comment keeps the spaces before it (its alignment)."""
    at = _comment_start(rest)
    if at is None:
        return rest, ""
    value = rest[:at].rstrip(" \t")
    return value, rest[len(value):]


def yaml_comments(text: str) -> list[str]:
    """The comments of a YAML text, each from its "#" to the end of its line, in order. Read line
    by line, so a "#" inside a block scalar counts too; it is found in both texts compared, so
    it never shows as dropped while its line is unchanged."""
    found = []
    for line in text.splitlines():
        at = _comment_start(line)
        if at is not None:
            found.append(line[at:].strip())
    return found


def _missing(old: list[str], new: list[str]) -> list[str]:
    """The comments of `old` not found in `new`, each matched once; a comment kept inside a
    longer one (the commented-out item "# - geo  # places") counts as kept."""
    left = list(new)
    missing = []
    for c in old:
        hit = next((i for i, n in enumerate(left) if c in n), None)
        if hit is None:
            missing.append(c)
        else:
            left.pop(hit)
    return missing


def _flow_end(lines: list[str], j: int, value_at: int, end: int) -> int | None:
    """The line where the flow list that starts on line `j` at column `value_at` closes, or None
    if it does not close within the section."""
    depth = 0
    for i in range(j, end):
        line = lines[i].rstrip("\r\n")[value_at if i == j else 0:]
        at = _comment_start(line)
        code = _QUOTED.sub("", line if at is None else line[:at])
        depth += code.count("[") + code.count("{") - code.count("]") - code.count("}")
        if depth <= 0:
            return i
    return None


def _replace_flow(lines: list[str], j: int, close: int, key_line: str, eol: str) -> None:
    """Lines j..close (a flow list) become `key_line`; the comments of the list's further lines
    stay, each on a line of its own in the column it had."""
    kept = []
    for line in lines[j + 1: close + 1]:
        body = line.rstrip("\r\n")
        at = _comment_start(body)
        if at is not None:
            kept.append(" " * at + body[at:] + eol)
    lines[j: close + 1] = [key_line, *kept]


@dataclass
class _Item:
    leading: list[str]  # the comment and blank lines just above the item (what describes it)
    line: str
    indent: str
    value: str
    comment: str


def _replace_block(lines: list[str], j: int, end: int, key_indent: str, types: list[str], key_line: str,
                   eol: str) -> list[str] | None:
    """The block list under the key on line `j` made to list `types`, in that order, with every
    comment kept: a type still listed keeps its line (comment included) and the comment lines
    above it; a type no longer listed goes, unless its line has a comment, and then the line
    stays, commented out. Comment lines after the last item belong to what follows and are not
    touched; a key with no item (a null value) gets the flow list. Returns the old types whose
    lines were commented out, or None for a layout this does not handle (a nested value, an
    item over several lines)."""
    items: list[_Item] = []
    pending: list[str] = []
    k = j + 1
    while k < end:
        body = lines[k].rstrip("\r\n")
        if not body.strip() or body.lstrip().startswith("#"):
            pending.append(lines[k])
            k += 1
            continue
        indent = re.match(r"[ \t]*", body).group(0)  # type: ignore[union-attr]
        m = _ITEM.match(body)
        if m is None or len(indent) < len(key_indent):
            deeper = len(indent) > len(items[0].indent if items else key_indent)
            if deeper:
                return None  # an item continued on the next line, or a mapping under the key
            break  # the next key
        if items and indent != items[0].indent:
            return None
        value_text, comment = _split_comment(m.group("rest") or "")
        try:
            value = yaml.safe_load(value_text) if value_text.strip() else None
        except yaml.YAMLError:
            return None
        if not isinstance(value, str):
            return None
        line = lines[k] if lines[k].endswith(("\n", "\r")) else lines[k] + eol
        items.append(_Item(pending, line, indent, value, comment))
        pending = []
        k += 1
    if not items:
        lines[j] = key_line
        return []
    region_end = j + 1 + sum(len(it.leading) + 1 for it in items)
    first: dict[str, _Item] = {}
    for it in items:
        first.setdefault(it.value, it)
    wanted = set(types)
    out: list[str] = []
    placed: set[str] = set()
    commented_out: list[str] = []

    def place(t: str) -> None:
        it = first.get(t)
        out.extend([*it.leading, it.line] if it else [f"{items[0].indent}- {_scalar(t)}{eol}"])
        placed.add(t)

    pos = 0  # the next of `types` to place
    for it in items:
        if it.value in wanted and first[it.value] is it:
            if it.value in placed:
                continue  # placed earlier than its old position, with the comment lines above it
            while types[pos] != it.value:
                if types[pos] not in placed:
                    place(types[pos])
                pos += 1
            place(it.value)
            pos += 1
        else:  # no longer listed (or listed twice): the comment lines above it stay where they were
            out.extend(it.leading)
            if it.comment:
                cut = len(it.indent)
                out.append(it.line[:cut] + "# " + it.line[cut:])
                commented_out.append(it.value)
    for t in types[pos:]:
        if t not in placed:
            place(t)
    lines[j + 1: region_end] = out
    return commented_out


def _edited(text: str, types: list[str]) -> tuple[str, list[str]] | None:
    """(settings.yaml with extraction.entity_types set to `types` by editing its lines, the old
    types kept on commented-out lines), or None for a layout this does not handle. A flow list
    stays a flow list, a block list a block list, and no comment is removed."""
    flow = "[" + ", ".join(_scalar(t) for t in types) + "]"
    nl = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if _SECTION.match(ln.rstrip("\r\n"))), None)
    if start is None:
        if re.search(r"^extraction\s*:", text, re.M):
            return None  # e.g. a flow mapping on one line
        body = text if not text or text.endswith("\n") else text + nl
        return body + (nl if body.strip() else "") + f"extraction:{nl}  entity_types: {flow}{nl}", []
    if not lines[start].endswith("\n"):
        lines[start] += nl
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t" or lines[end].startswith("#")):
        end += 1
    body = [ln for ln in lines[start + 1:end] if ln.strip() and ln[0] in " \t" and not ln.lstrip().startswith("#")]
    indent = re.match(r"[ \t]+", body[0]).group(0) if body else "  "  # type: ignore[union-attr]
    for j in range(start + 1, end):
        line = lines[j].rstrip("\r\n")
        m = _KEY.match(line)
        if not m or m.group("indent") != indent:
            continue
        value, comment = _split_comment(m.group("rest"))
        eol = lines[j][len(line):] or nl
        key_line = f"{indent}entity_types: {flow}{comment}{eol}"
        if value.strip().startswith("["):
            close = _flow_end(lines, j, m.start("rest"), end)
            if close is None:
                return None
            _replace_flow(lines, j, close, key_line, eol)
            return "".join(lines), []
        if value.strip():
            return None
        commented_out = _replace_block(lines, j, end, indent, types, key_line, eol)
        return None if commented_out is None else ("".join(lines), commented_out)
    lines.insert(start + 1, f"{indent}entity_types: {flow}{nl}")
    return "".join(lines), []


def set_entity_types(text: str, types: list[str]) -> SettingsEdit:
    """settings.yaml text with extraction.entity_types = `types`, and what became of its comments.

    The lines are edited in place; the result is accepted only if it parses to the old settings
    with just that key changed. Otherwise (a layout the edit does not know) the YAML is
    rewritten from its parsed form, which keeps every setting but loses the comments. Either
    way `dropped_comments` is measured by comparing the two texts, not assumed."""
    old = yaml.safe_load(text) if text.strip() else {}
    old = old or {}
    if not isinstance(old, dict):
        raise TuneError(f"{SETTINGS_FILE} must be a mapping of sections")
    expected = copy.deepcopy(old)
    if not isinstance(expected.get("extraction"), dict):
        expected["extraction"] = {}
    expected["extraction"]["entity_types"] = list(types)
    edited = _edited(text, list(types))
    if edited is not None:
        new_text, commented_out = edited
        try:
            ok = yaml.safe_load(new_text) == expected
        except yaml.YAMLError:
            ok = False
        if ok:
            return SettingsEdit(new_text, False, _missing(yaml_comments(text), yaml_comments(new_text)),
                                commented_out)
    return SettingsEdit(yaml.safe_dump(expected, sort_keys=False, allow_unicode=True), True,
                        yaml_comments(text), [])


# -- the whole run -------------------------------------------------------------------------------

def _ending(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _prompt_change(settings: Settings, name: str, language: str, new: str) -> FileChange:
    folder = prompt_language(language)  # where the index reads this language's prompts (Japanese: en/)
    path = Path(settings.root) / "prompts" / folder / f"{name}.txt"
    label = f"prompts/{folder}/{name}.txt"
    if path.exists():
        return FileChange(path, label, path.read_text(encoding="utf-8"), new, "project")
    packaged = PACKAGE_DIR / folder / f"{name}.txt"
    return FileChange(path, label, packaged.read_text(encoding="utf-8") if packaged.exists() else "", new, "packaged")


async def tune(settings: Settings, llm: ChatClient, *, sample: int = DEFAULT_SAMPLE,
               examples: int = DEFAULT_EXAMPLES, seed: int = SEED,
               warn: Callable[[str], None] = lambda m: None) -> TunePlan:
    """Propose the domain, entity types and few-shot examples for the project; return the plan
    (nothing written). Raises documents.InputError (no input), TuneError (no usable answer),
    LLMError (a call failed after its retries; its finished calls are cached for the rerun)."""
    s = load_sample(settings, sample, seed, warn)
    domain, types, refused = await propose(llm, s, settings)
    candidates = [(str(u.id), example_passage(u.text, mid_document=int(u.chunk_index) > 0))
                  for u in s.units.itertuples()]
    candidates = [(uid, text) for uid, text in candidates if text]
    kept: list[Example] = []
    skipped: list[tuple[str, str]] = []
    tried = 0
    # Passages whose example fails its checks are replaced by the next sampled ones, up to twice
    # as many calls as examples wanted: a small model may ground nothing in one passage.
    while len(kept) < examples and tried < min(len(candidates), 2 * examples):
        batch = candidates[tried: tried + min(examples - len(kept), 2 * examples - tried)]
        tried += len(batch)
        results = await asyncio.gather(*(write_example(llm, uid, text, domain, types, s.language, settings)
                                         for uid, text in batch), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, LLMError):
                raise r
        errors = [r for r in results if isinstance(r, LLMError)]
        if errors:
            raise next((e for e in errors if isinstance(e, BudgetReached)), errors[0])
        for ex in results:
            assert isinstance(ex, Example)
            if len(ex.entities) >= MIN_EXAMPLE_ENTITIES:
                kept.append(ex)
            else:
                why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in ex.dropped.items()) or "no entity"
                skipped.append((ex.unit_id, f"{len(ex.entities)} grounded entities ({why})"))
    if not kept:
        raise TuneError("the chat model wrote no usable few-shot example: "
                        + "; ".join(f"passage {uid}: {why}" for uid, why in skipped)
                        + ". Nothing written; try a larger --sample or a stronger chat model")
    order = {uid: i for i, (uid, _) in enumerate(candidates)}
    kept.sort(key=lambda ex: order[ex.unit_id])
    return _plan(settings, s, domain, types, kept, skipped, refused)


def _plan(settings: Settings, s: Sample, domain: str, types: list[str], kept: list[Example],
          skipped: list[tuple[str, str]], refused: list[tuple[str, str]]) -> TunePlan:
    lang, folder = s.language, prompt_language(s.language)
    notes: list[str] = [note] if (note := language_note(lang)) else []
    examples_change = _prompt_change(settings, "examples_graph", lang, render_examples(kept, lang))
    changes = [examples_change]
    before, after = count_tokens(examples_change.old), count_tokens(examples_change.new)
    notes.append(f"few-shot examples: {after:,} tokens (were {before:,}), in the prompt of every extraction call")
    current = load_prompt("extract_graph", lang, settings.root)
    adapted = with_domain(current, domain, lang)
    if adapted is None:
        notes.append(f"prompts/{folder}/extract_graph.txt lacks the packaged placeholders; its wording is left as it is")
    else:
        extract_change = _prompt_change(settings, "extract_graph", lang, adapted)
        changes.append(extract_change)
        if extract_change.old_source == "packaged" and extract_change.old != extract_change.new:
            notes.append(f"prompts/{folder}/extract_graph.txt becomes the project's own copy: later changes to "
                         "sensegraph's packaged prompt will not reach it (delete it to use the packaged one)")
    settings_path = Path(settings.root) / SETTINGS_FILE
    old_yaml = settings_path.read_text(encoding="utf-8") if settings_path.exists() else ""
    edit = set_entity_types(old_yaml, types)
    changes.append(FileChange(settings_path, SETTINGS_FILE, old_yaml, edit.text,
                              "project" if settings_path.exists() else "none"))
    lost = "; ".join(edit.dropped_comments[:10]) + (" …" if len(edit.dropped_comments) > 10 else "")
    if edit.rewritten and edit.dropped_comments:
        notes.append(f"{SETTINGS_FILE} is rewritten from its parsed form (the layout of extraction.entity_types "
                     f"is not one the edit handles): its {len(edit.dropped_comments)} comment(s) are lost: {lost}")
    elif edit.dropped_comments:
        notes.append(f"{SETTINGS_FILE}: {len(edit.dropped_comments)} comment(s) are lost: {lost}")
    if edit.commented_out:
        notes.append(f"{SETTINGS_FILE}: entity types no longer listed keep their comment on a commented-out "
                     f"line: {', '.join(edit.commented_out)}")
    if os.environ.get("SENSEGRAPH_EXTRACTION__ENTITY_TYPES"):
        notes.append("SENSEGRAPH_EXTRACTION__ENTITY_TYPES is set in the environment and overrides settings.yaml")
    if settings.index_method == "lazy":
        notes.append("index_method is lazy: these prompts apply to the standard index "
                     "(`sensegraph index --method standard`)")
    # A prompt equal to the one in effect is not written (the packaged one stays in use).
    changed = [c for c in changes if c.old_source == "none" or _ending(c.old) != _ending(c.new)]
    return TunePlan(Path(settings.root), lang, domain, types, list(settings.extraction.entity_types), kept, skipped,
                    changed, notes, s, refused)


def write_changes(plan: TunePlan) -> list[Path]:
    """Write the plan's files (each atomically); the paths written."""
    written = []
    for c in plan.changes:
        c.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = c.path.with_name(c.path.name + ".tmp")
        tmp.write_text(_ending(c.new), encoding="utf-8")
        os.replace(tmp, c.path)
        written.append(c.path)
    return written


def estimate(settings: Settings, *, sample: int = DEFAULT_SAMPLE, examples: int = DEFAULT_EXAMPLES,
             seed: int = SEED, warn: Callable[[str], None] = lambda m: None) -> TuneEstimate:
    """Calls and tokens of a prompt-tune run, calling nothing. The proposal prompt is counted
    exactly; an example prompt from its passage (the domain and types are not known yet, the
    current types stand in for them); answers from the extraction ratios of index --dry-run."""
    s = load_sample(settings, sample, seed, warn)
    prompt = sum(count_tokens(m["content"]) for m in proposal_messages(s, settings))
    completion = 20 + 8 * MAX_TYPES
    ratio = RATIOS["local" if settings.chat.provider == "local" else "hosted"]["completion_per_input_token"]
    passages = [example_passage(u.text, mid_document=int(u.chunk_index) > 0) for u in s.units.itertuples()]
    passages = [p for p in passages if p][:examples]
    for p in passages:
        messages = example_messages(p, "", list(settings.extraction.entity_types), s.language, settings.root)
        prompt += sum(count_tokens(m["content"]) for m in messages) + 20
        completion += min(settings.extraction.max_tokens, EXAMPLE_MAX_TOKENS, int(count_tokens(p) * ratio) + 50)
    n_examples = len(passages)
    retries = min(len(s.units), 2 * examples) - n_examples
    return TuneEstimate(s.documents, s.text_units, len(s.units), s.language, 1 + n_examples,
                        1 + n_examples + max(0, retries), prompt, completion,
                        "prompts counted; answers estimated from measured extraction ratios")
