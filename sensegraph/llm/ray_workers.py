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
  no cache files have to be merged and no node needs a shared disk. The cost of this design is
  one Ray round trip per call (a millisecond, beside hundreds for the model), and that the
  driver's prompt building stays on one core, measured at ~4-6 ms per call
  (docs/performance.md), i.e. ~200 calls/s.
- The result equals a single-process index of the same input: the same driver code makes the
  same calls in the same order and merges the same answers.

Shares of the endpoints (`shares`): every endpoint is split over as many workers as its limits
allow, each of its concurrency, requests_per_minute and tokens_per_minute as integers that add
up to the endpoint's limit exactly (the remainders to the first of those workers), so the cluster
never sends a server more than its settings allow. An endpoint with concurrency 4 and 3 requests
per minute over 10 workers is used by 3 of them (concurrency 2, 1, 1; 1 request per minute each);
the others have no share of it and do not use it (0 stays "no limit" only where the limit is 0).
With enough concurrency every worker has a share of every endpoint, so a worker fails over
between its own servers exactly as a single process does (endpoints.py). A worker with no share
of any server of a model gets none of its calls; one with no share at all is not started.

Routing by health, not by speed: every answer carries the worker's endpoint report, including
whether all of its servers are out (and until when its next probe may go). The driver sends a
call to the least loaded worker whose servers are in rotation (calls in flight over its share of
the servers' concurrency; the driver holds no call back when all are busy: it queues in the
worker, which keeps each server's limits). A worker whose servers are all out
does not wait for them: its client's Endpoints have `hand_back` set, so the call comes back at
once as a HANDED_BACK answer (a marker, not a failed item: waiting for a server costs no
attempt) and the driver sends it to another worker. A worker that is out gets no calls until its
cool-down ends; then the next call goes to it as the probe, before any other worker is chosen
(half-open, as endpoints.py does per server; else, while the others answer, it would never come
back). When
every worker's servers are out, calls wait in the driver; when they have all been out for
`outage_timeout` (or all refused), calls fail at once with the one-line message a single process
gives ("no server of chat has answered for 180 s on any of the 2 Ray workers (...)"), the steps
record those items as failed, the run ends, and a rerun redoes only them. While every worker is
out the run's log shows "waiting: all servers of chat are out on every Ray worker ..." every 15 s.
A call handed back again and again by workers whose servers fail is bounded like any call: once
its handed-back requests reach `max_retries` + 1, it fails with the servers' last errors. A
worker whose servers in rotation answer garbage (the last INVALID_IN_ROW answers of each were
rejected) while another worker's answer well is avoided for a cool-down that doubles until an
answer is kept, and a call that failed there on garbage is sent once to another worker (in one
process, the retry would have avoided that server); when every worker answers garbage, the
model is the problem and none is avoided.

A worker that dies (its process killed, a node lost): the actor is restarted by Ray (unlimited
restarts, each rerunning its constructor), but Ray retries no task (`max_task_retries=0`): the
driver does. Each call whose worker died under it is sent again, at most CRASH_RETRIES times,
and the last time alone on its worker (the driver drains one worker and sends it only that
call): a call that kills its worker every time then dies alone and fails as an LLMError (its
item recorded as failed like any other), while a call that was only beside it when it struck
succeeds alone, so the calls beside a poison call are not lost with it, and a worker killed
once costs no stall (its calls are simply sent again). The restarted worker serves the other
calls; calls are not sent to a worker that is restarting (the driver waits for its `hello`, checks
its version again, and gives a worker up that is not back within RESTART_TIMEOUT); every answer
that had arrived is in the cache, and the dead process's per-server counts stay in stats.json.

Connecting: before `ray.init` the head's address is tried with a plain TCP connection
(CONNECT_TIMEOUT), and ray.init itself runs under INIT_TIMEOUT, so `--ray 127.0.0.1:1` fails in
a second with one line (RayUnavailable) instead of retrying "Failed to connect to GCS" for minutes.

Install check on each node: Ray's `runtime_env` could pip-install sensegraph on every node, but
that needs a registry (or a wheel) reachable from every node at every actor start and takes
minutes, and a driver running from a checkout has no installable version to name. So instead
each worker reports the sensegraph version it imported (`ModelWorker.hello`) and the driver
refuses with one line naming the node when one differs from its own, or when a node cannot
import sensegraph at all: install the same version on every node.

Ray is an optional extra (`pip install sensegraph[ray]`); single-machine runs never import it.
Requests of the embedded model cannot be sent to other nodes (it listens on 127.0.0.1), so
`--ray` needs `provider: openai` endpoints.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from ..config import ChatSettings, EmbeddingSettings, ModelSettings, Settings
from .client import ChatClient, strict_schema
from .embeddings import Embedder
from .endpoints import INVALID_IN_ROW, LOG_EVERY, Endpoints, HandBack, _short
from .transport import LLMError
from .usage import StepUsage, Usage

def _version() -> str:
    # The package's version, read from the package already imported (a parent is imported before
    # its submodules) rather than by `from .. import`: the package re-exports the API, which
    # imports the pipeline, which imports this module.
    return sys.modules[__name__.split(".")[0]].__version__


VERSION = _version()  # what the driver runs; every node must run the same (tests change it here)
CRASH_RETRIES = 2  # a call whose worker dies under it is sent again at most this many times
CONNECT_TIMEOUT = 10.0  # seconds for the TCP connection to the head, before ray.init
INIT_TIMEOUT = 60.0  # seconds for ray.init to connect once the head answers
START_TIMEOUT = 120.0  # seconds for the workers to start and say which version they run
RESTART_TIMEOUT = 120.0  # seconds for a dead worker to be back before it is given up
PROBE_WAIT = 0.2  # the least wait before a worker whose servers are out gets its probe


class RayUnavailable(RuntimeError):
    pass


UNKNOWN_SCHEMA = ("schema", "unknown", 0)  # a worker's answer when it lost its schemas (restarted)
HANDED_BACK = ("handed", "back", 0)  # a worker's answer when every server it has is out


# -- the shares of the endpoints -------------------------------------------------------------------
def split(limit: int, parts: int) -> list[int]:
    """`limit` as `parts` integers that add up to it exactly, the remainder to the first ones."""
    whole, rest = divmod(limit, parts)
    return [whole + (n < rest) for n in range(parts)]


def shares(section: ModelSettings, workers: int) -> list[ModelSettings | None]:
    """Each worker's copy of a model section, with its share of each endpoint (None: a worker
    with no share of any). An endpoint is used by as many workers as its concurrency and its
    rate limits allow (a limit of 0 is no limit, and no bound); its limits are split over them
    exactly (`split`). The first endpoint's workers start at worker 0, the next one's after
    them, so when endpoints cannot go to every worker they go to different ones."""
    servers: list[Any] = list(section.endpoints or []) or [None]  # None: the section's own server
    mine: list[list[tuple[Any, int, int, int]]] = [[] for _ in range(workers)]
    start = 0
    for e in servers:
        concurrency = (e.concurrency if e is not None and e.concurrency else None) or section.concurrency
        rpm = section.requests_per_minute if e is None or e.requests_per_minute is None else e.requests_per_minute
        tpm = section.tokens_per_minute if e is None or e.tokens_per_minute is None else e.tokens_per_minute
        users = min([workers, concurrency] + [limit for limit in (rpm, tpm) if limit])
        parts = zip(split(concurrency, users), split(rpm, users), split(tpm, users))
        for n, (c, r, t) in enumerate(parts):
            mine[(start + n) % workers].append((e, c, r, t))
        start += users
    out: list[ModelSettings | None] = []
    for part in mine:
        if not part:
            out.append(None)
        elif section.endpoints:
            out.append(section.model_copy(update={"endpoints": [
                e.model_copy(update={"concurrency": c, "requests_per_minute": r, "tokens_per_minute": t})
                for e, c, r, t in part]}))
        else:
            (_, c, r, t), = part
            out.append(section.model_copy(update={"concurrency": c, "requests_per_minute": r, "tokens_per_minute": t}))
    return out


def capacity(section: ModelSettings | None) -> int:
    """Requests a worker's copy of a section may have in flight (0: it makes no such calls)."""
    if section is None:
        return 0
    return sum(e.concurrency or section.concurrency for e in section.endpoints) if section.endpoints \
        else section.concurrency


# -- the worker ------------------------------------------------------------------------------------
def _health(endpoints: Endpoints) -> dict[str, Any] | None:
    """None while one of the worker's servers is in rotation and answers well; {"bad": True}
    when the last INVALID_IN_ROW answers of each one in rotation were all rejected (garbage
    200s); else (all out) how long all have been out, when the next probe may go (None: all
    refused for the run) and each server's last error."""
    if not all(e.out for e in endpoints.all):
        if all(e.invalid_in_row >= INVALID_IN_ROW for e in endpoints.all if not e.out):
            return {"bad": True}
        return None
    now = time.monotonic()
    since = max(e.out_since if e.out_since is not None else e.refused_at for e in endpoints.all)
    waits = [max(e.back_at, e.paused_until) - now for e in endpoints.all if e.refused is None]
    return {"out_for": now - since, "probe_in": min(waits) if waits else None,
            "servers": {str(e.base_url): _short(e.refused or e.last_error or "no answer") for e in endpoints.all}}


class ModelWorker:
    """One worker: a chat client and an embedder without cache or budget (the driver has both),
    either absent when the worker has no share of that model's servers.

    Each call's usage is recorded under a step name of its own and handed back with the answer,
    so concurrent calls in one actor never mix their counts."""

    def __init__(self, chat: str | None, embedding: str | None):
        self.chat = ChatClient(ChatSettings.model_validate_json(chat), cache=None) if chat else None
        self.embedder = Embedder(EmbeddingSettings.model_validate_json(embedding), cache=None) if embedding else None
        for client in (self.chat, self.embedder):
            if client is not None:
                client.endpoints.hand_back = True  # all out: the call goes back to the driver
        self._tags = itertools.count()
        # Response schemas by key, each sent once: unpickling a pydantic class builds it anew
        # (~10 ms), which per call made a worker slower than the model it waits for.
        self.schemas: dict[str, type[BaseModel]] = {}

    def hello(self) -> dict[str, Any]:
        """Who this worker is: its process, its node, and the sensegraph version it imported."""
        version = _version()

        try:
            import ray

            node = ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - only a name for messages
            node = socket.gethostname()
        return {"pid": os.getpid(), "node": node, "version": version}

    async def chat_call(self, messages: list[dict[str, str]], key: str | None, schema: type[BaseModel] | None,
                        step: str, item: str, max_tokens: int,
                        temperature: float | None) -> tuple[str | None, dict, tuple | None, dict, dict | None]:
        assert self.chat is not None
        if key is not None:
            if schema is not None:
                self.schemas[key] = schema
            elif key not in self.schemas:  # a restarted worker: the driver sends the schema again
                return None, {}, UNKNOWN_SCHEMA, {}, None
            schema = self.schemas[key]
        tag = f"{step}#{next(self._tags)}"
        error = None
        content = None
        try:
            content = await self.chat._call(messages, step=tag, item=item, max_tokens=max_tokens,
                                            temperature=temperature, schema=schema)
        except HandBack:
            error = HANDED_BACK
        except LLMError as exc:
            # Every server of this worker refused (401/403/404): another worker's may not.
            error = HANDED_BACK if all(e.refused for e in self.chat.endpoints.all) else (
                exc.purpose, exc.reason, exc.attempts)
        return content, self._use(self.chat, tag, error), error, self.chat.endpoints.report(), \
            _health(self.chat.endpoints)

    async def embed_call(self, batch: list[str], step: str,
                         number: int) -> tuple[Any, dict, tuple | None, dict, dict | None]:
        assert self.embedder is not None
        tag = f"{step}#{next(self._tags)}"
        error = None
        vectors = None
        try:
            vectors = await self.embedder._remote_batch(batch, tag, number)
        except HandBack:
            error = HANDED_BACK
        except LLMError as exc:
            error = HANDED_BACK if all(e.refused for e in self.embedder.endpoints.all) else (
                exc.purpose, exc.reason, exc.attempts)
        return vectors, self._use(self.embedder, tag, error), error, self.embedder.endpoints.report(), \
            _health(self.embedder.endpoints)

    @staticmethod
    def _use(client: ChatClient | Embedder, tag: str, error: tuple | None) -> dict:
        use = client.usage.steps.pop(tag, StepUsage())
        if error == HANDED_BACK:
            use.failures = []  # not failed: the driver sends it elsewhere
        return asdict(use)

    async def close(self) -> None:
        for client in (self.chat, self.embedder):
            if client is not None:
                await client.aclose()


# -- the driver ------------------------------------------------------------------------------------
@dataclass
class _Out:
    """A worker whose servers of one model are all out, as the driver knows it."""

    since: float  # the driver's clock
    probe_at: float | None  # when its next probe may go (None: all refused for the run)
    servers: dict[str, str]  # each server's last error


class _NoWorker(Exception):
    """No worker can make the call (every one's servers out past the deadline, or refused)."""


def _connect(ray: Any, address: str) -> None:
    """ray.init, after checking that the head answers at all; RayUnavailable in a few seconds
    when it does not (ray.init alone retries "Failed to connect to GCS" for minutes)."""
    head = address
    if address in ("auto", "") or address is None:
        try:
            from ray._private.services import get_ray_address_from_environment

            head = get_ray_address_from_environment("auto", None)
        except ConnectionError as exc:
            raise RayUnavailable(f"--ray {address}: {exc} (start one with `ray start --head`, or give "
                                 "its address: --ray HEAD:6379)") from None
        except Exception:  # noqa: BLE001 - Ray's own lookup changed: let ray.init find it
            head = None
    if head and head != "auto":
        hostport = head.split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        if not host:
            host, port = hostport, "10001" if head.startswith("ray://") else "6379"
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
            raise RayUnavailable(f"the Ray head at {host}:{port} cannot be reached ({why}): start it "
                                 f"(`ray start --head` there) or give the right address (--ray HOST:PORT or "
                                 f"ray.address)") from None
    done = threading.Event()
    failed: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=address, namespace="sensegraph", log_to_driver=False, include_dashboard=False,
                     ignore_reinit_error=True)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            failed.append(exc)
        finally:
            done.set()
    # (in a thread, so that a head that accepts connections but never answers as Ray cannot
    # hang the run: after INIT_TIMEOUT the run stops, and the thread dies with the process. Ray
    # then sets no SIGTERM handler of its own, and says so: that line is not the user's concern.)
    quiet = _Without("SIGTERM handler is not set")
    logging.getLogger("ray._private.worker").addFilter(quiet)
    try:
        threading.Thread(target=init, name="ray-init", daemon=True).start()
        started = done.wait(INIT_TIMEOUT)
    finally:
        logging.getLogger("ray._private.worker").removeFilter(quiet)
    if not started:
        raise RayUnavailable(f"--ray {address}: the address accepts connections but no Ray cluster answered "
                             f"within {INIT_TIMEOUT:g} s: is it a Ray head's GCS port (6379 by default)?")
    if failed:
        exc = failed[0]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            raise RayUnavailable(f"--ray {address}: {one_line(exc)}") from None
        raise exc


class _Without(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def one_line(exc: BaseException, most: int = 200) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    errors = [x for x in lines if "Error:" in x or "Exception:" in x]
    return _short((errors or lines or [type(exc).__name__])[-1], most)


class RayWorkers:
    """The driver's side: the actors, and which one gets the next call (the least loaded of
    those whose servers are in rotation; see the module's docstring). `chat` and `embed` are
    what ChatClient and Embedder call instead of their own requests when `workers` is set."""

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
            _connect(ray, address)
        self.actors: list[Any] = []
        try:
            self._start(settings, workers)
        except BaseException:
            self._stop()
            raise

    def _start(self, settings: Settings, workers: int) -> None:
        ray = self._ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = workers or max(1, len(nodes))
        # The budget is the driver's (it sees every call's tokens); a worker must not keep its own.
        chats = [c.model_copy(update={"budget_tokens": 0, "budget_cost": 0.0}) if c is not None else None
                 for c in shares(settings.chat, count)]
        embeds = shares(settings.embedding, count)
        kept = [(c, e) for c, e in zip(chats, embeds) if c is not None or e is not None]
        # Ray restarts a dead worker (its constructor again) but retries none of its calls: the
        # driver does, a bounded number of times (CRASH_RETRIES).
        actor = ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0,
                           scheduling_strategy="SPREAD")(ModelWorker)
        self.actors = [actor.remote(c.model_dump_json() if c is not None else None,
                                    e.model_dump_json() if e is not None else None) for c, e in kept]
        self.capacity = {"chat": [capacity(c) for c, _ in kept], "embedding": [capacity(e) for _, e in kept]}
        self.settings = {"chat": settings.chat, "embedding": settings.embedding}
        try:  # up and running, with our version, before the first call
            hellos = ray.get([a.hello.remote() for a in self.actors], timeout=START_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            raise RayUnavailable(f"the Ray workers did not start within {START_TIMEOUT:g} s (is every node "
                                 "alive, with sensegraph installed?)") from None
        except ray.exceptions.RayError as exc:
            raise RayUnavailable(f"a Ray node could not start sensegraph's worker ({one_line(exc)}): install "
                                 f"sensegraph {VERSION} with its ray extra on every node "
                                 f"(pip install 'sensegraph[ray]=={VERSION}')") from None
        for hello in hellos:
            self._check(hello)
        self._pids = [h["pid"] for h in hellos]
        size = len(self.actors)
        self._in_flight = {"chat": [0] * size, "embedding": [0] * size}
        self._out: dict[str, list[_Out | None]] = {"chat": [None] * size, "embedding": [None] * size}
        self._probing = {"chat": [False] * size, "embedding": [False] * size}
        # Workers whose servers answer garbage: until when they are avoided, and how often in a row.
        self._bad: dict[str, list[float | None]] = {"chat": [None] * size, "embedding": [None] * size}
        self._bad_times = {"chat": [0] * size, "embedding": [0] * size}
        self._restarting = [False] * size
        self._gone = [False] * size  # did not come back after dying
        self._draining = [False] * size  # kept free for a call that must run alone
        self._alone = [False] * size  # running a call alone
        self._isolation: asyncio.Lock | None = None
        self._event: asyncio.Event | None = None
        self._logged = {"chat": 0.0, "embedding": 0.0}  # when "waiting: ..." was last logged
        self._failing = {"chat": False, "embedding": False}
        self._tasks: set[asyncio.Task] = set()
        self._sent: list[set[str]] = [set() for _ in range(size)]  # schema keys each worker holds
        self._keys: dict[type[BaseModel], str] = {}
        self.endpoint_reports: dict[str, dict[int, dict]] = {"chat": {}, "embedding": {}}
        # The counts of the processes of each worker that died (added to its current counts).
        self._carried: dict[str, dict[int, dict]] = {"chat": {}, "embedding": {}}
        self.gave_up: dict[str, str | None] = {"chat": None, "embedding": None}
        self.crashes = 0  # calls whose worker died under them

    def _check(self, hello: dict[str, Any]) -> None:
        if hello.get("version") != VERSION:
            raise RayUnavailable(f"the Ray node {hello.get('node')} runs sensegraph {hello.get('version')}, this "
                                 f"machine {VERSION}: install the same version on every node "
                                 f"(pip install 'sensegraph[ray]=={VERSION}')")

    @property
    def size(self) -> int:
        return len(self.actors)

    # -- the calls ------------------------------------------------------------------------------
    async def chat(self, client: ChatClient, messages: list[dict[str, str]], *, schema: type[BaseModel] | None,
                   step: str, item: str, max_tokens: int, temperature: float | None) -> str:
        key = self._key(schema)

        async def send(n: int) -> tuple:
            while True:
                send = schema if key is not None and key not in self._sent[n] else None
                if send is not None:
                    self._sent[n].add(key)  # type: ignore[arg-type]
                answer = await self.actors[n].chat_call.remote(messages, key, send, step, item, max_tokens,
                                                               temperature)
                if answer[2] != UNKNOWN_SCHEMA:
                    return answer
                self._sent[n].clear()  # the worker restarted and lost them all

        return await self._call("chat", client.usage, client.endpoints, step, item or step,
                                ChatClient._purpose(step, item), send)

    def _key(self, schema: type[BaseModel] | None) -> str | None:
        """A schema's identity across processes: its name and JSON schema."""
        if schema is None:
            return None
        if schema not in self._keys:
            text = json.dumps(strict_schema(schema), sort_keys=True)
            self._keys[schema] = f"{schema.__name__}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        return self._keys[schema]

    async def embed(self, embedder: Embedder, batch: list[str], *, step: str, number: int) -> np.ndarray:
        async def send(n: int) -> tuple:
            return await self.actors[n].embed_call.remote(batch, step, number)

        vectors = await self._call("embedding", embedder.usage, embedder.endpoints, step, f"{step} batch {number}",
                                   f"{step} (embedding batch {number} of {len(batch)} texts)", send)
        return np.asarray(vectors, dtype=np.float32)

    async def _call(self, kind: str, usage: Usage, pool: Endpoints, step: str, failure: str, purpose: str,
                    send: Callable[[int], Awaitable[tuple]]) -> Any:
        """One call, on a worker chosen by `_route`, until it is answered or has failed: a
        handed-back call goes to another worker, a call whose worker died is sent again (its
        last time alone)."""
        crashes = 0
        handed = 0  # requests the call spent on workers that handed it back
        garbage_resent = False
        attempts = self.settings[kind].max_retries + 1
        while True:
            try:
                n, probe = await self._route(kind, pool, alone=crashes >= CRASH_RETRIES)
            except _NoWorker as exc:
                self.gave_up[kind] = pool.gave_up = str(exc)
                usage.step(step).failures.append(failure)
                raise LLMError(purpose, str(exc), handed) from None
            alone = crashes >= CRASH_RETRIES
            try:
                answer, delta, error, report, health = await send(n)
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.WorkerCrashedError) as exc:
                crashes += 1
                self.crashes += 1
                self._died(n)
                if crashes > CRASH_RETRIES:
                    usage.step(step).failures.append(failure)
                    raise LLMError(purpose, f"its Ray worker died each of the {crashes} times it was sent "
                                            f"({one_line(exc)})", crashes) from None
                continue
            finally:
                self._done(kind, n, probe, alone)
            self._healthy(kind, n, health)
            self.endpoint_reports[kind][n] = report
            if error is not None and error != HANDED_BACK and not garbage_resent and self._avoid(kind, n):
                # Its worker's servers answer garbage while another worker's answer well: the
                # call goes there once (in one process, the retry would have avoided that server).
                garbage_resent = True
                self._add(usage, kind, step, {**delta, "failures": []})
                continue
            if error == HANDED_BACK:
                self._add(usage, kind, step, delta)
                handed += delta.get("requests", 0)
                if handed >= attempts:
                    usage.step(step).failures.append(failure)
                    servers = health["servers"] if health else {}
                    raise LLMError(purpose, "every Ray worker it was sent to had its servers out: "
                                            + "; ".join(f"{u}: {e}" for u, e in servers.items()), handed)
                continue
            return self._returned(usage, kind, step, answer, delta, error)

    def _returned(self, usage: Usage, kind: str, step: str, answer: Any, delta: dict, error: tuple | None) -> Any:
        """What a worker's call gave: its usage added to the driver's, and the answer, or the
        LLMError it ended in."""
        self._add(usage, kind, step, delta)
        if error is not None:
            raise LLMError(*error)
        return answer

    @staticmethod
    def _add(usage: Usage, kind: str, step: str, delta: dict) -> None:
        """A worker's usage of one call added to the driver's (chat tokens through add_chat, so
        the spending budget sees them)."""
        use = StepUsage(**delta)
        if kind == "chat":
            usage.add_chat(step, use.prompt_tokens, use.completion_tokens, use.cached_prompt_tokens)
            use.prompt_tokens = use.completion_tokens = use.cached_prompt_tokens = 0
        usage.step(step).add(use)

    # -- routing --------------------------------------------------------------------------------
    def _serving(self, kind: str) -> list[int]:
        return [n for n in range(self.size) if self.capacity[kind][n] > 0 and not self._gone[n]]

    async def _route(self, kind: str, pool: Endpoints, alone: bool) -> tuple[int, bool]:
        """The worker for the next call, and whether the call is its probe. A call that must run
        alone waits for the isolation lock, then for the chosen worker to have nothing else in
        flight. Raises _NoWorker when no worker can answer."""
        if not alone:
            return await self._choose(kind, pool)
        if self._isolation is None:
            self._isolation = asyncio.Lock()
        async with self._isolation:
            while True:
                n, probe = await self._choose(kind, pool)
                self._draining[n] = True
                try:
                    while self._in_flight["chat"][n] + self._in_flight["embedding"][n] > 1:
                        await self._wait(None)
                finally:
                    self._draining[n] = False
                if not self._restarting[n] and not self._gone[n]:
                    self._alone[n] = True
                    return n, probe
                self._done(kind, n, probe, False)

    async def _choose(self, kind: str, pool: Endpoints) -> tuple[int, bool]:
        while True:
            now = time.monotonic()
            ready = [n for n in self._serving(kind)
                     if not (self._restarting[n] or self._draining[n] or self._alone[n])]
            # A worker whose cool-down has ended gets this call as its probe, first (else, while
            # the others answer, it would never come back).
            for n in ready:
                out = self._out[kind][n]
                if out is not None and out.probe_at is not None and out.probe_at <= now and not self._probing[kind][n]:
                    self._probing[kind][n] = True
                    self._in_flight[kind][n] += 1
                    return n, True
            healthy = [n for n in ready if self._out[kind][n] is None]
            # (a worker whose servers answer garbage waits out its cool-down while others answer well)
            healthy = [n for n in healthy if not self._avoid(kind, n) or (self._bad[kind][n] or 0) <= now] or healthy
            if healthy:
                n = min(healthy, key=lambda i: (self._in_flight[kind][i] / self.capacity[kind][i],
                                                self._in_flight[kind][i]))
                self._in_flight[kind][n] += 1
                self._failing[kind] = False
                return n, False
            if (why := self._unavailable(kind, now)) is not None:
                if not self._failing[kind]:
                    self._failing[kind] = True
                    pool.log(f"{why}; failing its calls")
                raise _NoWorker(why)
            self._log_waiting(kind, pool, now)
            outs = [o for n in self._serving(kind) if (o := self._out[kind][n]) is not None]
            ends = [o.probe_at for o in outs if o.probe_at is not None]
            if outs and len(outs) == len(self._serving(kind)):
                ends.append(max(o.since for o in outs) + self.settings[kind].outage_timeout)
            await self._wait(max(0.01, min(ends) - now) if ends else LOG_EVERY)

    def _unavailable(self, kind: str, now: float) -> str | None:
        """Why no worker can make a call of `kind` (the one-line message), or None while one may."""
        serving = self._serving(kind)
        if not serving:
            return f"no Ray worker is left for {kind}: they died and did not come back"
        outs = [self._out[kind][n] for n in serving]
        if any(o is None for o in outs):
            return None
        servers: dict[str, str] = {}
        for o in outs:
            servers.update(o.servers)  # type: ignore[union-attr]
        listed = "; ".join(f"{u}: {e}" for u, e in servers.items())
        if all(o.probe_at is None for o in outs):  # type: ignore[union-attr]
            return f"every server of {kind} refused the request on every Ray worker ({listed})"
        since = max(o.since for o in outs)  # type: ignore[union-attr]
        timeout = self.settings[kind].outage_timeout
        if now - since < timeout:
            return None
        return (f"no server of {kind} has answered for {now - since:.0f} s on any of the {len(serving)} Ray workers "
                f"({len(servers)} of {len(servers)} out; {kind}.outage_timeout = {timeout:g}): {listed}")

    def _log_waiting(self, kind: str, pool: Endpoints, now: float) -> None:
        serving = self._serving(kind)
        outs = [self._out[kind][n] for n in serving]
        if not outs or any(o is None for o in outs) or now - self._logged[kind] < LOG_EVERY:
            return
        self._logged[kind] = now
        since = max(o.since for o in outs)  # type: ignore[union-attr]
        servers: dict[str, str] = {}
        for o in outs:
            servers.update(o.servers)  # type: ignore[union-attr]
        left = since + self.settings[kind].outage_timeout - now
        pool.log(f"waiting: all servers of {kind} are out on every Ray worker ({len(servers)} of {len(servers)}) "
                 f"for {now - since:.0f} s (fails in {max(0.0, left):.0f} s): "
                 + "; ".join(f"{u}: {e}" for u, e in servers.items()))

    def _healthy(self, kind: str, n: int, health: dict | None) -> None:
        """A worker's report on its servers of `kind`, as it came with an answer."""
        now = time.monotonic()
        if health is None or health.get("bad"):
            self._out[kind][n] = None
            if health is None:
                self._bad[kind][n] = None
                self._bad_times[kind][n] = 0
            elif self._bad[kind][n] is None or self._bad[kind][n] <= now:
                # Garbage again: avoided for a cool-down that doubles while no answer is kept.
                s = self.settings[kind]
                pause = min(s.outage_cool_down_cap, s.outage_cool_down * 2 ** self._bad_times[kind][n])
                self._bad[kind][n] = now + pause
                self._bad_times[kind][n] += 1
        else:
            probe_in = health["probe_in"]
            self._out[kind][n] = _Out(now - health["out_for"],
                                      None if probe_in is None else now + max(PROBE_WAIT, probe_in),
                                      health["servers"])
        self._notify()

    def _avoid(self, kind: str, n: int) -> bool:
        """Whether worker `n` answers garbage while another worker in rotation does not."""
        if self._bad[kind][n] is None:
            return False
        return any(i != n and self._bad[kind][i] is None and self._out[kind][i] is None
                   and not self._restarting[i] for i in self._serving(kind))

    def _done(self, kind: str, n: int, probe: bool, alone: bool) -> None:
        self._in_flight[kind][n] -= 1
        if probe:
            self._probing[kind][n] = False
        if alone:
            self._alone[n] = False
        self._notify()

    async def _wait(self, timeout: float | None) -> None:
        """Until something changes (a call ends, a worker reports or comes back), or `timeout`."""
        if self._event is None:
            self._event = asyncio.Event()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    # -- a worker that died -----------------------------------------------------------------------
    def _died(self, n: int) -> None:
        """Worker `n` died under a call: no calls for it until Ray has restarted it."""
        self._sent[n].clear()
        if self._restarting[n] or self._gone[n]:
            return
        self._restarting[n] = True
        for kind, reports in self.endpoint_reports.items():  # the new process counts from zero
            before = self._carried[kind].setdefault(n, {})
            for name, counts in reports.pop(n, {}).items():
                mine = before.setdefault(name, {})
                for field, value in counts.items():
                    mine[field] = mine.get(field, 0) + value
        task = asyncio.ensure_future(self._restarted(n))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restarted(self, n: int) -> None:
        ray = self._ray
        deadline = time.monotonic() + RESTART_TIMEOUT
        hello = None
        while hello is None and time.monotonic() < deadline:
            try:
                left = max(1.0, deadline - time.monotonic())
                hello = await asyncio.wait_for(_get(self.actors[n].hello.remote()), left)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                await asyncio.sleep(0.2)
            except asyncio.TimeoutError:
                break
        try:
            if hello is None:
                raise RayUnavailable("did not come back")
            self._check(hello)
            self._pids[n] = hello["pid"]
        except RayUnavailable:
            self._gone[n] = True
        finally:
            self._restarting[n] = False
            for kind in ("chat", "embedding"):  # a new process: its servers afresh
                self._out[kind][n] = self._bad[kind][n] = None
            self._notify()

    # -- the end ----------------------------------------------------------------------------------
    def pool(self, kind: str) -> "WorkerEndpoints":
        """What Usage.endpoint_report() reads for `kind` ("chat" or "embedding") in a Ray run."""
        return WorkerEndpoints(self, kind)

    async def aclose(self) -> None:
        for task in list(getattr(self, "_tasks", ())):
            task.cancel()
        await asyncio.gather(*(a.close.remote() for a in self.actors), return_exceptions=True)
        self._stop()

    def _stop(self) -> None:
        ray = self._ray
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self._started and ray.is_initialized():
            ray.shutdown()


async def _get(ref: Any) -> Any:
    return await ref


class WorkerEndpoints:
    """The endpoints of every worker for one model, as stats.json `endpoints` lists them."""

    several = True

    def __init__(self, workers: RayWorkers, kind: str):
        self.workers = workers
        self.kind = kind

    @property
    def gave_up(self) -> str | None:
        """Why calls of this model failed with no worker's server left (stats.json `outages`)."""
        return self.workers.gave_up[self.kind]

    def report(self) -> dict[str, dict[str, Any]]:
        carried = self.workers._carried[self.kind]
        current = self.workers.endpoint_reports[self.kind]
        out: dict[str, dict[str, Any]] = {}
        for n in sorted(set(carried) | set(current)):
            for reports in (carried.get(n, {}), current.get(n, {})):
                for name, counts in reports.items():
                    mine = out.setdefault(f"worker {n}, endpoint {name}", {})
                    for field, value in counts.items():
                        mine[field] = mine.get(field, 0) + value
        return out
