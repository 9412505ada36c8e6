"""ChatClient against the real mock HTTP server: retries, faults, fallbacks, limits, usage."""
from __future__ import annotations

import asyncio
import json
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import scripted
from pydantic import BaseModel, Field

from mock_llm import start_mock_server
from sensegraph.config import ChatSettings
from sensegraph.llm import ChatClient, LLMError
from sensegraph.llm.cache import Cache
from sensegraph.tokens import count_tokens
from sensegraph.llm.limits import RateLimiter, backoff_delay, parse_retry_after

TEXT = ("Acme Corp announced on Monday that Jane Doe will lead its Berlin office. "
        "Jane Doe previously worked at Globex with John Smith.")


class Entity(BaseModel):
    name: str
    type: str
    description: str


class Relationship(BaseModel):
    source: str
    target: str
    description: str
    strength: int = Field(ge=1, le=10)


class Extraction(BaseModel):
    entities: list[Entity]
    relationships: list[Relationship]


@pytest.fixture
def mock_server():
    """mock_server(**kwargs) starts a server that is stopped after the test."""
    started = []

    def start(**kwargs):
        server = start_mock_server(**kwargs)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


def settings(server, **kw) -> ChatSettings:
    base = dict(provider="openai", model="m", base_url=server.base_url, api_key="k",
                retry_base_seconds=0.01, max_retries=3, timeout=10)
    return ChatSettings(**{**base, **kw})


def messages(text: str = TEXT) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Extract entities."}, {"role": "user", "content": text}]


async def _extract(client: ChatClient, item: str = "tu-1", text: str = TEXT) -> Extraction:
    try:
        return await client.structured(messages(text), Extraction, step="extract", item=item, max_tokens=800)
    finally:
        await client.aclose()


def extract(server, item: str = "tu-1", **kw) -> tuple[Extraction, ChatClient]:
    client = ChatClient(settings(server, **kw), cache=None)
    return asyncio.run(_extract(client, item)), client


def test_structured_answer_names_entities_of_the_text(mock_server):
    server = mock_server()
    reply, client = extract(server)
    names = {e.name for e in reply.entities}
    assert names and all(n in TEXT for n in names)
    assert all(r.source in names and r.target in names for r in reply.relationships)
    use = client.usage.step("extract")
    assert (use.calls, use.requests, use.retries, use.failures) == (1, 1, 0, [])
    assert use.prompt_tokens > 0 and use.completion_tokens > 0
    assert server.stats["requests"] == 1


def test_answers_are_deterministic(mock_server):
    a, _ = extract(mock_server())
    b, _ = extract(mock_server())
    assert a == b


@pytest.mark.parametrize("fault", ["429", "500", "503", "drop", "truncated", "invalid", "empty", "length"])
def test_fault_is_retried_once(mock_server, fault):
    server = mock_server(script=[fault, "ok"])
    reply, client = extract(server)
    assert reply.entities
    stats = server.stats
    assert stats["requests"] == 2
    assert stats["by_fault"] == {fault: 1, "ok": 1}
    use = client.usage.step("extract")
    assert (use.calls, use.requests, use.retries, use.failures) == (1, 2, 1, [])


def test_hang_times_out_and_is_retried(mock_server):
    server = mock_server(script=["hang", "ok"])
    reply, client = extract(server, timeout=0.3)
    assert reply.entities
    assert server.stats["requests"] == 2
    use = client.usage.step("extract")
    assert (use.calls, use.requests, use.retries) == (1, 2, 1)


def test_fenced_json_is_repaired_without_a_retry(mock_server):
    server = mock_server(script=["fenced"])
    reply, client = extract(server)
    assert reply.entities
    assert server.stats["requests"] == 1
    assert client.usage.step("extract").retries == 0


def test_item_failing_every_attempt_raises_and_is_recorded(mock_server):
    server = mock_server(script=["500"] * 10)
    client = ChatClient(settings(server, max_retries=2), cache=None)
    with pytest.raises(LLMError) as err:
        asyncio.run(_extract(client, item="tu-7"))
    assert "extract" in str(err.value) and "tu-7" in str(err.value)
    assert "3 attempts" in str(err.value) and "500" in str(err.value)
    # the second 500 in a row is asked again at once in JSON mode (a server may fail the format
    # with a 500); that failing too, the 500s are the server's and the attempts go on as they were
    assert server.stats["requests"] == 4
    use = client.usage.step("extract")
    assert use.failures == ["tu-7"]
    assert (use.calls, use.requests, use.retries) == (0, 4, 3)


def test_invalid_json_every_attempt_fails_with_schema_reason(mock_server):
    server = mock_server(script=["invalid"] * 10)
    client = ChatClient(settings(server, max_retries=1), cache=None)
    with pytest.raises(LLMError, match="Extraction"):
        asyncio.run(_extract(client, item="tu-9"))
    assert server.stats["requests"] == 2
    assert client.usage.step("extract").failures == ["tu-9"]


@pytest.mark.parametrize("status, hint", [("401", "api_key"), ("404", "base_url")])
def test_auth_and_not_found_are_not_retried(mock_server, status, hint):
    server = mock_server(script=[status] * 5)
    client = ChatClient(settings(server), cache=None)
    with pytest.raises(LLMError) as err:
        asyncio.run(_extract(client, item="tu-2"))
    assert hint in str(err.value) and status in str(err.value) and "tu-2" in str(err.value)
    assert server.stats["requests"] == 1
    assert client.usage.step("extract").failures == ["tu-2"]


def test_falls_back_to_json_mode_when_json_schema_is_refused(mock_server):
    server = mock_server(reject_formats=("json_schema",))
    client = ChatClient(settings(server), cache=None)

    async def two_calls():
        try:
            first = await client.structured(messages(), Extraction, step="extract", item="a", max_tokens=800)
            second = await client.structured(messages("Other text about Initech and Bill Lumbergh."),
                                             Extraction, step="extract", item="b", max_tokens=800)
            return first, second
        finally:
            await client.aclose()

    first, second = asyncio.run(two_calls())
    assert first.entities and second.entities
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    # One refused json_schema request, then JSON mode stays on for later calls.
    assert kinds == ["json_schema", "json_object", "json_object"]
    assert client.usage.step("extract").requests == 3
    assert client.usage.step("extract").failures == []


def test_falls_back_to_prompt_only_when_json_mode_is_refused_too(mock_server):
    server = mock_server(reject_formats=("json_schema", "json_object"))
    reply, _ = extract(server)
    assert reply.entities
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    assert kinds == ["json_schema", "json_object", None]


def _three_calls(client: ChatClient):
    async def run():
        try:
            return [await client.structured(messages(f"{TEXT} Call {n}."), Extraction, step="extract",
                                            item=f"tu-{n}", max_tokens=800) for n in range(3)]
        finally:
            await client.aclose()
    return asyncio.run(run())


def test_a_server_that_fails_json_schema_with_500_steps_down_to_json_mode(mock_server):
    # vLLM's guided decoding has answered structured requests it cannot serve with a 500 while
    # plain ones work: that is no outage, and waiting one out (outage_timeout) would stall the run
    server = mock_server(reject_formats=("json_schema",), reject_status=500)
    client = ChatClient(settings(server, max_retries=2, outage_timeout=5), cache=None)
    replies = _three_calls(client)
    assert all(r.entities for r in replies)
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    # a request's second 500 in a row is asked again at once in JSON mode; the second time
    # that happens, JSON mode stays on
    s, j = "json_schema", "json_object"
    assert kinds == [s, s, j, s, s, j, j]
    assert client._mode == "json_mode"
    use = client.usage.step("extract")
    assert use.failures == [] and use.calls == 3
    assert client.endpoints.all[0].usage.out_of_rotation == 0


def test_passing_500s_on_json_schema_requests_do_not_step_down(mock_server):
    # a 500 is retried as it is (a fault must not change the question); a request's second 500
    # in a row is asked in JSON mode, but the server serves json_schema between: the mode stays
    server = mock_server(script=["500", "500", "ok", "ok", "500", "500", "ok"])
    client = ChatClient(settings(server, max_retries=2), cache=None)
    replies = _three_calls(client)
    assert all(r.entities for r in replies)
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    s, j = "json_schema", "json_object"
    assert kinds == [s, s, j, s, s, s, j]
    assert client._mode == "json_schema"
    assert client.usage.step("extract").failures == []


def test_a_lower_mode_answer_cut_off_still_shows_the_server_serves_that_mode(mock_server):
    # the JSON-mode answers run out of tokens once each: the server answers that mode, so the
    # 500s are the format's, and the cut-off answer is retried as any bad answer
    server = mock_server(reject_formats=("json_schema",), reject_status=500, script=["ok", "ok", "length"])
    client = ChatClient(settings(server, max_retries=5, outage_timeout=5), cache=None)
    replies = _three_calls(client)
    assert all(r.entities for r in replies)
    assert client._mode == "json_mode"
    assert client.endpoints.all[0].usage.out_of_rotation == 0
    assert client.usage.step("extract").failures == []


def test_a_burst_of_passing_500s_is_retried_as_it_is(mock_server):
    # four requests in flight meet one passing fault together: each is sent again unchanged
    server = mock_server(script=["500"] * 4)
    client = ChatClient(settings(server, max_retries=3, concurrency=4), cache=None)

    async def together():
        try:
            return await asyncio.gather(*(client.structured(messages(f"{TEXT} Call {n}."), Extraction, step="extract",
                                                            item=f"tu-{n}", max_tokens=800) for n in range(4)))
        finally:
            await client.aclose()

    assert all(r.entities for r in asyncio.run(together()))
    assert client._mode == "json_schema"
    assert client.usage.step("extract").failures == []
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    assert kinds == ["json_schema"] * 8


def test_concurrent_requests_meeting_a_json_schema_500_do_not_take_the_server_out(mock_server):
    # eight requests in flight all get a 500: counted against the server as faults, they would
    # take it out as if it were down (3 in a row), and every call would wait for the outage
    server = mock_server(reject_formats=("json_schema",), reject_status=500, latency=0.02)
    client = ChatClient(settings(server, max_retries=3, concurrency=8, outage_timeout=3), cache=None)

    async def together():
        try:
            burst = await asyncio.gather(*(client.structured(messages(f"{TEXT} Call {n}."), Extraction, step="extract",
                                                             item=f"tu-{n}", max_tokens=800) for n in range(16)))
            return burst + [await client.structured(messages(), Extraction, step="extract", item="after",
                                                    max_tokens=800)]
        finally:
            await client.aclose()

    assert all(r.entities for r in asyncio.run(together()))
    assert client._mode == "json_mode"
    assert client.endpoints.all[0].usage.out_of_rotation == 0
    assert client.usage.step("extract").failures == []


def test_a_503_is_not_taken_for_the_format(mock_server):
    # 503 says the server is overloaded or away: retried after the back-off, no other request sent
    server = mock_server(script=["503", "ok"])
    reply, client = extract(server)
    assert reply.entities
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    assert kinds == ["json_schema", "json_schema"]


def test_a_server_that_fails_every_request_with_500_is_a_fault_in_any_mode(mock_server):
    server = mock_server(script=["500"] * 20)
    client = ChatClient(settings(server, max_retries=1, outage_timeout=5), cache=None)
    with pytest.raises(LLMError, match="500"):
        asyncio.run(_extract(client, item="tu-7"))
    assert client._mode == "json_schema"  # JSON mode failed as well: not the format's fault
    assert client.usage.step("extract").failures == ["tu-7"]
    kinds = [(r.get("response_format") or {}).get("type") for r in server.requests]
    assert kinds == ["json_schema", "json_schema", "json_object"]


def test_structured_output_json_schema_does_not_fall_back(mock_server):
    server = mock_server(reject_formats=("json_schema",))
    client = ChatClient(settings(server, structured_output="json_schema"), cache=None)
    with pytest.raises(LLMError, match="400"):
        asyncio.run(_extract(client))
    assert server.stats["requests"] == 1


def test_concurrency_limit_is_respected_by_the_server_count(mock_server):
    server = mock_server(latency=0.05)
    client = ChatClient(settings(server, concurrency=3), cache=None)

    async def many():
        try:
            return await asyncio.gather(*(
                client.complete([{"role": "user", "content": f"Question {i} about Acme"}], step="q",
                                item=str(i), max_tokens=50) for i in range(12)))
        finally:
            await client.aclose()

    answers = asyncio.run(many())
    assert len(answers) == 12 and all(answers)
    assert server.stats["requests"] == 12
    assert server.stats["max_in_flight"] == 3


def test_random_faults_all_recover_and_counts_agree(mock_server):
    faults = {"429": 0.15, "500": 0.15, "truncated": 0.1, "invalid": 0.1}

    def run():
        server = mock_server(faults=faults, seed=7)
        client = ChatClient(settings(server, concurrency=4, max_retries=10), cache=None)

        async def many():
            try:
                return await asyncio.gather(*(
                    client.structured(messages(f"Report {i}: Acme Corp met Globex in Paris."), Extraction,
                                      step="extract", item=f"tu-{i}", max_tokens=800) for i in range(20)))
            finally:
                await client.aclose()

        replies = asyncio.run(many())
        return replies, server.stats, client.usage.step("extract")

    replies, stats, use = run()
    assert len(replies) == 20 and all(r.entities for r in replies)
    assert use.failures == [] and use.calls == 20
    assert stats["requests"] == use.requests == 20 + use.retries
    assert stats["by_fault"]["ok"] == 20 and use.retries > 0
    # Faults are seeded per request body, so a rerun sees the same faults.
    _, stats2, use2 = run()
    assert stats2["by_fault"] == stats["by_fault"] and use2.retries == use.retries


def test_stream_yields_the_answer(mock_server):
    server = mock_server()
    client = ChatClient(settings(server), cache=None)

    async def collect():
        try:
            return [p async for p in client.stream(messages(), step="query", max_tokens=100)]
        finally:
            await client.aclose()

    parts = asyncio.run(collect())
    assert len(parts) > 1 and "Acme Corp" in "".join(parts)
    use = client.usage.step("query")
    assert (use.calls, use.requests) == (1, 1) and use.completion_tokens > 0


# -- streaming: the same path as complete() (cache, budget, retries, usage) -----------------------
STREAMED = "The Harbor Cooperative was founded in 1998 by Maria Okafor and Daniel Reyes."


def _sse(text: str, *, drop_after: int | None = None, pieces: int = 5) -> httpx.Response:
    """A streamed chat answer in `pieces` chunks; with `drop_after`, the connection breaks after
    that many chunks were sent (an httpx error inside the stream, as a reset socket gives)."""
    step = -(-len(text) // pieces)

    def event(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
        chunk = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "scripted",
                 "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
                 "usage": usage}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    async def body():
        yield event({"role": "assistant", "content": ""})
        for n, i in enumerate(range(0, len(text), step)):
            if n == drop_after:
                raise httpx.ReadError("connection reset by peer")
            yield event({"content": text[i:i + step]})
        yield event({}, "stop")
        yield event(None, usage={"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21})
        yield b"data: [DONE]\n\n"

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def _streamed(client: ChatClient, item: str = "answer") -> tuple[list[str], BaseException | None]:
    pieces: list[str] = []

    async def collect():
        async for piece in client.stream([{"role": "user", "content": "Who founded the cooperative?"}],
                                         step="reduce", item=item, max_tokens=100):
            pieces.append(piece)

    try:
        asyncio.run(collect())
    except LLMError as exc:
        return pieces, exc
    return pieces, None


def test_a_stream_that_drops_midway_is_retried_and_its_answer_cached(tmp_path):
    replies = iter([_sse(STREAMED, drop_after=2), _sse(STREAMED)])
    llm = scripted.ScriptedLLM(lambda body: next(replies))
    client = llm.client(cache=tmp_path / "llm.sqlite")
    pieces, error = _streamed(client)
    assert error is None
    # What the reader saw is the whole answer once: the retry's repeat of the shown part is not
    # shown again.
    assert "".join(pieces) == STREAMED
    use = client.usage.step("reduce")
    assert (use.calls, use.requests, use.retries, use.failures) == (1, 2, 1, [])
    assert use.completion_tokens == 9  # the answer we kept; the dropped attempt reported none
    assert llm.requests[0] == llm.requests[1] and llm.requests[0]["stream"] is True  # resent as it was

    # The answer is in the cache: streaming it again, or asking without streaming, sends nothing.
    again = llm.client(cache=tmp_path / "llm.sqlite")
    pieces, error = _streamed(again)
    assert error is None and pieces == [STREAMED]
    assert asyncio.run(again.complete([{"role": "user", "content": "Who founded the cooperative?"}],
                                      step="reduce", max_tokens=100)) == STREAMED
    assert len(llm.requests) == 2 and again.usage.step("reduce").cache_hits == 2


def test_a_retried_stream_that_answers_differently_is_never_spliced_into_the_shown_text(tmp_path):
    other = "Nobody knows who founded it, the records were lost in the Great Storm of 2012."
    first = iter([_sse(STREAMED, drop_after=2)])
    llm = scripted.ScriptedLLM(lambda body: next(first, None) or _sse(other))
    settings = ChatSettings(provider="openai", model="scripted", base_url="http://scripted/v1",
                            retry_base_seconds=0.001, max_retries=2)
    client = llm.client(settings, cache=tmp_path / "llm.sqlite")
    pieces, error = _streamed(client, item="q7")
    assert isinstance(error, LLMError) and "q7" in str(error) and "differs" in str(error)
    shown = "".join(pieces)
    assert shown and STREAMED.startswith(shown)  # only the first attempt's text, never a mix
    use = client.usage.step("reduce")
    assert (use.requests, use.retries, use.failures) == (3, 2, ["q7"])


# -- limits.py ------------------------------------------------------------------------------------
def test_backoff_delay_honours_retry_after():
    for attempt in range(6):
        assert backoff_delay(attempt, 0.01, retry_after=0.05) >= 0.05
        assert backoff_delay(attempt, 0.01, retry_after=2.0) >= 2.0
    delays = [backoff_delay(a, 1.0, cap=8.0) for a in range(10)]
    assert all(0.5 <= d <= 8.0 for d in delays)
    assert backoff_delay(0, 1.0) <= 1.0 and backoff_delay(3, 1.0) >= 4.0


def test_parse_retry_after():
    assert parse_retry_after("0.05") == 0.05
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("-1") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("") is None
    assert parse_retry_after("soon") is None
    when = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 <= parse_retry_after(when) <= 31


def test_rate_limiter_requests_per_window():
    async def scenario():
        limiter = RateLimiter(requests_per_minute=3, window=0.5)
        tasks = [asyncio.create_task(limiter.acquire(1)) for _ in range(5)]
        for _ in range(20):
            await asyncio.sleep(0)
        passed_at_once = sum(t.done() for t in tasks)
        await asyncio.gather(*tasks)
        return passed_at_once

    assert asyncio.run(scenario()) == 3


def test_rate_limiter_tokens_per_window():
    async def scenario():
        limiter = RateLimiter(tokens_per_minute=100, window=0.5)
        tasks = [asyncio.create_task(limiter.acquire(40)) for _ in range(4)]
        for _ in range(20):
            await asyncio.sleep(0)
        passed = sum(t.done() for t in tasks)
        await asyncio.gather(*tasks)
        # A single request bigger than the whole budget still goes, alone in its window.
        big = RateLimiter(tokens_per_minute=100, window=0.5)
        await asyncio.wait_for(big.acquire(500), 1)
        return passed

    assert asyncio.run(scenario()) == 2
    assert not RateLimiter().enabled


def test_rate_limiter_counts_what_a_reply_used_not_its_estimate():
    async def scenario():
        limiter = RateLimiter(tokens_per_minute=1000)
        first = await limiter.acquire(900)  # the prompt plus max_tokens
        assert not limiter.fits(800)
        limiter.settle(first, 100)  # the reply's usage: 100 tokens
        return limiter.fits(800)

    assert asyncio.run(scenario())


def test_the_chat_client_settles_its_token_reservation_from_the_reply(mock_server):
    server = mock_server()
    settings = ChatSettings(provider="openai", model="m", base_url=server.base_url, api_key="k",
                            tokens_per_minute=100_000)
    client = ChatClient(settings, cache=None)

    async def scenario():
        try:
            await client.complete([{"role": "user", "content": "Tell me about Acme Corp."}], step="s",
                                  max_tokens=3000)
        finally:
            await client.aclose()

    asyncio.run(scenario())
    use = client.usage.step("s")
    # reserved ~3,000 tokens (prompt + max_tokens), kept the reply's count
    assert client.endpoints.all[0].limiter._tokens == use.prompt_tokens + use.completion_tokens < 100


def test_cut_off_json_is_not_repaired_into_a_partial_answer():
    from sensegraph.llm.client import _validated
    from sensegraph.llm.transport import Retryable

    whole = ('{"entities": [{"name": "Acme", "type": "organization", "description": "d"}], '
             '"relationships": []}')
    assert Extraction.model_validate_json(_validated(whole, Extraction)[0]).entities[0].name == "Acme"
    # Near-JSON is repaired: code fences, trailing commas.
    assert _validated("```json\n" + whole[:-1] + ",}\n```", Extraction)[0]
    # json_repair would close the brackets and return a valid object holding half the answer.
    with pytest.raises(Retryable, match="cut off"):
        _validated(whole[:-1], Extraction)
    with pytest.raises(Retryable, match="cut off"):
        _validated("```json\n" + whole[:60], Extraction)


def test_lists_past_max_items_are_cut_to_their_first_items_wherever_they_are():
    from sensegraph.llm.client import _validated, strict_schema

    class Tag(BaseModel):
        labels: list[str] = Field(max_length=2)

    class Answer(BaseModel):
        tags: list[Tag] = Field(max_length=3)                       # a $ref in pydantic's schema
        maybe: list[int] | None = Field(max_length=1)               # anyOf [array, null]
        hinted: list[int] = Field(json_schema_extra={"maxItems": 2})  # a schema hint pydantic never checks
        free: list[int]

    reply = {"tags": [{"labels": ["a", "b", "c"]}] * 4, "maybe": [1, 2], "hinted": [1, 2, 3], "free": [1] * 9}
    content, cut = _validated(json.dumps(reply), Answer)
    answer = Answer.model_validate_json(content)
    assert [t.labels for t in answer.tags] == [["a", "b"]] * 3 and answer.maybe == [1] and answer.hinted == [1, 2]
    assert answer.free == [1] * 9
    assert cut == 1 + 3 + 1 + 1  # tags, the labels of each kept tag, maybe, hinted
    # The JSON-mode path (code fence, trailing comma: repaired first) cuts the same way.
    fenced = "```json\n" + json.dumps(reply)[:-1] + ",}\n```"
    assert _validated(fenced, Answer) == (content, cut)
    assert _validated(json.dumps({**reply, "maybe": None}), Answer)[1] == 5
    assert strict_schema(Answer)["properties"]["tags"]["maxItems"] == 3


def test_strict_schema_keeps_properties_named_title_or_default():
    from sensegraph.llm.client import strict_schema

    class Finding(BaseModel):
        title: str
        default: int

    class Report(BaseModel):
        title: str
        findings: list[Finding]

    schema = strict_schema(Report)
    assert schema["required"] == ["title", "findings"] and "title" not in schema
    inner = schema["properties"]["findings"]["items"]
    assert inner["required"] == ["title", "default"] and inner["additionalProperties"] is False


def test_server_prompt_cache_hits_are_recorded_apart():
    # llama.cpp and OpenAI report the prompt tokens they took from their prompt cache; they
    # stay in prompt_tokens (they were sent) and are shown apart, as they were not read again.
    def respond(body):
        r = scripted.completion("fine", prompt_tokens=100, completion_tokens=3)
        data = json.loads(r.content)
        data["usage"]["prompt_tokens_details"] = {"cached_tokens": 80 if len(body["messages"]) > 1 else 0}
        return httpx.Response(200, json=data)

    client = scripted.ScriptedLLM(respond).client()
    asyncio.run(client.complete([{"role": "user", "content": "a"}], step="s", item="1", max_tokens=5))
    asyncio.run(client.complete([{"role": "system", "content": "x"}, {"role": "user", "content": "b"}],
                                step="s", item="2", max_tokens=5))
    s = client.usage.step("s")
    assert (s.prompt_tokens, s.cached_prompt_tokens, s.completion_tokens) == (200, 80, 6)


def test_replies_without_a_usable_choice_are_retried_and_token_counts_are_read_from_the_json():
    import httpx

    from sensegraph.config import ChatSettings

    replies = [
        {"id": "a", "object": "chat.completion", "choices": []},                        # no choice
        {"id": "b", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                                                              "message": {"role": "assistant", "content": None}}]},
        {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                                                              "message": {"role": "assistant", "content": "Hello."}}],
         "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13,
                   "prompt_tokens_details": {"cached_tokens": 8}}},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=replies.pop(0))

    s = ChatSettings(provider="openai", model="m", base_url="http://fake/v1", api_key="k", retry_base_seconds=0.001)
    client = ChatClient(s, cache=None, http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))

    async def ask():
        try:
            return await client.complete(messages("Say hello."), step="query", max_tokens=20)
        finally:
            await client.aclose()

    assert asyncio.run(ask()) == "Hello."
    use = client.usage.step("query")
    assert use.retries == 2 and use.calls == 1 and replies == []
    assert (use.prompt_tokens, use.completion_tokens, use.cached_prompt_tokens) == (11, 2, 8)


def test_the_embedded_server_is_sent_no_more_requests_than_it_has_slots(mock_server, monkeypatch, tmp_path):
    """llama.cpp queues what its slots cannot take, and a queued request's wait counts against
    the client's timeout: with one slot and the default four requests in flight, report calls
    of ~2 minutes timed out behind each other, the server was taken for down, and an index
    failed two reports (stop 49). The client holds the requests past the slots itself."""
    from sensegraph.config import load_settings
    from sensegraph.llm import embedded, open_chat

    server = mock_server(latency=0.4, batch_limit=1)  # one slot: the others queue at the server
    monkeypatch.setattr(embedded, "ensure_server", lambda local: (server.base_url, "m"))
    settings = load_settings(tmp_path, overrides={
        "chat": {"provider": "local", "concurrency": 4, "timeout": 1.0, "max_retries": 0,
                 "retry_base_seconds": 0.01},
        "local": {"parallel": 1}}, env={})

    async def four() -> list[Extraction]:
        client = open_chat(settings, cache=None)
        try:
            return await asyncio.gather(*(client.structured(messages(TEXT + f" ({i})"), Extraction, step="extract",
                                                            item=f"tu-{i}", max_tokens=800) for i in range(4)))
        finally:
            await client.aclose()

    answers = asyncio.run(four())
    assert len(answers) == 4
    assert server.stats["max_in_flight"] == 1


def _local_client(server, monkeypatch, tmp_path, **chat):
    from sensegraph.config import load_settings
    from sensegraph.llm import embedded, open_chat

    monkeypatch.setattr(embedded, "ensure_server", lambda local: (server.base_url, "m"))
    settings = load_settings(tmp_path, overrides={
        "chat": {"provider": "local", "max_retries": 0, "retry_base_seconds": 0.01, **chat}}, env={})
    return open_chat(settings, cache=None)


def test_a_slow_embedded_model_is_not_taken_for_a_dead_one(mock_server, monkeypatch, tmp_path):
    """On a slow day one extraction answer of the embedded model took longer than chat.timeout
    (300 s) to write; three such timeouts took the server out and the outage failed the rest of
    the index (stop 49). Its answers are read as a stream now: the timeout bounds the silence
    between tokens, so a model that keeps writing is waited for however long the answer is."""
    server = mock_server(chunk_seconds=0.3)  # pieces 0.3 s apart: the whole answer takes ~2 s
    client = _local_client(server, monkeypatch, tmp_path, timeout=1.0)
    answer = asyncio.run(_extract(client))
    assert answer.entities
    total = client.usage.total()
    assert total.calls == 1 and total.prompt_tokens > 0 and total.completion_tokens > 0


def test_a_hung_embedded_model_still_times_out(mock_server, monkeypatch, tmp_path):
    server = mock_server(script=["hang"])
    client = _local_client(server, monkeypatch, tmp_path, timeout=0.5)
    with pytest.raises(LLMError, match="timed out"):
        asyncio.run(_extract(client))


@pytest.mark.parametrize("stream", [False, True])
def test_the_tokens_of_an_answer_cut_off_at_max_tokens_are_counted(mock_server, monkeypatch, tmp_path, stream):
    """A server bills an answer it cut off at max_tokens like any other. Its tokens were not
    counted (the request was retried before they were added): a report the 1.5B ran to its
    1,500-token limit three times showed 1,672 completion tokens for ~6,000 written (stop 49),
    and a budget would not see them. They count now, streamed or not."""
    def spent(script: list[str]) -> tuple[int, int, int]:
        server = mock_server(script=script)
        if stream:
            client = _local_client(server, monkeypatch, tmp_path, max_retries=3)
        else:
            client = ChatClient(settings(server), cache=None)
        asyncio.run(_extract(client))
        total = client.usage.total()
        return total.calls, total.prompt_tokens, total.completion_tokens

    calls, prompt, completion = spent(["ok"])
    calls_cut, prompt_cut, completion_cut = spent(["length", "ok"])
    assert calls_cut == calls == 1
    assert prompt_cut == 2 * prompt
    assert completion_cut > completion


def test_a_slow_self_hosted_server_is_waited_for_when_its_answers_are_streamed(mock_server, tmp_path):
    """A user's own llama.cpp or Ollama server on a slow machine writes long answers as slowly as
    the embedded model. Without streaming its answer must be whole within chat.timeout, and the
    server is taken for dead; with chat.stream_replies the timeout bounds the silence between
    tokens, as for the embedded model."""
    from sensegraph.config import load_settings
    from sensegraph.llm import open_chat

    server = mock_server(chunk_seconds=0.3)  # pieces 0.3 s apart: the whole answer takes ~2 s

    def client(**chat):
        s = load_settings(tmp_path, overrides={"chat": {
            "provider": "openai", "model": "m", "base_url": server.base_url, "api_key": "k",
            "max_retries": 0, "timeout": 1.0, **chat}}, env={})
        return open_chat(s, cache=None)

    with pytest.raises(LLMError, match="timed out"):
        asyncio.run(_extract(client()))  # the default for a server of one's own: not streamed
    streamed = client(stream_replies=True)
    assert asyncio.run(_extract(streamed)).entities
    total = streamed.usage.total()
    assert total.calls == 1 and total.completion_tokens > 0


def test_rejected_answers_are_kept_and_shown_by_doctor(mock_server, tmp_path):
    """An answer the client cannot use is retried, and its text was seen nowhere: a user whose
    model kept failing one step could not tell why. Each one (not valid for its schema, cut off at
    max_tokens, cut off mid-JSON, empty) is now kept in the project's cache with the reason, and
    `sensegraph doctor --rejected N` shows them; answers that were used are not among them."""
    from click.testing import CliRunner

    from sensegraph.cli import main as cli_main
    from sensegraph.config import load_settings
    from sensegraph.llm import open_cache, open_chat

    server = mock_server(script=["invalid", "length", "truncated", "empty", "ok", "ok"])
    project = load_settings(tmp_path, overrides={"chat": {
        "provider": "openai", "model": "m", "base_url": server.base_url, "api_key": "k",
        "max_retries": 5, "retry_base_seconds": 0.01}}, env={})
    client = open_chat(project, cache=open_cache(project))
    assert asyncio.run(_extract(client, item="tu-7")).entities
    kept = open_cache(project).rejected(10)
    assert [r["item"] for r in kept] == ["tu-7"] * 4 and {r["model"] for r in kept} == {"m"}
    empty, truncated, length, invalid = kept  # newest first
    assert "empty answer" in empty["reason"] and empty["reply"] == ""
    assert "cut off in the middle of the JSON" in truncated["reason"] and truncated["reply"]
    assert "cut off at max_tokens=800" in length["reason"] and length["reply"].startswith("{")
    assert "does not match schema Extraction" in invalid["reason"] and invalid["reply"]

    shown = CliRunner().invoke(cli_main, ["doctor", "--root", str(tmp_path), "--rejected", "2"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.count("extract · tu-7") == 2 and "empty answer" in shown.output
    assert "cut off in the middle of the JSON" in shown.output and "max_tokens" not in shown.output


def _counting(start: int, count: int) -> str:
    return ", ".join(str(n) for n in range(start, start + count))


def test_a_run_is_numbers_counting_up_inside_a_string_only():
    """What the guard stops (llm/runaway.py): the 1.5B's citation loop, and nothing a good model
    writes: a short citation list, numbers that do not count, or a list of picked numbers that
    happens to be all of them."""
    from sensegraph.llm.runaway import RUN, counting_run

    loop = json.dumps({"findings": [{"explanation": f"Acme grew [Data: Entities (101, 33, 34, 78, {_counting(112, 300)}"}]})
    assert counting_run(loop).startswith("101, 33, 34, 78, 112, 113")
    assert counting_run(json.dumps({"explanation": f"Counted {_counting(1, RUN)}."})) is not None
    assert counting_run(json.dumps({"explanation": f"Counted {_counting(1, RUN - 1)}."})) is None
    assert counting_run(json.dumps({"explanation": "[Data: Entities (3, 4, 5, 6, 7, +more)]"})) is None
    assert counting_run(json.dumps({"explanation": ", ".join(str(n * 2) for n in range(60))})) is None
    assert counting_run(json.dumps({"relevant": list(range(1, 60))})) is None  # a list, not text
    escaped = json.dumps({"a": 'He said "stop" at ' + _counting(1, 25), "relevant": list(range(1, 40))})
    assert counting_run(escaped) is not None


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_that_starts_counting_is_stopped_and_asked_again_varied(mock_server, monkeypatch, tmp_path,
                                                                            stream):
    """The 1.5B now and then writes a citation list as a count (101, 102, 103, ...) until the
    answer is cut off at max_tokens: every report the stop-49/50 indexes lost, ~8,000 tokens of
    the reports step's ~13,500. Such an answer is rejected (its text kept for doctor --rejected)
    and asked again varied, whether or not it ran to its end; read as a stream (the embedded
    model), it is stopped as the count starts, so it costs a fraction of what it would write."""
    clean = {"entities": [{"name": "Acme", "type": "organization", "description": "A firm."}],
             "relationships": []}
    runaway = {"entities": [{"name": "Acme", "type": "organization",
                             "description": f"A firm [Data: Entities (101, 33, {_counting(112, 2000)})]."}],
               "relationships": []}
    seeds = []

    def respond(body):
        seeds.append(body.get("seed"))
        return json.dumps(clean if body.get("seed") else runaway)

    server = mock_server(responder=respond)
    if stream:
        client = _local_client(server, monkeypatch, tmp_path, max_retries=3)
    else:
        client = ChatClient(settings(server), cache=None)
    client.cache = Cache(tmp_path / "cache.sqlite")
    got = asyncio.run(_extract(client))
    assert got.entities[0].description == "A firm."
    assert seeds[0] is None and seeds[1] is not None and len(seeds) == 2  # one varied retry
    rejected = client.cache.rejected(5)
    assert len(rejected) == 1 and "started counting" in rejected[0]["reason"]
    spent = client.usage.total().completion_tokens
    if stream:
        # stopped within the first of the stream's four pieces, counted as far as it went
        assert spent < count_tokens(json.dumps(runaway)) / 2
    else:
        assert spent > len(json.dumps(runaway)) // 4  # read whole: billed whole (the mock's count)
