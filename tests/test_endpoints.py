"""Several endpoints of one model (sensegraph/llm/endpoints.py) against real mock HTTP servers:
load spreading within each server's limits, failover when one is down or rate-limiting, its
return to the rotation, one cache whichever server answered, and per-server stats."""
from __future__ import annotations

import asyncio
import json
import socket

import pytest
from pydantic import BaseModel

from sensegraph.config import ChatSettings, EmbeddingSettings, SettingsError, load_settings
from sensegraph.index.pipeline import run_index
from sensegraph.llm import ChatClient, LLMError
from sensegraph.llm import endpoints as endpoints_module
from sensegraph.llm.cache import Cache
from sensegraph.llm.embeddings import Embedder
from test_llm_client import mock_server as servers  # noqa: F401 - the fixture: servers(**kw) starts one
from test_pipeline import write_docs


class Answer(BaseModel):
    answer: str


def closed_port() -> str:
    """The base URL of a port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def chat(*urls: str, cache: Cache | None = None, **kw) -> ChatClient:
    base = dict(provider="openai", model="m", api_key="k", retry_base_seconds=0.01, max_retries=4, timeout=5,
                endpoints=[{"base_url": u, "concurrency": 2} for u in urls])
    return ChatClient(ChatSettings(**{**base, **kw}), cache=cache)


async def ask_all(client: ChatClient, n: int, step: str = "extract") -> list[str]:
    try:
        answers = await asyncio.gather(*(client.structured([{"role": "user", "content": f"Question {i} about Acme"}],
                                                           Answer, step=step, item=f"q{i}", max_tokens=50)
                                         for i in range(n)))
        return [a.answer for a in answers]
    finally:
        await client.aclose()


def test_calls_spread_over_the_endpoints_within_each_ones_concurrency(servers):
    a, b = servers(latency=0.05), servers(latency=0.05)
    client = chat(a.base_url, b.base_url)
    answers = asyncio.run(ask_all(client, 24))
    assert len(answers) == 24 and not client.usage.total().failures
    assert a.stats["requests"] + b.stats["requests"] == 24
    assert min(a.stats["requests"], b.stats["requests"]) >= 8  # both worked, neither took it all
    assert a.stats["max_in_flight"] <= 2 and b.stats["max_in_flight"] <= 2
    report = client.usage.endpoint_report()["chat"]
    assert sorted(e["requests"] for e in report.values()) == sorted([a.stats["requests"], b.stats["requests"]])
    assert all(e["faults"] == 0 for e in report.values())


def test_a_down_endpoint_leaves_the_rotation_and_nothing_is_lost(servers):
    up = servers()
    down = closed_port()
    client = chat(down, up.base_url)
    answers = asyncio.run(ask_all(client, 30))
    assert len(answers) == 30 and not client.usage.total().failures
    report = client.usage.endpoint_report()["chat"]
    dead = report[f"0: {down}"]
    assert dead["answers"] == 0 and dead["out_of_rotation"] >= 1
    # out after OUT_AFTER_FAILURES faults in a row, plus those already sent to it at that moment
    assert dead["faults"] <= endpoints_module.OUT_AFTER_FAILURES + 2
    assert up.stats["requests"] == 30


def test_a_rate_limiting_endpoint_is_paused_for_its_retry_after(servers):
    limited = servers(faults={"429": 1.0})  # answers every request with 429, Retry-After 0.05 s
    fine = servers(latency=0.01)
    client = chat(limited.base_url, fine.base_url)
    answers = asyncio.run(ask_all(client, 30))
    assert len(answers) == 30 and not client.usage.total().failures
    report = client.usage.endpoint_report()["chat"]
    assert report[f"0: {limited.base_url}"]["rate_limited"] == limited.stats["requests"] >= 1
    # paused after each 429, so it got a small share of the requests
    assert limited.stats["requests"] < fine.stats["requests"] / 2
    assert report[f"0: {limited.base_url}"]["out_of_rotation"] == 0  # a 429 is not a failure


def test_a_failed_endpoint_comes_back_after_its_cool_down(servers):
    flaky = servers(script=["503"] * 3)  # three faults, then healthy
    other = servers(latency=0.05)
    client = chat(flaky.base_url, other.base_url, outage_cool_down=0.2)

    async def scenario():
        await ask_all_open(client, 6)  # the flaky one fails three times and leaves
        out = client.usage.endpoint_report()["chat"][f"0: {flaky.base_url}"]["out_of_rotation"]
        await asyncio.sleep(0.3)  # its cool-down ends
        before = flaky.stats["requests"]
        await ask_all_open(client, 10, offset=100)
        await client.aclose()
        return out, flaky.stats["requests"] - before

    out, served_after = asyncio.run(scenario())
    assert out == 1 and served_after >= 3  # back in the rotation, taking its share again
    assert not client.usage.total().failures


async def ask_all_open(client: ChatClient, n: int, offset: int = 0) -> None:
    await asyncio.gather(*(client.structured([{"role": "user", "content": f"Question {offset + i}"}], Answer,
                                             step="extract", item=f"q{i}", max_tokens=50) for i in range(n)))


def test_answers_are_cached_under_the_model_whichever_endpoint_gave_them(servers, tmp_path):
    a, b, c = servers(), servers(), servers()
    cache = Cache(tmp_path / "llm.sqlite")
    first = asyncio.run(ask_all(chat(a.base_url, b.base_url, cache=cache), 12))
    again = chat(c.base_url, cache=cache)  # another server of the same model
    assert asyncio.run(ask_all(again, 12)) == first
    assert c.stats["requests"] == 0 and again.usage.total().cache_hits == 12


def test_each_endpoint_is_asked_for_its_own_deployment_name(servers):
    a = servers(models=("deployment-a",))
    b = servers(models=("deployment-b",))
    settings = ChatSettings(provider="openai", model="gpt-x", api_key="k", retry_base_seconds=0.01, max_retries=2,
                            endpoints=[{"base_url": a.base_url, "model": "deployment-a", "concurrency": 1},
                                       {"base_url": b.base_url, "model": "deployment-b", "api_key": "other"}])
    client = ChatClient(settings, cache=None)
    assert len(asyncio.run(ask_all(client, 8))) == 8
    assert {r["model"] for r in a.requests} == {"deployment-a"} and {r["model"] for r in b.requests} == {"deployment-b"}


def test_every_endpoint_down_fails_the_item_and_names_it(servers):
    client = chat(closed_port(), closed_port(), max_retries=2)
    with pytest.raises(LLMError, match="extract of q0 failed after 3 attempts"):
        asyncio.run(ask_all(client, 1))
    assert client.usage.step("extract").failures == ["q0"]


def test_embeddings_use_several_endpoints_too(servers):
    a, b = servers(), servers()
    settings = EmbeddingSettings(provider="openai", model="e", api_key="k", batch_size=2, retry_base_seconds=0.01,
                                 endpoints=[{"base_url": a.base_url, "concurrency": 1},
                                            {"base_url": closed_port(), "concurrency": 1},
                                            {"base_url": b.base_url, "concurrency": 1}])
    embedder = Embedder(settings, cache=None)

    async def run():
        try:
            return await embedder.embed([f"text {i}" for i in range(20)])
        finally:
            await embedder.aclose()

    vectors = asyncio.run(run())
    assert vectors.shape[0] == 20
    assert a.stats["requests"] >= 2 and b.stats["requests"] >= 2
    report = embedder.usage.endpoint_report()["embedding"]
    assert sum(e["answers"] for e in report.values()) == 10  # one per batch, none lost


def test_an_index_over_two_endpoints_reports_each_in_stats(servers, tmp_path):
    a, b = servers(), servers()
    write_docs(tmp_path, {"a.txt": "Acme Corp hired Jane Doe in Berlin. Jane Doe met John Smith at Globex.",
                          "b.txt": "Globex opened an office in Paris. John Smith leads Globex in Paris."})
    both = [{"base_url": a.base_url}, {"base_url": b.base_url}]
    common = {"provider": "openai", "model": "mock", "api_key": "x", "retry_base_seconds": 0.01, "endpoints": both}
    settings = load_settings(tmp_path, overrides={"chat": common, "embedding": common,
                                                  "chunks": {"size": 120, "overlap": 20}}, env={})
    result = asyncio.run(run_index(settings, log=lambda m: None))
    stats = json.loads((tmp_path / "output" / "stats.json").read_text())
    chat_report = stats["endpoints"]["chat"]
    assert len(chat_report) == 2 and all(e["answers"] > 0 for e in chat_report.values())
    assert sum(e["answers"] for e in chat_report.values()) == stats["llm"]["total"]["calls"] - stats["llm"]["embed"]["calls"]
    assert len(result.tables["entities"]) and not result.failures


def test_settings_reject_endpoints_without_a_model_or_with_the_embedded_one(tmp_path):
    with pytest.raises(SettingsError, match="chat.model: with chat.endpoints"):
        load_settings(tmp_path, overrides={"chat": {"provider": "openai", "endpoints": [{"base_url": "http://a/v1"}]}},
                      env={})
    with pytest.raises(SettingsError, match="need provider 'openai'"):
        load_settings(tmp_path, overrides={"chat": {"endpoints": [{"base_url": "http://a/v1"}]}}, env={})


def test_preflight_checks_every_endpoint(servers, tmp_path):
    from sensegraph.llm.doctor import preflight

    fine, keyed = servers(), servers(api_key="right")

    def problems(*entries):
        chat_section = {"provider": "openai", "model": "mock", "api_key": "k", "endpoints": list(entries)}
        s = load_settings(tmp_path, overrides={"chat": chat_section}, env={})
        return asyncio.run(preflight(s))

    assert problems({"base_url": fine.base_url}, {"base_url": keyed.base_url, "api_key": "right"}) == []
    wrong = problems({"base_url": fine.base_url}, {"base_url": keyed.base_url})  # the section's key "k"
    assert len(wrong) == 1 and wrong[0].startswith("chat.endpoints[1] ") and "401" in wrong[0]
    # one server down among several: the run copes (it leaves the rotation); all down: it cannot
    assert problems({"base_url": closed_port()}, {"base_url": fine.base_url}) == []
    down = problems({"base_url": closed_port()}, {"base_url": closed_port()})
    assert len(down) == 1 and "endpoints[0]" in down[0] and "endpoints[1]" in down[0]
