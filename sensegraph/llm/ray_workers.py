"""LLM calls on a Ray cluster (`sensegraph index --ray ADDRESS`): the model-bound half of every
step runs on the cluster's workers, the rest stays in the driver.

What runs where, and why:
- The driver runs the pipeline unchanged: it reads the tables, builds every prompt, checks the
  answer cache and the spending budget, merges results and writes tables; clustering is there
  too. Each call that is not in the cache goes to a worker, and its answer comes back to the
  driver, which writes it to the project's cache at once.
- A worker (a Ray actor, one per node by default, spread over the nodes) owns HTTP clients for
  its share of the endpoints (endpoints.py) and does the call's requests, retries, back-off,
  Retry-After pauses and JSON validation: the part that waits on servers and costs the CPU.
- The answer cache is the driver's. A call is sent only when the cache does not hold it, and an
  answer is cached as soon as it arrives, so the cache is shared across nodes by construction;
  no cache files have to be merged and no node needs a shared disk. A worker that dies takes
  only its calls in flight with it: Ray restarts the actor and retries those calls (the actor is
  created with unlimited restarts and task retries), and every answer that had arrived is a
  cache hit on any rerun. The cost of this design is one Ray round trip per call (a millisecond,
  beside hundreds for the model), and that the driver's prompt building stays on one core,
  measured at ~4-6 ms per call (docs/performance.md), i.e. ~200 calls/s.
- The result equals a single-process index of the same input: the same driver code makes the
  same calls in the same order and merges the same answers.

Ray is an optional extra (`pip install sensegraph[ray]`); single-machine runs never import it.
Requests of the embedded model cannot be sent to other nodes (it listens on 127.0.0.1), so
`--ray` needs `provider: openai` endpoints.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from dataclasses import asdict
from typing import Any

import numpy as np
from pydantic import BaseModel

from ..config import ChatSettings, EmbeddingSettings, ModelSettings, Settings
from .client import ChatClient, strict_schema
from .embeddings import Embedder
from .transport import LLMError
from .usage import StepUsage, Usage


class RayUnavailable(RuntimeError):
    pass


UNKNOWN_SCHEMA = ("schema", "unknown", 0)  # a worker's answer when it lost its schemas (restarted)


def shares(section: ModelSettings, workers: int) -> list[ModelSettings]:
    """Each worker's copy of a model section: its share of the endpoints. With more workers than
    endpoints, workers share an endpoint and split its concurrency (at least 1 each), so the
    cluster as a whole keeps each server's limit; with fewer, a worker gets several endpoints."""
    servers = section.endpoints or []
    if not servers:  # one server: every worker talks to it, with an equal part of its limits
        part = {"concurrency": max(1, section.concurrency // workers),
                "requests_per_minute": _split(None, section.requests_per_minute, workers),
                "tokens_per_minute": _split(None, section.tokens_per_minute, workers)}
        return [section.model_copy(update=part) for _ in range(workers)]
    out = []
    for w in range(workers):
        mine = [e for n, e in enumerate(servers) if n % workers == w % len(servers)] if workers >= len(servers) \
            else [e for n, e in enumerate(servers) if n % workers == w]
        if workers > len(servers):
            sharing = len([v for v in range(workers) if v % len(servers) == w % len(servers)])
            mine = [e.model_copy(update={"concurrency": max(1, (e.concurrency or section.concurrency) // sharing),
                                         "requests_per_minute": _split(e.requests_per_minute, section.requests_per_minute, sharing),
                                         "tokens_per_minute": _split(e.tokens_per_minute, section.tokens_per_minute, sharing)})
                    for e in mine]
        out.append(section.model_copy(update={"endpoints": mine}))
    return out


def _split(own: int | None, section: int, sharing: int) -> int:
    limit = section if own is None else own
    return max(1, limit // sharing) if limit else 0


class ModelWorker:
    """One worker: a chat client and an embedder without cache or budget (the driver has both).

    Each call's usage is recorded under a step name of its own and handed back with the answer,
    so concurrent calls in one actor never mix their counts."""

    def __init__(self, chat: str, embedding: str):
        self.chat = ChatClient(ChatSettings.model_validate_json(chat), cache=None)
        self.embedder = Embedder(EmbeddingSettings.model_validate_json(embedding), cache=None)
        self._tags = itertools.count()
        # Response schemas by key, each sent once: unpickling a pydantic class builds it anew
        # (~10 ms), which per call made a worker slower than the model it waits for.
        self.schemas: dict[str, type[BaseModel]] = {}

    def pid(self) -> int:
        import os

        return os.getpid()

    async def chat_call(self, messages: list[dict[str, str]], key: str | None, schema: type[BaseModel] | None,
                        step: str, item: str, max_tokens: int,
                        temperature: float | None) -> tuple[str | None, dict, tuple | None, dict]:
        if key is not None:
            if schema is not None:
                self.schemas[key] = schema
            elif key not in self.schemas:  # a restarted worker: the driver sends the schema again
                return None, {}, UNKNOWN_SCHEMA, {}
            schema = self.schemas[key]
        tag = f"{step}#{next(self._tags)}"
        error = None
        content = None
        try:
            content = await self.chat._call(messages, step=tag, item=item, max_tokens=max_tokens,
                                            temperature=temperature, schema=schema)
        except LLMError as exc:
            error = (exc.purpose, exc.reason, exc.attempts)
        use = self.chat.usage.steps.pop(tag, StepUsage())
        return content, asdict(use), error, self.chat.endpoints.report()

    async def embed_call(self, batch: list[str], step: str, number: int) -> tuple[Any, dict, tuple | None, dict]:
        tag = f"{step}#{next(self._tags)}"
        error = None
        vectors = None
        try:
            vectors = await self.embedder._remote_batch(batch, tag, number)
        except LLMError as exc:
            error = (exc.purpose, exc.reason, exc.attempts)
        use = self.embedder.usage.steps.pop(tag, StepUsage())
        return vectors, asdict(use), error, self.embedder.endpoints.report()

    async def close(self) -> None:
        await self.chat.aclose()
        await self.embedder.aclose()


class RayWorkers:
    """The driver's side: the actors, and which one gets the next call (the one with the fewest
    calls in flight). `chat` and `embed` are what ChatClient and Embedder call instead of their
    own requests when `workers` is set on them."""

    def __init__(self, settings: Settings, address: str, workers: int = 0):
        try:
            import ray
        except ImportError:
            raise RayUnavailable("--ray needs Ray: pip install 'sensegraph[ray]'") from None
        for name, m in (("chat", settings.chat), ("embedding", settings.embedding)):
            if m.provider != "openai":
                raise RayUnavailable(f"--ray needs {name}.provider openai: the embedded model listens on 127.0.0.1 "
                                     f"of this machine only; give the cluster servers it can reach ({name}.endpoints)")
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=address, namespace="sensegraph", log_to_driver=False, include_dashboard=False,
                     ignore_reinit_error=True)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = workers or max(1, len(nodes))
        actor = ray.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0,
                           scheduling_strategy="SPREAD")(ModelWorker)
        # The budget is the driver's (it sees every call's tokens); a worker must not keep its own.
        chats = [c.model_copy(update={"budget_tokens": 0, "budget_cost": 0.0}) for c in shares(settings.chat, count)]
        embeds = shares(settings.embedding, count)
        self.actors = [actor.remote(c.model_dump_json(), e.model_dump_json()) for c, e in zip(chats, embeds)]
        ray.get([a.pid.remote() for a in self.actors])  # up and running before the first call
        self._in_flight = [0] * count
        self._sent: list[set[str]] = [set() for _ in range(count)]  # schema keys each worker holds
        self._keys: dict[type[BaseModel], str] = {}
        self.endpoint_reports: dict[str, dict[int, dict]] = {"chat": {}, "embedding": {}}

    @property
    def size(self) -> int:
        return len(self.actors)

    def _pick(self) -> int:
        n = min(range(len(self.actors)), key=lambda i: self._in_flight[i])
        self._in_flight[n] += 1
        return n

    async def chat(self, client: ChatClient, messages: list[dict[str, str]], *, schema: type[BaseModel] | None,
                   step: str, item: str, max_tokens: int, temperature: float | None) -> str:
        key = self._key(schema)
        n = self._pick()
        try:
            while True:
                send = schema if key is not None and key not in self._sent[n] else None
                if send is not None:
                    self._sent[n].add(key)  # type: ignore[arg-type]
                content, delta, error, report = await self.actors[n].chat_call.remote(
                    messages, key, send, step, item, max_tokens, temperature)
                if error != UNKNOWN_SCHEMA:
                    break
                self._sent[n].clear()  # the worker restarted and lost them all
        finally:
            self._in_flight[n] -= 1
        return self._returned(client.usage, "chat", step, n, content, delta, error, report)

    def _key(self, schema: type[BaseModel] | None) -> str | None:
        """A schema's identity across processes: its name and JSON schema."""
        if schema is None:
            return None
        if schema not in self._keys:
            text = json.dumps(strict_schema(schema), sort_keys=True)
            self._keys[schema] = f"{schema.__name__}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        return self._keys[schema]

    async def embed(self, embedder: Embedder, batch: list[str], *, step: str, number: int) -> np.ndarray:
        n = self._pick()
        try:
            vectors, delta, error, report = await self.actors[n].embed_call.remote(batch, step, number)
        finally:
            self._in_flight[n] -= 1
        return np.asarray(self._returned(embedder.usage, "embedding", step, n, vectors, delta, error, report),
                          dtype=np.float32)

    def _returned(self, usage: Usage, kind: str, step: str, n: int, answer: Any, delta: dict,
                  error: tuple | None, report: dict) -> Any:
        """What a worker's call gave: its usage added to the driver's (chat tokens through
        add_chat, so the spending budget sees them), its endpoints' counts kept for stats, and
        the answer, or the LLMError it ended in."""
        use = StepUsage(**delta)
        if kind == "chat":
            usage.add_chat(step, use.prompt_tokens, use.completion_tokens, use.cached_prompt_tokens)
            use.prompt_tokens = use.completion_tokens = use.cached_prompt_tokens = 0
        usage.step(step).add(use)
        self.endpoint_reports[kind][n] = report
        if error is not None:
            raise LLMError(*error)
        return answer

    def pool(self, kind: str) -> "WorkerEndpoints":
        """What Usage.endpoint_report() reads for `kind` ("chat" or "embedding") in a Ray run."""
        return WorkerEndpoints(self, kind)

    async def aclose(self) -> None:
        ray = self._ray
        await asyncio.gather(*(a.close.remote() for a in self.actors), return_exceptions=True)
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self._started:
            ray.shutdown()


class WorkerEndpoints:
    """The endpoints of every worker for one model, as stats.json `endpoints` lists them."""

    several = True

    def __init__(self, workers: RayWorkers, kind: str):
        self.workers = workers
        self.kind = kind

    def report(self) -> dict[str, dict[str, Any]]:
        return {f"worker {n}, endpoint {name}": counts
                for n, servers in sorted(self.workers.endpoint_reports[self.kind].items())
                for name, counts in servers.items()}
