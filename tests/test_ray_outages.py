"""Outages end on Ray too (issue 27; sensegraph/llm/ray_workers.py): failover across workers,
limits split without over-commit, bounded retries of a call that kills its worker, a head that
cannot be reached, and each node's sensegraph version. On a real local Ray cluster (head + one
worker node, tests/test_ray.py's `cluster` fixture) against the mock servers of tests/mock_llm.py.
Nothing here asserts how long anything took: HANG only turns a hang (the old behaviour) into a
failure."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from mock_llm import start_mock_server  # noqa: E402
from sensegraph.config import ChatSettings, load_settings  # noqa: E402
from sensegraph.index.pipeline import IndexFailed, run_index  # noqa: E402
from sensegraph.llm import ray_workers  # noqa: E402
from sensegraph.llm.ray_workers import RayUnavailable, RayWorkers, shares, split  # noqa: E402
from test_endpoints import closed_port  # noqa: E402
from test_pipeline import _cli_env, snapshot, write_docs  # noqa: E402
from test_ray import DOCS, cluster  # noqa: E402,F401 - the fixture: a head and a worker node

HANG = 300.0  # seconds: a guard against a hang, far above any run here


def project(root: Path, urls: list[str], concurrency: int = 4, **sections):
    write_docs(root, DOCS)
    common = {"provider": "openai", "model": "mock", "api_key": "x", "retry_base_seconds": 0.05,
              "endpoints": [{"base_url": u, "concurrency": concurrency} for u in urls]}
    for name in ("chat", "embedding"):
        sections[name] = {**common, **sections.get(name, {})}
    return load_settings(root, overrides={"chunks": {"size": 120, "overlap": 20}, **sections}, env={})


def index(settings, log=None):
    return asyncio.run(asyncio.wait_for(run_index(settings, log=log or (lambda m: None)), HANG))


# -- limits split without over-commit (no cluster) --------------------------------------------------
def test_each_endpoints_limits_split_over_the_workers_add_up_to_the_limit_exactly():
    # The case: concurrency 4 and 3 requests per minute over 10 workers became 10 and 10.
    s = ChatSettings(provider="openai", model="m", concurrency=4, requests_per_minute=3, tokens_per_minute=1000,
                     endpoints=[{"base_url": "http://a/v1"}])
    parts = shares(s, 10)
    used = [e for w in parts if w is not None for e in w.endpoints]
    assert sum(e.concurrency for e in used) == 4 and sum(e.requests_per_minute for e in used) == 3
    assert sum(e.tokens_per_minute for e in used) == 1000
    # a worker with no request of the minute has no share at all: a 0 would mean "no limit"
    assert len(used) == 3 and all(e.requests_per_minute >= 1 for e in used) and parts.count(None) == 7
    assert [e.concurrency for e in used] == [2, 1, 1]  # the remainder to the first

    assert split(7, 3) == [3, 2, 2] and sum(split(5, 5)) == 5
    for workers in range(1, 13):
        for conc, rpm, tpm in [(1, 0, 0), (4, 3, 0), (8, 0, 7), (3, 100, 50_000), (16, 5, 0)]:
            mixed = ChatSettings(provider="openai", model="m", concurrency=conc, requests_per_minute=rpm,
                                 tokens_per_minute=tpm,
                                 endpoints=[{"base_url": "http://a/v1"},
                                            {"base_url": "http://b/v1", "concurrency": 2, "requests_per_minute": 0},
                                            {"base_url": "http://c/v1", "tokens_per_minute": 9}])
            parts = shares(mixed, workers)
            assert len(parts) == workers
            for url, (c, r, t) in {"http://a/v1": (conc, rpm, tpm), "http://b/v1": (2, 0, tpm),
                                   "http://c/v1": (conc, rpm, 9)}.items():
                mine = [e for w in parts if w is not None for e in w.endpoints if e.base_url == url]
                assert mine and sum(e.concurrency for e in mine) == c and all(e.concurrency >= 1 for e in mine)
                for field, limit in (("requests_per_minute", r), ("tokens_per_minute", t)):
                    values = [getattr(e, field) for e in mine]
                    # split exactly when limited, every share at least 1; "no limit" stays 0 everywhere
                    assert (sum(values) == limit and min(values) >= 1) if limit else set(values) == {0}
    single = ChatSettings(provider="openai", model="m", base_url="http://x/v1", concurrency=3, requests_per_minute=2)
    parts = shares(single, 4)
    assert [(w.concurrency, w.requests_per_minute) for w in parts if w is not None] == [(2, 1), (1, 1)]
    assert parts[2:] == [None, None]


# -- an unreachable head (no cluster) ---------------------------------------------------------------
def test_an_unreachable_head_fails_at_once_with_one_line_saying_what_to_do(tmp_path):
    settings = project(tmp_path, ["http://127.0.0.1:9/v1"])
    raised: list[BaseException] = []

    def connect() -> None:
        try:
            RayWorkers(settings, "127.0.0.1:1")
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)
    # (in a thread, as a hang guard: the old code retried "Failed to connect to GCS" for minutes)
    trying = threading.Thread(target=connect, daemon=True)
    trying.start()
    trying.join(120)
    assert raised and isinstance(raised[0], RayUnavailable), raised or "still connecting after 120 s"
    message = str(raised[0])
    assert "127.0.0.1:1 cannot be reached" in message and "ray start --head" in message and "\n" not in message
    assert not ray.is_initialized()


def test_the_cli_prints_the_one_line_and_exits_non_zero_when_the_head_cannot_be_reached(tmp_path):
    with start_mock_server() as server:
        root = tmp_path / "p"
        write_docs(root, DOCS)
        sensegraph = Path(sys.executable).parent / "sensegraph"  # the installed command, in its own process
        done = subprocess.run([str(sensegraph), "index", "--root", str(root), "--ray", "127.0.0.1:1"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, **_cli_env(server), "COLUMNS": "400"})
    assert done.returncode != 0
    lines = [x for x in (done.stdout + done.stderr).splitlines() if x.strip()]
    assert any("127.0.0.1:1 cannot be reached" in x for x in lines), lines
    assert "Traceback" not in done.stderr


# -- failover across workers ------------------------------------------------------------------------
@pytest.mark.parametrize("concurrency", [1, 4])
def test_one_of_two_servers_killed_mid_index_costs_no_item_and_gives_the_clean_tables(cluster, tmp_path, concurrency):
    # concurrency 1: each server's one slot goes to one worker, so the worker whose server dies
    # has none left and must hand its calls back; 4: each worker has both and fails over itself.
    with start_mock_server() as clean:
        index(project(tmp_path / "clean", [clean.base_url]))
    with start_mock_server(latency=0.05) as a, start_mock_server(latency=0.05) as b:
        settings = project(tmp_path / "ray", [a.base_url, b.base_url], concurrency, ray={"address": cluster})
        killed = threading.Event()

        def kill_a() -> None:
            deadline = time.monotonic() + HANG
            while a.stats["requests"] < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            a.stop()  # its port closes: requests in flight drop, new ones are refused
            killed.set()

        killer = threading.Thread(target=kill_a)
        killer.start()
        try:
            result = index(settings)
        finally:
            killer.join()
        served_by_b = b.stats["requests"]
    assert killed.is_set() and served_by_b > 0
    assert not result.failures  # the CLI's exit 0
    assert snapshot(tmp_path / "ray" / "output") == snapshot(tmp_path / "clean" / "output")


def test_a_server_answering_garbage_is_avoided_across_workers_and_costs_no_item(cluster, tmp_path):
    # concurrency 1: the garbage server's worker has no other server to retry on
    with start_mock_server() as clean:
        index(project(tmp_path / "clean", [clean.base_url]))
    with start_mock_server(faults={"invalid": 1.0}) as garbage, start_mock_server() as fine:
        result = index(project(tmp_path / "ray", [garbage.base_url, fine.base_url], 1, ray={"address": cluster}))
        wasted = garbage.stats["requests"]
    assert not result.failures and wasted  # (each call that went there did up to max_retries + 1)
    assert snapshot(tmp_path / "ray" / "output") == snapshot(tmp_path / "clean" / "output")


def test_all_servers_dead_ends_after_outage_timeout_records_the_items_and_the_rerun_resumes(cluster, tmp_path):
    dead = [closed_port(), closed_port()]
    outage = {"outage_cool_down": 0.05, "outage_timeout": 3}
    lines: list[str] = []
    settings = project(tmp_path, dead, ray={"address": cluster}, chat=outage, embedding=outage)
    with pytest.raises(IndexFailed) as failed:
        index(settings, log=lines.append)
    stats = json.loads((tmp_path / "output" / "stats.json").read_text())
    assert stats["failures"]["extract"] and failed.value.failures["extract"] == stats["failures"]["extract"]
    message = str(failed.value)
    assert "no server of chat has answered" in message and "Ray workers" in message
    assert all(url in message for url in dead)
    assert "no server of chat has answered" in stats["outages"]["chat"]
    assert any("waiting: all servers of chat are out on every Ray worker" in line for line in lines), lines
    assert any("failing its calls" in line for line in lines), lines

    with start_mock_server() as a, start_mock_server() as b:
        again = index(project(tmp_path, [a.base_url, b.base_url], ray={"address": cluster}))
    assert not again.failures and len(again.tables["entities"])


def test_a_worker_whose_server_comes_back_is_probed_and_back_in_rotation_while_the_others_answer(cluster):
    from pydantic import BaseModel

    from sensegraph.config import EmbeddingSettings, Settings
    from sensegraph.llm import ChatClient

    class Answer(BaseModel):
        answer: str

    with start_mock_server() as a, start_mock_server() as b:
        common = dict(provider="openai", model="mock", api_key="x", retry_base_seconds=0.01,
                      outage_cool_down=0.05, outage_cool_down_cap=0.2)
        # concurrency 1: each server's one slot is one worker's, so a's worker has no other server
        chat = ChatSettings(**common, endpoints=[{"base_url": u, "concurrency": 1} for u in (a.base_url, b.base_url)])
        settings = Settings(chat=chat, embedding=EmbeddingSettings(**common, base_url=b.base_url))
        client = ChatClient(chat, cache=None)
        client.workers = workers = RayWorkers(settings, cluster, 2)

        async def ask(n: int, offset: int) -> list:
            return await asyncio.wait_for(asyncio.gather(*(
                client.structured([{"role": "user", "content": f"Question {offset + i} about Acme"}], Answer,
                                  step="extract", item=f"q{offset + i}", max_tokens=50) for i in range(n))), HANG)

        async def scenario() -> int:
            try:
                a.down = "503"
                await ask(20, 0)  # a's worker hands its calls back: b answers them all
                a.down = None
                await asyncio.sleep(0.5)
                a.reset_stats()
                for round in range(3):  # (each round's calls are all routed before the probe's answer)
                    await ask(10, 100 + 10 * round)
                return a.stats["requests"]
            finally:
                await client.aclose()
                await workers.aclose()

        served_by_a = asyncio.run(scenario())
    assert served_by_a >= 3  # probed, then back to its share
    assert not client.usage.step("extract").failures


# -- a call that kills its worker every time ---------------------------------------------------------
class PoisonWorker(ray_workers.ModelWorker):
    """A worker whose process dies on any chat call about POISON (as a call that crashes a
    native library would), every time it is sent."""

    async def chat_call(self, messages, *args, **kwargs):
        if any("POISON" in m["content"] for m in messages):
            os._exit(1)
        return await super().chat_call(messages, *args, **kwargs)


def test_a_call_that_kills_its_worker_each_time_fails_alone_and_the_run_ends(cluster, tmp_path, monkeypatch):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
    monkeypatch.setattr(ray_workers, "ModelWorker", PoisonWorker)
    with start_mock_server(latency=0.05) as a, start_mock_server(latency=0.05) as b:
        settings = project(tmp_path, [a.base_url, b.base_url], ray={"address": cluster})
        write_docs(tmp_path, {"poison.txt": "POISON Corp poisoned the well."})
        lines: list[str] = []
        with pytest.raises(IndexFailed) as failed:
            index(settings, log=lines.append)
    # the poison unit's extraction failed, and nothing else: the calls beside it were sent again
    failures = {step: items for step, items in failed.value.failures.items() if items}
    assert list(failures) == ["extract"] and len(failures["extract"]) == 1
    units = {row["id"]: row["text"] for row in snapshot(tmp_path / "output")["text_units"]}
    assert "POISON" in units[failures["extract"][0]]
    assert len(units) > 1


# -- the install check ---------------------------------------------------------------------------------
def test_a_node_with_another_sensegraph_version_is_refused_naming_it(cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_workers, "VERSION", "0.0.0-other")
    with start_mock_server() as a:
        settings = project(tmp_path, [a.base_url])
        with pytest.raises(RayUnavailable) as refused:
            RayWorkers(settings, cluster)
    message = str(refused.value)
    assert "this machine 0.0.0-other" in message and "install the same version on every node" in message
    assert "\n" not in message and not ray.is_initialized()


def test_ray_data_with_all_servers_dead_ends_records_the_units_and_the_rerun_resumes(cluster, tmp_path):
    # The outage model runs inside each Ray Data actor: its calls fail after outage_timeout, the
    # partitions record their units as failed, and the run ends (no hang) naming them.
    dead = [closed_port(), closed_port()]
    outage = {"outage_cool_down": 0.05, "outage_timeout": 3}
    data = {"address": cluster, "data": True, "data_path": str(tmp_path / "partitions"), "partition_units": 2}
    settings = project(tmp_path, dead, ray=data, chat=outage, embedding=outage)
    with pytest.raises(IndexFailed) as failed:
        index(settings)
    stats = json.loads((tmp_path / "output" / "stats.json").read_text())
    units = stats["steps"]["text_units"]["text_units"]
    assert len(failed.value.failures["extract"]) == units == len(stats["failures"]["extract"])

    with start_mock_server() as a, start_mock_server() as b:
        again = index(project(tmp_path, [a.base_url, b.base_url], ray=data))
    assert not again.failures and len(again.tables["entities"])
