"""The one chat client every step uses: cache, limits, retries, structured output, usage.

Any OpenAI-compatible server works (OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp); the
embedded default is such a server started on 127.0.0.1. The `openai` package does the HTTP;
its own retries are switched off because ours count attempts per item, honour Retry-After and
also retry replies that are not valid JSON for the requested schema.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import json_repair
import openai
from pydantic import BaseModel, ValidationError

from ..config import ChatSettings
from ..tokens import count_tokens
from .cache import Cache, cache_key
from .endpoints import REFUSALS, Endpoint, Endpoints, NoServer
from .limits import backoff_delay
from .runaway import TAIL, RunawayAnswer, counting_run
from .transport import TRANSPORT_ERRORS, LLMError, Retryable, describe_error, open_client, transient
from .usage import Usage

T = TypeVar("T", bound=BaseModel)
# Identical invalid answers in a row after which retries change temperature and seed.
SAME_BAD_ANSWERS_BEFORE_VARYING = 3
# Structured requests a server failed with a 500 and then served in a lower mode, with no
# answer in the run's mode between, after which the run stays in the lower mode. One can be
# a passing fault that the lower mode's request happened to outlive; two in a row, the second
# sent after the first was seen (not two of one burst of concurrent requests), are the format.
FORMAT_FAULTS = 2
Messages = list[dict[str, str]]
Usage3 = tuple[int, int, int]  # prompt, completion and server-cached prompt tokens of one request
TOP_LOGPROBS = 10  # first-token alternatives choose() asks for (OpenAI allows up to 20)


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
        stream_replies: bool = False,
    ):
        self.settings = settings
        self.cache = cache
        self.usage = usage or Usage(settings.price_per_1k_prompt, settings.price_per_1k_completion)
        self.model = model or settings.model
        # What the settings name, before a server fills `model` in (the embedded server's file,
        # an endpoint's default): step fingerprints read this, so whether a call has already
        # happened in this run never changes them.
        self.configured_model = self.model
        # `endpoint` resolves (base_url, model) lazily: the embedded server starts on first use.
        self.endpoints = Endpoints(settings, base_url=base_url, resolve=endpoint, http_client=http_client, name="chat")
        self._secrets = tuple(e.api_key for e in self.endpoints.all) + (settings.api_key,)
        self.usage.pools["chat"] = self.endpoints
        # Set by the pipeline for `--ray`: the cluster's workers make the uncached calls.
        self.workers: Any = None
        # Chat tokens and cost the budget counts that `usage` does not: set on a Ray Data actor's
        # client to what the run's other actors spent (index/ray_data.py, Worker._elsewhere).
        self.spent_elsewhere: Callable[[Usage], tuple[int, float]] | None = None
        # Server-specific sampling options (llama.cpp's repeat_penalty for the embedded model);
        # part of the cache key because they change the answer.
        self.extra_body = extra_body or {}
        self._http_client = http_client
        # Read every answer (but choose()'s one token) as a stream: `chat.timeout` then bounds
        # the wait between tokens, not the whole answer. For the embedded server (and any slow
        # one, chat.stream_replies), where a long answer on a slow machine outlasted the timeout
        # and the server was taken for down.
        self.stream_replies = stream_replies
        self._mode = settings.structured_output if settings.structured_output != "auto" else "json_schema"
        self._auto = settings.structured_output == "auto"
        # Structured requests that got a 500 twice and then an answer in a lower mode, per mode,
        # since that mode last got an answer (_ask_in_lower_mode)
        self._format_faults: dict[str, int] = {}
        self._format_fault_seen: dict[str, float] = {}  # when the last one was counted
        # A lower mode's request failed too since the last answer: the server is failing, not
        # the format, and its 500s are retried as they come (no lower-mode request per attempt).
        self._lower_failed = False
        # choose() asks for log-probabilities until a server refuses them (400/422): then it
        # reads the answered word alone.
        self._logprobs = True

    # -- spending budget ----------------------------------------------------------------------
    # The budget is per client, i.e. per run: cache hits are free and not counted, so rerunning
    # a stopped run continues where it stopped and may spend the whole budget again on new calls.
    # Embedding tokens never count toward budget_tokens: they are cheap, and the local embedder's
    # counts are not billed tokens at all. They do count toward budget_cost when an embedder
    # shares this Usage and has a price (see Usage.cost).
    def spent(self) -> tuple[int, float]:
        """The run's chat tokens and cost so far, as the budget counts them."""
        tokens, cost = self.usage.chat_tokens(), self.usage.cost()
        if self.spent_elsewhere is not None:
            more_tokens, more_cost = self.spent_elsewhere(self.usage)
            tokens, cost = tokens + more_tokens, cost + more_cost
        return tokens, cost

    def budget_limit(self) -> str | None:
        """The setting this run's spending has reached ("budget_tokens" or "budget_cost"), or None."""
        s = self.settings
        if not (s.budget_tokens or s.budget_cost):
            return None
        tokens, cost = self.spent()
        if s.budget_tokens and tokens >= s.budget_tokens:
            return "budget_tokens"
        if s.budget_cost and cost >= s.budget_cost:
            return "budget_cost"
        return None

    def describe_budget(self) -> str:
        """The reached limit in words, with what was spent."""
        s = self.settings
        tokens, cost = self.spent()
        if self.budget_limit() == "budget_tokens":
            return (f"the token budget is used up (chat.budget_tokens = {s.budget_tokens:,}; "
                    f"{tokens:,} tokens spent in this run)")
        return f"the cost budget is used up (chat.budget_cost = {s.budget_cost:g}; {cost:.4f} spent in this run)"

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
        """The `openai` client of the first endpoint (resolving the embedded server's address):
        what `sensegraph doctor` probes."""
        first = await self.endpoints.resolved()
        self.model = self.model or first.model
        return self.endpoints.client(first)

    @property
    def _base_url(self) -> str | None:
        return self.endpoints.all[0].base_url

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
        """An answer validated against `schema`; invalid replies are retried, never returned.
        Lists longer than the schema's `maxItems` are cut to their first items (counted in
        usage as `truncated`), as a server with constrained decoding would have ended them."""
        text = await self._call(messages, step=step, item=item, max_tokens=max_tokens,
                                temperature=temperature, schema=schema)
        return schema.model_validate_json(text)

    async def choose(
        self,
        messages: Messages,
        options: tuple[str, ...],
        *,
        step: str,
        item: str = "",
        temperature: float | None = None,
    ) -> dict[str, float]:
        """How likely the model is to answer each of `options` (one-word answers, "yes"/"no"):
        read from its first token's log-probabilities, normalised over the options, where the
        server gives them; else 1.0 for the option it answered. A model whose answer is none of
        them, and names none among its likeliest first tokens, gives {}. One generated token: a
        graded verdict for the price of reading the prompt."""
        text = await self._call(messages, step=step, item=item, max_tokens=1, temperature=temperature,
                                schema=None, options=options)
        return {k: float(v) for k, v in json.loads(text).items()}

    async def stream(
        self, messages: Messages, *, step: str, item: str = "", max_tokens: int, temperature: float | None = None
    ) -> AsyncIterator[str]:
        """Yield the answer as it is generated; a cached answer is yielded whole.

        The same call as complete() (same cache entry, budget, retries and usage), only read as
        it arrives: a stream that drops is retried like any other fault, and a retry yields
        only the text beyond what was already yielded (see _Shown)."""
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        call = asyncio.ensure_future(self._call(messages, step=step, item=item, max_tokens=max_tokens,
                                                temperature=temperature, schema=None, on_token=pieces.put_nowait))
        call.add_done_callback(lambda _: pieces.put_nowait(None))
        try:
            while (piece := await pieces.get()) is not None:
                yield piece
            await call  # raises the call's LLMError, after every piece it produced was yielded
        finally:
            if not call.done():  # the caller stopped reading: stop the request too
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call
            elif not call.cancelled():
                call.exception()  # a failure the caller stopped reading before is not "never retrieved"

    # -- internals ----------------------------------------------------------------------------
    @staticmethod
    def _purpose(step: str, item: str) -> str:
        return f"{step} of {item}" if item else step

    def _key(self, messages: Messages, max_tokens: int, temperature: float, schema: dict | None,
             options: tuple[str, ...] | None = None) -> str:
        return cache_key("chat", {"model": self.model or f"local:{self.settings.model}", "messages": messages,
                                  "max_tokens": max_tokens, "temperature": temperature, "schema": schema,
                                  **({"extra_body": self.extra_body} if self.extra_body else {}),
                                  **({"options": list(options)} if options else {})})

    async def _call(
        self, messages: Messages, *, step: str, item: str, max_tokens: int,
        temperature: float | None, schema: type[BaseModel] | None,
        on_token: Callable[[str], None] | None = None, options: tuple[str, ...] | None = None,
    ) -> str:
        """The one path of every call: cache, budget, rate limits, retries, validation, usage.
        With `on_token` (plain text only) the answer is streamed and handed over as it comes.
        With `options` (choose()) the answer is the options' probabilities as JSON."""
        temperature = self.settings.temperature if temperature is None else temperature
        json_schema = _strict_schema(schema) if schema is not None else None
        use = self.usage.step(step)
        if not self.model:
            await self._openai()  # resolves the model name, which is part of the cache key
        key = self._key(messages, max_tokens, temperature, json_schema, options)
        if self.cache is not None and (hit := self.cache.get_json(key)) is not None:
            use.cache_hits += 1
            if on_token is not None:
                on_token(hit["content"])
            return hit["content"]

        if self.workers is not None and on_token is None and options is None:
            # A Ray cluster makes the call (llm/ray_workers.py); cache, budget and usage stay here.
            self._check_budget(step, item)
            content = await self.workers.chat(self, messages, schema=schema, step=step, item=item,
                                              max_tokens=max_tokens, temperature=temperature)
            if self.cache is not None:
                self.cache.put_json(key, {"content": content})
            return content

        purpose = self._purpose(step, item)
        limited = any(e.limiter.enabled for e in self.endpoints.all)
        estimate = _prompt_tokens(messages) + max_tokens if limited else 0
        attempts = self.settings.max_retries + 1
        shown = _Shown(on_token) if on_token is not None else None
        last = ""
        # A retry resends the identical request, so a transient fault (429, 5xx, a dropped or
        # garbled reply) costs nothing but the retry: the answer is the one a fault-free run gets.
        # Only once the server is seen to repeat a bad answer (a deterministic model at
        # temperature 0 would forever) do retries vary the request to get a different answer.
        # Twice the same bad answer can be chance; three times is not.
        vary = 0
        last_bad: str | None = None
        same_bad = 0
        failed_on = None  # the endpoint the last attempt faulted on: the retry goes elsewhere
        attempt = 0  # attempts spent; a server that refused (401/403/404) spends none
        sent = 0
        again_500 = False  # the last attempt got a 500: another one may be the format's (_ask_in_lower_mode)
        while attempt < attempts:
            self._check_budget(step, item)  # before waiting for a slot or the rate limiter
            if sent:
                use.retries += 1
            sent += 1
            endpoint: Endpoint | None = None
            try:
                content, usage, endpoint = await self._request(messages, max_tokens, temperature, schema, json_schema,
                                                               vary, step, item, shown, estimate, failed_on, options,
                                                               after_500=again_500)
                # Tokens of a rejected answer are billed too; `calls` counts only answers we keep.
                self.usage.add_chat(step, usage[0] or _prompt_tokens(messages),
                                    usage[1] or count_tokens(content), usage[2])
                if schema is not None:
                    try:
                        content, cut = _validated(content, schema, json_schema)
                    except Retryable as exc:
                        exc.reply = content
                        raise
                    use.truncated += cut
                self.endpoints.answered(endpoint)
                use.calls += 1
                if self.cache is not None:
                    self.cache.put_json(key, {"content": content})
                return content
            except _Refused as exc:
                # That server is out for the run (logged); the request itself was never the problem.
                last, failed_on = str(exc), exc.endpoint
                again_500 = False
            except Retryable as exc:
                if exc.usage is not None and any(exc.usage):
                    # an answer we cannot use, billed all the same (as the server counted it)
                    self.usage.add_chat(step, *exc.usage)
                if exc.endpoint is None and endpoint is not None:
                    # A 200 whose content failed validation: that server's fault, for the retry's choice.
                    exc.endpoint = endpoint
                    self.endpoints.invalid(endpoint)
                last = str(exc)
                if exc.reply is not None and self.cache is not None:
                    self.cache.reject(model=self.model, step=step, item=item, reason=last, reply=exc.reply)
                failed_on = exc.endpoint
                again_500 = exc.status == 500
                if schema is not None and exc.answer is not None:
                    same_bad = same_bad + 1 if exc.answer == last_bad else 1
                    if vary or exc.repeats or same_bad >= SAME_BAD_ANSWERS_BEFORE_VARYING:
                        vary += 1
                    last_bad = exc.answer
                attempt += 1
                if attempt < attempts:
                    await asyncio.sleep(self._retry_delay(attempt - 1, exc))
            except NoServer as exc:
                use.failures.append(item or step)
                raise LLMError(purpose, str(exc), attempt) from None
            except openai.APIStatusError as exc:
                use.failures.append(item or step)
                raise LLMError(purpose, describe_error(exc, self._secrets), attempt + 1) from None
        use.failures.append(item or step)
        raise LLMError(purpose, last, attempts)

    def _retry_delay(self, attempt: int, fault: Retryable) -> float:
        """The back-off before a retry. A server's Retry-After binds only that server: when
        another one is idle, the retry goes there after the usual short back-off instead."""
        elsewhere = fault.endpoint is not None and self.endpoints.ready_elsewhere(fault.endpoint)
        return backoff_delay(attempt, self.settings.retry_base_seconds,
                             retry_after=None if elsewhere else fault.retry_after)

    async def _request(
        self, messages: Messages, max_tokens: int, temperature: float,
        schema: type[BaseModel] | None, json_schema: dict | None, vary: int, step: str, item: str = "",
        shown: _Shown | None = None, estimate: int = 0, avoid: Any = None,
        options: tuple[str, ...] | None = None, as_mode: str | None = None, prefer: Endpoint | None = None,
        after_500: bool = False,
    ) -> tuple[str, Usage3, Endpoint]:
        """One HTTP request (streamed when `shown` is given) on the endpoint that has a slot: the
        answer, its token counts and the endpoint, or Retryable for a transient fault or an
        unusable answer (_Refused when that server refused and another is left). `as_mode`: a
        structured-output mode for this request only, and `prefer` the server to ask when it is
        ready; `after_500`: the call's last attempt got a 500 (_ask_in_lower_mode)."""
        kwargs: dict[str, Any] = dict(messages=messages, max_tokens=max_tokens, temperature=temperature)
        # The body's fields the library would walk, field by field, to "transform" them (1.6 ms
        # of CPU per call for a schema and a few messages, a third of the client's cost) go in
        # `extra_body`, which it sends as given: they are plain JSON already.
        body: dict[str, Any] = {**self.extra_body}
        if vary and schema is not None:
            # A deterministic server repeats an invalid answer; a little randomness gets a new one.
            kwargs["temperature"] = max(temperature, 0.4)
            kwargs["seed"] = vary
        mode = (as_mode or self._mode) if schema is not None else None
        sent = time.monotonic()  # (when it left, for _format_fault: set again once it has a slot)
        if mode == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": schema.__name__, "schema": json_schema, "strict": True}}
        elif mode in ("json_mode", "prompt"):
            kwargs["messages"] = _with_hint(messages, _schema_hint(json_schema))
            if mode == "json_mode":
                body["response_format"] = {"type": "json_object"}
        if options and self._logprobs:
            body["logprobs"], body["top_logprobs"] = True, TOP_LOGPROBS
        # (`messages` is a required argument: an empty list, replaced by the body's.)
        body["messages"], kwargs["messages"] = kwargs["messages"], []
        kwargs["extra_body"] = body
        try:
            async with self.endpoints.slot(avoid, estimate, prefer) as endpoint:
                sent = time.monotonic()
                self._check_budget(step, item)
                reservation = await endpoint.limiter.acquire(estimate)
                self._check_budget(step, item)  # the limiter may have waited
                # Counted per HTTP request, so a fallback between structured modes counts too.
                self.usage.step(step).requests += 1
                client = self.endpoints.client(endpoint)
                try:
                    # The endpoint's model name (an Azure deployment); the cache key keeps self.model.
                    kwargs["model"] = endpoint.model or self.model
                    if (bound := self.endpoints.request_timeout(endpoint)) is not None:
                        kwargs["timeout"] = bound  # a probe while every server is out: until the deadline
                    if shown is None and (options or not self.stream_replies):
                        # The reply's JSON as sent: building the library's pydantic objects for
                        # it cost ~1 ms of CPU per answer, more for long ones.
                        reply = await client.chat.completions.with_raw_response.create(**kwargs)
                        data = reply.http_response.json()
                        content, finish, usage = _answer_of(data)
                        if options:
                            content = json.dumps(option_probabilities(data, content, options))
                    else:
                        # Read inside the slot: the request is in flight until its last chunk.
                        chunks = await client.chat.completions.create(
                            **kwargs, stream=True, stream_options={"include_usage": True})
                        content, finish, usage = await _read_stream(chunks, shown or _Shown(_unread),
                                                                    watch=schema is not None)
                except Retryable as fault:  # a reply without choices, a stream that differs, a runaway
                    self.endpoints.invalid(endpoint)
                    fault.endpoint = endpoint
                    if isinstance(fault, RunawayAnswer):
                        # billed as far as it went (the server's own count never came)
                        fault.usage = (_prompt_tokens(messages), count_tokens(fault.reply or ""), 0)
                    raise
                except (openai.OpenAIError, *TRANSPORT_ERRORS, json.JSONDecodeError) as exc:
                    if (fault := transient(exc, self._secrets)) is None:
                        if isinstance(exc, openai.APIStatusError) and exc.status_code in REFUSALS:
                            self.endpoints.refuse(endpoint, exc.status_code, describe_error(exc, self._secrets))
                            if self.endpoints.unavailable() is None:
                                raise _Refused(describe_error(exc, self._secrets), endpoint) from None
                        raise
                    if not self._format_suspect(fault, mode, as_mode):
                        # (a 500 that may be the format's is charged to the server only once a
                        # lower mode fails too: else a burst of them takes it out as if it were down)
                        self.endpoints.faulted(endpoint, fault, rate_limited=isinstance(exc, openai.RateLimitError))
                    fault.endpoint = endpoint
                    raise fault from None
                self.endpoints.replied(endpoint)
                endpoint.limiter.settle(reservation, usage[0] + usage[1])
        except Retryable as fault:
            if not (after_500 and self._format_suspect(fault, mode, as_mode)):
                raise  # (a first 500 is retried as it is: a passing fault must not change the question)
            return await self._ask_in_lower_mode(fault, mode, sent, step, messages, max_tokens, temperature, schema,
                                                 json_schema, vary, step, item, shown, estimate, avoid, options)
        except (openai.OpenAIError, *TRANSPORT_ERRORS, json.JSONDecodeError) as exc:
            if (fault := transient(exc, self._secrets)) is not None:
                raise fault from None
            if (options and self._logprobs and isinstance(exc, openai.APIStatusError)
                    and exc.status_code in (400, 422)):
                # Perhaps the server takes no logprobs: ask again for the word alone, and from
                # now on if that is answered (a request refused either way refuses for another reason).
                self._logprobs = False
                try:
                    return await self._request(messages, max_tokens, temperature, schema, json_schema, vary, step,
                                               item, shown, estimate, avoid, options, as_mode)
                except BaseException:
                    self._logprobs = True
                    raise
            if (schema is not None and self._auto and isinstance(exc, openai.APIStatusError)
                    and exc.status_code in (400, 422) and mode != "prompt"):
                # The server does not support this structured-output mode: step down once and retry now
                # (for this request only when it was itself asked in a lower mode than the run's).
                lower = "json_mode" if mode == "json_schema" else "prompt"
                if as_mode is None:
                    self._mode = lower
                return await self._request(messages, max_tokens, temperature, schema, json_schema, vary, step,
                                           item, shown, estimate, avoid, options, as_mode and lower)
            raise
        if not content.strip():
            raise self._rejected(endpoint, Retryable(f"empty answer (finish_reason={finish})", answer=content), usage)
        if schema is not None and (run := counting_run(content)) is not None:
            # (a streamed answer is stopped as the run starts, _read_stream; one read whole ends here)
            raise self._rejected(endpoint, RunawayAnswer(run, content), usage)
        if schema is not None and finish == "length":
            # The model itself ran out of tokens: the identical request would run out again.
            raise self._rejected(endpoint, Retryable(
                f"answer cut off at max_tokens={max_tokens} before the JSON was complete", answer=content, repeats=True),
                usage)
        self._lower_failed = False
        if as_mode is None and mode is not None:
            self._format_faults[mode] = 0  # this mode is served: its 5xx so far were passing faults
        return content, usage, endpoint

    def _charge(self, fault: Retryable) -> None:
        """A 5xx held back as the format's (_request) counts as the server's fault after all."""
        if fault.endpoint is not None:
            self.endpoints.faulted(fault.endpoint, fault, rate_limited=False)

    def _format_suspect(self, fault: Retryable, mode: str | None, as_mode: str | None) -> bool:
        """Whether a 500 may be the server failing the structured-output format rather than the
        request: asked in the run's own mode (auto), with a lower mode left to ask in, and no
        lower mode failed since the last answer. (Not a 502-504 or 429: those say the server is
        overloaded or away.) The request's second 500 in a row is asked in the lower mode
        (_ask_in_lower_mode); its first is retried as it is, so that a passing fault does not
        change the question (docs/reliability.md)."""
        return (fault.status == 500 and self._auto and as_mode is None
                and mode in ("json_schema", "json_mode") and not self._lower_failed)

    async def _ask_in_lower_mode(self, fault: Retryable, mode: str, sent: float, step: str,
                                 *request: Any) -> tuple[str, Usage3, Endpoint]:
        """A structured request the server failed with a 500 twice in a row (the second sent at
        `sent`), asked again at once, of the same server, in the next lower mode (json_schema ->
        JSON mode -> schema in the prompt; our own validation checks the answer in any mode).
        Some servers fail a format they cannot serve with a 500 instead of a 400 (vLLM's guided
        decoding: vllm-project/vllm#8429, #13260), and retrying the identical request would fail
        until the outage timeout. When the lower mode is answered, that answer is kept (or,
        unusable, goes to the retry loop as any bad answer); after FORMAT_FAULTS such times with
        no answer in the run's mode between, the run stays in the lower mode (said once). When
        the lower mode gets no answer either, the server is at fault: the original 500 goes to
        the retry loop as any 5xx does."""
        lower = "json_mode" if mode == "json_schema" else "prompt"
        self.usage.step(step).retries += 1
        try:
            answer = await self._request(*request, as_mode=lower, prefer=fault.endpoint)
        except Retryable as failed:
            if failed.endpoint is not fault.endpoint or failed.answer is None:
                # no answer (or another server's): the server is failing, not the format
                if failed.endpoint is fault.endpoint:
                    self._lower_failed = True
                self._charge(fault)
                raise fault from None
            # The server answered in the lower mode, only not usably (empty, cut off): it serves
            # that mode, and the retry loop handles the answer as any bad answer.
            self._format_fault(fault, mode, lower, sent)
            raise
        if answer[2] is not fault.endpoint:
            self._charge(fault)  # another server answered: no word on this one's formats
            return answer
        self._format_fault(fault, mode, lower, sent)
        return answer

    def _format_fault(self, fault: Retryable, mode: str, lower: str, sent: float) -> None:
        """One more sign that the server fails `mode` and serves `lower`; at FORMAT_FAULTS the run
        steps down."""
        if sent > self._format_fault_seen.get(mode, -math.inf):  # not of a burst already counted
            self._format_faults[mode] = self._format_faults.get(mode, 0) + 1
            self._format_fault_seen[mode] = time.monotonic()
        if self._format_faults.get(mode, 0) >= FORMAT_FAULTS and self._mode == mode:
            self._mode = lower
            where = getattr(fault.endpoint, "base_url", None) or "the server"
            self.endpoints.log(f"chat: {where} failed {FORMAT_FAULTS} {mode} requests with HTTP {fault.status} "
                               f"and answered them in {lower}: structured output is {lower} from now on "
                               f"(chat.structured_output sets it)")

    def _rejected(self, endpoint: Endpoint, fault: Retryable, usage: Usage3 | None = None) -> Retryable:
        self.endpoints.invalid(endpoint)
        fault.endpoint = endpoint
        fault.usage = usage
        return fault

    async def aclose(self) -> None:
        await self.endpoints.aclose()


class _Refused(Retryable):
    """A server refused (401/403/404) and is out for the run; another one is left to try."""

    def __init__(self, reason: str, endpoint: Endpoint):
        super().__init__(reason)
        self.endpoint = endpoint


def _prompt_tokens(messages: Messages) -> int:
    """Our count of a request's prompt, where the server's is missing or not yet known."""
    return sum(count_tokens(m["content"]) for m in messages)


_DIGIT = re.compile(r"\d")  # a streamed piece that can continue a count (llm/runaway.py)


def _with_hint(messages: Messages, hint: str) -> Messages:
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0]["content"] = out[0]["content"] + "\n\n" + hint
    else:
        out.insert(0, {"role": "system", "content": hint})
    return out


def _answer_of(reply: Any) -> tuple[str, str | None, Usage3]:
    """Text, finish reason and token counts of a whole (not streamed) reply, from its JSON."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise Retryable("the server returned no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    usage = reply.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    content = message.get("content") if isinstance(message, dict) else None
    return (content if isinstance(content, str) else "", choice.get("finish_reason"),
            (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0,
             (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0))


def option_probabilities(reply: Any, content: str, options: tuple[str, ...]) -> dict[str, float]:
    """Each option's probability as the reply's first token (its variants " Yes", "YES" and
    "yes" added up), normalised over the options; without log-probabilities in the reply, 1.0 for
    the option the answer starts with. {} when neither tells an option."""
    wanted = {o.casefold(): o for o in options}
    mass = dict.fromkeys(options, 0.0)
    try:
        first = reply["choices"][0]["logprobs"]["content"][0]
        alternatives = first.get("top_logprobs") or [first]
    except (KeyError, IndexError, TypeError):
        alternatives = []
    for alt in alternatives:
        if not isinstance(alt, dict):
            continue
        token = str(alt.get("token", "")).strip().casefold()
        if token in wanted and isinstance(alt.get("logprob"), (int, float)):
            mass[wanted[token]] += math.exp(alt["logprob"])
    total = sum(mass.values())
    if total > 0:
        return {o: m / total for o, m in mass.items()}
    words = content.strip().casefold().split()
    word = words[0].strip(".,!:;\"'") if words else ""
    if word in wanted:
        return {o: float(o == wanted[word]) for o in options}
    return {}


async def _read_stream(chunks: Any, shown: _Shown, watch: bool = False) -> tuple[str, str | None, Usage3]:
    """Text, finish reason and token counts of a streamed reply, handing text on as it arrives.
    A connection that drops mid-stream raises here (openai wraps it, or not: both are triaged).
    `watch`: a structured answer, stopped (RunawayAnswer) once it starts counting (llm/runaway.py);
    closing the stream makes a llama.cpp server stop writing it."""
    received, finish, usage = "", None, (0, 0, 0)
    try:
        async for chunk in chunks:
            if chunk.usage:
                usage = _usage_of(chunk.usage)
            if chunk.choices:
                choice = chunk.choices[0]
                finish = choice.finish_reason or finish
                if choice.delta is not None and (delta := choice.delta.content):
                    received += delta
                    shown.receive(received, len(delta))
                    if watch and _DIGIT.search(delta) and (
                            run := counting_run(received, len(received) - len(delta) - TAIL)) is not None:
                        raise RunawayAnswer(run, received)
    finally:
        await chunks.close()  # also when `shown` stops a retry that went another way
    shown.finished(received)
    return received, finish, usage


class _Shown:
    """The text a streamed call has handed to its reader, over all of its attempts.

    Text already printed to a terminal or sent as server-sent events cannot be taken back, and a
    retry resends the identical request. So a retried stream is read silently up to the length
    already shown, must repeat that text exactly, and only what goes beyond it is handed on:
    with a deterministic server (temperature 0, the default) the reader sees one uninterrupted
    answer, and the answer returned and cached is exactly the text shown. A retry that answers
    differently is stopped and counts as a failed attempt (retried again; the item fails if no
    attempt matches) rather than splicing two answers into one. The alternatives are worse for
    the CLI and the server: buffering every answer until it is whole stops streaming, retrying
    only before the first token leaves the common fault (a connection dropped mid-answer) fatal,
    and a "reset" event would need every reader to handle it."""

    def __init__(self, on_token: Callable[[str], None]):
        self.on_token = on_token
        self.text = ""

    def receive(self, received: str, new: int) -> None:
        """`received` is this attempt's text so far; its last `new` characters just arrived."""
        start = len(received) - new
        end = min(len(received), len(self.text))
        if start < end and received[start:end] != self.text[start:end]:
            raise Retryable(_DIFFERS)
        if len(received) > len(self.text):
            fresh = received[max(start, len(self.text)):]
            self.text = received
            self.on_token(fresh)

    def finished(self, received: str) -> None:
        if len(received) < len(self.text):
            raise Retryable(_DIFFERS)


def _unread(_: str) -> None:
    """A streamed answer nobody reads as it comes (ChatClient.stream_replies): only the whole."""


_DIFFERS = "the retried stream differs from the part of the answer already shown"


def _validated(content: str, schema: type[BaseModel], json_schema: dict[str, Any] | None = None) -> tuple[str, int]:
    """Canonical JSON of a schema-valid reply, repairing near-JSON (code fences, trailing commas),
    and the number of its lists cut to their schema's maxItems."""
    json_schema = _strict_schema(schema) if json_schema is None else json_schema
    try:
        data = json.loads(content)
    except ValueError:
        pass
    else:
        cut = cut_to_max_items(data, json_schema)
        try:
            return schema.model_validate_json(json.dumps(data) if cut else content).model_dump_json(), cut
        except ValidationError:
            pass
    if _cut_off(content):
        # json_repair would close the brackets and hand back a plausible but partial answer
        # (e.g. half the entities); a fresh attempt is the only way to get all of it.
        raise Retryable(f"reply is cut off in the middle of the JSON (reply ended: {content[-60:]!r})")
    try:
        repaired = json_repair.loads(content)
        cut = cut_to_max_items(repaired, json_schema)
        return schema.model_validate(repaired).model_dump_json(), cut
    except (ValidationError, ValueError, TypeError) as exc:
        snippet = content[:120].replace("\n", " ")
        # `answer` lets the caller see a model repeat the same wrong answer. A cut-off reply
        # (above) does not count: another temperature would not make it arrive whole.
        raise Retryable(f"reply does not match schema {schema.__name__}: {str(exc).splitlines()[0]} "
                        f"(reply began: {snippet!r})", answer=content) from None


def cut_to_max_items(value: Any, schema: dict[str, Any]) -> int:
    """Cut, in place, every list in `value` longer than its `maxItems` in `schema` (a strict
    schema: references inlined) to its first maxItems items; the number of lists cut.

    A server without constrained decoding (JSON mode, many Ollama/vLLM setups) does not stop a
    list at maxItems. Its first items are what a server that obeys would have sent, so keeping
    them gives the same kind of answer, where a validation error would lose the whole answer:
    a retry resends the identical request and gets the same long list again."""
    if not isinstance(schema, dict) or not isinstance(value, (list, dict)):
        return 0
    kind = "array" if isinstance(value, list) else "object"
    cut = sum(cut_to_max_items(value, sub) for sub in schema.get("allOf", ()))
    # Of alternatives (an optional list, say) the first that takes this kind of value applies.
    branch = next((sub for sub in [*schema.get("anyOf", ()), *schema.get("oneOf", ())]
                   if isinstance(sub, dict) and kind in _types(sub)), None)
    if branch is not None:
        cut += cut_to_max_items(value, branch)
    if isinstance(value, list):
        limit = schema.get("maxItems")
        if isinstance(limit, int) and len(value) > limit:
            del value[limit:]
            cut += 1
        items = schema.get("items")
        if isinstance(items, dict):
            cut += sum(cut_to_max_items(v, items) for v in value)
    else:
        properties = schema.get("properties") or {}
        cut += sum(cut_to_max_items(v, properties[k]) for k, v in value.items() if k in properties)
    return cut


def _types(schema: dict[str, Any]) -> set[str]:
    t = schema.get("type")
    return {t} if isinstance(t, str) else set(t or ())


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


def _usage_of(u: Any) -> Usage3:
    return (u.prompt_tokens or 0, u.completion_tokens or 0, _cached_tokens(u)) if u else (0, 0, 0)


def _cached_tokens(usage: object) -> int:
    """Prompt tokens the server took from its prompt cache; servers without one send no details."""
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", 0) or 0) if details else 0


def run_sync(coro: Awaitable[Any]) -> Any:
    """Run a coroutine from sync code (the CLI and the sync API)."""
    return asyncio.run(coro)  # type: ignore[arg-type]


