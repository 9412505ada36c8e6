"""The SQLite answer cache: repeated calls are free, changed calls are not, processes share it."""
from __future__ import annotations

import asyncio
import multiprocessing
import os

import pytest
from pydantic import BaseModel

from mock_llm import start_mock_server
from sensegraph.config import ChatSettings
from sensegraph.llm import Cache, ChatClient, LLMError
from sensegraph.llm.cache import cache_key


class Answer(BaseModel):
    title: str
    score: int


class Other(BaseModel):
    title: str


MESSAGES = [{"role": "user", "content": "What did Acme Corp announce in Berlin?"}]


@pytest.fixture
def server():
    with start_mock_server() as s:
        yield s


def client(server, cache, **kw) -> ChatClient:
    s = ChatSettings(provider="openai", model=kw.pop("model", "m"), base_url=server.base_url, api_key="k",
                     retry_base_seconds=0.01, **kw)
    return ChatClient(s, cache=cache)


async def _calls(c: ChatClient, *calls: dict) -> list:
    out = []
    try:
        for call in calls:
            call = dict(call)
            schema = call.pop("schema", None)
            kw = dict(step="s", item="i", max_tokens=100) | call
            if schema is None:
                out.append(await c.complete(kw.pop("messages", MESSAGES), **kw))
            else:
                out.append(await c.structured(kw.pop("messages", MESSAGES), schema, **kw))
    finally:
        await c.aclose()
    return out


def test_second_identical_call_makes_no_request(server, tmp_path):
    c = client(server, Cache(tmp_path / "llm.sqlite"))
    a, b = asyncio.run(_calls(c, {"schema": Answer}, {"schema": Answer}))
    assert a == b
    assert server.stats["requests"] == 1
    use = c.usage.step("s")
    assert (use.calls, use.cache_hits, use.requests) == (1, 1, 1)


def test_cache_survives_a_new_client(server, tmp_path):
    path = tmp_path / "llm.sqlite"
    first = asyncio.run(_calls(client(server, Cache(path)), {}))
    c = client(server, Cache(path))
    second = asyncio.run(_calls(c, {}))
    assert first == second and server.stats["requests"] == 1
    assert c.usage.step("s").cache_hits == 1


@pytest.mark.parametrize("change", [
    {"max_tokens": 101},
    {"temperature": 0.5},
    {"messages": [{"role": "user", "content": "What did Globex announce?"}]},
    {"schema": Other},
    {"model": "other-model"},
])
def test_changed_parameter_makes_a_request(server, tmp_path, change):
    cache = Cache(tmp_path / "llm.sqlite")
    asyncio.run(_calls(client(server, cache), {"schema": Answer}))
    change = dict(change)
    model = change.pop("model", "m")
    c = client(server, cache, model=model)
    asyncio.run(_calls(c, {"schema": Answer} | change))
    assert server.stats["requests"] == 2
    assert c.usage.step("s").cache_hits == 0


def test_structured_and_plain_calls_do_not_share_entries(server, tmp_path):
    cache = Cache(tmp_path / "llm.sqlite")
    asyncio.run(_calls(client(server, cache), {"schema": Answer}, {}))
    assert server.stats["requests"] == 2 and len(cache) == 2


def test_no_cache_always_requests(server):
    c = client(server, None)
    asyncio.run(_calls(c, {}, {}, {}))
    assert server.stats["requests"] == 3
    assert c.usage.step("s").cache_hits == 0


def test_failures_are_not_cached(tmp_path):
    cache = Cache(tmp_path / "llm.sqlite")
    # (two attempts; the second 500 is asked once more in JSON mode: three requests fail)
    with start_mock_server(script=["500", "500", "500"]) as s:
        with pytest.raises(LLMError):
            asyncio.run(_calls(client(s, cache, max_retries=1), {"schema": Answer}))
        assert len(cache) == 0
        asyncio.run(_calls(client(s, cache), {"schema": Answer}))
        assert s.stats["requests"] == 4 and len(cache) == 1


def test_cache_key_is_order_independent_and_sensitive_to_values():
    assert cache_key("chat", {"a": 1, "b": [1, 2]}) == cache_key("chat", {"b": [1, 2], "a": 1})
    assert cache_key("chat", {"a": 1}) != cache_key("chat", {"a": 2})
    assert cache_key("chat", {"a": 1}) != cache_key("embed", {"a": 1})


def _writer(path: str, worker: int, n: int, queue) -> None:
    """Child process: write its own keys and shared keys, read everything back."""
    try:
        cache = Cache(path)
        for i in range(n):
            cache.put_json(f"w{worker}-{i}", {"worker": worker, "i": i})
            cache.put_json(f"shared-{i}", {"i": i})
            if i % 10 == 0:
                cache.get_json(f"w{1 - worker}-{i}")  # read what the other process wrote, if there
        missing = [i for i in range(n) if cache.get_json(f"w{worker}-{i}") != {"worker": worker, "i": i}]
        cache.close()
        queue.put((worker, "ok" if not missing else f"missing {missing[:5]}"))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        queue.put((worker, f"{type(exc).__name__}: {exc}"))


def test_two_processes_share_the_cache(tmp_path):
    path = str(tmp_path / "shared" / "llm.sqlite")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    n = 300
    procs = [ctx.Process(target=_writer, args=(path, w, n, queue)) for w in (0, 1)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert results == {0: "ok", 1: "ok"}
    cache = Cache(path)
    assert len(cache) == 3 * n
    assert all(cache.get_json(f"w{w}-{i}") == {"worker": w, "i": i} for w in (0, 1) for i in range(n))


def _opener(path: str, start: float, queue) -> None:
    """Child process: open the cache the moment the others do, write one key."""
    import time

    while time.time() < start:
        pass
    try:
        cache = Cache(path)
        cache.put_json(f"k{os.getpid()}", 1)
        cache.close()
        queue.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        queue.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_new_cache_together_all_succeed(tmp_path):
    # Two runs started together on a new project both switch the new file to WAL; SQLite
    # refused the loser at once with "database is locked" (CI failure of stop 38).
    import time

    ctx = multiprocessing.get_context("fork")
    errors = []
    for round_ in range(15):
        path = str(tmp_path / f"r{round_}" / "llm.sqlite")
        queue = ctx.Queue()
        start = time.time() + 0.3
        procs = [ctx.Process(target=_opener, args=(path, start, queue)) for _ in range(6)]
        for p in procs:
            p.start()
        errors += [r for r in (queue.get(timeout=120) for _ in procs) if r != "ok"]
        for p in procs:
            p.join(timeout=30)
        if not errors:
            assert len(Cache(path)) == 6  # every process wrote its key
    assert errors == []


def test_extra_body_is_sent_and_is_part_of_the_cache_key(tmp_path):
    import asyncio

    from scripted import ScriptedLLM
    from sensegraph.config import ChatSettings
    from sensegraph.llm import Cache, ChatClient

    llm = ScriptedLLM(lambda body: "ok")
    settings = ChatSettings(provider="openai", model="m", base_url="http://scripted/v1")
    cache = Cache(tmp_path / "c.sqlite")
    messages = [{"role": "user", "content": "hi"}]
    plain = llm.client(settings, cache=cache)
    asyncio.run(plain.complete(messages, step="t", max_tokens=5))
    penalised = ChatClient(settings, cache=cache, extra_body={"repeat_penalty": 1.15},
                           http_client=plain._http_client)
    asyncio.run(penalised.complete(messages, step="t", max_tokens=5))
    asyncio.run(penalised.complete(messages, step="t", max_tokens=5))
    assert len(llm.requests) == 2
    assert "repeat_penalty" not in llm.requests[0] and llm.requests[1]["repeat_penalty"] == 1.15
