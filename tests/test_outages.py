"""Outages end (issue 27, one machine): per-outage back-off with a half-open probe, refusals
that take one server out, garbage answers that count against their server, capped Retry-After
with failover before sleeping, and a deadline after which a model with no server left fails
its calls at once. Against real mock HTTP servers (tests/mock_llm.py) and, for the slot queue,
sensegraph/llm/endpoints.py alone. Cool-downs and deadlines are made small through settings;
nothing here asserts how long anything took."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import BaseModel

from mock_llm import FAULTS  # noqa: F401 - the fault names the servers below use
from sensegraph.config import ChatSettings, EmbeddingSettings, load_settings
from sensegraph.index.pipeline import IndexFailed, run_index
from sensegraph.llm import ChatClient, LLMError
from sensegraph.llm import endpoints as endpoints_module
from sensegraph.llm.embeddings import Embedder
from sensegraph.llm.endpoints import Endpoints, NoServer
from sensegraph.llm.limits import RETRY_AFTER_CAP, parse_retry_after, retry_after_of
from sensegraph.llm.transport import Retryable
from test_endpoints import closed_port
from test_llm_client import mock_server as servers  # noqa: F401 - the fixture: servers(**kw) starts one
from test_pipeline import write_docs

HANG = 30.0  # a guard that turns a hang (the old behaviour) into a failure, not a timing assertion


class Answer(BaseModel):
    answer: str


def chat(*urls: str, concurrency: int = 2, log: list[str] | None = None, **kw) -> ChatClient:
    base = dict(provider="openai", model="m", api_key="k", retry_base_seconds=0.01, max_retries=4, timeout=5,
                outage_cool_down=0.05, outage_cool_down_cap=0.2,
                endpoints=[{"base_url": u, "concurrency": concurrency} for u in urls])
    client = ChatClient(ChatSettings(**{**base, **kw}), cache=None)
    if log is not None:
        client.endpoints.log = log.append
    return client


async def ask(client: ChatClient, n: int, offset: int = 0, step: str = "extract") -> list[Answer | BaseException]:
    calls = (client.structured([{"role": "user", "content": f"Question {offset + i} about Acme"}], Answer,
                               step=step, item=f"q{offset + i}", max_tokens=50) for i in range(n))
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), HANG)


async def ask_and_close(client: ChatClient, n: int) -> list[Answer | BaseException]:
    try:
        return await ask(client, n)
    finally:
        await client.aclose()


def report(client: ChatClient, url: str) -> dict:
    return next(v for k, v in client.endpoints.report().items() if k.endswith(url))


# -- 1. per-outage back-off, half-open probe -------------------------------------------------------
def test_a_burst_of_faults_in_flight_is_one_outage_not_a_doubled_cool_down_each(servers):
    dead = servers(faults={"503": 1.0}, latency=0.05)
    fine = servers()
    client = chat(dead.base_url, fine.base_url, concurrency=8)

    answers = asyncio.run(ask_and_close(client, 16))
    assert all(isinstance(a, Answer) for a in answers)
    out = client.endpoints.all[0]
    # Eight requests were in flight when it went out; their faults are one outage. Before,
    # each fault after the third doubled the cool-down (8 faults: a 120 s pause).
    assert report(client, dead.base_url)["out_of_rotation"] == 1
    assert out.cool_down == pytest.approx(0.05)


def single(concurrency: int = 4, **kw) -> Endpoints:
    settings = dict(provider="openai", model="m", api_key="k", outage_cool_down=0.05, outage_cool_down_cap=1.0,
                    outage_timeout=60, endpoints=[{"base_url": "http://s0/v1", "concurrency": concurrency}])
    return Endpoints(ChatSettings(**{**settings, **kw}))


async def fault(eps: Endpoints) -> None:
    async with eps.slot() as e:
        eps.faulted(e, Retryable("HTTP 503"), rate_limited=False)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_after_its_cool_down_exactly_one_probe_goes_and_its_result_decides():
    eps = single()
    server = eps.all[0]

    async def scenario() -> None:
        for _ in range(endpoints_module.OUT_AFTER_FAILURES):
            await fault(eps)
        assert server.out_since is not None and not server.ready(server.back_at - 0.001)
        await asyncio.sleep(0.06)  # past the cool-down: half-open
        probe = eps.slot()
        await probe.__aenter__()
        held: list = []  # the entered slots, kept so none is released by being collected

        async def hold():
            cm = eps.slot()
            held.append(cm)
            return await cm.__aenter__()
        others = [asyncio.ensure_future(hold()) for _ in range(3)]
        await settle()
        assert not any(t.done() for t in others)  # one probe only, though 3 of 4 slots are free
        # The probe fails: the next cool-down is twice as long, and still one request waits.
        eps.faulted(server, Retryable("HTTP 503"), rate_limited=False)
        await probe.__aexit__(None, None, None)
        assert server.cool_down == pytest.approx(0.1) and server.usage.probes == 1
        await asyncio.sleep(0.11)
        await settle()
        assert sum(t.done() for t in others) == 1  # the next probe
        # A fault of a request sent before the outage began says nothing new: no doubling.
        eps.faulted(server, Retryable("late 503"), rate_limited=False)
        assert server.cool_down == pytest.approx(0.1)
        # The probe succeeds (in its own task, as a request reports its own outcome).
        prober = next(t for t in others if t.done())
        assert server.probe is not None
        server.probe = asyncio.current_task()
        eps.answered(server)
        assert server.out_since is None
        await settle()
        assert all(t.done() for t in others)  # fully back: every slot can be taken
        assert server.in_flight == 3 and prober.result() is server

    asyncio.run(asyncio.wait_for(scenario(), HANG))


def test_a_flapping_server_is_back_in_rotation_soon_after_each_recovery(servers):
    flapping = servers(latency=0.01)
    steady = servers(latency=0.01)
    client = chat(flapping.base_url, steady.base_url, outage_cool_down=0.05, outage_cool_down_cap=0.1)
    server = client.endpoints.all[0]

    async def scenario():
        served_after_recovery = []
        for cycle in range(3):  # down, up, down, up ...
            flapping.down = "503"
            await ask(client, 12, offset=100 * cycle)
            assert server.out_since is not None  # taken out while down
            flapping.reset_stats()
            await ask(client, 12, offset=100 * cycle + 20)  # still down: only probes reach it
            probes_while_down = flapping.stats
            assert probes_while_down["max_in_flight"] <= 1
            assert probes_while_down["requests"] <= server.usage.probes
            flapping.down = None
            await asyncio.sleep(0.12)  # one capped cool-down
            flapping.reset_stats()
            await ask(client, 12, offset=100 * cycle + 50)
            served_after_recovery.append(flapping.stats["requests"])
            assert server.out_since is None and server.cool_down <= 0.1
        await client.aclose()
        return served_after_recovery

    served = asyncio.run(scenario())
    assert all(n >= 3 for n in served), served  # back, taking its share (not just the probe)
    assert report(client, flapping.base_url)["out_of_rotation"] == 3
    assert not client.usage.step("extract").failures


# -- 2. refusals and garbage -----------------------------------------------------------------------
@pytest.mark.parametrize("status", ["401", "403", "404"])
def test_a_refusing_server_is_taken_out_once_said_and_its_items_go_elsewhere(servers, status):
    refusing = servers(script=[status] * 100)
    fine = servers()
    lines: list[str] = []
    client = chat(refusing.base_url, fine.base_url, log=lines)

    answers = asyncio.run(ask_and_close(client, 20))
    assert all(isinstance(a, Answer) for a in answers), answers
    assert not client.usage.step("extract").failures
    assert refusing.stats["requests"] <= 2  # those sent before the first refusal came back
    said = [line for line in lines if refusing.base_url in line]
    assert len(said) == 1 and f"HTTP {status}" in said[0] and "out of rotation" in said[0]


def test_when_every_server_refused_calls_fail_clearly_and_at_once(servers):
    a, b = servers(api_key="other"), servers(api_key="other")
    client = chat(a.base_url, b.base_url)

    async def scenario():
        first = await ask(client, 1)
        sent = a.stats["by_kind"].get("unauthorized", 0) + b.stats["by_kind"].get("unauthorized", 0)
        later = await ask(client, 5, offset=10)
        after = a.stats["by_kind"].get("unauthorized", 0) + b.stats["by_kind"].get("unauthorized", 0)
        await client.aclose()
        return first, later, sent, after

    first, later, sent, after = asyncio.run(scenario())
    assert isinstance(first[0], LLMError) and "401" in str(first[0])
    assert sent == 2  # one request to each, then nothing left
    assert after == sent  # later calls fail without a request
    for error in later:
        assert isinstance(error, LLMError) and "every server of chat refused" in str(error)
        assert a.base_url in str(error) and b.base_url in str(error)
    assert len(client.usage.step("extract").failures) == 6


def test_a_server_answering_garbage_is_avoided_by_the_retry_and_then_by_new_calls(servers):
    garbage = servers(faults={"invalid": 1.0})  # 200s that fail the schema
    fine = servers()
    client = chat(garbage.base_url, fine.base_url, outage_cool_down=30)  # no probe during the test

    async def scenario():
        for i in range(10):  # one after another, so each call chooses anew
            answer = await ask(client, 1, offset=i)
            assert isinstance(answer[0], Answer), answer
        await client.aclose()

    asyncio.run(scenario())
    use = client.usage.step("extract")
    # Each garbage answer cost one retry, which went to the other server; after INVALID_IN_ROW
    # rejected answers in a row, while the other answers well, the garbage server is out.
    assert garbage.stats["requests"] == endpoints_module.INVALID_IN_ROW == use.retries
    bad = report(client, garbage.base_url)
    assert bad["invalid"] == endpoints_module.INVALID_IN_ROW and bad["answers"] == 0 and bad["out_of_rotation"] == 1
    assert fine.stats["requests"] == 10 and not use.failures


def test_garbage_embedding_replies_count_against_their_server(servers):
    garbage, fine = servers(faults={"invalid": 1.0}), servers()
    settings = EmbeddingSettings(provider="openai", model="e", api_key="k", batch_size=1, retry_base_seconds=0.01,
                                 outage_cool_down=30,
                                 endpoints=[{"base_url": garbage.base_url, "concurrency": 1},
                                            {"base_url": fine.base_url, "concurrency": 1}])
    embedder = Embedder(settings, cache=None)

    async def run():
        try:
            for i in range(6):
                await embedder.embed([f"text {i}"])
        finally:
            await embedder.aclose()

    asyncio.run(run())
    use = embedder.usage.step("embed")
    assert garbage.stats["requests"] == endpoints_module.INVALID_IN_ROW == use.retries and not use.failures


def test_when_every_server_answers_garbage_none_is_taken_out_for_it(servers):
    a, b = servers(faults={"invalid": 1.0}), servers(faults={"invalid": 1.0})
    client = chat(a.base_url, b.base_url, max_retries=3)

    answers = asyncio.run(ask_and_close(client, 4))
    assert all(isinstance(x, LLMError) and "does not match schema" in str(x) for x in answers)
    assert all(e.out_since is None for e in client.endpoints.all)  # the model is the problem, not a server


# -- 3. Retry-After ---------------------------------------------------------------------------------
def two(concurrency: int = 4) -> Endpoints:
    return Endpoints(ChatSettings(provider="openai", model="m", api_key="k",
                                  endpoints=[{"base_url": f"http://s{i}/v1", "concurrency": concurrency}
                                             for i in range(2)]))


def test_429s_of_requests_in_flight_are_one_pause_and_a_busy_server_still_counts_as_elsewhere():
    eps = two()
    limited, other = eps.all

    async def scenario() -> None:
        held = [eps.slot() for _ in range(8)]
        got = [await cm.__aenter__() for cm in held]
        assert got.count(limited) == 4 and got.count(other) == 4  # both full
        for _ in range(4):  # the four requests in flight on `limited` all get a 429
            eps.faulted(limited, Retryable("429", retry_after=0.05), rate_limited=True)
        assert limited.limited_in_row == 1  # one series step, not four (a 0.4 s pause)
        assert limited.paused_until - time.monotonic() <= 0.05
        # `other` is full but not paused: a retry queues for it instead of sleeping out the 429
        assert eps.ready_elsewhere(limited)
        assert not eps.ready_elsewhere(other)  # (from `other`, the only other server is paused)
        for cm in held:
            await cm.__aexit__(None, None, None)

    asyncio.run(scenario())


def test_retry_after_is_capped_and_garbage_is_no_pause():
    assert parse_retry_after("3600") == RETRY_AFTER_CAP
    assert parse_retry_after("inf") is None and parse_retry_after("nan") is None
    assert parse_retry_after("-inf") is None and parse_retry_after("1e400") is None
    assert parse_retry_after("Wed, 21 Oct 2099 07:28:00 GMT") == RETRY_AFTER_CAP
    assert retry_after_of({"retry-after-ms": "250"}) == 0.25
    assert retry_after_of({"retry-after-ms": "250", "retry-after": "3"}) == 0.25  # the precise one wins
    assert retry_after_of({"retry-after-ms": "soon", "retry-after": "3"}) == 3.0
    assert retry_after_of({}) is None


def record_delays(monkeypatch) -> list[tuple[float, float | None]]:
    """(delay slept, Retry-After asked) of every retry."""
    seen: list[tuple[float, float | None]] = []
    real = ChatClient._retry_delay

    def delay(self, attempt, fault):
        d = real(self, attempt, fault)
        seen.append((d, fault.retry_after))
        return d
    monkeypatch.setattr(ChatClient, "_retry_delay", delay)
    return seen


def test_a_long_retry_after_sends_the_retry_to_an_idle_server_instead_of_sleeping(servers, monkeypatch):
    delays = record_delays(monkeypatch)
    limited = servers(script=["429"] * 5)
    limited.retry_after_headers = {"Retry-After": "3600"}
    idle = servers()
    client = chat(limited.base_url, idle.base_url)

    assert isinstance(asyncio.run(ask_and_close(client, 1))[0], Answer)
    assert limited.stats["requests"] == 1 and idle.stats["requests"] == 1
    (slept, asked), = delays
    assert asked == RETRY_AFTER_CAP and slept < 1.0  # the usual back-off, not the server's hour
    assert client.endpoints.all[0].paused_until > 0  # the limited server itself stays paused


@pytest.mark.parametrize("headers, expected", [({"retry-after-ms": "40"}, 0.04),
                                               ({"Retry-After": "inf"}, None)])
def test_a_single_server_honours_retry_after_ms_and_never_sleeps_forever(servers, monkeypatch, headers, expected):
    delays = record_delays(monkeypatch)
    server = servers(script=["429", "ok"])
    server.retry_after_headers = headers
    client = chat(server.base_url)

    assert isinstance(asyncio.run(ask_and_close(client, 1))[0], Answer)
    (slept, asked), = delays
    assert asked == expected
    if expected is not None:
        assert slept >= expected


# -- 4 and 5. nothing can answer: a deadline, for waiting requests too ------------------------------
@pytest.mark.parametrize("count", [1, 2])
def test_when_every_server_is_out_past_outage_timeout_calls_fail_naming_them(count):
    urls = [closed_port() for _ in range(count)]
    lines: list[str] = []
    client = chat(*urls, concurrency=2, outage_timeout=0.3, log=lines)

    async def scenario():
        try:
            first = await ask(client, 20)  # most of them wait for a slot that never comes
            later = await ask(client, 3, offset=50)  # after the deadline
            return first, later
        finally:
            await client.aclose()

    first, later = asyncio.run(scenario())
    assert all(isinstance(e, LLMError) for e in first + later), first + later
    assert sorted(client.usage.step("extract").failures) == sorted(f"q{i}" for i in [*range(20), 50, 51, 52])
    for error in later:
        message = str(error)
        assert "no server of chat has answered" in message and "\n" not in message
        assert all(url in message for url in urls) and "could not reach the server" in message
    assert any(f"waiting: all servers of chat are out ({count} of {count})" in line for line in lines), lines
    assert any("failing its calls" in line for line in lines), lines


def test_a_request_waiting_for_a_slot_fails_at_the_deadline():
    eps = single(concurrency=1, outage_timeout=0.2, outage_cool_down=5.0, outage_cool_down_cap=5.0)

    async def scenario() -> None:
        for _ in range(endpoints_module.OUT_AFTER_FAILURES):
            await fault(eps)
        waiting = asyncio.ensure_future(eps.slot().__aenter__())
        await settle()
        assert not waiting.done()  # it waits (no attempt of its item is spent) ...
        with pytest.raises(NoServer, match="no server of chat has answered"):
            await waiting  # ... but not for ever: the deadline ends the wait
        with pytest.raises(NoServer):
            await eps.slot().__aenter__()  # new requests fail at once

    asyncio.run(asyncio.wait_for(scenario(), HANG))


def test_an_index_against_dead_servers_ends_records_its_items_and_the_rerun_resumes(servers, tmp_path):
    write_docs(tmp_path, {"a.txt": "Acme Corp hired Jane Doe in Berlin. Jane Doe met John Smith at Globex.",
                          "b.txt": "Globex opened an office in Paris. John Smith leads Globex in Paris."})
    dead = [{"base_url": closed_port()}, {"base_url": closed_port()}]
    common = {"provider": "openai", "model": "mock", "api_key": "x", "retry_base_seconds": 0.01,
              "outage_cool_down": 0.05, "outage_timeout": 0.3}
    sections = {"chunks": {"size": 120, "overlap": 20}}
    lines: list[str] = []
    settings = load_settings(tmp_path, overrides={"chat": {**common, "endpoints": dead},
                                                  "embedding": {**common, "endpoints": dead}, **sections}, env={})
    with pytest.raises(IndexFailed) as failed:
        asyncio.run(asyncio.wait_for(run_index(settings, log=lines.append), HANG))
    stats = json.loads((tmp_path / "output" / "stats.json").read_text())
    assert stats["failures"]["extract"] and failed.value.failures["extract"] == stats["failures"]["extract"]
    assert any("waiting: all servers of chat are out (2 of 2)" in line for line in lines), lines
    assert any("no server of chat has answered" in line for line in lines), lines
    # The run's final message says why, naming the servers; stats.json keeps it.
    assert "no server of chat has answered" in str(failed.value) and dead[0]["base_url"] in str(failed.value)
    assert "no server of chat has answered" in stats["outages"]["chat"]

    a, b = servers(), servers()
    alive = [{"base_url": a.base_url}, {"base_url": b.base_url}]
    settings = load_settings(tmp_path, overrides={"chat": {**common, "endpoints": alive},
                                                  "embedding": {**common, "endpoints": alive}, **sections}, env={})
    result = asyncio.run(run_index(settings, log=lambda m: None))
    assert not result.failures and len(result.tables["entities"])


def test_a_request_goes_to_a_server_whose_rate_limit_admits_it_now():
    eps = Endpoints(ChatSettings(provider="openai", model="m", api_key="k", requests_per_minute=1,
                                 endpoints=[{"base_url": f"http://s{i}/v1", "concurrency": 4} for i in range(2)]))
    limited, other = eps.all

    async def scenario() -> None:
        await limited.limiter.acquire(10)  # its one request of this minute is used
        busy = eps.slot(avoid=limited)
        assert await busy.__aenter__() is other  # `other` now has more in flight ...
        async with eps.slot(tokens=10) as endpoint:
            assert endpoint is other  # ... but `limited` would hold the slot for a minute
        await busy.__aexit__(None, None, None)

    asyncio.run(asyncio.wait_for(scenario(), HANG))


def test_a_probe_to_a_server_that_now_hangs_ends_at_the_outage_deadline(servers):
    """Both servers fail (503) and go out; then they hang. Each cool-down lets a probe through,
    which would hold its call for the request timeout (here 20 s): once every server is out, a
    probe gets only the time left until the outage deadline, so every call fails at the deadline
    instead of one request timeout later."""
    a, b = servers(), servers()
    a.down = b.down = "503"
    client = chat(a.base_url, b.base_url, timeout=20, max_retries=6, outage_timeout=1.0,
                  outage_cool_down=0.05, outage_cool_down_cap=0.1)

    async def scenario():
        try:
            first = await ask(client, 2)  # they go out
            a.down = b.down = "hang"
            later = await asyncio.wait_for(ask(client, 4, offset=10), 10)  # old code: held ~20 s by the probe
            return first, later
        finally:
            await client.aclose()

    first, later = asyncio.run(scenario())
    assert all(isinstance(e, LLMError) for e in first + later), later
    assert any("no server of chat has answered" in str(e) for e in later), later
    assert a.stats["requests"] + b.stats["requests"] > 0
