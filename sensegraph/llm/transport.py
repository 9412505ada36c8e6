"""The HTTP side both model clients share: how the `openai` client is built, and what a failed
request means — a transient fault worth resending the identical request for (`Retryable`), or a
final one (`LLMError`) whose one-line reason never contains the API key.

Chat (client.py) and embeddings (embeddings.py) differ only in what they ask and how they check
the answer; connection settings and error triage are the same, so they live here once.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import openai

from ..config import ModelSettings
from .limits import retry_after_of


class LLMError(RuntimeError):
    """A request failed for good; the message names what it was for and why."""

    def __init__(self, purpose: str, reason: str, attempts: int = 0):
        self.purpose = purpose
        self.reason = reason
        self.attempts = attempts
        tries = f" after {attempts} attempt{'s' * (attempts != 1)}" if attempts else ""
        super().__init__(f"{purpose} failed{tries}: {reason}")


class Retryable(Exception):
    """A failed attempt worth repeating. `answer` is set when the server did answer, but with
    something unusable; `repeats` when the same request is known to give the same bad answer."""

    def __init__(self, reason: str, retry_after: float | None = None, *, answer: str | None = None,
                 repeats: bool = False, status: int | None = None):
        super().__init__(reason)
        self.retry_after = retry_after
        self.answer = answer
        # the text the server sent, whatever was wrong with it (kept for `sensegraph doctor
        # --rejected`); `answer` is left unset where a repeat of it says nothing (a cut-off reply)
        self.reply: str | None = answer
        self.repeats = repeats
        self.status = status  # the HTTP status of a 5xx (or 408/409)
        self.endpoint: Any = None  # the server that faulted, when it was the server (llm/endpoints.py)
        # (prompt, completion, cached) tokens of an answer the server gave and we could not use
        # (cut off, empty): billed all the same, so counted all the same
        self.usage: tuple[int, int, int] | None = None


# The HTTP library the `openai` package is built on: httpx for 1.x, its successor httpx2 for
# 3.x. Its own client is the one to use: handing 3.x an httpx client works, but costs 1.2 ms of
# CPU more per request (httpcore's connection pool scans every connection on every request),
# over a third of what the whole pipeline spends per call.
_SDK_HTTP = sys.modules[type(openai.DEFAULT_CONNECTION_LIMITS).__module__.split(".")[0]]
# A connection dropped while a streamed body is read comes through unwrapped, from either library.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = tuple({httpx.TransportError, _SDK_HTTP.TransportError})


def open_client(settings: ModelSettings, base_url: str | None, http_client: httpx.AsyncClient | None = None, *,
                api_key: str | None = None, api_version: str | None = None,
                concurrency: int | None = None) -> openai.AsyncOpenAI:
    """The `openai` client for one endpoint (Azure when `api_version` is set); key, API version
    and concurrency default to the section's (an entry of `endpoints` may have its own)."""
    s = settings
    key = api_key or s.api_key
    version = api_version or s.api_version
    connections = (concurrency or s.concurrency) + 4
    http = http_client or openai.DefaultAsyncHttpxClient(
        timeout=_SDK_HTTP.Timeout(s.timeout, connect=min(30.0, s.timeout)),
        limits=_SDK_HTTP.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
    # Our retry loops count attempts per item and honour Retry-After; the library's would double them.
    common: dict[str, Any] = dict(api_key=key or "sensegraph-no-key", max_retries=0, timeout=s.timeout,
                                  http_client=http)
    if version:
        return openai.AsyncAzureOpenAI(azure_endpoint=base_url, api_version=version, **common)
    return openai.AsyncOpenAI(base_url=base_url, **common)


def transient(exc: BaseException, secret: str | tuple[str | None, ...] | None = None) -> Retryable | None:
    """The Retryable for a fault that the identical request may not hit again (rate limit, 5xx,
    timeout, dropped connection, a body cut off in transfer), or None for one it would hit again
    (401, 404, a 400 the caller may handle)."""
    if isinstance(exc, openai.RateLimitError):
        return Retryable(describe_error(exc, secret), retry_after_of(exc.response.headers))
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code >= 500 or exc.status_code in (408, 409):
            return Retryable(describe_error(exc, secret), status=exc.status_code)
        return None
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return Retryable(describe_error(exc, secret))
    if isinstance(exc, openai.APIError):
        # An error event inside a streamed answer: the server broke off mid-answer.
        return Retryable(describe_error(exc, secret))
    if isinstance(exc, TRANSPORT_ERRORS):
        # A stream dropped while its body was being read (openai 1.x lets these through unwrapped).
        return Retryable(f"the connection dropped during the reply ({type(exc).__name__}: {exc})")
    if isinstance(exc, json.JSONDecodeError):
        # The HTTP body itself was cut off or garbled in transfer (not the model's answer): ask again.
        return Retryable(f"the server's reply is not valid JSON ({exc.msg})")
    return None


def describe_error(exc: BaseException, secret: str | tuple[str | None, ...] | None = None) -> str:
    """One line saying why a request failed; never containing `secret` (the API key, or the keys
    of several endpoints), which a server may echo back in an error body."""
    text = _error_text(exc)
    for key in (secret if isinstance(secret, tuple) else (secret,)):
        if key and len(key) >= 4:
            text = text.replace(key, "***")
    return text


def _error_text(exc: BaseException) -> str:
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
