"""POST /api/query: every query method, answered as one JSON object or streamed as server-sent
events (`token` while the answer is written, then `result` with citations and cited records)."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from ..llm import LLMError
from ..query import METHODS, QueryResult
from .security import require_key
from .state import state_of

router = APIRouter(prefix="/api", dependencies=[Depends(require_key)])
MAX_QUESTION_CHARS = 4000
MethodName = Literal[METHODS]  # type: ignore[valid-type]  # the registry's names, as an enum in the schema


class Turn(BaseModel):
    role: Literal["user", "assistant"]
    content: str = Field(max_length=20_000)


class QueryRequest(BaseModel):
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    method: MethodName | None = Field(None, description="default: global, or lazy on a lazy index "
                                                         "(/api/info default_method)")
    level: int | None = Field(None, ge=0, le=50, description="global search: community level (0 = root)")
    dynamic: bool = Field(False, description="global search: dynamic community selection")
    budget: int | None = Field(None, ge=1, le=100_000, description="lazy search: relevance tests of text units "
                                                                  "(default: the settings' lazy.budget)")
    response_type: str | None = Field(None, max_length=200, description='e.g. "single paragraph"')
    history: list[Turn] = Field(default_factory=list, max_length=50, description="earlier turns")
    stream: bool = Field(False, description="answer as server-sent events")
    include_context: bool = Field(False, description="also return the full context the model saw")


def result_json(result: QueryResult, include_context: bool = False) -> dict[str, Any]:
    out = result.to_dict()
    if not include_context:
        out.pop("context", None)  # often hundreds of kilobytes; the page shows the cited records
    return out


def query_kwargs(req: QueryRequest) -> dict[str, Any]:
    out = {"level": req.level, "dynamic": req.dynamic, "response_type": req.response_type,
           "history": [t.model_dump() for t in req.history]}
    if req.budget is not None:  # only then: the searcher refuses a budget for a method that takes none
        out["budget"] = req.budget
    return out


def error_status(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, ValueError):
        return 400, "invalid_request_error"
    if isinstance(exc, LLMError):
        return 502, "upstream_error"  # the configured model failed after every retry
    return 500, "server_error"


def sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n"


@router.post("/query", tags=["query"], summary=f"Ask a question ({', '.join(METHODS)})",
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "JSON result, or with stream=true server-sent events: "
                                             "`token` {text}, then `result` (the JSON result) or `error`"}})
async def query(request: Request, req: QueryRequest) -> Any:
    st = state_of(request)
    method = req.method or st.default_method
    if not req.stream:
        try:
            result = await st.query(req.question, method, **query_kwargs(req))
        except Exception as exc:
            status, kind = error_status(exc)
            if status == 500:
                raise
            raise HTTPException(status, f"{kind}: {exc}") from None
        return result_json(result, req.include_context)

    async def events() -> AsyncIterator[str]:
        yield sse("start", {"method": method, "level": req.level})
        async for kind, value in st.stream(req.question, method, **query_kwargs(req)):
            if kind == "token":
                yield sse("token", {"text": value})
            elif kind == "ping":
                yield ": keep-alive\n\n"
            elif kind == "result":
                yield sse("result", result_json(value, req.include_context))
            else:
                status, etype = error_status(value)
                yield sse("error", {"status": status, "type": etype, "message": str(value)})

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
