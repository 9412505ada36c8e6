"""A scripted LLM for unit tests: the real ChatClient talks to it through httpx.MockTransport,
so caching, retries, schema validation and usage accounting are exercised as in production."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sensegraph.config import ChatSettings
from sensegraph.llm import Cache, ChatClient, Usage

Responder = Callable[[dict[str, Any]], "str | dict | list | httpx.Response"]


def schema_name(body: dict[str, Any]) -> str | None:
    """The pydantic model name of a structured request (None for plain text requests)."""
    rf = body.get("response_format") or {}
    return (rf.get("json_schema") or {}).get("name")


def last_user(body: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def completion(content: str, prompt_tokens: int = 10, completion_tokens: int = 5,
               finish_reason: str = "stop") -> httpx.Response:
    return httpx.Response(200, json={
        "id": "scripted", "object": "chat.completion", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "finish_reason": finish_reason,
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


class SchemaNames:
    """Names for requests sent without one. A JSON-mode or prompt-mode request (the schema in the
    system prompt's hint, as ChatClient sends it after stepping down) is given the name of the
    json_schema request with that schema seen before, so `schema_name` answers for it as a real
    server answers the same question in either mode; the type stays as sent."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}  # a json_schema request's schema, as sent -> its name

    def named(self, body: dict[str, Any]) -> dict[str, Any]:
        rf = body.get("response_format") or {}
        if rf.get("json_schema"):
            self._names[json.dumps(rf["json_schema"].get("schema"), sort_keys=True)] = rf["json_schema"].get("name")
            return body
        messages = body.get("messages") or []
        system = messages[0].get("content") or "" if messages and messages[0].get("role") == "system" else ""
        if "JSON schema:\n" not in system:
            return body
        try:
            schema = json.loads(system.rsplit("JSON schema:\n", 1)[1])
        except ValueError:
            return body
        name = self._names.get(json.dumps(schema, sort_keys=True))
        if name is None:
            return body
        return {**body, "response_format": {**rf, "json_schema": {"name": name}}}


class ScriptedLLM:
    """`responder(body)` returns the answer content (str, or a dict/list sent as JSON) or a
    full httpx.Response (for faults). Every request body is kept in `self.requests`."""

    def __init__(self, responder: Responder):
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._names = SchemaNames()

    def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        out = self.responder(self._names.named(body))
        if isinstance(out, httpx.Response):
            return out
        if not isinstance(out, str):
            out = json.dumps(out, ensure_ascii=False)
        return completion(out)

    def client(self, settings: ChatSettings | None = None, cache: Cache | str | Path | None = None,
               usage: Usage | None = None) -> ChatClient:
        settings = settings or ChatSettings(provider="openai", model="scripted", base_url="http://scripted/v1",
                                            retry_base_seconds=0.001)
        if isinstance(cache, (str, Path)):
            cache = Cache(cache)
        http = httpx.AsyncClient(transport=httpx.MockTransport(self._handle))
        return ChatClient(settings, cache=cache, usage=usage, http_client=http)
