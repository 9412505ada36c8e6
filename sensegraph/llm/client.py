"""The one chat client every step uses: cache, limits, retries, structured output, usage.

Any OpenAI-compatible server works (OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp); the
embedded default is such a server started on 127.0.0.1. The `openai` package does the HTTP;
its own retries are switched off because ours count attempts per item, honour Retry-After and
also retry replies that are not valid JSON for the requested schema.
"""
from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import json_repair
import openai
from pydantic import BaseModel, ValidationError

from ..config import ChatSettings
from ..tokens import count_tokens
from .cache import Cache, cache_key
from .limits import RateLimiter, backoff_delay, parse_retry_after
from .usage import Usage

T = TypeVar("T", bound=BaseModel)
# Identical invalid answers in a row after which retries change temperature and seed.
SAME_BAD_ANSWERS_BEFORE_VARYING = 3
Messages = list[dict[str, str]]


class LLMError(RuntimeError):
    """A request failed for good; the message names what it was for and why."""

    def __init__(self, purpose: str, reason: str, attempts: int = 0):
        self.purpose = purpose
        self.reason = reason
        self.attempts = attempts
        tries = f" after {attempts} attempt{'s' * (attempts != 1)}" if attempts else ""
        super().__init__(f"{purpose} failed{tries}: {reason}")


class BudgetReached(LLMError):
    """The run's spending reached chat.budget_tokens or chat.budget_cost, so the request was not
    sent. An LLMError, so every step records the item as not done and finishes quickly: each
    further call fails at once, without a request. Usage lists such items under `budget_skipped`,
    apart from real failures, and a rerun (with a larger budget) does them."""

    def __init__(self, purpose: str, limit: str):
        self.purpose = purpose
        self.reason = limit
        self.attempts = 0
        RuntimeError.__init__(self, f"{purpose} not sent: {limit}")


class _Retryable(Exception):
    """A failed attempt worth repeating. `answer` is set when the server did answer, but with
    something unusable; `repeats` when the same request is known to give the same bad answer."""

    def __init__(self, reason: str, retry_after: float | None = None, *, answer: str | None = None,
                 repeats: bool = False):
        super().__init__(reason)
        self.retry_after = retry_after
        self.answer = answer
        self.repeats = repeats


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A pydantic model's JSON schema in the strict form OpenAI and llama.cpp both accept:
    references inlined, every property required, no extra properties."""
    return copy.deepcopy(_strict_schema(model))


@functools.lru_cache(maxsize=256)
def _strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Generating a schema costs ~0.5 ms; every call of a step uses the same few models.
    # Shared between calls: read it, never change it.
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return fix(copy.deepcopy(defs[node["$ref"].split("/")[-1]]))
            # Drop the "title"/"default" annotations, but never a *property* named title or default.
            node = {k: ({p: fix(s) for p, s in v.items()} if k == "properties" and isinstance(v, dict) else fix(v))
                    for k, v in node.items() if k not in ("default", "title")}
            if node.get("type") == "object" and "properties" in node:
                node["required"] = list(node["properties"])
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    return fix(schema)


def _schema_hint(schema: dict[str, Any]) -> str:
    return (
        "Reply with one JSON object only, no prose and no code fences, matching this JSON "
        f"schema:\n{json.dumps(schema, ensure_ascii=False)}"
    )


class ChatClient:
    """Async chat client. `step` names the pipeline step for usage accounting, `item` the id of
    the thing being worked on, so a failure can say exactly what was lost."""

    def __init__(
        self,
        settings: ChatSettings,
        *,
        cache: Cache | None,
        usage: Usage | None = None,
        base_url: str | None = None,
        model: str | None = None,
        endpoint: Callable[[], Awaitable[tuple[str, str]]] | None = None,
        extra_body: dict[str, Any] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ):
        self.settings = settings
        self.cache = cache
        self.usage = usage or Usage(settings.price_per_1k_prompt, settings.price_per_1k_completion)
        self.model = model or settings.model
        self._base_url = base_url or settings.base_url
        # `endpoint` resolves (base_url, model) lazily: the embedded server starts on first use.
        self._endpoint = endpoint
        # Server-specific sampling options (llama.cpp's repeat_penalty for the embedded model);
        # part of the cache key because they change the answer.
        self.extra_body = extra_body or {}
        self._http_client = http_client
        self._client: openai.AsyncOpenAI | None = None
        self._client_lock = asyncio.Lock()
        self._semaphore = asyncio.Semaphore(settings.concurrency)
        self._limiter = RateLimiter(settings.requests_per_minute, settings.tokens_per_minute)
        self._mode = settings.structured_output if settings.structured_output != "auto" else "json_schema"
        self._auto = settings.structured_output == "auto"

    # -- spending budget ----------------------------------------------------------------------
    # The budget is per client, i.e. per run: cache hits are free and not counted, so rerunning
    # a stopped run continues where it stopped and may spend the whole budget again on new calls.
    # Embedding tokens never count toward budget_tokens: they are cheap, and the local embedder's
    # counts are not billed tokens at all. They do count toward budget_cost when an embedder
    # shares this Usage and has a price (see Usage.cost).
    def budget_limit(self) -> str | None:
        """The setting this run's spending has reached ("budget_tokens" or "budget_cost"), or None."""
        s, u = self.settings, self.usage
        if s.budget_tokens and u.chat_tokens() >= s.budget_tokens:
            return "budget_tokens"
        if s.budget_cost and u.cost() >= s.budget_cost:
            return "budget_cost"
        return None

    def describe_budget(self) -> str:
        """The reached limit in words, with what was spent."""
        s, u = self.settings, self.usage
        if self.budget_limit() == "budget_tokens":
            return (f"the token budget is used up (chat.budget_tokens = {s.budget_tokens:,}; "
                    f"{u.chat_tokens():,} tokens spent in this run)")
        return f"the cost budget is used up (chat.budget_cost = {s.budget_cost:g}; {u.cost():.4f} spent in this run)"

    @property
    def budget_reached(self) -> bool:
        return self.budget_limit() is not None

    def _check_budget(self, step: str, item: str) -> None:
        # Checked before every attempt that would send a request (retries included) and again
        # once a concurrency slot is free, so requests queued behind the limit are never sent.
        # Calls already in flight when the limit is crossed complete normally (their tokens are
        # spent anyway): the overshoot is at most the calls in flight, `concurrency` at most.
        if self.budget_reached:
            self.usage.step(step).budget_skipped.append(item or step)
            raise BudgetReached(self._purpose(step, item), self.describe_budget())

    # -- connection ---------------------------------------------------------------------------
    async def _openai(self) -> openai.AsyncOpenAI:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                if self._endpoint is not None:
                    self._base_url, model = await self._endpoint()
                    self.model = self.model or model
                s = self.settings
                http = self._http_client or httpx.AsyncClient(
                    timeout=httpx.Timeout(s.timeout, connect=min(30.0, s.timeout)),
                    limits=httpx.Limits(max_connections=s.concurrency + 4, max_keepalive_connections=s.concurrency + 4),
                )
                common: dict[str, Any] = dict(
                    api_key=s.api_key or "sensegraph-no-key", max_retries=0, timeout=s.timeout, http_client=http
                )
                if s.api_version:
                    self._client = openai.AsyncAzureOpenAI(
                        azure_endpoint=self._base_url, api_version=s.api_version, **common
                    )
                else:
                    self._client = openai.AsyncOpenAI(base_url=self._base_url, **common)
        return self._client

    # -- public API ---------------------------------------------------------------------------
    async def complete(
        self,
        messages: Messages,
        *,
        step: str,
        item: str = "",
        max_tokens: int,
        temperature: float | None = None,
    ) -> str:
        """Plain text answer."""
        return await self._call(messages, step=step, item=item, max_tokens=max_tokens,
                                temperature=temperature, schema=None)

    async def structured(
        self,
        messages: Messages,
        schema: type[T],
        *,
        step: str,
        item: str = "",
        max_tokens: int,
        temperature: float | None = None,
    ) -> T:
        """An answer validated against `schema`; invalid replies are retried, never returned."""
        text = await self._call(messages, step=step, item=item, max_tokens=max_tokens,
                                temperature=temperature, schema=schema)
        return schema.model_validate_json(text)

    async def stream(
        self, messages: Messages, *, step: str, item: str = "", max_tokens: int, temperature: float | None = None
    ) -> AsyncIterator[str]:
        """Yield the answer as it is generated; a cached answer is yielded whole."""
        temperature = self.settings.temperature if temperature is None else temperature
        key = self._key(messages, max_tokens, temperature, None)
        use = self.usage.step(step)
        if self.cache is not None and (hit := self.cache.get_json(key)) is not None:
            use.cache_hits += 1
            yield hit["content"]
            return
        self._check_budget(step, item)
        client = await self._openai()
        parts: list[str] = []
        prompt_tokens = completion_tokens = cached = 0
        async with self._semaphore:
            self._check_budget(step, item)
            use.requests += 1
            try:
                stream = await client.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=max_tokens, temperature=temperature,
                    stream=True, stream_options={"include_usage": True}, extra_body=self.extra_body or None,
                )
                async for chunk in stream:
                    if chunk.usage:
                        prompt_tokens, completion_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                        cached = _cached_tokens(chunk.usage)
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                        yield chunk.choices[0].delta.content
            except openai.OpenAIError as exc:
                use.failures.append(item or step)
                raise LLMError(self._purpose(step, item), _describe_error(exc, self.settings.api_key), 1) from None
        content = "".join(parts)
        use.calls += 1
        self.usage.add_chat(step, prompt_tokens or sum(count_tokens(m["content"]) for m in messages),
                            completion_tokens or count_tokens(content), cached)
        if self.cache is not None:
            self.cache.put_json(key, {"content": content})

    # -- internals ----------------------------------------------------------------------------
    @staticmethod
    def _purpose(step: str, item: str) -> str:
        return f"{step} of {item}" if item else step

    def _key(self, messages: Messages, max_tokens: int, temperature: float, schema: dict | None) -> str:
        return cache_key("chat", {"model": self.model or f"local:{self.settings.model}", "messages": messages,
                                  "max_tokens": max_tokens, "temperature": temperature, "schema": schema,
                                  **({"extra_body": self.extra_body} if self.extra_body else {})})

    async def _call(
        self, messages: Messages, *, step: str, item: str, max_tokens: int,
        temperature: float | None, schema: type[BaseModel] | None,
    ) -> str:
        temperature = self.settings.temperature if temperature is None else temperature
        json_schema = _strict_schema(schema) if schema is not None else None
        use = self.usage.step(step)
        if self._endpoint is not None and self._client is None:
            await self._openai()  # resolves the model name, which is part of the cache key
        key = self._key(messages, max_tokens, temperature, json_schema)
        if self.cache is not None and (hit := self.cache.get_json(key)) is not None:
            use.cache_hits += 1
            return hit["content"]

        purpose = self._purpose(step, item)
        estimate = sum(count_tokens(m["content"]) for m in messages) + max_tokens if self._limiter.enabled else 0
        attempts = self.settings.max_retries + 1
        last = ""
        # A retry resends the identical request, so a transient fault (429, 5xx, a dropped or
        # garbled reply) costs nothing but the retry: the answer is the one a fault-free run gets.
        # Only once the server is seen to repeat a bad answer (a deterministic model at
        # temperature 0 would forever) do retries vary the request to get a different answer.
        # Twice the same bad answer can be chance; three times is not.
        vary = 0
        last_bad: str | None = None
        same_bad = 0
        for attempt in range(attempts):
            self._check_budget(step, item)  # before the rate limiter, which may wait
            if attempt:
                use.retries += 1
            await self._limiter.acquire(estimate)
            try:
                content, usage = await self._request(messages, max_tokens, temperature, schema, json_schema,
                                                     vary, step, item)
                # Tokens of a rejected answer are billed too; `calls` counts only answers we keep.
                self.usage.add_chat(step, usage[0] or sum(count_tokens(m["content"]) for m in messages),
                                    usage[1] or count_tokens(content), usage[2])
                if schema is not None:
                    content = _validated(content, schema)
                use.calls += 1
                if self.cache is not None:
                    self.cache.put_json(key, {"content": content})
                return content
            except _Retryable as exc:
                last = str(exc)
                if schema is not None and exc.answer is not None:
                    same_bad = same_bad + 1 if exc.answer == last_bad else 1
                    if vary or exc.repeats or same_bad >= SAME_BAD_ANSWERS_BEFORE_VARYING:
                        vary += 1
                    last_bad = exc.answer
                if attempt + 1 < attempts:
                    await asyncio.sleep(backoff_delay(attempt, self.settings.retry_base_seconds,
                                                      retry_after=exc.retry_after))
            except openai.APIStatusError as exc:
                use.failures.append(item or step)
                raise LLMError(purpose, _describe_error(exc, self.settings.api_key), attempt + 1) from None
        use.failures.append(item or step)
        raise LLMError(purpose, last, attempts)

    async def _request(
        self, messages: Messages, max_tokens: int, temperature: float,
        schema: type[BaseModel] | None, json_schema: dict | None, vary: int, step: str, item: str = "",
    ) -> tuple[str, tuple[int, int, int]]:
        client = await self._openai()
        kwargs: dict[str, Any] = dict(model=self.model, messages=messages, max_tokens=max_tokens,
                                      temperature=temperature)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        if vary and schema is not None:
            # A deterministic server repeats an invalid answer; a little randomness gets a new one.
            kwargs["temperature"] = max(temperature, 0.4)
            kwargs["seed"] = vary
        mode = self._mode if schema is not None else None
        if mode == "json_schema":
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": schema.__name__, "schema": json_schema, "strict": True}}
        elif mode in ("json_mode", "prompt"):
            kwargs["messages"] = _with_hint(messages, _schema_hint(json_schema))
            if mode == "json_mode":
                kwargs["response_format"] = {"type": "json_object"}
        try:
            async with self._semaphore:
                self._check_budget(step, item)
                # Counted per HTTP request, so a fallback between structured modes counts too.
                self.usage.step(step).requests += 1
                reply = await client.chat.completions.create(**kwargs)
        except openai.RateLimitError as exc:
            raise _Retryable(_describe_error(exc, self.settings.api_key),
                             parse_retry_after(exc.response.headers.get("retry-after")))
        except openai.APIStatusError as exc:
            if exc.status_code >= 500 or exc.status_code in (408, 409):
                raise _Retryable(_describe_error(exc, self.settings.api_key)) from None
            if schema is not None and self._auto and exc.status_code in (400, 422) and mode != "prompt":
                # The server does not support this structured-output mode: step down once and retry now.
                self._mode = "json_mode" if mode == "json_schema" else "prompt"
                return await self._request(messages, max_tokens, temperature, schema, json_schema, vary, step,
                                           item)
            raise
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise _Retryable(_describe_error(exc, self.settings.api_key)) from None
        except json.JSONDecodeError as exc:
            # The HTTP body itself was cut off or garbled (not the model's answer): ask again.
            raise _Retryable(f"the server's reply is not valid JSON ({exc.msg})") from None
        if not reply.choices:
            raise _Retryable("the server returned no choices")
        choice = reply.choices[0]
        content = choice.message.content or ""
        if not content.strip():
            raise _Retryable(f"empty answer (finish_reason={choice.finish_reason})", answer=content)
        if schema is not None and choice.finish_reason == "length":
            # The model itself ran out of tokens: the identical request would run out again.
            raise _Retryable(f"answer cut off at max_tokens={max_tokens} before the JSON was complete",
                             answer=content, repeats=True)
        u = reply.usage
        return content, ((u.prompt_tokens or 0, u.completion_tokens or 0, _cached_tokens(u)) if u else (0, 0, 0))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _with_hint(messages: Messages, hint: str) -> Messages:
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0]["content"] = out[0]["content"] + "\n\n" + hint
    else:
        out.insert(0, {"role": "system", "content": hint})
    return out


def _validated(content: str, schema: type[BaseModel]) -> str:
    """Canonical JSON of a schema-valid reply, repairing near-JSON (code fences, trailing commas)."""
    try:
        return schema.model_validate_json(content).model_dump_json()
    except ValidationError:
        pass
    if _cut_off(content):
        # json_repair would close the brackets and hand back a plausible but partial answer
        # (e.g. half the entities); a fresh attempt is the only way to get all of it.
        raise _Retryable(f"reply is cut off in the middle of the JSON (reply ended: {content[-60:]!r})")
    try:
        repaired = json_repair.loads(content)
        return schema.model_validate(repaired).model_dump_json()
    except (ValidationError, ValueError, TypeError) as exc:
        snippet = content[:120].replace("\n", " ")
        # `answer` lets the caller see a model repeat the same wrong answer. A cut-off reply
        # (above) does not count: another temperature would not make it arrive whole.
        raise _Retryable(f"reply does not match schema {schema.__name__}: {str(exc).splitlines()[0]} "
                         f"(reply began: {snippet!r})", answer=content) from None


def _cut_off(content: str) -> bool:
    """True when a JSON reply stops before its closing bracket (code fences allowed)."""
    text = content.strip()
    if text.startswith("```"):
        text = text.partition("\n")[2].strip()
    if text.endswith("```"):
        text = text[:-3].rstrip()
    if not text or text[0] not in "{[":
        return False
    depth, in_string, escaped = 0, False, False
    for ch in text:  # only reached for replies that failed strict validation
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return in_string or depth > 0


def _cached_tokens(usage: object) -> int:
    """Prompt tokens the server took from its prompt cache; servers without one send no details."""
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", 0) or 0) if details else 0


def _describe_error(exc: Exception, secret: str | None = None) -> str:
    """One line saying why a request failed; never containing `secret` (the API key), which a
    server may echo back in an error body."""
    text = _error_text(exc)
    return text.replace(secret, "***") if secret and len(secret) >= 4 else text


def _error_text(exc: Exception) -> str:
    if isinstance(exc, openai.AuthenticationError):
        return "the server refused the API key (401); check api_key in settings.yaml or .env"
    if isinstance(exc, openai.NotFoundError):
        return "model or URL not found (404); check model and base_url in settings.yaml"
    if isinstance(exc, openai.APIStatusError):
        body = exc.response.text[:300] if exc.response is not None else ""
        return f"HTTP {exc.status_code}: {body}"
    if isinstance(exc, openai.APITimeoutError):
        return "the request timed out"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return f"could not reach the server ({type(cause).__name__}: {cause})"
    return f"{type(exc).__name__}: {exc}"


def run_sync(coro: Awaitable[Any]) -> Any:
    """Run a coroutine from sync code (the CLI and the sync API)."""
    return asyncio.run(coro)  # type: ignore[arg-type]


