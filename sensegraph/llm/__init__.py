"""Chat and embedding clients built from settings; every model call in sensegraph goes through
these two, so caching, limits, retries and usage accounting apply everywhere."""
from __future__ import annotations

import asyncio

from ..config import Settings
from .cache import Cache
from .client import BudgetReached, ChatClient, LLMError, Messages, run_sync, strict_schema
from .usage import StepUsage, Usage


def open_cache(settings: Settings, enabled: bool | None = None) -> Cache | None:
    on = settings.cache.enabled if enabled is None else enabled
    return Cache(settings.path(settings.cache.dir) / "llm.sqlite") if on else None


def open_chat(settings: Settings, *, cache: Cache | None, usage: Usage | None = None, **kwargs) -> ChatClient:
    """The chat client for these settings; `provider: local` starts the embedded server lazily."""
    usage = usage or Usage(settings.chat.price_per_1k_prompt, settings.chat.price_per_1k_completion)
    if settings.chat.provider == "local":
        from .embedded import ensure_server

        local = settings.local

        async def endpoint() -> tuple[str, str]:
            # Loading the model blocks for seconds; keep the event loop free meanwhile.
            return await asyncio.to_thread(ensure_server, local)

        extra = {"repeat_penalty": local.repeat_penalty, "repeat_last_n": 1024} if local.repeat_penalty != 1.0 else None
        # No more requests in flight than the server has slots: llama.cpp queues the rest, and
        # a queued request's wait counts against chat.timeout. With one slot and four in flight,
        # two-minute report calls timed out behind each other and the server was taken for
        # down; held here instead, they wait without a clock (the server is no less busy).
        chat = settings.chat.model_copy(update={"concurrency": min(settings.chat.concurrency, local.parallel)})
        # Streamed, so that chat.timeout is the longest silence between tokens: a whole answer
        # of 1,500 tokens ran past 300 s on a slow day, and the server was taken for down.
        stream = settings.chat.stream_replies is not False
        return ChatClient(chat, cache=cache, usage=usage, endpoint=endpoint, extra_body=extra,
                          stream_replies=stream, **kwargs)
    return ChatClient(settings.chat, cache=cache, usage=usage, stream_replies=bool(settings.chat.stream_replies),
                      **kwargs)


def open_embedder(settings: Settings, *, cache: Cache | None, usage: Usage | None = None, **kwargs):
    from .embeddings import Embedder

    return Embedder(settings.embedding, cache=cache, usage=usage, **kwargs)


__all__ = [
    "BudgetReached", "Cache", "ChatClient", "LLMError", "Messages", "StepUsage", "Usage",
    "open_cache", "open_chat", "open_embedder", "run_sync", "strict_schema",
]
