"""A deterministic OpenAI-compatible mock server for tests and benchmarks (stdlib only).

A real HTTP/1.1 server on 127.0.0.1 (keep-alive, Content-Length bodies) that answers
`/v1/chat/completions` and `/v1/embeddings`. Answers depend only on the request body, so a
rerun sees identical answers. Structured requests get a schema-valid instance whose strings are
taken from the last user message: capitalised phrases (and runs of Han characters), so an
extraction schema yields entity names that occur in the text and relationships between them.
Faults (429, 5xx, hangs, dropped connections, broken JSON ...) come from a script or at seeded
random rates, so retry paths can be tested against real sockets. A `responder` hook can give the
content of chosen chat replies itself (a benchmark playing a perfect extractor).

    with start_mock_server(latency=0.05, script=["429", "ok"]) as server:
        ChatSettings(provider="openai", model="m", base_url=server.base_url, api_key="k")
        ...
        server.stats["by_fault"]["429"] == 1

Manual use: python tests/mock_llm.py --port 8000 --latency 0.3 --fault-rate 0.3
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import random
import re
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import numpy as np

FAULTS = ("429", "500", "503", "hang", "drop", "truncated", "invalid", "empty")
# Also accepted in a script: "ok", "fenced" (valid JSON inside a code fence), "length" (cut JSON
# with finish_reason=length) and any other HTTP status code such as "401", "404" or "400".
EXTRA_SCRIPT_ENTRIES = ("ok", "fenced", "length")
HANG_SECONDS = 30.0
RETRY_AFTER = "0.05"

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 408: "Request Timeout",
            422: "Unprocessable Entity", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


# -- answers derived from the input text -----------------------------------------------------------
_CAPITALISED = re.compile(r"\b[A-Z][\w'&.-]*(?:[ \t]+(?:of[ \t]+|the[ \t]+|and[ \t]+)?[A-Z][\w'&-]*)*")
_HAN = re.compile(r"[\u4e00-\u9fff]{2,4}")
_SENTENCE_WORDS = {"The", "A", "An", "In", "On", "At", "It", "He", "She", "They", "We", "I", "This", "That",
                   "These", "Those", "But", "And", "Or", "If", "When", "As", "For", "With", "From", "By",
                   "Text", "Extract", "Return", "Answer", "Question", "Reply", "Output", "Input", "Use"}
_TYPES = ("organization", "person", "geo", "event")
_NAME_FIELDS = ("name", "title", "entity", "source", "target", "subject", "object", "head", "tail")
_TEXT_FIELDS = ("description", "summary", "explanation", "text", "content", "answer", "reason",
                "full_content", "finding", "rationale", "source_text", "span", "question")


def _last_user(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):  # content parts
                return " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            return c or ""
    return ""


def _phrases(text: str, most: int = 16) -> list[str]:
    """Capitalised phrases and Han runs of the text, in order of first appearance."""
    out: dict[str, None] = {}
    for m in _CAPITALISED.finditer(text):
        words = m.group(0).rstrip(".-'&").split()
        while words and words[0] in _SENTENCE_WORDS:  # "The Board" -> "Board"
            words.pop(0)
        p = " ".join(words)
        if len(p) > 1:
            out.setdefault(p, None)
        if len(out) >= most:
            break
    if len(out) < most:
        for m in _HAN.finditer(text):
            out.setdefault(m.group(0), None)
            if len(out) >= most:
                break
    return list(out) or ["Unknown"]


def _sentence_end(s: str, start: int) -> int:
    return min((j for j in (s.find(". ", start), s.find("。", start), s.find("\n", start)) if j > start),
               default=-1)


def _window(text: str, phrase: str, width: int = 160, sentences: int = 1) -> str:
    """A stretch of the input around `phrase`: a description that really comes from the text,
    `sentences` sentences of it at most (within `width` characters)."""
    i = max(0, text.find(phrase))
    s = text[i:i + width]
    end = 0
    for _ in range(sentences):
        nxt = _sentence_end(s, end)
        if nxt < 0:
            break
        end = nxt + 1
    s = " ".join((s[:end] if end > 0 else s).split())
    return s or phrase


class _Gen:
    """Builds a schema instance from text; `rng` makes choices depend on the request body."""

    def __init__(self, text: str, rng: random.Random, yes_rate: float = 0.0, scale: float = 1.0):
        self.text = text
        self.rng = rng
        self.yes_rate = yes_rate
        # answer_scale: texts `scale` times longer, `scale` times more items per list (to maxItems)
        self.scale = scale
        # With yes_rate set the mock also reads the ids of the prompt's `id|text` table rows and
        # cites those (a mock that answers about its context, as benchmarks of retrieval need).
        self.rows = [int(m) for m in re.findall(r"(?m)^(\d+)\|", text)] if yes_rate else []
        self.phrases = _phrases(text, _scaled(16, scale))
        self.items = _scaled(4, scale)
        self.k = max(1, min(self.items, len(self.phrases)))  # items per array: entity i <-> relationship i

    def value(self, schema: Any, field: str = "", i: int = 0) -> Any:
        if not isinstance(schema, dict):
            return None
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return schema["enum"][(i + self.rng.randrange(len(schema["enum"]))) % len(schema["enum"])]
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
                return self.value(options[0], field, i)
        t = schema.get("type")
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), "null")
        if t is None:
            t = "object" if "properties" in schema else "array" if "items" in schema else "string"
        if t == "object":
            props = schema.get("properties") or {}
            return {k: self.value(v, k, i) for k, v in props.items()}
        if t == "array":
            lo = max(1, int(schema.get("minItems", 1)))
            hi = min(max(lo, self.items), int(schema.get("maxItems", self.items)))
            n = max(lo, min(hi, self.k))
            return [self.value(schema.get("items", {}), field, j) for j in range(n)]
        if t == "string":
            return self.string(schema, field.lower(), i)
        if t == "integer" and self.rows and field.lower() in ("id", "ids", "sources"):
            return self.rows[i % len(self.rows)]
        if t in ("integer", "number"):
            return self.number(schema, t, field.lower())
        if t == "boolean":
            if self.yes_rate and field != "missed":  # e.g. relevance verdicts: some yes, by request
                return self.rng.random() < self.yes_rate
            return False  # "were entities missed?" -> no, so gleaning loops end
        return None

    def string(self, schema: dict[str, Any], field: str, i: int) -> str:
        p = self.phrases
        if field in ("target", "object", "tail") or field.endswith("_target") or field.endswith("object_id"):
            s = p[(i + 1) % self.k]
        elif field in ("type", "entity_type", "category") or field.endswith("_type"):
            s = _TYPES[i % len(_TYPES)]
        elif any(field == f or field.endswith("_" + f) for f in _NAME_FIELDS) or field.endswith("_id"):
            s = p[i % self.k]
        elif any(f in field for f in _TEXT_FIELDS):
            s = _scaled_window(self.text, p[i % self.k], 160, self.scale)
        elif field in ("status",):
            s = ("TRUE", "FALSE", "SUSPECTED")[i % 3]
        elif "date" in field or "period" in field:
            s = ""
        else:
            s = p[(i + self.rng.randrange(len(p))) % len(p)]
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        if hi is not None:
            s = s[: int(hi)]
        if len(s) < lo:
            s = s + "x" * (lo - len(s))
        return s

    def number(self, schema: dict[str, Any], t: str, field: str) -> int | float:
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        if lo is None and hi is None:
            lo, hi = (0, 100) if "score" in field else (1, 10)
        elif lo is None:
            lo = hi - 10
        elif hi is None:
            hi = lo + 10
        if "exclusiveMinimum" in schema:
            lo = lo + (1 if t == "integer" else 1e-6)
        if "exclusiveMaximum" in schema:
            hi = hi - (1 if t == "integer" else 1e-6)
        if t == "integer":
            lo, hi = math.ceil(lo), math.floor(hi)
            return self.rng.randint(lo, max(lo, hi))
        return round(lo + (hi - lo) * self.rng.random(), 3)


def _scaled(n: int, scale: float) -> int:
    return max(1, round(n * scale))


def _scaled_window(text: str, phrase: str, width: int, scale: float) -> str:
    """`scale` times the usual window: as many sentences, in as many characters."""
    if scale == 1.0:
        return _window(text, phrase, width)
    return _window(text, phrase, _scaled(width, scale), _scaled(1, scale))


def _break(instance: Any, schema: dict[str, Any]) -> Any:
    """A schema violation: drop a required key (or give a wrong type)."""
    if isinstance(instance, dict) and instance:
        out = dict(instance)
        out.pop((schema.get("required") or list(out))[0], None)
        return out
    return {"unexpected": "not what the schema asked for"}


def _hint_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """A JSON schema written into the prompt (JSON mode and prompt mode put it there)."""
    for m in body.get("messages") or []:
        c = m.get("content")
        if not isinstance(c, str):
            continue
        at = c.rfind("schema")
        if at < 0:
            continue
        start = c.find("{", at)
        if start < 0:
            continue
        try:
            schema, _ = json.JSONDecoder().raw_decode(c, start)
        except ValueError:
            continue
        if isinstance(schema, dict) and ("properties" in schema or "type" in schema):
            return schema
    return None


def _wants_json(body: dict[str, Any]) -> bool:
    return bool(body.get("response_format")) or _hint_schema(body) is not None


def _chat_answer(body: dict[str, Any], digest: bytes, fault: str, yes_rate: float = 0.0,
                 answer_scale: float = 1.0) -> tuple[str, str]:
    """(content, finish_reason) for a chat request; `answer_scale` > 1 writes longer answers
    (texts of that many sentences, that many times more list items up to maxItems)."""
    text = _last_user(body)
    rng = random.Random(digest)
    rf = body.get("response_format") or {}
    schema = None
    if rf.get("type") == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema") or {"type": "object", "properties": {}}
    else:
        schema = _hint_schema(body)
    if schema is None and rf.get("type") == "json_object":
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    if fault == "empty":
        return "", "stop"
    if schema is None:
        phrases = _phrases(text)[:_scaled(3, answer_scale)]
        content = f"About {', '.join(phrases)}: {_scaled_window(text, phrases[0], 200, answer_scale)}"
        if fault == "length":
            return content[: len(content) // 2], "length"
        # ("truncated" plain text is cut in transfer by _chat: a shorter text that claims to be
        # complete would be a different answer, not a fault any client could notice.)
        return content, "stop"
    instance = _Gen(text, rng, yes_rate, answer_scale).value(schema)
    if fault == "invalid":
        instance = _break(instance, schema)
    content = json.dumps(instance, ensure_ascii=False)
    if fault in ("truncated", "length"):
        cut = content[: max(1, len(content) // 2)]
        while len(cut) > 1 and cut[-1] in "}]":
            cut = cut[:-1]
        return cut, "length" if fault == "length" else "stop"
    if fault == "fenced":
        content = f"```json\n{content}\n```"
    return content, "stop"


def _tokens(s: str) -> int:
    return max(1, len(s) // 4)


def _fast_embedding(text: str, dim: int) -> np.ndarray:
    # Uniform components from the text's hash, centred and normalised: a unit vector per text.
    raw = np.frombuffer(hashlib.shake_256(text.encode("utf-8")).digest(4 * dim), dtype="<u4")
    v = raw / 2.0**32 - 0.5
    return v / (np.linalg.norm(v) or 1.0)


def _embedding(text: str, dim: int) -> list[float]:
    rng = random.Random(hashlib.sha256(text.encode("utf-8")).digest())
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


# -- the server ------------------------------------------------------------------------------------
class MockServer:
    """Runs in a background thread with its own event loop. Use `start_mock_server()`."""

    def __init__(self, *, latency: float = 0.0, faults: dict[str, float] | None = None,
                 script: list[str] | None = None, seed: int = 0, host: str = "127.0.0.1", port: int = 0,
                 reject_formats: tuple[str, ...] = (), models: tuple[str, ...] | None = None,
                 api_key: str | None = None, yes_rate: float = 0.0, batch_limit: int = 0,
                 answer_scale: float = 1.0, fast_vectors: bool = False,
                 responder: Callable[[dict[str, Any]], str | None] | None = None, reject_status: int = 400,
                 chunk_seconds: float = 0.0):
        unknown = set(faults or {}) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; allowed: {', '.join(FAULTS)}")
        self.latency = latency
        self.faults = dict(faults or {})
        self.script: deque[str] = deque(script or [])
        self.seed = seed
        self.host = host
        self.port = port
        # response_format types answered with 400, like a server without structured output.
        self.reject_formats = set(reject_formats)
        # 400 by default; 500 like a server whose structured decoding breaks on the request
        # (vLLM's guided decoding has answered so: vllm-project/vllm#8429, #13260).
        self.reject_status = reject_status
        # Like a real server: unknown model names get 404, a missing or wrong key gets 401.
        self.models = tuple(models) if models is not None else None
        self.api_key = api_key
        # Share of boolean fields (other than gleaning's "missed") answered true.
        self.yes_rate = yes_rate
        # Answers this many times longer (benchmarks: a model more verbose than this mock).
        self.answer_scale = answer_scale
        # Vectors drawn by numpy (other values, same properties). The server is one event loop:
        # drawn in Python, a batch of 64 vectors held every chat answer in flight back by ~15 ms,
        # which no real server does; benchmarks that embed beside chat calls turn this on.
        self.fast_vectors = fast_vectors
        # responder(body) -> the content to send for a chat request, or None for the usual answer
        # (benchmarks that play a particular model for some calls, e.g. a perfect extractor).
        self.responder = responder
        # At most this many requests are worked on at once (0 = no limit); the rest queue, like
        # a GPU server at its batch limit, so latency grows with the queue instead of staying flat.
        self.batch_limit = batch_limit
        self._batch: asyncio.Semaphore | None = None
        # A slow generator: a chat answer comes in pieces this many seconds apart, streamed as
        # they come, or (not streamed) sent once the last one is ready, like a local model.
        self.chunk_seconds = chunk_seconds
        # Set at any time to a fault ("503", "drop", "hang", "401" ...) that every request then
        # gets, before script and rates: a server that goes down and comes back (None) mid-test.
        self.down: str | None = None
        # The headers of a 429 (tests and benchmarks set Retry-After values a real server sends).
        self.retry_after_headers: dict[str, str] = {"Retry-After": RETRY_AFTER}
        self.last_headers: dict[str, str] = {}
        self.requests: deque[dict[str, Any]] = deque(maxlen=1000)  # the last request bodies
        self._seen: Counter[bytes] = Counter()  # occurrences per body: faults repeat per request order
        self._by_kind: Counter[str] = Counter()
        self._by_fault: Counter[str] = Counter()
        self._in_flight = 0
        self._max_in_flight = 0
        # per kind too: a client's chat and embedding sections have limits of their own
        self._in_flight_by_kind: Counter[str] = Counter()
        self._max_in_flight_by_kind: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None

    # -- public ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def stats(self) -> dict[str, Any]:
        """requests (total), by_kind ("chat", "embeddings", "other"), by_fault ("ok", "429", ...),
        in_flight and max_in_flight (requests being answered at once, seen by the server), and
        max_in_flight_by_kind."""
        with self._lock:
            return {"requests": sum(self._by_kind.values()), "by_kind": dict(self._by_kind),
                    "by_fault": dict(self._by_fault), "in_flight": self._in_flight,
                    "max_in_flight": self._max_in_flight,
                    "max_in_flight_by_kind": dict(self._max_in_flight_by_kind)}

    def reset_stats(self) -> None:
        with self._lock:
            self._by_kind.clear()
            self._by_fault.clear()
            self._max_in_flight = self._in_flight
            self._max_in_flight_by_kind = Counter(self._in_flight_by_kind)
            self.requests.clear()

    def start(self) -> "MockServer":
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, self.host, self.port, backlog=1024))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                error.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="mock-llm", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            raise error[0]
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for t in list(self._tasks):
                t.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self._thread.join(timeout=10)
        self._loop = None
        self._thread = None

    def __enter__(self) -> "MockServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------------
    def _fault(self, digest: bytes) -> str:
        with self._lock:
            if self.down is not None:
                return self.down
            if self.script:
                return self.script.popleft()
            if not self.faults:
                return "ok"
            # Seeded by the body and how often it was seen: reruns repeat, interleaving doesn't matter.
            n = self._seen[digest]
            self._seen[digest] = n + 1
        h = hashlib.sha256(digest + struct.pack("<qq", self.seed, n)).digest()
        u = int.from_bytes(h[:8], "little") / 2**64
        acc = 0.0
        for name, rate in self.faults.items():
            acc += rate
            if u < acc:
                return name
        return "ok"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, path, _version = lines[0].split(" ", 2)
                except ValueError:
                    return
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                self.last_headers = headers  # for subclasses that answer by header (tests)
                if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
                    with self._lock:
                        self._by_kind["unauthorized"] += 1
                    self._send(writer, 401, _error("Incorrect API key provided", "invalid_api_key"))
                    continue
                keep = await self._respond(method, path, body, reader, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.CancelledError:
            return
        finally:
            if task is not None:
                self._tasks.discard(task)
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    async def _respond(self, method: str, path: str, raw: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False closes the connection."""
        path = path.split("?", 1)[0].rstrip("/")
        kind = ("chat" if path.endswith("/chat/completions") else
                "embeddings" if path.endswith("/embeddings") else "other")
        with self._lock:
            self._by_kind[kind] += 1
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._in_flight_by_kind[kind] += 1
            self._max_in_flight_by_kind[kind] = max(self._max_in_flight_by_kind[kind], self._in_flight_by_kind[kind])
        try:
            if kind == "other":
                if method == "GET" and path.endswith("/models"):
                    self._send(writer, 200, {"object": "list", "data": [
                        {"id": m, "object": "model", "created": 0, "owned_by": "mock"}
                        for m in (self.models if self.models is not None else ("mock",))]})
                else:
                    self._send(writer, 404, _error(f"no route {method} {path}", "not_found"))
                return True
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(writer, 400, _error("request body is not JSON", "invalid_request_error"))
                return True
            self.requests.append(body)
            if self.models is not None and body.get("model") not in self.models:
                self._send(writer, 404, _error(f"The model `{body.get('model')}` does not exist", "model_not_found"))
                return True
            # Of the body's content, not its bytes: a client that orders or spaces its fields
            # differently gets the same answers and faults.
            digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).digest()
            fault = self._fault(digest)
            with self._lock:
                self._by_fault[fault] += 1
            if self.batch_limit:
                if self._batch is None:
                    self._batch = asyncio.Semaphore(self.batch_limit)
                async with self._batch:
                    await asyncio.sleep(self.latency)
            elif self.latency:
                await asyncio.sleep(self.latency)
            if fault == "hang":
                # Wait past any client timeout; a client that gives up closes the socket -> EOF.
                try:
                    await asyncio.wait_for(reader.read(1), HANG_SECONDS)
                except asyncio.TimeoutError:
                    pass
                return False
            if fault == "drop":
                writer.transport.abort()
                return False
            if fault.isdigit():
                status = int(fault)
                headers = dict(self.retry_after_headers) if status == 429 else {}
                etype = "rate_limit_exceeded" if status == 429 else "server_error" if status >= 500 else "error"
                self._send(writer, status, _error(f"mock fault {status}", etype), headers)
                return True
            rf_type = (body.get("response_format") or {}).get("type")
            if kind == "chat" and rf_type in self.reject_formats:
                if self.reject_status >= 500:
                    self._send(writer, self.reject_status, _error("Internal Server Error", "server_error"))
                else:
                    self._send(writer, self.reject_status, _error(
                        f"response_format type {rf_type!r} is not supported", "invalid_request_error"))
                return True
            if kind == "chat" and self.chunk_seconds:
                await self._slow_chat(writer, body, digest, fault)
            elif kind == "chat":
                self._chat(writer, body, digest, fault)
            else:
                self._embeddings(writer, body, fault)
            return True
        finally:
            with self._lock:
                self._in_flight -= 1
                self._in_flight_by_kind[kind] -= 1

    async def _slow_chat(self, writer: asyncio.StreamWriter, body: dict[str, Any], digest: bytes,
                         fault: str) -> None:
        """_chat from a slow generator (chunk_seconds): a streamed answer is written piece by
        piece as each is "generated"; any other waits for all of them and is sent whole."""
        if not body.get("stream"):
            await asyncio.sleep(self.chunk_seconds * (STREAM_PIECES + 1))
            self._chat(writer, body, digest, fault)
            return
        buffer = _Buffer()
        self._chat(buffer, body, digest, fault)  # type: ignore[arg-type]
        head, _, payload = bytes(buffer).partition(b"\r\n\r\n")
        head = head.replace(f"Content-Length: {len(payload)}".encode(), b"Transfer-Encoding: chunked")
        writer.write(head + b"\r\n\r\n")
        for event in payload.split(b"\n\n"):
            if event:
                await asyncio.sleep(self.chunk_seconds)
                writer.write(b"%x\r\n%s\n\n\r\n" % (len(event) + 2, event))
                await writer.drain()
        writer.write(b"0\r\n\r\n")

    def _chat(self, writer: asyncio.StreamWriter, body: dict[str, Any], digest: bytes, fault: str) -> None:
        # (tests replace _chat_answer with three-argument versions: pass options only when set)
        options = {**({"yes_rate": self.yes_rate} if self.yes_rate else {}),
                   **({"answer_scale": self.answer_scale} if self.answer_scale != 1.0 else {})}
        given = self.responder(body) if self.responder is not None else None
        if given is not None:
            # sent as given: only the faults of the request itself (status codes, hangs, drops)
            # were applied above, none that reshape an answer
            content, finish = given, "stop"
        else:
            content, finish = _chat_answer(body, digest, fault, **options)
        prompt = sum(_tokens(m.get("content") or "") for m in body.get("messages") or []
                     if isinstance(m.get("content"), str))
        usage = {"prompt_tokens": prompt, "completion_tokens": _tokens(content),
                 "total_tokens": prompt + _tokens(content)}
        model = body.get("model") or "mock"
        ident = "chatcmpl-" + digest[:8].hex()
        if body.get("stream"):
            self._stream(writer, ident, model, content, finish, usage)
            return
        reply = {
            "id": ident, "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content}}],
            "usage": usage,
        }
        if fault == "truncated" and not _wants_json(body):
            payload = json.dumps(reply, ensure_ascii=False).encode("utf-8")
            self._send_raw(writer, 200, payload[: len(payload) // 2], "application/json")
            return
        self._send(writer, 200, reply)

    def _stream(self, writer: asyncio.StreamWriter, ident: str, model: str, content: str, finish: str,
                usage: dict[str, int]) -> None:
        def event(delta: dict[str, Any], reason: str | None, u: dict | None = None) -> str:
            chunk = {"id": ident, "object": "chat.completion.chunk", "created": 0, "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": reason}] if delta is not None
                     else [], "usage": u}
            return "data: " + json.dumps(chunk, ensure_ascii=False) + "\n\n"

        step = max(1, len(content) // STREAM_PIECES)
        parts = [event({"role": "assistant", "content": ""}, None)]
        parts += [event({"content": content[i:i + step]}, None) for i in range(0, len(content), step)]
        parts.append(event({}, finish))
        parts.append(event(None, None, usage))  # type: ignore[arg-type]
        parts.append("data: [DONE]\n\n")
        self._send_raw(writer, 200, "".join(parts).encode("utf-8"), "text/event-stream")

    def _embeddings(self, writer: asyncio.StreamWriter, body: dict[str, Any], fault: str) -> None:
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        inputs = [x if isinstance(x, str) else json.dumps(x) for x in inputs or []]
        dim = int(body.get("dimensions") or 384)
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(inputs):
            if self.fast_vectors:
                arr = _fast_embedding(text, dim)
                emb: Any = base64.b64encode(arr.astype("<f4").tobytes()).decode("ascii") if b64 else arr.tolist()
            else:
                vec = _embedding(text, dim)
                emb = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode("ascii") if b64 else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        if fault == "empty":
            data = []
        tokens = sum(_tokens(t) for t in inputs)
        out: dict[str, Any] = {"object": "list", "data": data, "model": body.get("model") or "mock",
                               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        if fault == "invalid":
            out.pop("data")
        payload = json.dumps(out).encode("utf-8")
        if fault in ("truncated", "length"):
            payload = payload[: len(payload) // 2]
        self._send_raw(writer, 200, payload, "application/json")

    def _send(self, writer: asyncio.StreamWriter, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send_raw(writer, status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json",
                       headers)

    @staticmethod
    def _send_raw(writer: asyncio.StreamWriter, status: int, payload: bytes, ctype: str,
                  headers: dict[str, str] | None = None) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n{extra}\r\n")
        writer.write(head.encode("latin-1") + payload)


STREAM_PIECES = 4  # a streamed answer's content comes in this many pieces


class _Buffer(bytearray):
    """Collects what _chat writes, for _slow_chat to send in pieces."""

    def write(self, data: bytes) -> None:
        self.extend(data)


def _error(message: str, etype: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": None, "code": etype}}


def start_mock_server(*, latency: float = 0.0, faults: dict[str, float] | None = None,
                      script: list[str] | None = None, seed: int = 0, port: int = 0,
                      reject_formats: tuple[str, ...] = (), models: tuple[str, ...] | None = None,
                      api_key: str | None = None, yes_rate: float = 0.0, batch_limit: int = 0,
                      answer_scale: float = 1.0, fast_vectors: bool = False,
                      responder: Callable[[dict[str, Any]], str | None] | None = None,
                      reject_status: int = 400, chunk_seconds: float = 0.0) -> MockServer:
    """Start a mock server in a background thread; use as a context manager or call `.stop()`.

    faults: rates per fault, e.g. {"429": 0.1, "hang": 0.01} (FAULTS lists them).
    script: one entry per request, in arrival order, before random faults apply:
            "ok", a fault name, "fenced", "length" or any HTTP status such as "401".
    reject_formats: response_format types answered with 400 ("json_schema", "json_object").
    reject_status: the status they are answered with instead (500: a server whose structured
            decoding breaks on them).
    chunk_seconds: a slow generator: a chat answer's pieces come this many seconds apart,
            streamed as they come or, not streamed, sent once the last is ready.
    models: the model names served (listed by GET /models); others get 404. None: any name.
    api_key: if set, requests without `Authorization: Bearer <api_key>` get 401.
    batch_limit: at most this many requests are answered at once, the others queue (0 = no limit).
    answer_scale: answers this many times longer: descriptions, summaries and report texts of
            that many sentences, that many times more entities, relationships and findings per
            answer (up to the schema's maxItems); 1 = the usual answers.
    fast_vectors: embeddings drawn by numpy, so a batch does not stall the server's chat answers.
    responder: responder(body) -> the content of the reply to a chat request (its JSON body as sent),
            or None for the usual generated answer. Called in the server's thread; the faults
            written into generated answers (invalid, length, fenced, empty, truncated JSON) do
            not touch its answers, the others (status codes, hangs, drops) apply as usual.
    """
    return MockServer(latency=latency, faults=faults, script=script, seed=seed, port=port,
                      reject_formats=reject_formats, models=models, api_key=api_key, yes_rate=yes_rate,
                      batch_limit=batch_limit, answer_scale=answer_scale, fast_vectors=fast_vectors,
                      responder=responder, reject_status=reject_status, chunk_seconds=chunk_seconds).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    ap.add_argument("--fault-rate", type=float, default=0.0,
                    help="total fault rate, spread evenly over every fault except hang")
    ap.add_argument("--faults", default="", help="explicit rates, e.g. 429=0.1,hang=0.01 (wins over --fault-rate)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reject", default="", help="response_format types to refuse, e.g. json_schema")
    ap.add_argument("--models", default="", help="comma-separated model names served; others get 404")
    ap.add_argument("--api-key", default=None, help="require this bearer key (others get 401)")
    ap.add_argument("--batch-limit", type=int, default=0, help="requests answered at once; the rest queue (0 = no limit)")
    ap.add_argument("--answer-scale", type=float, default=1.0,
                    help="answers this many times longer (more sentences, more list items up to maxItems)")
    ap.add_argument("--fast-vectors", action="store_true",
                    help="draw embeddings with numpy: a batch then does not hold back the chat answers in flight")
    ap.add_argument("--yes-rate", type=float, default=0.0,
                    help="share of yes/no fields (relevance verdicts; not gleaning's 'missed') answered yes")
    args = ap.parse_args()
    faults: dict[str, float] = {}
    if args.fault_rate:
        kinds = [f for f in FAULTS if f != "hang"]
        faults = {f: args.fault_rate / len(kinds) for f in kinds}
    if args.faults:
        faults = {k: float(v) for k, v in (kv.split("=") for kv in args.faults.split(","))}
    server = start_mock_server(latency=args.latency, faults=faults, seed=args.seed, port=args.port,
                               reject_formats=tuple(x for x in args.reject.split(",") if x),
                               models=tuple(x for x in args.models.split(",") if x) or None,
                               api_key=args.api_key, yes_rate=args.yes_rate, batch_limit=args.batch_limit,
                               answer_scale=args.answer_scale, fast_vectors=args.fast_vectors)
    print(f"mock LLM at {server.base_url} (latency {args.latency}s, faults {faults or 'none'})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
