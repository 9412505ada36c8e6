"""Spending budgets (chat.budget_tokens / budget_cost): a run stops cleanly at the limit, says how to
go on, and a rerun continues from the cache to the same index as a run without a budget.

Against the mock OpenAI-compatible server (tests/mock_llm.py), through the CLI where the exit
code and the message matter.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mock_llm import MockServer, start_mock_server
from sensegraph.cli import BUDGET_EXIT
from sensegraph.cli import main as cli_main
from sensegraph.config import ChatSettings, SettingsError, load_settings
from sensegraph.llm import BudgetReached, Cache, ChatClient, LLMError, Usage
from test_pipeline import DOCS, _cli_env, endpoint, snapshot, stats_json, write_docs
from test_update import EXTRA, content, write_settings_yaml

CONCURRENCY = 4


class CountingServer(MockServer):
    """The mock server, keeping the tokens (prompt + completion) of every chat answer it sends."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.answer_tokens: list[int] = []

    def _send(self, writer, status, obj, headers=None):  # type: ignore[override]
        if status == 200 and isinstance(obj, dict) and "choices" in obj:
            with self._lock:
                self.answer_tokens.append(obj["usage"]["total_tokens"])
        super()._send(writer, status, obj, headers)


def chat_requests(server: MockServer) -> int:
    return server.stats["by_kind"].get("chat", 0)


def cli_env(server: MockServer) -> dict[str, str]:
    return {**_cli_env(server), "SENSEGRAPH_CHAT__CONCURRENCY": str(CONCURRENCY)}


def run_cli(*args: str, env: dict[str, str]):
    return CliRunner().invoke(cli_main, list(args), env=env)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Any]:
    """A fresh index without a budget, in its own folder with its own cache and server."""
    root = tmp_path_factory.mktemp("fresh")
    write_docs(root, DOCS)
    with CountingServer(latency=0.01).start() as srv:
        res = run_cli("index", "--root", str(root), env=cli_env(srv))
        assert res.exit_code == 0, res.output
        stats = stats_json(root)
        return {"root": root, "chat_calls": chat_requests(srv), "stats": stats,
                "chat_tokens": sum(srv.answer_tokens), "snapshot": snapshot(root / "output")}


def step_tokens(stats: dict[str, Any], *steps: str) -> int:
    return sum(stats["steps"][s]["prompt_tokens"] + stats["steps"][s]["completion_tokens"] for s in steps)


# -- (1) + (2): stop at the limit, then continue ------------------------------------------------------
@pytest.mark.parametrize("stop_in", ["extract", "community_reports"])
def test_budget_stops_cleanly_and_a_rerun_finishes_the_same_index(tmp_path, reference, stop_in):
    ref = reference["stats"]
    if stop_in == "extract":
        budget = step_tokens(ref, "extract") // 3
    else:  # extraction and summaries fit, the reports do not
        budget = step_tokens(ref, "extract", "summarize") + step_tokens(ref, "community_reports") // 3
    write_docs(tmp_path, DOCS)

    with CountingServer(latency=0.02).start() as srv:
        env = cli_env(srv)
        stopped = run_cli("index", "--root", str(tmp_path), "--budget-tokens", str(budget), env=env)
        made = chat_requests(srv)
        sizes = list(srv.answer_tokens)
    assert stopped.exit_code == BUDGET_EXIT == 3, stopped.output
    assert "Traceback" not in stopped.output and isinstance(stopped.exception, SystemExit)
    text = " ".join(stopped.output.split())
    assert "token budget is used up" in text and f"chat.budget_tokens = {budget:,}" in text
    assert f"reached during {stop_in}:" in text and "skipped" in text
    assert "Nothing finished is lost" in text
    assert "rerun `sensegraph index`" in text and "--budget-tokens" in text and "cost nothing" in text

    stats = stats_json(tmp_path)
    assert stats["stopped"] == "budget"
    b = stats["budget"]
    assert b["limit"] == "budget_tokens" and b["budget_tokens"] == budget and b["step"] == stop_in
    # Spending: the limit was reached, and overshot by no more than the calls in flight.
    spent = sum(sizes)
    assert b["spent_tokens"] == spent
    assert budget <= spent <= budget + CONCURRENCY * max(sizes)
    # ... so the number of calls is what the budget pays for: every call started while the
    # spending was below the limit, and all but the last `concurrency` of them had finished then.
    assert made == len(sizes)
    assert made * max(sizes) >= budget
    assert (made - CONCURRENCY) * min(sizes) < budget
    step = b["steps"][stop_in]
    assert step["skipped"] > 0 and step["failed"] == 0 and step["done"] + step["skipped"] == step["items"]
    if stop_in == "community_reports":  # the steps before were complete
        assert b["steps"]["extract"]["skipped"] == 0 and b["steps"]["summarize"]["skipped"] == 0
    # skipped items are recorded as such, not as model failures
    llm = stats["llm"]
    assert llm["total"]["failures"] == [] and len(llm["total"]["budget_skipped"]) >= step["skipped"]
    state = tmp_path / "output" / "state.json"
    assert stop_in not in (json.loads(state.read_text()) if state.exists() else {})  # checkpoint not marked
    assert "embed" not in stats["steps"]  # later steps did not run
    if stop_in == "extract":
        assert not (tmp_path / "output" / "entities.parquet").exists()
    assert not (tmp_path / "output" / "community_reports.parquet").exists()

    # (2) without a budget the rerun completes, making exactly the calls not made yet
    with CountingServer().start() as srv:
        again = run_cli("index", "--root", str(tmp_path), env=cli_env(srv))
        assert again.exit_code == 0, again.output
        assert chat_requests(srv) == reference["chat_calls"] - made
    final = stats_json(tmp_path)
    assert "stopped" not in final and final["partial"] is False
    assert final["llm"]["total"]["budget_skipped"] == []
    assert snapshot(tmp_path / "output") == reference["snapshot"]


def test_rerun_with_the_same_budget_continues_where_it_stopped(tmp_path, reference):
    """The budget is per run: cache hits are free, so each rerun gets further, and they end at the index."""
    budget = reference["chat_tokens"] // 3
    write_docs(tmp_path, DOCS)
    runs, calls = [], 0
    with CountingServer().start() as srv:
        for _ in range(8):
            res = run_cli("index", "--root", str(tmp_path), "--budget-tokens", str(budget), env=cli_env(srv))
            runs.append(res.exit_code)
            if res.exit_code == 0:
                break
            assert res.exit_code == BUDGET_EXIT, res.output
            assert chat_requests(srv) > calls, "a rerun made no progress"
            calls = chat_requests(srv)
        total = chat_requests(srv)
    assert runs[-1] == 0 and len(runs) >= 3
    assert total == reference["chat_calls"]  # nothing was asked twice
    assert snapshot(tmp_path / "output") == reference["snapshot"]


def test_update_stops_at_the_budget_and_a_rerun_completes(tmp_path, reference):
    fresh, project = tmp_path / "fresh", tmp_path / "project"
    write_docs(fresh, {**DOCS, **EXTRA})
    write_docs(project, DOCS)
    with start_mock_server() as srv:
        write_settings_yaml(fresh, srv)
        write_settings_yaml(project, srv)
        assert run_cli("index", "--root", str(fresh), env={}).exit_code == 0
        assert run_cli("index", "--root", str(project), env={}).exit_code == 0
        write_docs(project, EXTRA)
        stopped = run_cli("update", "--root", str(project), "--budget-tokens", "1", env={})
        assert stopped.exit_code == BUDGET_EXIT, stopped.output
        assert "rerun `sensegraph update`" in " ".join(stopped.output.split())
        assert stats_json(project)["budget"]["step"] == "extract"
        done = run_cli("update", "--root", str(project), env={})
        assert done.exit_code == 0, done.output
    assert content(project / "output") == content(fresh / "output")


# -- (3) settings -------------------------------------------------------------------------------------
def test_budget_cost_needs_prices(tmp_path):
    with start_mock_server() as srv:
        with pytest.raises(SettingsError) as exc:
            load_settings(tmp_path, overrides={"chat": endpoint(srv, budget_cost=2.5)}, env={})
        assert "chat.budget_cost" in str(exc.value) and "price_per_1k_prompt" in str(exc.value)
        ok = load_settings(tmp_path, overrides={"chat": endpoint(srv, budget_cost=2.5, price_per_1k_prompt=0.01)},
                           env={})
        assert ok.chat.budget_cost == 2.5
        with pytest.raises(SettingsError):
            load_settings(tmp_path, overrides={"chat": endpoint(srv, budget_tokens=-1)}, env={})

        write_docs(tmp_path, DOCS)
        res = run_cli("index", "--root", str(tmp_path), "--budget-cost", "1", env=_cli_env(srv))
        assert res.exit_code == 2 and "price_per_1k_prompt" in res.output
        assert srv.stats["requests"] == 0


def test_dry_run_compares_the_estimate_with_the_budget(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as srv:
        env = _cli_env(srv)
        small = run_cli("index", "--root", str(tmp_path), "--dry-run", "--budget-tokens", "1000", env=env)
        assert small.exit_code == 0, small.output
        assert "chat.budget_tokens (1,000 tokens) covers roughly" in " ".join(small.output.split())
        big = run_cli("index", "--root", str(tmp_path), "--dry-run", "--budget-tokens", "100000000", env=env)
        assert "fit within chat.budget_tokens" in " ".join(big.output.split())
        plain = run_cli("index", "--root", str(tmp_path), "--dry-run", env=env)
        assert "Budget" not in plain.output
        assert srv.stats["requests"] == 0


# -- (4) the client ------------------------------------------------------------------------------------
def _client(server: MockServer, cache: Cache | None, **budget: Any) -> ChatClient:
    settings = ChatSettings(provider="openai", model="m", base_url=server.base_url, api_key="k",
                            retry_base_seconds=0.01, max_retries=2, **budget)
    return ChatClient(settings, cache=cache)


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_cached_calls_are_free_and_never_blocked(tmp_path):
    async def scenario(server: MockServer) -> None:
        cache = Cache(tmp_path / "llm.sqlite")
        first = _client(server, cache, budget_tokens=1)
        assert not first.budget_reached
        answer = await first.complete(_ask("Tell me about Acme Corp."), step="s", item="a", max_tokens=50)
        assert first.budget_reached and first.budget_limit() == "budget_tokens"
        sent = chat_requests(server)
        with pytest.raises(BudgetReached) as exc:
            await first.complete(_ask("Tell me about Globex."), step="s", item="b", max_tokens=50)
        assert isinstance(exc.value, LLMError)  # steps treat it as "not done"
        assert "not sent" in str(exc.value) and "chat.budget_tokens = 1" in str(exc.value)
        with pytest.raises(BudgetReached):
            async for _ in first.stream(_ask("Stream about Initech."), step="s", item="c", max_tokens=50):
                pass
        assert chat_requests(server) == sent, "a request was sent past the budget"
        # the cached answer still comes, with the budget used up
        assert await first.complete(_ask("Tell me about Acme Corp."), step="s", item="a", max_tokens=50) == answer
        use = first.usage.step("s")
        assert use.failures == [] and use.budget_skipped == ["b", "c"] and use.cache_hits == 1
        await first.aclose()

        # A new run: cache hits cost nothing, so they neither spend nor hit the budget.
        second = _client(server, cache, budget_tokens=1)
        for _ in range(3):
            assert await second.complete(_ask("Tell me about Acme Corp."), step="s", max_tokens=50) == answer
        pieces = [p async for p in second.stream(_ask("Tell me about Acme Corp."), step="s", max_tokens=50)]
        assert "".join(pieces) == answer
        assert second.usage.chat_tokens() == 0 and not second.budget_reached
        assert chat_requests(server) == sent
        await second.aclose()
        cache.close()

    with start_mock_server() as srv:
        asyncio.run(scenario(srv))


def test_embedding_spend_counts_toward_the_cost_budget_only_when_priced():
    settings = ChatSettings(provider="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key="k",
                            budget_tokens=1000, budget_cost=0.5, price_per_1k_prompt=1.0)
    priced = Usage(1.0, 0.0, price_per_1k_embedding=0.1)
    priced.step("embed").prompt_tokens += 4000  # what an embedder sharing the Usage records
    assert priced.chat_tokens() == 0 and priced.cost() == pytest.approx(0.4)
    client = ChatClient(settings, cache=None, usage=priced)
    assert not client.budget_reached  # embedding tokens are not chat tokens; 0.4 < 0.5
    priced.step("embed").prompt_tokens += 1000
    assert client.budget_limit() == "budget_cost"

    free = Usage(1.0, 0.0, price_per_1k_embedding=0.0)
    free.step("embed").prompt_tokens += 10**6
    assert not ChatClient(settings, cache=None, usage=free).budget_reached
    free.add_chat("extract", 900, 100)
    assert ChatClient(settings, cache=None, usage=free).budget_limit() == "budget_tokens"


# -- (5) queries: a call the budget blocks is reported as such, not as a model failure -----------------
def test_query_past_the_budget_says_the_budget_stopped_it(tmp_path, reference):
    import shutil

    root = tmp_path / "project"
    shutil.copytree(reference["root"], root)
    with start_mock_server() as srv:
        env = {**_cli_env(srv), "SENSEGRAPH_CHAT__CONCURRENCY": "1", "SENSEGRAPH_CHAT__BUDGET_TOKENS": "1"}
        res = run_cli("query", "--root", str(root), "--method", "global", "What are the main themes?", env=env)
        sent = chat_requests(srv)
    text = " ".join(res.output.split())
    assert sent == 1, "only the first call may go out once the budget is used up"
    assert "budget" in text and "failed after every retry" not in text


def test_query_footer_tells_unsent_calls_from_failed_ones(monkeypatch):
    import io

    from rich.console import Console

    from sensegraph.cli import query as query_cli
    from sensegraph.query.answer import QueryResult
    from sensegraph.query.context import Context

    buf = io.StringIO()
    monkeypatch.setattr(query_cli, "console", Console(file=buf, width=400))
    usage = {"calls": 2, "cache_hits": 1, "prompt_tokens": 900, "completion_tokens": 80,
             "budget_skipped": ["map batch 3", "map batch 4"]}
    result = QueryResult(question="q", method="global", answer="a", context=Context(), usage=usage,
                         failures=["map batch 2", "map batch 3", "map batch 4"])
    query_cli.print_footer(result)
    text = " ".join(buf.getvalue().split())
    assert "1 calls failed after every retry and are missing from this answer: map batch 2" in text
    assert "2 calls were not sent because the spending budget" in text
    assert "map batch 3, map batch 4" in text
