"""Paper step 2.2: text units -> element instances (entities, relationships, optional claims).

One JSON-schema structured call per text unit, then up to `max_gleanings` gleaning rounds. Each
round first asks a yes/no "was anything missed?" question; on yes the model is asked, in the
same conversation, for the *additional* records only. Every record of every round is kept as its
own row (Microsoft concatenates gleaned text without a separator and loses records), and gleaned
claims are kept too (Microsoft pays for them and throws them away).

Entity types are an enum built from the settings at run time, so a server with constrained
decoding cannot answer with a type the user did not configure. A server without it (JSON mode,
many Ollama/vLLM setups) may answer "ORGANISATION" or "VEHICLE": such a record is kept, its type
mapped to the nearest configured type or else to the catch-all (`catch_all_type`), and both are
counted in the stats. Retrying would not help: a retry resends the identical request. The prompt
asks the model to write in the language of the text; nothing here forces English.

A call that fails after its retries never discards what the unit already gave: a failed gleaning
round (or its yes/no check) keeps the first pass and the earlier rounds, and the unit is listed
in `failed` so the pipeline reports it and a rerun extracts it again from scratch (its finished
calls come from the cache, so the rerun replaces the partial records and equals a clean run).
"""
from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field, create_model, field_validator

from ..config import Settings
from ..llm import ChatClient, LLMError
from ..prompts import PACKAGE_DIR, load_prompt, prompt_language, render, to_messages
from .grounding import UnitText, clause, fold, generic, grounded, value_type
from .windows import run_windowed, window_of

ENTITY_COLUMNS = ["title", "type", "description", "text_unit_id", "round"]
RELATIONSHIP_COLUMNS = ["source", "target", "description", "strength", "text_unit_id", "round"]
CLAIM_COLUMNS = ["subject", "object", "type", "status", "start_date", "end_date", "description",
                 "source_text", "text_unit_id", "round"]

# A yes/no answer is a handful of tokens; a small cap stops a small model from rambling.
CHECK_MAX_TOKENS = 20
# difflib ratio from which an unknown type counts as a misspelling of a configured one:
# "organisation"/"organization" is 0.92, "personal"/"person" 0.86, "location"/"organization" 0.6.
TYPE_SIMILARITY = 0.8
# {description_rule} of extract_graph.txt, by extraction.descriptions and prompt language.
DESCRIPTION_RULES = {
    "en": {"full": "Descriptions are complete, self-contained sentences.",
           "short": "Keep descriptions short: an entity's description says what it is in a few words "
                    "(\"American film actress\", \"port city in the Netherlands\"); a relationship's description is "
                    "one sentence of at most 12 words."},
    "zh": {"full": "描述使用完整、可独立理解的句子。",
           "short": "描述要简短：实体的描述用几个词说明它是什么（如“美国电影演员”“荷兰的港口城市”）；"
                    "关系的描述用一句不超过25个字的话。"},
}
CLAIM_STATUSES = ("TRUE", "FALSE", "SUSPECTED")


@dataclass
class ExtractionResult:
    entities: pd.DataFrame       # title, type, description, text_unit_id, round (one row per instance)
    relationships: pd.DataFrame  # source, target, description, strength (1-10), text_unit_id, round
    claims: pd.DataFrame         # subject, object, type, status, start_date, end_date, description,
                                 # source_text, text_unit_id, round
    failed: list[str]            # text unit ids whose extraction failed (or is incomplete) after all retries
    self_loops: int = 0          # relationships dropped because source == target after normalisation
    empty_names: int = 0         # records dropped because a name (or endpoint) was empty
    stats: dict[str, int] = field(default_factory=dict)  # counts for the pipeline report (see extract_graph)
    # spaCy's names in the units (missed_names.SPAN_COLUMNS) when found where the units were
    # extracted (Ray Data's workers); None: the missed-names pass finds them itself.
    name_spans: pd.DataFrame | None = None


# -- schemas --------------------------------------------------------------------------------------

class GleanCheck(BaseModel):
    """Answer to "were any entities or relationships missed?"."""
    missed: bool


class ClaimGleanCheck(BaseModel):
    """Answer to "were any claims missed?" (a separate name so logs and tests can tell them apart)."""
    missed: bool


class Claim(BaseModel):
    subject: str
    object: str  # "" when the claim has no object
    type: str
    status: Literal["TRUE", "FALSE", "SUSPECTED"]
    start_date: str  # ISO-8601 or ""
    end_date: str    # ISO-8601 or ""
    description: str
    source_text: str

    @field_validator("status", mode="before")
    @classmethod
    def _status_case(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) else v


class ExtractedClaims(BaseModel):
    claims: list[Claim]


def normalize_name(name: str) -> str:
    """The merge key of a name: as every comparison sees it (grounding.fold: whitespace
    collapsed, NFKC, accents and case folded, traditional Chinese as simplified, abbreviation
    dots and title marks dropped), so "Zürich" and "Zurich", 紅樓夢 and 《红楼梦》 are one entity."""
    return fold(str(name))


def clean_name(name: str) -> str:
    """A name as displayed: trimmed with inner whitespace collapsed, case kept."""
    return " ".join(str(name).split())


def _configured(entity_types: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.strip() for t in entity_types if t.strip()))


def _type_key(t: str) -> str:
    return " ".join(t.replace("_", " ").replace("-", " ").split()).casefold()


def _singulars(key: str) -> list[str]:
    """English singular forms a plural key may have ("companies", "addresses", "places")."""
    return [key[:-len(plural)] + single for plural, single in (("ies", "y"), ("es", ""), ("s", ""))
            if key.endswith(plural) and len(key) > len(plural) + 2]


def catch_all_type(entity_types: list[str]) -> str:
    """The type of a record whose type is like none of the configured ones.

    The configured "other" (any case) if the user listed one; else "other", upper-cased when
    every configured type is. Not summarize's "unknown": that one means "never extracted as an
    entity, only named by a relationship", while this entity was extracted and described, only
    with a type the user did not configure. Downstream code treats `type` as a display label (the
    majority type of an entity's instances, the report and search context), so any string works."""
    types = _configured(entity_types)
    for t in types:
        if _type_key(t) == "other":
            return t
    return "OTHER" if types and all(t.isupper() for t in types) else "other"


def type_mapper(entity_types: list[str]) -> Callable[[str], tuple[str, str]]:
    """`map(type) -> (configured type, how)`, how being "" (a configured type, in any case or
    spacing), "mapped" (a plural, a spelling variant or a near miss of one) or "catch_all"."""
    types = _configured(entity_types)
    by_key = {_type_key(t): t for t in types}
    fallback = catch_all_type(entity_types)

    def map_type(raw: str) -> tuple[str, str]:
        key = _type_key(str(raw))
        if key in by_key:
            return by_key[key], ""
        if not key:
            return fallback, "catch_all"
        for single in _singulars(key):
            if single in by_key:
                return by_key[single], "mapped"
        close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=TYPE_SIMILARITY)
        if close:
            return by_key[close[0]], "mapped"
        return fallback, "catch_all"

    return map_type


def graph_schema(entity_types: list[str], max_entities: int = 25, max_relationships: int = 30) -> type[BaseModel]:
    """The extraction schema with `type` restricted to the configured entity types.

    The types become a JSON-schema enum, which constrained decoding (OpenAI strict mode,
    llama.cpp grammars) enforces. For servers without it (JSON mode + repair), a validator maps
    case and surrounding space variants ("PERSON ", "Person") onto the configured spelling, so
    the answer carried into the gleaning conversation reads as before. Any other type is
    accepted here and mapped when the records are read (`type_mapper`, counted there): a
    validation error would only make the client resend the identical request, and losing the
    whole unit for one record's type is worse than a mapped type."""
    types = _configured(entity_types)
    by_key = {t.casefold(): t for t in types}

    def _type_variant(cls, v: Any) -> Any:
        if isinstance(v, str):
            return by_key.get(v.strip().casefold(), v)
        return v

    entity = create_model(
        "Entity",
        name=(str, ...),
        # A plain string with the enum in its JSON schema (the same schema a Literal gives).
        type=(str, Field(json_schema_extra={"enum": list(types)})),
        description=(str, ...),
        __validators__={"_type_variant": field_validator("type", mode="before")(_type_variant)},
    )
    relationship = create_model(
        "Relationship",
        source=(str, ...),
        target=(str, ...),
        description=(str, ...),
        # No min/max in the schema (not every strict mode accepts them): clamped to 1-10 on read.
        strength=(int, ...),
    )
    # maxItems bounds the answer: constrained decoding must close the list, so a small model
    # that starts repeating its list (seen with 1.5B models) stops instead of filling max_tokens.
    # For servers that ignore it, the client keeps the first N items (llm/client.py
    # cut_to_max_items) rather than failing the call.
    return create_model(
        "ExtractedGraph",
        entities=(list[entity], Field(json_schema_extra={"maxItems": max_entities})),  # type: ignore[valid-type]
        relationships=(list[relationship], Field(json_schema_extra={"maxItems": max_relationships})),  # type: ignore[valid-type]
    )


# -- extraction -----------------------------------------------------------------------------------

@dataclass
class _UnitResult:
    entities: list[dict[str, Any]] = field(default_factory=list)
    relationships: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    failed: bool = False
    gleaned: int = 0  # gleaning rounds that returned records
    gleaning_failed: bool = False  # a gleaning round or check failed; the earlier rounds are kept


async def _glean(
    llm: ChatClient, messages: list[dict[str, str]], first: BaseModel, schema: type[BaseModel],
    check_schema: type[BaseModel], *, rounds: int, check_prompt: str, continue_prompt: str,
    step: str, item: str, max_tokens: int,
) -> tuple[list[BaseModel], bool]:
    """(the first answer plus every gleaned answer in order, complete). The conversation carries
    every previous answer so the model knows what it already gave. A check or round that fails
    after its retries ends the gleaning with complete=False; the answers received so far are
    returned, never dropped (the client has recorded the failure under `step`)."""
    answers = [first]
    history = messages + [{"role": "assistant", "content": first.model_dump_json()}]
    try:
        for _ in range(rounds):
            check = await llm.structured(history + [{"role": "user", "content": check_prompt}], check_schema,
                                         step=step, item=item, max_tokens=CHECK_MAX_TOKENS)
            if not check.missed:
                break
            history = history + [{"role": "user", "content": continue_prompt}]
            more = await llm.structured(history, schema, step=step, item=item, max_tokens=max_tokens)
            answers.append(more)
            history = history + [{"role": "assistant", "content": more.model_dump_json()}]
    except LLMError:
        return answers, False
    return answers, True


_EXAMPLE_NAME = re.compile(r'"(?:name|source|target)"\s*:\s*"([^"]+)"')


def example_names(examples: str) -> set[str]:
    """The names (normalised) the few-shot examples use, as written in their answers."""
    return {normalize_name(n) for n in _EXAMPLE_NAME.findall(examples)}


def _leaked(name: str, text: str, examples: set[str]) -> bool:
    """Whether `name` is one of the few-shot examples' names that the unit's text does not hold:
    small models copy the example answer ("Harbor Logistics", "Anna de Vries") into theirs."""
    key = normalize_name(name)
    return key in examples and key not in normalize_name(text)


# Configured types a date or an amount takes when the user has one (any case); else these.
_VALUE_TYPES = {"date": ("date", "time", "year", "period"), "number": ("number", "quantity", "amount", "num")}
# Types that say nothing about what a thing is: a date or an amount given one of these (or a
# type outside the configured list) is typed by its value.
PLACEHOLDER_TYPES = frozenset({"", "unknown", "other", "others", "none", "n/a", "na", "null", "entity", "thing"})
_VALUE_TYPE_KEYS = frozenset(k for keys in _VALUE_TYPES.values() for k in keys) | {"duration"}


def _value_type_of(name: str, entity_types: tuple[str, ...]) -> str | None:
    kind = value_type(name)
    if kind is None:
        return None
    by_key = {_type_key(t): t for t in entity_types}
    return next((by_key[k] for k in _VALUE_TYPES[kind] if k in by_key), kind)


@dataclass
class _NameCheck:
    """Checks of one unit's names against its text (grounding.py) under one policy, each name
    judged once (per whether its type exempts it from the common-noun check)."""

    text: str
    examples: frozenset[str]
    policy: str                 # "strict", "lenient" or "off" (Settings.check_policy)
    concept_types: frozenset[str] = frozenset()  # type keys never judged generic
    _unit: UnitText | None = None
    _verdicts: dict[tuple[str, bool], str] = field(default_factory=dict)

    def verdict(self, name: str, typ: str | None = None) -> str:
        """"" for a name to keep, else the stats key of the reason it is dropped."""
        key = _type_key(typ) if typ is not None else ""
        # A concept type's or a value type's name is what it says ("machine learning", "two",
        # "six months"), however the text writes it: no common noun.
        exempt = key in self.concept_types or key in _VALUE_TYPE_KEYS
        if (name, exempt) not in self._verdicts:
            self._verdicts[(name, exempt)] = self._judge(name, exempt)
        return self._verdicts[(name, exempt)]

    def _judge(self, name: str, exempt: bool) -> str:
        if self.policy == "off":
            return ""
        if self.examples and _leaked(name, self.text, self.examples):
            return "example_leaks"
        if self._unit is None:
            self._unit = UnitText.of(self.text)
        strict = self.policy == "strict"
        if strict and clause(name, self._unit) and not (exempt and self._unit.writes(name)):
            # (a value or concept the text writes as it is may be long: "the 26th day of the 4th month")
            return "names_clause"
        if not grounded(name, self._unit):
            return "names_ungrounded"
        # "machine learning" typed concept is a concept's name, however the text writes it
        if strict and not exempt and value_type(name) is None and generic(name, self._unit):
            return "names_generic"
        return ""


def _entity_type(name: str, given: str, map_type: Callable[[str], tuple[str, str]], entity_types: tuple[str, ...],
                 policy: str) -> tuple[str, str | None]:
    """The type an entity record gets, and the stats key that counts how (None: as given): the
    model's type when it is a configured one; a date or an amount given a placeholder or an
    unconfigured type gets its value's type; else the type mapped onto the configured ones (a
    near miss) or the catch-all."""
    typ, how = map_type(given)
    if policy != "off" and (how == "catch_all" or _type_key(typ) in PLACEHOLDER_TYPES):
        value = _value_type_of(name, entity_types)
        if value is not None:
            return value, "types_from_value" if value != typ else None
    return typ, {"mapped": "types_mapped", "catch_all": "types_to_catch_all"}.get(how)


def _unit_rows(answers: list[BaseModel], unit_id: str, out: _UnitResult, counts: dict[str, int],
               map_type: Callable[[str], tuple[str, str]], check: _NameCheck,
               entity_types: tuple[str, ...]) -> None:
    """The entity and relationship rows of one unit's answers (every round), checked. Entities
    first, so a relationship's endpoint is judged with the type its entity record gave it."""
    typed: dict[str, str] = {}
    for rnd, answer in enumerate(answers):
        for e in answer.entities:  # type: ignore[attr-defined]
            name = clean_name(e.name)
            if not name:
                counts["empty_names"] += 1
                continue
            typ, how = _entity_type(name, e.type, map_type, entity_types, check.policy)
            if reason := check.verdict(name, typ):
                counts[reason] += 1
                continue
            if how:
                counts[how] += 1
            typed.setdefault(normalize_name(name), typ)
            out.entities.append({"title": name, "type": typ, "description": e.description.strip(),
                                 "text_unit_id": unit_id, "round": rnd})
    for rnd, answer in enumerate(answers):
        for r in answer.relationships:  # type: ignore[attr-defined]
            source, target = clean_name(r.source), clean_name(r.target)
            if not source or not target:
                counts["empty_names"] += 1
                continue
            if normalize_name(source) == normalize_name(target):
                counts["self_loops"] += 1
                continue
            reasons = [x for x in (check.verdict(source, typed.get(normalize_name(source))),
                                   check.verdict(target, typed.get(normalize_name(target)))) if x]
            if reasons:
                # An edge to a name that is not in the text (or not a name) would bring that name
                # back as an entity known only from relationships.
                counts["example_leaks" if "example_leaks" in reasons else "relationships_dropped"] += 1
                continue
            out.relationships.append({"source": source, "target": target, "description": r.description.strip(),
                                      "strength": min(10, max(1, int(r.strength))), "text_unit_id": unit_id,
                                      "round": rnd})


def _claim_rows(answer: ExtractedClaims, unit_id: str, rnd: int, out: _UnitResult, counts: dict[str, int]) -> None:
    for c in answer.claims:
        subject = clean_name(c.subject)
        if not subject:
            counts["empty_names"] += 1
            continue
        out.claims.append({
            "subject": subject, "object": clean_name(c.object), "type": c.type.strip(), "status": c.status,
            "start_date": c.start_date.strip(), "end_date": c.end_date.strip(),
            "description": c.description.strip(), "source_text": c.source_text.strip(),
            "text_unit_id": unit_id, "round": rnd,
        })


async def _extract_unit(unit_id: str, text: str, llm: ChatClient, settings: Settings,
                        schema: type[BaseModel], prompts: dict[str, str], counts: dict[str, int],
                        map_type: Callable[[str], tuple[str, str]]) -> _UnitResult:
    ex = settings.extraction
    out = _UnitResult()
    types = ", ".join(ex.entity_types)
    messages = to_messages(render(prompts["extract_graph"], entity_types=types,
                                  examples=prompts["examples_graph"].strip(), text=text))
    try:
        first = await llm.structured(messages, schema, step="extract", item=unit_id, max_tokens=ex.max_tokens)
    except LLMError:
        out.failed = True
        return out
    answers, complete = await _glean(llm, messages, first, schema, GleanCheck, rounds=ex.max_gleanings,
                                     check_prompt=prompts["glean_check"],
                                     continue_prompt=prompts["glean_continue"],
                                     step="extract", item=unit_id, max_tokens=ex.max_tokens)
    if not complete:
        # The records already received are kept; the unit is reported as incomplete.
        out.failed = out.gleaning_failed = True
    check = _NameCheck(text, frozenset(example_names(prompts["examples_graph"])), settings.check_policy()[0],
                       frozenset(_type_key(t) for t in ex.concept_types))
    _unit_rows(answers, unit_id, out, counts, map_type, check, _configured(ex.entity_types))
    out.gleaned = len(answers) - 1

    if ex.claims:
        names = ", ".join(dict.fromkeys(e["title"] for e in out.entities)) or "-"
        claim_messages = to_messages(render(
            prompts["extract_claims"], entity_names=names, claim_description=ex.claim_description,
            text=text))
        try:
            first_claims = await llm.structured(claim_messages, ExtractedClaims, step="claims", item=unit_id,
                                                max_tokens=ex.max_tokens)
        except LLMError:
            out.failed = True
            return out
        claim_answers, complete = await _glean(llm, claim_messages, first_claims, ExtractedClaims,
                                               ClaimGleanCheck, rounds=ex.max_gleanings,
                                               check_prompt=prompts["glean_check"],
                                               continue_prompt=prompts["glean_continue"], step="claims",
                                               item=unit_id, max_tokens=ex.max_tokens)
        if not complete:
            out.failed = out.gleaning_failed = True
        for rnd, answer in enumerate(claim_answers):
            _claim_rows(answer, unit_id, rnd, out, counts)  # type: ignore[arg-type]
    return out


class _Rows:
    """The instance rows of finished units, as Arrow tables of up to BATCH_ROWS rows each
    (columnar: a fraction of the size of the row dicts), every row with its unit's position;
    `frame()` puts them in unit order, each unit's rows in the order they were made."""

    BATCH_ROWS = 4096

    def __init__(self, columns: list[str]):
        self.columns = columns
        self.schema = pa.schema([(c, pa.int64() if c in ("round", "strength") else pa.string())
                                 for c in columns] + [("_position", pa.int64())])
        self.rows: list[dict[str, Any]] = []
        self.positions: list[int] = []
        self.parts: list[pa.Table] = []
        self.count = 0

    def add(self, position: int, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)
        self.positions.extend([position] * len(rows))
        self.count += len(rows)
        if len(self.rows) >= self.BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            columns = {c: [r[c] for r in self.rows] for c in self.columns}
            self.parts.append(pa.table({**columns, "_position": self.positions}, schema=self.schema))
            self.rows, self.positions = [], []

    def frame(self) -> pd.DataFrame:
        self._flush()
        if not self.parts:
            return pd.DataFrame([], columns=self.columns)
        table = pa.concat_tables(self.parts)
        self.parts = []
        table = table.take(pc.sort_indices(table, [("_position", "ascending")]))  # a stable sort
        return table.drop(["_position"]).to_pandas()


def extraction_prompts(settings: Settings, language: str) -> dict[str, str]:
    """The prompts extraction reads (the project's own where it has them).

    Short descriptions come with examples_graph_short: a small model copies the examples'
    style over the rule (with the short rule and the full examples, the 1.5B still wrote
    12-word sentences). Examples a project changed (its own, prompt-tune's) win all the same."""
    names = ["extract_graph", "examples_graph", "glean_check", "glean_continue"]
    if settings.extraction.claims:
        names.append("extract_claims")
    prompts = {n: load_prompt(n, language, settings.root) for n in names}
    if settings.extraction.descriptions == "short" and _packaged(prompts["examples_graph"], language):
        prompts["examples_graph"] = load_prompt("examples_graph_short", language, settings.root)
    return prompts


def _packaged(text: str, language: str) -> bool:
    return text == (PACKAGE_DIR / prompt_language(language) / "examples_graph.txt").read_text(encoding="utf-8")


async def extract_graph(text_units: pd.DataFrame, llm: ChatClient, *, settings: Settings, language: str,
                        advance: Callable[[int], None] | None = None,
                        prompts: dict[str, str] | None = None) -> ExtractionResult:
    """Entity, relationship (and, if configured, claim) instances of every text unit.

    `text_units` needs `id` and `text`. Rows come out in text-unit order, then gleaning round,
    then the model's order, whatever order the concurrent calls finish in. A unit whose first
    call fails for good is in `failed` with no records; a unit whose gleaning or claim call fails
    keeps the records it already has and is also in `failed` (its extraction is incomplete).

    `stats`: units, entity/relationship/claim instances, gleaned_records, units_gleaned;
    gleaning_failed (units whose gleaning stopped at a failed call, earlier rounds kept),
    units_partial (failed units that still gave records); types_mapped (entity types taken as a
    variant of a configured type) and types_to_catch_all (given `catch_all_type`); example_leaks,
    names_ungrounded, names_generic, names_clause and relationships_dropped (records dropped by
    the checks against the unit's text, grounding.py); types_from_value (dates and amounts).

    At most `windows.window_of(llm)` units are in progress at once (a few per request slot),
    and a finished unit's records are kept as Arrow columns: memory does not grow with the
    number of units beyond the records themselves."""
    # (`prompts` as extraction_prompts gives them: a Ray Data worker gets them from the driver,
    # which may see a project folder the worker's node does not.)
    prompts = prompts if prompts is not None else extraction_prompts(settings, language)
    rule = DESCRIPTION_RULES[prompt_language(language)][settings.extraction.descriptions]
    prompts = {**prompts, "extract_graph": render(prompts["extract_graph"], description_rule=rule)}
    ex = settings.extraction
    schema = graph_schema(ex.entity_types, ex.max_entities, ex.max_relationships)
    map_type = type_mapper(ex.entity_types)
    counts = dict.fromkeys(("self_loops", "empty_names", "types_mapped", "types_to_catch_all", "example_leaks",
                            "names_ungrounded", "names_generic", "names_clause", "relationships_dropped",
                            "types_from_value"), 0)

    # The embedded llama.cpp server keeps each slot's last prompt cached, and a unit's gleaning
    # calls repeat its extraction prompt and answer. With no more units in progress than the
    # server has slots, a unit's next call finds its own slot idle (the others are busy) and
    # only the new tokens are read; with more, queued requests of other units take the freed
    # slot and evict the prefix. Hosted servers queue and cache on their own: no limit there.
    lanes = settings.local.parallel if settings.chat.provider == "local" else 0
    gate: Any = asyncio.Semaphore(lanes) if lanes else contextlib.nullcontext()

    async def one(unit_id: str, text: str) -> _UnitResult:
        try:
            async with gate:
                return await _extract_unit(unit_id, text, llm, settings, schema, prompts, counts, map_type)
        finally:
            if advance:
                advance(1)

    ids = [str(i) for i in text_units["id"]]
    entities, relationships, claims = _Rows(ENTITY_COLUMNS), _Rows(RELATIONSHIP_COLUMNS), _Rows(CLAIM_COLUMNS)
    failed: list[int] = []
    units = dict.fromkeys(("gleaned_records", "units_gleaned", "gleaning_failed", "units_partial"), 0)

    def finished(position: int, r: _UnitResult) -> None:
        records = (r.entities, r.relationships, r.claims)
        for table, rows in zip((entities, relationships, claims), records):
            table.add(position, rows)
        units["gleaned_records"] += sum(1 for rows in records for row in rows if row["round"] > 0)
        units["units_gleaned"] += bool(r.gleaned)
        units["gleaning_failed"] += r.gleaning_failed
        units["units_partial"] += r.failed and any(records)
        if r.failed:
            failed.append(position)

    await run_windowed(zip(ids, text_units["text"]), lambda unit: one(unit[0], str(unit[1])),
                       window=window_of(llm), done=finished)
    return ExtractionResult(
        entities=entities.frame(),
        relationships=relationships.frame(),
        claims=claims.frame(),
        failed=[ids[n] for n in sorted(failed)],
        self_loops=counts["self_loops"],
        empty_names=counts["empty_names"],
        stats={
            "units": len(ids),
            "entity_instances": entities.count,
            "relationship_instances": relationships.count,
            "claim_instances": claims.count,
            **units,
            # relationships of an entity to itself, and records with an empty name: dropped
            "self_loops": counts["self_loops"],
            "empty_names": counts["empty_names"],
            "types_mapped": counts["types_mapped"],
            "types_to_catch_all": counts["types_to_catch_all"],
            # records naming a few-shot example's entity that the unit's text does not hold
            "example_leaks": counts["example_leaks"],
            # entity records dropped by the checks against their unit (grounding.py): the name
            # does not occur there, is a common noun, or is a clause
            "names_ungrounded": counts["names_ungrounded"],
            "names_generic": counts["names_generic"],
            "names_clause": counts["names_clause"],
            # relationship records dropped because an endpoint failed those checks
            "relationships_dropped": counts["relationships_dropped"],
            # entities typed "date" or "number" from their name rather than the model's type
            "types_from_value": counts["types_from_value"],
        },
    )


def describe_schema(entity_types: list[str]) -> str:
    """The extraction JSON schema as sent to the server (for `sensegraph prompts` / debugging)."""
    from ..llm import strict_schema

    return json.dumps(strict_schema(graph_schema(entity_types)), ensure_ascii=False, indent=2)
