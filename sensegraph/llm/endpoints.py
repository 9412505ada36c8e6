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
- Rate limiting: a 429 pauses that server for its Retry-After (or a second; capped at
  limits.RETRY_AFTER_CAP) for every request, not only the one that got it, so the others go
  elsewhere instead of hitting it again; with several servers, each further 429 in a row
  doubles the pause (up to RATE_LIMIT_CAP). Only a 429 to a request sent after the pause began
  counts as further: the 429s of requests already in flight are the same news. A retry after a
  429 goes to another server that is not paused (queueing for its slot) instead of sleeping.
- Retries: a request whose attempt failed on a server takes another ready server next.
- Outages, as a load balancer handles them: after OUT_AFTER_FAILURES transient faults in a row
  (5xx, timeouts, refused connections) a server is out for a cool-down (`outage_cool_down`).
  The cool-down doubles per *outage* (each failed probe), up to `outage_cool_down_cap`, never
  per fault: requests already in flight when it went out fail too, and counting them doubled an
  8-request burst to a two-minute pause. When the cool-down ends exactly one request, the
  probe, is let through (half-open); its success (any HTTP answer) puts the server fully back,
  its failure starts the next, doubled, cool-down. A returning server thus gets one request,
  not full traffic at once, and a server that flaps is back within one cool-down of recovering.
  The same holds for a single server: waiting for its probe costs no attempt of any item.
- Refusals: 401, 403 and 404 say the key, the permission or the model is wrong on that server;
  the identical request would get the same answer. The server is out for the rest of the run
  (one log line says which and why), and the request tries another one.
- Nothing can answer: when every server has been out continuously for `outage_timeout`, or all
  refused, waiting requests and new ones fail at once with NoServer (one line naming each
  server and its last error), so a step records its items as failed and the run ends instead of
  stalling for hours. Cool-downs still end, so a probe may still bring a server back (a
  long-running `serve` recovers). While every server is out a line is logged every
  LOG_EVERY seconds ("waiting: all servers of chat are out (2 of 2) for 45 s").
- Answers that fail validation (garbage 200s) are that server's fault for the retry's choice:
  the retry avoids it, and a server whose last INVALID_IN_ROW answers were all rejected while
  another gives valid ones is out like a failing server (probed after its cool-down, which
  doubles while no valid answer comes). When every server answers badly, none is taken out.
- Cache keys name the model, not the server, so an answer is found again whichever served it.

The request's own retries (per item, in client.py and embeddings.py) are unchanged: a retry
after a fault simply gets a slot again, usually on another server.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
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
RATE_LIMIT_PAUSE = 1.0  # a 429 without Retry-After
# A server answering 429 again and again is paused longer each time (doubling from its
# Retry-After, up to this), so the requests go to the others instead of queueing for it.
RATE_LIMIT_CAP = 60.0
# Rejected answers in a row after which a server is taken only when the others are full.
INVALID_IN_ROW = 3
LOG_EVERY = 15.0  # seconds between "waiting: all servers ... are out" lines
REFUSALS = (401, 403, 404)

_logger = logging.getLogger("sensegraph.llm")


def _short(text: str, most: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[:most - 1] + "…"


class NoServer(Exception):
    """No server of the model can take a request: every one refused (401/403/404), or all have
    been out for `outage_timeout`. The message is one line naming each server and its last error."""


class HandBack(Exception):
    """(`Endpoints.hand_back`, set by a Ray worker) every server here is out and none can take a
    probe now: instead of waiting, the request goes back to the Ray driver, which sends the call
    to a worker whose servers answer (llm/ray_workers.py). It spends no attempt of the item."""


@dataclass
class EndpointUsage:
    """What one server did, for stats (reported when there is more than one)."""

    requests: int = 0
    answers: int = 0  # requests whose answer was kept (valid)
    invalid: int = 0  # HTTP answers the caller rejected (schema, empty, unusable vectors)
    faults: int = 0  # transient faults: 5xx, timeouts, dropped or refused connections
    rate_limited: int = 0  # 429s
    out_of_rotation: int = 0  # outages: times it was taken out after failing in a row
    probes: int = 0  # requests let through at the end of a cool-down
    refused: int = 0  # 401/403/404 answers (the first takes it out for the run)


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
    paused_until: float = 0.0  # a 429's pause
    failures_in_row: int = 0
    limited_in_row: int = 0
    invalid_in_row: int = 0
    # The current outage: when it began (None: in rotation), its cool-down, when that ends.
    out_since: float | None = None
    cool_down: float = 0.0
    back_at: float = 0.0
    # The task whose request is the probe (set while it is in flight): only its outcome ends
    # or extends the outage; faults of requests sent before the outage began say nothing new.
    probe: Any = None
    refused: str | None = None  # why it is out for the run (401/403/404)
    refused_at: float = 0.0
    last_error: str = ""
    usage: EndpointUsage = field(default_factory=EndpointUsage)
    client: openai.AsyncOpenAI | None = None

    def ready(self, now: float) -> bool:
        if self.refused is not None or self.in_flight >= self.concurrency or now < self.paused_until:
            return False
        return self.out_since is None or (now >= self.back_at and self.probe is None)

    def room(self, now: float) -> int:
        """Requests it can take now: its free slots in rotation, one (the probe) half-open."""
        if not self.ready(now):
            return 0
        return self.concurrency - self.in_flight if self.out_since is None else 1

    @property
    def out(self) -> bool:
        return self.refused is not None or self.out_since is not None

    @property
    def load(self) -> float:
        return self.in_flight / self.concurrency


class Endpoints:
    """The servers of one model section (`chat` or `embedding`).

    `resolve` (the embedded model) gives (base_url, model) of the one server on first use: the
    embedded server starts only when a call needs it. `log` takes the one-line notices (a
    server refused, every server out); the pipeline passes its own, the default is logging."""

    def __init__(self, settings: ModelSettings, *, base_url: str | None = None,
                 resolve: Callable[[], Awaitable[tuple[str, str]]] | None = None,
                 http_client: httpx.AsyncClient | None = None, name: str = "chat",
                 log: Callable[[str], None] | None = None):
        self.settings = settings
        self.name = name
        self.log: Callable[[str], None] = log or _logger.warning
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
        self._report: asyncio.TimerHandle | None = None  # the "waiting: ..." line while all are out
        self._report_loop: asyncio.AbstractEventLoop | None = None
        self._all_out_logged = False
        self._failing_logged = False
        # The last NoServer message: why calls of this model failed without a server (stats.json).
        self.gave_up: str | None = None
        # A Ray worker's servers: while every one is out, a request raises HandBack at once
        # (and waiting ones are woken to) instead of waiting; the driver holds the deadline.
        self.hand_back = False
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
    async def slot(self, avoid: Endpoint | None = None, tokens: int = 0,
                   prefer: Endpoint | None = None) -> AsyncIterator[Endpoint]:
        """A request's place on one server, held for the whole request. A retry passes the
        server its last attempt failed on as `avoid`: another ready server is taken first.
        `prefer`: that server when it is ready (a question about that server: ChatClient's
        lower-mode request after a 500).
        `tokens` (the request's estimate): a server whose rate limiter would admit it now is
        preferred, so a request does not hold one server's slot waiting for its limit while
        another could send it at once. Raises NoServer when no server can answer (see the
        module's docstring)."""
        await self.resolved()
        endpoint = await self._acquire(avoid, tokens, prefer)
        try:
            yield endpoint
        finally:
            endpoint.in_flight -= 1
            if endpoint.probe is not None and endpoint.probe is asyncio.current_task():
                # The probe ended without a verdict (cancelled, a 400 ...): the next request probes.
                endpoint.probe = None
            self._wake()

    # -- choosing a server ------------------------------------------------------------------------
    def _free(self, now: float) -> int:
        """Slots that can be taken now and are not promised to a woken waiter."""
        return sum(e.room(now) for e in self.all) - self._woken

    def _take(self, avoid: Endpoint | None, now: float, tokens: int = 0, prefer: Endpoint | None = None) -> Endpoint:
        ready = [e for e in self.all if e.ready(now)]
        # A half-open server's probe goes first (else under light load it would never come
        # back); a server that keeps giving rejected answers goes last.
        endpoint = min(ready, key=lambda e: (prefer is not None and e is not prefer, e is avoid, e.out_since is None,
                                             e.invalid_in_row >= INVALID_IN_ROW,
                                             e.limiter.enabled and not e.limiter.fits(tokens, now),
                                             e.load, e.usage.requests))
        endpoint.in_flight += 1
        endpoint.usage.requests += 1
        if endpoint.out_since is not None:
            endpoint.probe = asyncio.current_task()
            endpoint.usage.probes += 1
        return endpoint

    def unavailable(self, now: float | None = None) -> str | None:
        """Why no server can answer (NoServer's message), or None while one may."""
        now = time.monotonic() if now is None else now
        if all(e.refused is not None for e in self.all):
            return f"every server of {self.name} refused the request ({self._servers()})"
        since = self._all_out_since()
        timeout = self.settings.outage_timeout
        if since is not None and now - since >= timeout:
            n = len(self.all)
            return (f"no server of {self.name} has answered for {now - since:.0f} s "
                    f"({n} of {n} out; {self.name}.outage_timeout = {timeout:g}): {self._servers()}")
        return None

    def request_timeout(self, endpoint: Endpoint) -> float | None:
        """The timeout for this task's request to `endpoint` when it is a probe while every server
        is out: the time left until the outage deadline (at least 1 s), so a probe to a server that
        now hangs cannot hold its call, and the run, a whole request timeout past the deadline.
        None otherwise: the request's own timeout applies."""
        if endpoint.probe is None or endpoint.probe is not asyncio.current_task():
            return None
        since = self._all_out_since()
        if since is None:
            return None
        left = since + self.settings.outage_timeout - time.monotonic()
        return max(1.0, min(left, float(self.settings.timeout)))

    def _all_out_since(self) -> float | None:
        """Since when every server has been out (None: one is in rotation)."""
        if not all(e.out for e in self.all):
            return None
        return max(e.out_since if e.out_since is not None else e.refused_at for e in self.all)

    def _servers(self) -> str:
        # (an error body can be long; the start of each says enough, and the line stays readable)
        return "; ".join(f"{e.base_url}: {_short(e.refused or e.last_error or 'no answer')}" for e in self.all)

    def ready_elsewhere(self, endpoint: Endpoint | None) -> bool:
        """Whether another server than `endpoint` is in rotation and not paused (a retry then
        need not sleep out `endpoint`'s Retry-After: it queues for that server's next slot)."""
        now = time.monotonic()
        return any(e is not endpoint and e.refused is None and now >= e.paused_until
                   and (e.out_since is None or (now >= e.back_at and e.probe is None)) for e in self.all)

    async def _acquire(self, avoid: Endpoint | None, tokens: int = 0, prefer: Endpoint | None = None) -> Endpoint:
        now = time.monotonic()
        if not self._waiters and self._free(now) > 0:
            return self._take(avoid, now, tokens, prefer)
        if self.hand_back and self._all_out_since() is not None:
            raise HandBack(self.name)
        if (why := self.unavailable(now)) is not None:
            self.gave_up = why
            raise NoServer(why)
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
                return self._take(avoid, now, tokens, prefer)
            if self.hand_back and self._all_out_since() is not None:
                self._wake()  # the next in line goes back too
                raise HandBack(self.name)
            if (why := self.unavailable(now)) is not None:
                self._wake()  # the next in line fails too
                self.gave_up = why
                raise NoServer(why)
            first = True  # its server was paused (a 429) between the wake-up and now

    def _wake(self) -> None:
        """Wake one waiter per slot that can be taken now (every waiter when no server can
        answer: they fail); otherwise arrange one wake-up for when the first pause, cool-down or
        the outage deadline ends."""
        if not self._waiters:
            return
        now = time.monotonic()
        everyone = self.unavailable(now) is not None or (self.hand_back and self._all_out_since() is not None)
        free = len(self._waiters) if everyone else self._free(now)
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if waiter.done():  # cancelled, its task not yet run to remove it
                continue
            waiter.set_result(None)
            self._woken += 1
            free -= 1
        if self._waiters:
            ends = [max(e.paused_until, e.back_at if e.out_since is not None else 0.0) for e in self.all
                    if e.refused is None and e.in_flight < e.concurrency and e.probe is None]
            ends = [t for t in ends if t > now]
            if (since := self._all_out_since()) is not None:
                ends.append(since + self.settings.outage_timeout)
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
    def replied(self, endpoint: Endpoint) -> None:
        """The server gave an HTTP answer (valid or not): it is up, and in rotation again."""
        endpoint.failures_in_row = 0
        if endpoint.out_since is not None:
            was_all_out = self._all_out_since() is not None
            endpoint.out_since = None
            endpoint.probe = None
            if was_all_out:
                self._all_out_logged = self._failing_logged = False
                self.log(f"{self.name}: {endpoint.base_url} answers again after an outage")
            self._wake()  # a server back in rotation: its slots are free again

    def answered(self, endpoint: Endpoint) -> None:
        """An answer the caller kept: the server is fully well, its next outage starts afresh."""
        self.replied(endpoint)
        endpoint.usage.answers += 1
        endpoint.limited_in_row = endpoint.invalid_in_row = 0
        endpoint.cool_down = 0.0

    def invalid(self, endpoint: Endpoint) -> None:
        """An HTTP answer the caller rejected (not the schema, empty, no vectors): the server is
        up, but the retry should go elsewhere, and it is not a success. One that keeps giving
        them while another server gives valid answers (a proxy in front of the wrong model, a
        broken deployment) is out like a failing one, probed after its cool-down. When every
        server answers badly the model is the problem, and none is taken out for it."""
        self.replied(endpoint)
        endpoint.usage.invalid += 1
        endpoint.invalid_in_row += 1
        # (another "answers well": in rotation, and its last answer was kept)
        if endpoint.invalid_in_row >= INVALID_IN_ROW and any(
                e is not endpoint and not e.out and e.invalid_in_row == 0 and e.usage.answers for e in self.all):
            endpoint.last_error = "its answers fail validation"
            self._take_out(endpoint, time.monotonic())

    def refuse(self, endpoint: Endpoint, status: int, reason: str) -> None:
        """A 401/403/404: out for the rest of the run, said once."""
        endpoint.usage.refused += 1
        if endpoint.refused is not None:
            return
        endpoint.refused = f"HTTP {status}: {reason}"
        endpoint.refused_at = time.monotonic()
        endpoint.probe = None
        left = sum(e.refused is None for e in self.all)
        self.log(f"{self.name}: {endpoint.base_url} refused with HTTP {status} ({reason}); taken out of rotation "
                 f"for this run ({left} of {len(self.all)} servers left)")
        self._all_out_changed()
        self._wake()

    def faulted(self, endpoint: Endpoint, fault: Retryable, *, rate_limited: bool) -> None:
        """A transient fault of `endpoint`: pause it for a 429, take it out after several faults."""
        now = time.monotonic()
        endpoint.last_error = str(fault)
        if rate_limited:
            endpoint.usage.rate_limited += 1
            if now >= endpoint.paused_until:
                # Only a 429 to a request sent after the last pause began extends the series: the
                # requests in flight when the first came back say the same thing again.
                endpoint.limited_in_row += 1
            self.replied(endpoint)  # it answered: up, only busy
            pause = fault.retry_after if fault.retry_after is not None else RATE_LIMIT_PAUSE
            if self.several:
                pause = min(RATE_LIMIT_CAP, max(pause, pause * 2 ** (endpoint.limited_in_row - 1)))
            endpoint.paused_until = max(endpoint.paused_until, now + pause)
            return
        endpoint.usage.faults += 1
        s = self.settings
        if endpoint.out_since is not None:
            if endpoint.probe is not None and endpoint.probe is asyncio.current_task():
                # The probe failed: the outage goes on, with the next (doubled) cool-down.
                endpoint.probe = None
                endpoint.cool_down = min(s.outage_cool_down_cap, endpoint.cool_down * 2)
                endpoint.back_at = now + endpoint.cool_down
            # else: a request sent before the outage began; the outage is known already
            return
        endpoint.failures_in_row += 1
        if endpoint.failures_in_row >= OUT_AFTER_FAILURES:
            self._take_out(endpoint, now)

    def _take_out(self, endpoint: Endpoint, now: float) -> None:
        """An outage begins. Its cool-down starts at `outage_cool_down`, or doubles the last
        one when no valid answer came between (a server whose every probe answers garbage)."""
        s = self.settings
        endpoint.out_since = now
        endpoint.cool_down = min(s.outage_cool_down_cap, endpoint.cool_down * 2 if endpoint.cool_down
                                 else s.outage_cool_down)
        endpoint.back_at = now + endpoint.cool_down
        endpoint.usage.out_of_rotation += 1
        self._all_out_changed()
        if self.hand_back:
            self._wake()  # every server out: the waiting requests go back to the driver

    # -- while every server is out: one line now and then ------------------------------------------
    def _all_out_changed(self) -> None:
        if self._all_out_since() is None or self._all_out_logged:
            return
        self._all_out_logged = True
        self._log_waiting()

    def _log_waiting(self) -> None:
        self._report = None
        since = self._all_out_since()
        if since is None:
            self._all_out_logged = False
            return
        now = time.monotonic()
        n = len(self.all)
        if (why := self.unavailable(now)) is not None:
            if not self._failing_logged:
                self._failing_logged = True
                self.log(f"{why}; failing its calls")
        else:
            self.log(f"waiting: all servers of {self.name} are out ({n} of {n}) for {now - since:.0f} s "
                     f"(fails in {since + self.settings.outage_timeout - now:.0f} s): {self._servers()}")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        left = since + self.settings.outage_timeout - now
        delay = min(LOG_EVERY, left) if left > 0 else LOG_EVERY
        self._report_loop = loop
        self._report = loop.call_later(max(0.01, delay), self._log_waiting)

    def report(self) -> dict[str, dict[str, Any]]:
        """Per-server usage, keyed by address (stats.json `llm.endpoints`)."""
        return {f"{n}: {e.base_url}": asdict(e.usage) for n, e in enumerate(self.all)}

    async def aclose(self) -> None:
        for handle in (self._timer, self._report):
            if handle is not None:
                handle.cancel()
        self._timer = self._report = None
        self._all_out_logged = False
        for endpoint in self.all:
            if endpoint.client is not None:
                await endpoint.client.close()
                endpoint.client = None
