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
    assert server.stats["requests"] == 3
    use = client.usage.step("extract")
    assert use.failures == ["tu-7"]
    assert (use.calls, use.requests, use.retries) == (0, 3, 2)


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


def test_cut_off_json_is_not_repaired_into_a_partial_answer():
    from sensegraph.llm.client import _Retryable, _validated

    whole = ('{"entities": [{"name": "Acme", "type": "organization", "description": "d"}], '
             '"relationships": []}')
    assert Extraction.model_validate_json(_validated(whole, Extraction)).entities[0].name == "Acme"
    # Near-JSON is repaired: code fences, trailing commas.
    assert _validated("```json\n" + whole[:-1] + ",}\n```", Extraction)
    # json_repair would close the brackets and return a valid object holding half the answer.
    with pytest.raises(_Retryable, match="cut off"):
        _validated(whole[:-1], Extraction)
    with pytest.raises(_Retryable, match="cut off"):
        _validated("```json\n" + whole[:60], Extraction)


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
