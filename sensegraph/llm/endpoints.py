"""The servers one model is reached through: one, or several (`chat.endpoints`), with a slot
for each request on the least loaded server that is in rotation.

Why here and not in a proxy: a laptop user with two Ollama boxes, or a team with three Azure
deployments of one model, should get their combined throughput without running LiteLLM or
nginx beside sensegraph, and the client is where the per-server facts are known (its limits,
its last Retry-After, whether it just failed).

- Load: a request takes the server with the lowest share of its `concurrency` in use (ties: the
  one that has served fewer requests), and waits when every server is full.
- Waiting: the waiting requests form one queue, served in order; a freed slot (or a pause that
  ends) wakes exactly as many as there are slots to take, never all of them. Waking every
  waiter made the client's CPU per call grow with the number of waiters (a step that started
  all its items at once spent 17 ms per call re-checking the servers).
- Limits: each server has its own concurrency and requests/tokens per minute.
- Rate limiting: a 429 pauses that server for its Retry-After (or a second) for every request,
  not only the one that got it, so the others go elsewhere instead of hitting it again; with
  several servers, each further 429 in a row doubles the pause (up to RATE_LIMIT_CAP).
- Retries: a request whose attempt failed on a server takes another ready server next.
- Failures: after OUT_AFTER_FAILURES transient faults in a row (5xx, timeouts, refused
  connections) a server leaves the rotation for a cool-down (COOL_DOWN_SECONDS, doubled each
  time it fails again on its return, up to COOL_DOWN_CAP); when it is back one success puts it
  fully back. With a single server there is nothing to fail over to, so only Retry-After pauses.
- Cache keys name the model, not the server, so an answer is found again whichever served it.

The request's own retries (per item, in client.py and embeddings.py) are unchanged: a retry
after a fault simply gets a slot again, usually on another server.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import openai

from ..config import ModelSettings
from .limits import RateLimiter
from .transport import Retryable, open_client

OUT_AFTER_FAILURES = 3
COOL_DOWN_SECONDS = 5.0
COOL_DOWN_CAP = 120.0
RATE_LIMIT_PAUSE = 1.0  # a 429 without Retry-After
# A server answering 429 again and again is paused longer each time (doubling from its
# Retry-After, up to this), so the requests go to the others instead of queueing for it.
RATE_LIMIT_CAP = 60.0


@dataclass
class EndpointUsage:
    """What one server did, for stats (reported when there is more than one)."""

    requests: int = 0
    answers: int = 0  # requests that got an HTTP answer (the caller may still reject it)
    faults: int = 0  # transient faults: 5xx, timeouts, dropped or refused connections
    rate_limited: int = 0  # 429s
    out_of_rotation: int = 0  # times it was taken out after failing in a row


@dataclass
class Endpoint:
    """One server: where it is, its limits, and its state."""

    base_url: str | None
    model: str
    api_key: str | None
    api_version: str | None
    concurrency: int
    limiter: RateLimiter
    in_flight: int = 0
    paused_until: float = 0.0
    failures_in_row: int = 0
    limited_in_row: int = 0
    cool_down: float = field(default_factory=lambda: COOL_DOWN_SECONDS)
    usage: EndpointUsage = field(default_factory=EndpointUsage)
    client: openai.AsyncOpenAI | None = None

    def ready(self, now: float) -> bool:
        return self.in_flight < self.concurrency and now >= self.paused_until

    @property
    def load(self) -> float:
        return self.in_flight / self.concurrency


class Endpoints:
    """The servers of one model section (`chat` or `embedding`).

    `resolve` (the embedded model) gives (base_url, model) of the one server on first use: the
    embedded server starts only when a call needs it."""

    def __init__(self, settings: ModelSettings, *, base_url: str | None = None,
                 resolve: Callable[[], Awaitable[tuple[str, str]]] | None = None,
                 http_client: httpx.AsyncClient | None = None):
        self.settings = settings
        self._resolve = resolve
        self._http_client = http_client
        s = settings
        if s.endpoints:
            self.all = [Endpoint(e.base_url, e.model or s.model, e.api_key or s.api_key, e.api_version or s.api_version,
                                 e.concurrency or s.concurrency,
                                 RateLimiter(s.requests_per_minute if e.requests_per_minute is None else e.requests_per_minute,
                                             s.tokens_per_minute if e.tokens_per_minute is None else e.tokens_per_minute))
                        for e in s.endpoints]
        else:
            self.all = [Endpoint(base_url or s.base_url, s.model, s.api_key, s.api_version, s.concurrency,
                                 RateLimiter(s.requests_per_minute, s.tokens_per_minute))]
        # Waiting requests, oldest first; `_woken` of them have been told a slot is theirs and
        # have not run yet, so a newcomer must not take it from under them.
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._woken = 0
        self._timer: asyncio.TimerHandle | None = None  # wakes waiters when a pause ends
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._resolved = resolve is None
        self._resolve_lock = asyncio.Lock()

    @property
    def several(self) -> bool:
        return len(self.all) > 1

    async def resolved(self) -> Endpoint:
        """The first server, its address known (starting the embedded server if need be)."""
        if not self._resolved:
            async with self._resolve_lock:
                if not self._resolved:
                    assert self._resolve is not None
                    base_url, model = await self._resolve()
                    first = self.all[0]
                    first.base_url = base_url
                    first.model = first.model or model
                    self._resolved = True
        return self.all[0]

    @contextlib.asynccontextmanager
    async def slot(self, avoid: Endpoint | None = None) -> AsyncIterator[Endpoint]:
        """A request's place on one server, held for the whole request. A retry passes the
        server its last attempt failed on as `avoid`: another ready server is taken first."""
        await self.resolved()
        endpoint = await self._acquire(avoid)
        try:
            yield endpoint
        finally:
            endpoint.in_flight -= 1
            self._wake()

    def _free(self, now: float) -> int:
        """Slots that can be taken now and are not promised to a woken waiter."""
        return sum(e.concurrency - e.in_flight for e in self.all if e.ready(now)) - self._woken

    def _take(self, avoid: Endpoint | None, now: float) -> Endpoint:
        ready = [e for e in self.all if e.ready(now)]
        endpoint = min(ready, key=lambda e: (e is avoid, e.load, e.usage.requests))
        endpoint.in_flight += 1
        endpoint.usage.requests += 1
        return endpoint

    async def _acquire(self, avoid: Endpoint | None) -> Endpoint:
        if not self._waiters and self._free(time.monotonic()) > 0:
            return self._take(avoid, time.monotonic())
        loop = asyncio.get_running_loop()
        first = False  # a woken waiter that found its slot gone keeps its place at the front
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            if first:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            self._wake()  # a slot may already be free (or a pause over): never wait for nothing
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    # Woken, then cancelled before it ran: the slot goes to the next in line.
                    self._woken -= 1
                    self._wake()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
            self._woken -= 1
            now = time.monotonic()
            if any(e.ready(now) for e in self.all):
                return self._take(avoid, now)
            first = True  # its server was paused (a 429) between the wake-up and now

    def _wake(self) -> None:
        """Wake one waiter per slot that can be taken now; if every server with room is paused,
        arrange one wake-up for when the first pause ends."""
        if not self._waiters:
            return
        now = time.monotonic()
        free = self._free(now)
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if waiter.done():  # cancelled, its task not yet run to remove it
                continue
            waiter.set_result(None)
            self._woken += 1
            free -= 1
        if self._waiters:
            ends = [e.paused_until for e in self.all if e.paused_until > now and e.in_flight < e.concurrency]
            if ends:
                self._wake_at(min(ends) - now)

    def _wake_at(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.001, delay)
        if (self._timer is not None and self._timer_loop is loop and not self._timer.cancelled()
                and self._timer.when() <= when):
            return  # an earlier wake-up is already set
        if self._timer is not None:
            self._timer.cancel()
        self._timer_loop = loop
        self._timer = loop.call_at(when, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._wake()

    def client(self, endpoint: Endpoint) -> openai.AsyncOpenAI:
        if endpoint.client is None:
            endpoint.client = open_client(self.settings, endpoint.base_url, self._http_client,
                                          api_key=endpoint.api_key, api_version=endpoint.api_version,
                                          concurrency=endpoint.concurrency)
        return endpoint.client

    # -- what happened ----------------------------------------------------------------------------
    def answered(self, endpoint: Endpoint) -> None:
        endpoint.usage.answers += 1
        endpoint.failures_in_row = endpoint.limited_in_row = 0
        endpoint.cool_down = COOL_DOWN_SECONDS

    def faulted(self, endpoint: Endpoint, fault: Retryable, *, rate_limited: bool) -> None:
        """A transient fault of `endpoint`: pause it for a 429, take it out after several faults."""
        now = time.monotonic()
        if rate_limited:
            endpoint.usage.rate_limited += 1
            endpoint.limited_in_row += 1
            pause = fault.retry_after if fault.retry_after is not None else RATE_LIMIT_PAUSE
            if self.several:
                pause = min(RATE_LIMIT_CAP, max(pause, pause * 2 ** (endpoint.limited_in_row - 1)))
            endpoint.paused_until = max(endpoint.paused_until, now + pause)
            return
        endpoint.usage.faults += 1
        endpoint.failures_in_row += 1
        if self.several and endpoint.failures_in_row >= OUT_AFTER_FAILURES:
            endpoint.paused_until = max(endpoint.paused_until, now + endpoint.cool_down)
            endpoint.usage.out_of_rotation += 1
            endpoint.cool_down = min(COOL_DOWN_CAP, endpoint.cool_down * 2)

    def report(self) -> dict[str, dict[str, Any]]:
        """Per-server usage, keyed by address (stats.json `llm.endpoints`)."""
        return {f"{n}: {e.base_url}": asdict(e.usage) for n, e in enumerate(self.all)}

    async def aclose(self) -> None:
        for endpoint in self.all:
            if endpoint.client is not None:
                await endpoint.client.close()
                endpoint.client = None
