"""An OpenAI-compatible chat endpoint, so existing chat front ends can talk to an index.

The model name picks the method: `sensegraph-global` (global search at the configured level),
`sensegraph-global-c0` … `-cN` (a given level, the paper's C0 = root), `sensegraph-global-dynamic`,
`sensegraph-local`, `sensegraph-drift`, `sensegraph-basic`, `sensegraph-text`, `sensegraph-lazy`
(every name of the query registry). The last user message is the question; earlier user and
assistant turns are the conversation history.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..query import REGISTRY
from .ask import MAX_QUESTION_CHARS, error_status
from .browse import chat_models
from .security import require_key
from .state import state_of

router = APIRouter(prefix="/v1", dependencies=[Depends(require_key)], tags=["openai-compatible"])
_MODEL = re.compile(r"^sensegraph-(?P<method>[a-z]+)(?:-(?:c(?P<level>\d+)|(?P<dynamic>dynamic)))?$")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls ...: accepted and ignored
    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text parts carry a question
            return " ".join(str(p.get("text", "")) for p in self.content if p.get("type", "text") == "text")
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    # Sampling parameters (temperature, max_tokens, ...) are accepted and ignored: the index's
    # settings decide how its methods call the model.
    model_config = ConfigDict(extra="allow")
    model: str = Field(max_length=100)
    messages: list[ChatMessage] = Field(min_length=1, max_length=100)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_type: str | None = Field(None, max_length=200, description="sensegraph: shape of the answer")


def openai_error(status: int, message: str, etype: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": etype, "param": param, "code": code}},
                        status_code=status)


def parse_model(name: str, levels: int) -> tuple[str, int | None, bool] | None:
    m = _MODEL.match(name.strip())
    if not m or m["method"] not in REGISTRY:
        return None
    level = int(m["level"]) if m["level"] is not None else None
    if (level is not None or m["dynamic"]) and not REGISTRY[m["method"]].by_level:
        return None
    if level is not None and level >= levels:
        return None
    return m["method"], level, bool(m["dynamic"])


@router.get("/models", summary="The models (query methods) this server offers")
def models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": chat_models(state_of(request).explorer.max_level() + 1)}


@router.post("/chat/completions", summary="Chat completion answered from the index (stream true/false)")
async def chat_completions(request: Request, req: ChatRequest) -> Any:
    st = state_of(request)
    parsed = parse_model(req.model, st.explorer.max_level() + 1)
    if parsed is None:
        names = ", ".join(m["id"] for m in chat_models(st.explorer.max_level() + 1))
        return openai_error(404, f"unknown model {req.model!r}; this server offers {names}",
                            "invalid_request_error", "model", "model_not_found")
    method, level, dynamic = parsed
    turns = [m for m in req.messages if m.role in ("user", "assistant")]
    if not turns or turns[-1].role != "user" or not turns[-1].text().strip():
        return openai_error(400, "the last message must be a non-empty user message (the question)",
                            "invalid_request_error", "messages")
    question = turns[-1].text()
    if len(question) > MAX_QUESTION_CHARS:
        return openai_error(400, f"the question is longer than {MAX_QUESTION_CHARS} characters",
                            "invalid_request_error", "messages")
    history = [{"role": m.role, "content": m.text()} for m in turns[:-1]]
    kwargs = {"level": level, "dynamic": dynamic, "response_type": req.response_type, "history": history}
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def usage(result: Any) -> dict[str, int]:
        u = result.usage or {}
        prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def extension(result: Any) -> dict[str, Any]:
        # Not part of OpenAI's schema; clients ignore it, programs can follow the citations.
        return {"method": result.method, "citations": result.citations, "stats": result.stats}

    if not req.stream:
        try:
            result = await st.query(question, method, **kwargs)
        except Exception as exc:
            status, etype = error_status(exc)
            if status == 500:
                raise
            return openai_error(status, str(exc), etype)
        return {"id": ident, "object": "chat.completion", "created": created, "model": req.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer},
                             "finish_reason": "stop"}],
                "usage": usage(result), "sensegraph": extension(result)}

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
        body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return "data: " + json.dumps(body, ensure_ascii=False, default=str) + "\n\n"

    async def events() -> AsyncIterator[str]:
        yield chunk({"role": "assistant", "content": ""})
        streamed = False
        async for kind, value in st.stream(question, method, **kwargs):
            if kind == "token":
                streamed = True
                yield chunk({"content": value})
            elif kind == "ping":
                yield ": keep-alive\n\n"
            elif kind == "result":
                if not streamed:  # an answers object that does not stream: send the answer whole
                    yield chunk({"content": value.answer})
                yield chunk({}, "stop", sensegraph=extension(value))
                if include_usage:
                    yield chunk(None, usage=usage(value))
            else:
                status, etype = error_status(value)
                yield "data: " + json.dumps({"error": {"message": str(value), "type": etype, "code": status}}) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


__all__ = ["router", "parse_model"]
