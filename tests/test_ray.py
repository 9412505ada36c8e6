"""Indexing on a real local Ray cluster (sensegraph/llm/ray_workers.py): a head node and one
worker node started with `ray start`, two mock endpoints, and the same corpus indexed in one
process for comparison. Skipped when Ray is not installed (it is an optional extra; the test
extra and .ci/run install it)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from mock_llm import start_mock_server  # noqa: E402
from sensegraph.config import load_settings  # noqa: E402
from sensegraph.index.pipeline import run_index  # noqa: E402
from test_endpoints import closed_port  # noqa: E402
from test_pipeline import snapshot, write_docs  # noqa: E402

DOCS = {f"d{i}.txt": f"Acme Corp hired Jane Doe{i} in Berlin. Jane Doe{i} met John Smith at Globex. "
                     f"Globex opened an office in Paris{i}, where Maria Lopez{i} leads the Paris{i} team. "
                     f"Acme Corp and Globex signed the Berlin Accord{i} with the City of Paris{i}."
        for i in range(6)}
RAY = [sys.executable, "-m", "ray.scripts.scripts"]


# Token authentication off for this throw-away local cluster, in the nodes and in this driver,
# whatever a ~/.ray/auth_token left by another local run would make Ray choose.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _ray(*args: str) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([*RAY, *args], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120)


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node on this machine, one CPU each; stopped after the module."""
    port = closed_port().split(":")[2].split("/")[0]  # a free port
    _ray("start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
         "--disable-usage-stats")
    try:
        _ray("start", f"--address=127.0.0.1:{port}", "--num-cpus=1")
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _ray("stop", "--force")


def kill_one_worker(pattern: str, servers: list, after: int) -> tuple[threading.Thread, list[int]]:
    """A thread that SIGKILLs one process matching `pattern` once the servers have had `after`
    requests, and the list it puts the killed pid in. (Ray names an actor's process after its
    class; the state API would need the dashboard.)"""
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + 60
        while sum(s.stats["requests"] for s in servers) < after and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        if pids:
            os.kill(int(pids[0]), signal.SIGKILL)
            killed.append(int(pids[0]))

    killer = threading.Thread(target=kill)
    killer.start()
    return killer, killed


def project(root: Path, urls: list[str], chat: dict | None = None, docs: dict[str, str] = DOCS, **sections):
    write_docs(root, docs)
    common = {"provider": "openai", "model": "mock", "api_key": "x", "retry_base_seconds": 0.05,
              "endpoints": [{"base_url": u, "concurrency": 4} for u in urls]}
    return load_settings(root, overrides={"chat": {**common, **(chat or {})}, "embedding": common,
                                          "chunks": {"size": 120, "overlap": 20}, **sections}, env={})


def test_an_index_on_a_ray_cluster_equals_the_single_process_index(cluster, tmp_path):
    with start_mock_server() as a, start_mock_server() as b:
        alone = project(tmp_path / "alone", [a.base_url, b.base_url])
        asyncio.run(run_index(alone, log=lambda m: None))
        before = a.stats["requests"] + b.stats["requests"]
        spread = project(tmp_path / "ray", [a.base_url, b.base_url], ray={"address": cluster})
        result = asyncio.run(run_index(spread, log=lambda m: None))
        sent = a.stats["requests"] + b.stats["requests"] - before
    assert snapshot(tmp_path / "alone" / "output") == snapshot(tmp_path / "ray" / "output")
    stats = json.loads((tmp_path / "ray" / "output" / "stats.json").read_text())
    workers = {name.split(",")[0] for name in stats["endpoints"]["chat"]}
    assert workers == {"worker 0", "worker 1"}  # one per node, both made calls
    chat_calls = stats["llm"]["total"]["calls"] - stats["llm"]["embed"]["calls"]
    assert sum(e["answers"] for e in stats["endpoints"]["chat"].values()) == chat_calls
    assert sent >= chat_calls and not result.failures
    # every answer reached the project's cache: a rerun makes no call at all
    with start_mock_server() as c:
        again = asyncio.run(run_index(project(tmp_path / "ray", [c.base_url], ray={"address": cluster}),
                                      log=lambda m: None))
        assert c.stats["requests"] == 0 and not again.failures


def test_a_ray_data_index_equals_the_single_process_index_and_reruns_from_its_partitions(cluster, tmp_path):
    shared = tmp_path / "partitions"  # the folder every node reaches (one machine: any local folder)
    data = {"address": cluster, "data": True, "data_path": str(shared), "partition_units": 2}
    with start_mock_server() as a, start_mock_server() as b:
        alone = project(tmp_path / "alone", [a.base_url, b.base_url])
        asyncio.run(run_index(alone, log=lambda m: None))
        result = asyncio.run(run_index(project(tmp_path / "ray", [a.base_url, b.base_url], ray=data),
                                       log=lambda m: None))
    assert not result.failures
    assert snapshot(tmp_path / "alone" / "output") == snapshot(tmp_path / "ray" / "output")
    stats = json.loads((tmp_path / "ray" / "output" / "stats.json").read_text())
    extract = stats["steps"]["extract"]
    units = len(result.tables["text_units"])
    assert extract["ray_data"] == {"partitions": -(-units // 2), "partitions_reused": 0}
    assert stats["llm"]["extract"]["calls"] >= units  # the workers' calls are counted by the driver
    summaries = stats["steps"]["summarize"]["ray_data"]
    assert summaries["partitions"] >= 1 and summaries["partitions_reused"] == 0
    assert stats["llm"]["summarize"]["calls"] >= 1
    # the reports: one dataset per level, written by the workers (their calls counted here)
    reports = stats["steps"]["community_reports"]["ray_data"]
    levels = len(set(result.tables["communities"]["level"]))
    assert reports["partitions"] >= levels and reports["partitions_reused"] == 0
    assert stats["llm"]["community_reports"]["calls"] >= 1
    # the embeddings: a dataset per table, embedded by the workers and written here
    vectors = stats["steps"]["embed"]["ray_data"]
    assert vectors["partitions"] >= 3 and vectors["partitions_reused"] == 0  # units, entities, reports
    assert stats["llm"]["embed"]["calls"] >= 3
    for name in ("text_units", "entities", "community_reports"):  # the same vectors, in the same order
        assert _vectors(tmp_path / "ray", name).equals(_vectors(tmp_path / "alone", name))
    # the items went by reference (a folder per run and step), gone once the run ended
    assert shared.joinpath("inputs").is_dir() and not list(shared.glob("inputs/*"))
    finished = sorted(shared.glob("extract/*/done.json"))
    assert len(finished) == extract["ray_data"]["partitions"]
    # an answer cache per node that ran an actor (Ray Data spreads them, best effort)
    caches = [p.stem for p in shared.glob("answers/*.sqlite")]
    assert 1 <= len(caches) <= 2 and all(len(c) == 56 and int(c, 16) for c in caches)  # Ray node ids

    # The index lost (a new project on the same documents), and one partition lost with it:
    # the others are read, not asked again, and only the lost one is extracted.
    finished[0].unlink()
    with start_mock_server() as c:
        again = asyncio.run(run_index(project(tmp_path / "again", [c.base_url], ray=data), log=lambda m: None))
    assert not again.failures
    assert snapshot(tmp_path / "again" / "output") == snapshot(tmp_path / "alone" / "output")
    stats = json.loads((tmp_path / "again" / "output" / "stats.json").read_text())
    assert stats["steps"]["extract"]["ray_data"]["partitions_reused"] == extract["ray_data"]["partitions"] - 1
    # the summaries' partitions were all finished: read, not asked again
    assert stats["steps"]["summarize"]["ray_data"]["partitions_reused"] == summaries["partitions"]
    assert stats["llm"].get("summarize", {}).get("calls", 0) == 0
    assert stats["steps"]["community_reports"]["ray_data"]["partitions_reused"] == reports["partitions"]
    assert stats["llm"].get("community_reports", {}).get("calls", 0) == 0
    assert stats["steps"]["embed"]["ray_data"]["partitions_reused"] == vectors["partitions"]
    assert stats["llm"].get("embed", {}).get("calls", 0) == 0
    lost = stats["llm"]["extract"]
    assert 0 < lost["calls"] + lost["cache_hits"] <= 2 * (1 + alone.extraction.max_gleanings) * 2


def test_ray_data_workers_find_spacys_names_and_the_driver_only_matches_them(cluster, tmp_path, monkeypatch):
    from sensegraph.index import concepts

    shared = tmp_path / "partitions"
    data = {"address": cluster, "data": True, "data_path": str(shared), "partition_units": 2}
    ner = {"ner": True}  # the missed-names pass on, as for a small model
    with start_mock_server() as a:
        asyncio.run(run_index(project(tmp_path / "alone", [a.base_url], extraction=ner), log=lambda m: None))
        # From here spaCy's calls on the driver are recorded (the workers are other processes).
        on_driver: list[str] = []
        real = concepts.english_concepts

        def recorded(texts, **kwargs):
            texts = list(texts)
            on_driver.extend(texts)
            return real(texts, **kwargs)
        monkeypatch.setattr(concepts, "english_concepts", recorded)
        result = asyncio.run(run_index(project(tmp_path / "ray", [a.base_url], ray=data, extraction=ner),
                                       log=lambda m: None))
    assert not result.failures
    alone = snapshot(tmp_path / "alone" / "output")
    assert snapshot(tmp_path / "ray" / "output") == alone
    added = json.loads((tmp_path / "alone" / "output" / "stats.json").read_text())["steps"]["extract"]
    assert added["names_from_ner"] > 0  # the pass added names
    unit_texts = set(result.tables["text_units"]["text"])
    assert not unit_texts & set(on_driver)  # ... which spaCy found on the workers
    stats = json.loads((tmp_path / "ray" / "output" / "stats.json").read_text())
    assert stats["steps"]["extract"]["ray_data"]["name_spans_on_driver"] == 0

    # A partition without spans (a node without spaCy wrote it): the driver finds its units'
    # names itself, and the tables are the same.
    lost = sorted(shared.glob("extract/*/name_spans.parquet"))[0]
    lost.unlink()
    items = json.loads((lost.parent / "done.json").read_text())["items"]
    with start_mock_server() as c:
        again = asyncio.run(run_index(project(tmp_path / "again", [c.base_url], ray=data, extraction=ner),
                                      log=lambda m: None))
        assert c.stats["requests"] == 0 and not again.failures  # every partition read, none asked again
    assert snapshot(tmp_path / "again" / "output") == alone
    stats = json.loads((tmp_path / "again" / "output" / "stats.json").read_text())
    assert stats["steps"]["extract"]["ray_data"]["name_spans_on_driver"] == items
    assert len(on_driver) == items


def test_a_partitions_items_reach_its_worker_as_they_were_given(tmp_path):
    from sensegraph.index.ray_data import _read_input, _write_input

    rows = {"extract": {"key": "k1", "ids": ["u1", "u2"], "texts": ["Ébène « x »\n", ""]},
            "summarize": {"key": "k2", "names": ["A", "B"], "descriptions": [["one", "two"], ["three"]]},
            "embed": {"key": "k3", "first": 7, "ids": ["e"], "texts": ["text"]},
            "reports": {"key": "k4", "numbers": [3, 5], "subreports": json.dumps({"1": {"title": "t"}})}}
    for kind, row in rows.items():
        assert _read_input(_write_input(tmp_path / kind, row)) == row
    assert not list(tmp_path.glob("*/*.tmp"))


def test_inputs_a_killed_driver_left_are_removed_and_no_live_runs(tmp_path):
    from sensegraph.index.ray_data import _driver_mark, _inputs_folder

    host, namespace, me = _driver_mark().split("~")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(gone.stdout)  # a process that ran and ended: its PID runs nothing now
    folders = {
        "killed driver": f"extract~{host}~{namespace}~{dead}~aaaa",
        "this driver": f"extract~{host}~{namespace}~{me}~bbbb",
        "another host": f"extract~elsewhere~{namespace}~{dead}~cccc",
        "another container": f"extract~{host}~1~{dead}~dddd",
        "not ours": "notes",
    }
    for name in folders.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "k.parquet").write_bytes(b"x")
    new = _inputs_folder(tmp_path, "summarize")
    kept = {p.name for p in tmp_path.iterdir()}
    assert kept == set(folders.values()) - {folders["killed driver"]}
    assert new.name.startswith(f"summarize~{host}~{namespace}~{me}~") and not new.exists()


def _vectors(root: Path, name: str):
    import pyarrow.parquet as pq

    from sensegraph.store.vectors import vectors_path

    return pq.read_table(vectors_path(root / "output", name))


def test_a_ray_data_worker_killed_mid_extraction_loses_no_item(cluster, tmp_path):
    data = {"address": cluster, "data": True, "data_path": str(tmp_path / "partitions"), "partition_units": 1}
    with start_mock_server(latency=0.3) as a, start_mock_server(latency=0.3) as b:
        settings = project(tmp_path / "ray", [a.base_url, b.base_url], ray=data)
        # once the actors are extracting, SIGKILL one (Ray Data restarts it and retries its partition)
        killer, killed = kill_one_worker("MapBatches\\(Worker\\)", [a, b], after=3)
        result = asyncio.run(run_index(settings, log=lambda m: None))
        killer.join()
        alone = project(tmp_path / "alone", [a.base_url, b.base_url])
        asyncio.run(run_index(alone, log=lambda m: None))
    assert killed and not result.failures
    assert snapshot(tmp_path / "ray" / "output") == snapshot(tmp_path / "alone" / "output")


def test_ray_data_actors_together_keep_each_servers_concurrency(cluster, tmp_path):
    # 36 units in two partitions, extracted at once by two actors (seconds each, so the two
    # overlap): each has half of each server's chat concurrency of 4, so no server ever has more
    # than 4 chat requests in flight. (The text units' embeddings, made meanwhile by the driver,
    # have a concurrency of their own.)
    data = {"address": cluster, "data": True, "data_path": str(tmp_path / "partitions"), "partition_units": 18,
            "workers": 2}
    with start_mock_server(latency=1.0) as a, start_mock_server(latency=1.0) as b:
        settings = project(tmp_path, [a.base_url, b.base_url], ray=data)
        write_docs(tmp_path, {f"more{i}.txt": text.replace("Jane", f"Ann{i}") for i, text in
                              enumerate(list(DOCS.values()) * 5)})
        result = asyncio.run(run_index(settings, log=lambda m: None))
    assert not result.failures, result.failures
    assert len(result.tables["text_units"]) == 36
    in_flight = [a.stats["max_in_flight_by_kind"]["chat"], b.stats["max_in_flight_by_kind"]["chat"]]
    assert 2 <= max(in_flight) <= 4, in_flight


def test_a_ray_data_path_that_cannot_be_written_fails_in_one_line_that_names_it(cluster, tmp_path):
    from sensegraph.llm.ray_workers import RayUnavailable

    (tmp_path / "a-file").write_text("not a folder")
    bad = tmp_path / "a-file" / "partitions"
    with start_mock_server() as a:
        settings = project(tmp_path / "p", [a.base_url], ray={"address": cluster, "data": True, "data_path": str(bad)})
        with pytest.raises(RayUnavailable) as caught:
            asyncio.run(run_index(settings, log=lambda m: None))
    message = str(caught.value)
    assert str(bad) in message and "ray.data_path" in message and "\n" not in message
    # A failure inside the workers (here: each node's answer cache cannot be made) stops the
    # run with the workers' error in one line, not Ray's pages of tracebacks.
    good = tmp_path / "partitions"
    (good).mkdir()
    (good / "answers").write_text("not a folder")
    with start_mock_server() as a:
        settings = project(tmp_path / "q", [a.base_url], ray={"address": cluster, "data": True, "data_path": str(good)})
        with pytest.raises(RayUnavailable) as caught:
            asyncio.run(run_index(settings, log=lambda m: None))
    message = str(caught.value)
    assert "Ray Data workers stopped" in message and "File exists" in message and "\n" not in message


def test_a_ray_data_path_the_nodes_do_not_share_is_refused_before_any_call(cluster, tmp_path, monkeypatch):
    from sensegraph.llm.ray_workers import RayUnavailable

    # /proc/self/cwd is each process's own working folder: here the test's, in the Ray workers
    # the folder the nodes were started in. A path under it is one the nodes do not share with
    # the driver, as a local disk path on each machine of a real cluster would be.
    monkeypatch.chdir(tmp_path)
    data = {"address": cluster, "data": True, "data_path": "/proc/self/cwd/partitions"}
    with start_mock_server() as a:
        settings = project(tmp_path / "p", [a.base_url], ray=data)
        with pytest.raises(RayUnavailable) as caught:
            asyncio.run(run_index(settings, log=lambda m: None))
        assert a.stats["requests"] == 0  # refused before any call
    message = str(caught.value)
    assert re.search(r"^ray.data_path /proc/self/cwd/partitions is not shared: the node at [\d.]+ cannot see", message)
    assert "\n" not in message
    assert not list((tmp_path / "partitions").glob("extract/*"))  # and no partition written


def test_ray_data_without_a_cluster_is_refused_with_what_to_do(tmp_path):
    from sensegraph.config import SettingsError

    with pytest.raises(SettingsError, match="--ray ADDRESS"):
        load_settings(tmp_path, overrides={"ray": {"data": True}}, env={})


def test_a_budget_under_ray_data_counts_every_actors_spending_and_a_rerun_finishes_the_same_index(cluster, tmp_path):
    """The budget is the run's, not each actor's: two actors on two nodes, each counting only
    its own partitions, would extract everything before either reached a third of it."""
    from sensegraph.index.pipeline import BudgetStopped
    from test_budget import CountingServer

    docs = {f"d{i}.txt": DOCS[f"d{i % 6}.txt"].replace("Doe", f"Doe{i}x") for i in range(24)}
    with CountingServer(latency=0.3).start() as a:
        asyncio.run(run_index(project(tmp_path / "alone", [a.base_url], docs=docs), log=lambda m: None))
    alone = json.loads((tmp_path / "alone" / "output" / "stats.json").read_text())["steps"]["extract"]
    extraction = alone["prompt_tokens"] + alone["completion_tokens"]
    budget = extraction // 3
    data = {"address": cluster, "data": True, "data_path": str(tmp_path / "partitions"), "partition_units": 1}
    with CountingServer(latency=0.3).start() as srv:
        settings = project(tmp_path / "ray", [srv.base_url], chat={"budget_tokens": budget}, docs=docs, ray=data)
        with pytest.raises(BudgetStopped) as stopped:
            asyncio.run(run_index(settings, log=lambda m: None))
        sizes = list(srv.answer_tokens)
    assert "reached during extract" in str(stopped.value)
    stats = json.loads((tmp_path / "ray" / "output" / "stats.json").read_text())
    b = stats["budget"]
    assert stats["stopped"] == "budget" and b["step"] == "extract" and b["budget_tokens"] == budget
    assert b["spent_tokens"] == sum(sizes)  # every token the actors spent reached the driver
    # Reached, and overshot by no more than the calls in flight (4) and what the other actor
    # spent since it last reported (0.1 s of one 0.3-s call each at most): far below the rest.
    assert budget <= sum(sizes) <= budget + 2 * 4 * max(sizes) < extraction, (sum(sizes), len(sizes))
    step = b["steps"]["extract"]
    assert step["skipped"] > 0 and step["failed"] == 0 and step["done"] + step["skipped"] == step["items"]
    assert stats["llm"]["total"]["failures"] == [] and stats["llm"]["total"]["budget_skipped"]

    # Without a budget the rerun extracts the units that were skipped (their partitions were
    # not finished) and ends with the single-process index.
    with start_mock_server() as c:
        again = asyncio.run(run_index(project(tmp_path / "ray", [c.base_url], docs=docs, ray=data),
                                      log=lambda m: None))
    assert not again.failures
    assert snapshot(tmp_path / "ray" / "output") == snapshot(tmp_path / "alone" / "output")
    rerun = json.loads((tmp_path / "ray" / "output" / "stats.json").read_text())["steps"]["extract"]["ray_data"]
    assert 0 < rerun["partitions_reused"] < rerun["partitions"]


def test_a_worker_killed_mid_step_costs_no_item(cluster, tmp_path):
    with start_mock_server(latency=0.3) as a, start_mock_server(latency=0.3) as b:
        settings = project(tmp_path, [a.base_url, b.base_url], ray={"address": cluster})
        # once extraction is under way, SIGKILL one worker process (Ray restarts it)
        killer, killed = kill_one_worker("ray::ModelWorker", [a, b], after=4)
        result = asyncio.run(run_index(settings, log=lambda m: None))
        killer.join()
    assert killed and not result.failures
    units = result.tables["text_units"]
    extracted = result.tables["entities"]["text_unit_ids"].explode().dropna().unique()
    assert set(extracted) == set(units["id"])  # every unit's extraction made it
    # the per-server counts of stats.json include those of the process that was killed
    stats = json.loads((tmp_path / "output" / "stats.json").read_text())
    chat_calls = stats["llm"]["total"]["calls"] - stats["llm"]["embed"]["calls"]
    assert sum(e["answers"] for e in stats["endpoints"]["chat"].values()) == chat_calls


def test_workers_share_the_endpoints_and_split_the_limits_of_shared_ones():
    from sensegraph.config import ChatSettings
    from sensegraph.llm.ray_workers import shares

    # two workers on four servers: each worker has a share of every server, so it can fail over
    four = ChatSettings(provider="openai", model="m", concurrency=8,
                        endpoints=[{"base_url": f"http://s{i}/v1"} for i in range(4)])
    assert [[(e.base_url, e.concurrency) for e in w.endpoints] for w in shares(four, 2)] == [
        [(f"http://s{i}/v1", 4) for i in range(4)]] * 2
    # three workers on two servers: each server's limits split exactly, the remainder to the first
    two = ChatSettings(provider="openai", model="m", concurrency=8, requests_per_minute=300,
                       endpoints=[{"base_url": "http://a/v1"}, {"base_url": "http://b/v1", "concurrency": 2}])
    parts = shares(two, 3)
    assert [[(e.base_url, e.concurrency, e.requests_per_minute) for e in w.endpoints] for w in parts] == [
        [("http://a/v1", 3, 100), ("http://b/v1", 1, 150)], [("http://a/v1", 3, 100), ("http://b/v1", 1, 150)],
        [("http://a/v1", 2, 100)]]
    # one server without an endpoints list: every worker gets a part of its limits, adding up to them
    one = ChatSettings(provider="openai", model="m", base_url="http://x/v1", concurrency=10, requests_per_minute=90)
    assert [(w.concurrency, w.requests_per_minute) for w in shares(one, 3)] == [(4, 30), (3, 30), (3, 30)]


def test_ray_with_the_embedded_model_is_refused_with_what_to_do(tmp_path):
    from sensegraph.llm.ray_workers import RayUnavailable, RayWorkers

    settings = load_settings(tmp_path, overrides={"ray": {"address": "auto"}}, env={})
    with pytest.raises(RayUnavailable, match="chat.provider openai"):
        RayWorkers(settings, "auto")
