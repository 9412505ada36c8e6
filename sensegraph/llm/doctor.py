"""`sensegraph doctor`: call each configured model once and say what works and what to fix.

Checks, in order: the chat model with a plain prompt (latency, prompt and generation speed),
the chat model with a tiny structured request (does JSON-schema output work?), and the
embedding model. A failure becomes one sentence naming the setting to change. API keys are
never printed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai
from pydantic import BaseModel

from ..config import ModelSettings, Settings
from . import open_chat, open_embedder
from .client import LLMError

OPENAI_URL = "https://api.openai.com/v1"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    latency_s: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)


class _Capital(BaseModel):
    country: str
    capital: str


def _safe_url(url: str | None) -> str:
    """The URL without user:password@, which may hold a secret."""
    if not url:
        return OPENAI_URL
    parts = urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def _scrub(text: str, settings: Settings) -> str:
    for key in (settings.chat.api_key, settings.embedding.api_key):
        if key and len(key) >= 4:
            text = text.replace(key, "***")
    return text


def _missing_key(m: ModelSettings) -> bool:
    return m.provider == "openai" and not m.api_key and (not m.base_url or "openai.com" in m.base_url)


def _fix(exc: BaseException, section: str, m: ModelSettings, base_url: str | None) -> str:
    """One sentence saying what to change."""
    url = _safe_url(base_url or m.base_url)
    reason = exc.reason if isinstance(exc, LLMError) else ""
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)) or "(401)" in reason:
        status = getattr(exc, "status_code", 401)
        what = "refused the API key" if m.api_key else "needs an API key, and none is set"
        return (f"the server at {url} {what} ({status}); set OPENAI_API_KEY in .env "
                f"or {section}.api_key in settings.yaml")
    if isinstance(exc, openai.NotFoundError) or "(404)" in reason:
        return (f"{url} does not know the model {m.model!r} (404); fix {section}.model "
                f"(for Azure, the deployment name) or {section}.base_url")
    # APITimeoutError is an APIConnectionError: test it first.
    if isinstance(exc, openai.APITimeoutError) or "timed out" in reason:
        return f"{url} did not answer within {m.timeout:.0f}s; check the server or raise {section}.timeout"
    if isinstance(exc, openai.APIConnectionError) or "could not reach the server" in reason:
        return f"nothing answers at {url}; start the server or fix {section}.base_url"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text


def _target(settings: Settings, section: str, base_url: str | None, model: str) -> str:
    m = getattr(settings, section)
    if m.provider == "local":
        return f"embedded {model}"
    return f"{_safe_url(base_url or m.base_url)} model {model}"


def _short(settings: Settings) -> Settings:
    """A copy that fails fast: doctor should answer in seconds, not after six back-offs."""
    s = settings.model_copy(deep=True)
    for m in (s.chat, s.embedding):
        m.max_retries = min(m.max_retries, 1)
        m.timeout = min(m.timeout, 120.0)
        m.retry_base_seconds = min(m.retry_base_seconds, 0.5)
    return s


async def _check_chat(settings: Settings) -> list[Check]:
    m = settings.chat
    if _missing_key(m):
        sentence = "no API key for api.openai.com; set OPENAI_API_KEY in .env or chat.api_key in settings.yaml"
        return [Check("chat", False, sentence), Check("structured output", False, "skipped: the chat model is not reachable")]
    client = open_chat(settings, cache=None)
    checks: list[Check] = []
    try:
        # Resolving the endpoint starts the embedded server; time it apart from the request.
        t0 = time.perf_counter()
        try:
            raw = await client._openai()
        except Exception as exc:  # noqa: BLE001 - the embedded model may fail in many ways
            checks.append(Check("chat", False, _scrub(_fix(exc, "chat", m, None), settings)))
            checks.append(Check("structured output", False, "skipped: the chat model is not reachable"))
            return checks
        setup_s = time.perf_counter() - t0
        base_url, model = client._base_url, client.model
        target = _target(settings, "chat", base_url, model)
        figures: dict[str, Any] = {}
        if m.provider == "local":
            from .embedded import TIMINGS

            t = TIMINGS.get(settings.local.size, {})
            figures["join s"] = round(t.get("join_s", 0.0), 2)
            figures["verify s"] = round(t.get("verify_s", 0.0), 3)
            figures["load s"] = round(t.get("load_s", setup_s), 2)
            figures["url"] = base_url

        messages = [{"role": "user", "content": "In one sentence: what is a knowledge graph?"}]
        t0 = time.perf_counter()
        try:
            reply = await raw.chat.completions.create(model=model, messages=messages, max_tokens=48,
                                                      temperature=0.0)
        except openai.OpenAIError as exc:
            checks.append(Check("chat", False, _scrub(_fix(exc, "chat", m, base_url), settings)))
            checks.append(Check("structured output", False, "skipped: the chat model is not reachable"))
            return checks
        latency = time.perf_counter() - t0
        u = reply.usage
        figures["prompt tokens"] = u.prompt_tokens if u else None
        figures["generated tokens"] = u.completion_tokens if u else None
        timings = (reply.model_extra or {}).get("timings") or {}
        if timings:  # llama.cpp reports its own speeds, which exclude HTTP and queueing
            figures["prompt tok/s"] = round(timings.get("prompt_per_second") or 0.0, 1)
            figures["generation tok/s"] = round(timings.get("predicted_per_second") or 0.0, 1)
        elif u and u.completion_tokens:
            figures["generation tok/s (incl. prompt)"] = round(u.completion_tokens / latency, 1)
        answer = (reply.choices[0].message.content or "").strip() if reply.choices else ""
        ok = bool(answer)
        detail = f"{target}: " + (repr(answer[:80]) if ok else "the server answered with no text")
        checks.append(Check("chat", ok, detail, latency, figures))

        t0 = time.perf_counter()
        try:
            capital = await client.structured(
                [{"role": "user", "content": "Which country is Paris the capital of? Answer as JSON."}],
                _Capital, step="doctor", max_tokens=64)
            mode = client._mode
            checks.append(Check("structured output", True,
                                capital.model_dump_json(), time.perf_counter() - t0, {"mode": mode}))
        except LLMError as exc:
            checks.append(Check("structured output", False,
                                _scrub(f"no schema-valid answer: {_fix(exc, 'chat', m, base_url)}; "
                                       "try chat.structured_output: json_mode", settings),
                                time.perf_counter() - t0))
    finally:
        await client.aclose()
    return checks


async def _check_embedding(settings: Settings) -> Check:
    m = settings.embedding
    if _missing_key(m):
        return Check("embeddings", False,
                     "no API key for api.openai.com; set OPENAI_API_KEY in .env or embedding.api_key in settings.yaml")
    embedder = open_embedder(settings, cache=None)
    target = _target(settings, "embedding", m.base_url, embedder.model)
    t0 = time.perf_counter()
    try:
        vectors = await embedder.embed(["What did Scrooge see on Christmas Eve?"], kind="query", step="doctor")
    except Exception as exc:  # noqa: BLE001 - report any failure as one sentence
        return Check("embeddings", False, _scrub(_fix(exc, "embedding", m, None), settings))
    finally:
        await embedder.aclose()
    latency = time.perf_counter() - t0
    return Check("embeddings", True, f"{target}: {vectors.shape[1]} dimensions", latency,
                 {"dimensions": int(vectors.shape[1])})


def extraction_checks(settings: Settings) -> Check:
    """Which checks of extracted names apply to this chat model, and why (no call)."""
    policy, why = settings.check_policy()
    small, _ = settings.small_chat_model()
    ner = settings.extraction.ner
    what = {"strict": "names not in their text, prompt-example copies, common nouns, clauses",
            "lenient": "names not in their text and prompt-example copies only",
            "off": "none"}[policy]
    names = "on" if ner is True or (ner == "auto" and small) else "off"
    return Check("extraction checks", True, f"{policy} ({why}): {what}; NER names for English: {names}. "
                 "Change with extraction.checks (strict, lenient, off) and extraction.ner.",
                 figures={"policy": policy})


async def run_doctor(settings: Settings) -> list[Check]:
    """Call the chat model (plain and structured) and the embedding model once each; say
    which checks of extracted names apply."""
    settings = _short(settings)
    checks = await _check_chat(settings)
    checks.append(await _check_embedding(settings))
    checks.append(extraction_checks(settings))
    return checks


# -- preflight: the checks `sensegraph index` makes before any work -----------------------------
PREFLIGHT_TIMEOUT = 30.0


async def preflight(settings: Settings, sections: tuple[str, ...] = ("chat", "embedding"), *,
                    nlp: bool = False) -> list[str]:
    """One sentence per configured remote endpoint that cannot work (unreachable, key refused,
    unknown model); empty if all look usable. Costs nothing when the server lists the model
    (GET /models); otherwise one tiny request tells whether the model name is known. Transient
    errors (429, 5xx) pass: the index's own retries deal with them. `sections`: the models the
    command will use (`prompt-tune` needs only the chat model). `nlp` (index and update): for
    `index_method: lazy`, also the NLP packages, checked file by file and imported by no one
    (index.concepts.check_nlp), so a missing or modified one is said before any document is read."""
    problems = []
    if nlp and settings.index_method == "lazy":
        from ..config import SettingsError
        from ..index.concepts import ConceptError, check_nlp

        try:
            check_nlp(settings.language)
        except (ConceptError, SettingsError) as exc:
            problems.append(str(exc))
    for section in sections:
        m: ModelSettings = getattr(settings, section)
        if section == "chat" and settings.index_method == "lazy":
            continue  # a lazy index makes no chat call
        if m.provider != "openai":
            # The embedded models: installed? (They are verified and started at their first call.)
            from .embedded import install_problem
            from .embeddings import local_embedder_problem

            sentence = install_problem(settings.local) if section == "chat" else local_embedder_problem()
            if sentence:
                problems.append(sentence)
            continue
        sentence = await _preflight_endpoint(settings, section)
        if sentence:
            problems.append(_scrub(sentence, settings))
    return problems


async def _preflight_endpoint(settings: Settings, section: str) -> str | None:
    """The problem of one model section, checking each of its servers (`endpoints`). A wrong key
    or model on any server is a problem (its requests would fail for good); an unreachable one
    among several is not (the run takes it out of the rotation), all of them unreachable is."""
    s = settings.model_copy(deep=True)
    m: ModelSettings = getattr(s, section)
    m.timeout = min(m.timeout, PREFLIGHT_TIMEOUT)
    m.max_retries = 0
    holder = open_chat(s, cache=None) if section == "chat" else open_embedder(s, cache=None)
    try:
        if section == "chat":
            await holder._openai()  # resolves the address of the first server
        servers = holder.endpoints.all
        unreachable: list[str] = []
        for n, endpoint in enumerate(servers):
            where = f"{section}.endpoints[{n}] " if len(servers) > 1 else ""
            sentence, down = await _check_server(holder.endpoints.client(endpoint), section, m,
                                                 endpoint.model or m.model, endpoint.base_url)
            if sentence and not down:
                return where + sentence
            if sentence:
                unreachable.append(where + sentence)
        return "; ".join(unreachable) if len(unreachable) == len(servers) else None
    finally:
        await holder.aclose()


async def _check_server(raw: openai.AsyncOpenAI, section: str, m: ModelSettings, model: str,
                        base_url: str | None) -> tuple[str | None, bool]:
    """(problem or None, whether the problem is that nothing answers) for one server."""
    listed: set[str] | None = None
    try:
        # The same openai client (URL, key, Azure version) the index will use.
        listed = await _listed_models(raw)
        if listed is not None and model in listed:
            return None, False
        # Not listed: some servers serve any name, Azure lists models, not deployments. Ask once.
        if section == "chat":
            await raw.chat.completions.create(model=model, messages=[{"role": "user", "content": "ping"}],
                                              max_tokens=1, temperature=0.0)
        else:
            await raw.embeddings.create(model=model, input=["ping"])
        return None, False
    except openai.NotFoundError as exc:
        known = f" (the server lists: {', '.join(sorted(listed)[:8])})" if listed else ""
        return _fix(exc, section, m, base_url) + known, False
    except openai.APIConnectionError as exc:
        return _fix(exc, section, m, base_url), True
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        return _fix(exc, section, m, base_url), False
    except (openai.OpenAIError, ValueError):
        # 400, 429, 5xx, a garbled reply: not a setup error; the index's retries and messages handle them.
        return None, False


async def _listed_models(raw: openai.AsyncOpenAI) -> set[str] | None:
    """The model ids the server lists, or None if it has no listing (or lists nothing)."""
    try:
        page = await raw.models.list()
    except (openai.AuthenticationError, openai.PermissionDeniedError):
        raise
    except (openai.APIStatusError, openai.APIResponseValidationError, ValueError):
        return None  # no (usable) /models route: not an error, the tiny request decides
    ids = {str(getattr(x, "id", "")) for x in page.data or []}
    return ids or None
