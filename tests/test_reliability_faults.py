"""Faulty servers: transient faults change nothing, permanent ones are named, never dropped.

test_pipeline.py already covers a text unit whose extraction always fails (named, exit 1,
--allow-partial) and a failing community-report step resumed later; this file adds a full index
through 30% faults of every kind, and permanent failures in the summary and embedding steps.
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
from click.testing import CliRunner

from mock_llm import FAULTS, start_mock_server
from sensegraph.cli import main as cli_main
from sensegraph.index.summarize import entity_id
from sensegraph.store.tables import read_table
from test_pipeline import DOCS, FaultyServer, _cli_env, index, settings_for, snapshot, write_docs

FAULT_RATE = 0.30
# Small units and claims: ~110 requests, so every fault kind occurs several times.
SECTIONS = {"chunks": {"size": 60, "overlap": 10}, "extraction": {"claims": True}}


def bodies(server) -> set[str]:
    return {json.dumps(b, sort_keys=True) for b in server.requests}


def test_thirty_percent_faults_give_the_same_tables(tmp_path):
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    write_docs(clean, DOCS)
    write_docs(faulty, DOCS)
    with start_mock_server() as healthy:
        reference = index(settings_for(clean, healthy, **SECTIONS))
        clean_bodies = bodies(healthy)
    faults = {f: FAULT_RATE / len(FAULTS) for f in FAULTS}
    with start_mock_server(faults=faults, seed=1) as server:
        settings = settings_for(faulty, server, max_retries=10, **SECTIONS)
        for m in (settings.chat, settings.embedding):
            m.timeout = 0.5  # a "hang" costs half a second, not five minutes
        result = index(settings)
        by_fault = server.stats["by_fault"]
        faulty_bodies = bodies(server)
    faulty_requests = sum(n for f, n in by_fault.items() if f != "ok")
    assert set(by_fault) == {"ok", *FAULTS}, by_fault  # every kind of fault happened
    assert faulty_requests >= 0.2 * sum(by_fault.values()), by_fault
    assert result.failures == {} and result.stats["partial"] is False
    # Retries resend the identical request, so the faulty run asked exactly what the clean run
    # asked (some more than once), and got the same answers: the same tables.
    assert faulty_bodies == clean_bodies
    assert result.stats["llm"]["total"]["retries"] > 0 and reference.stats["llm"]["total"]["retries"] == 0
    assert snapshot(faulty / "output") == snapshot(clean / "output")


def _summary_request_about(name: str):
    marker = f"Entity or relationship: {name}\n"  # as the summarize prompt names its subject

    def check(body: dict[str, Any]) -> bool:
        plain = "response_format" not in body and "messages" in body
        return plain and any(marker in (m.get("content") or "") for m in body["messages"])
    return check


def test_failures_in_every_step_are_named_and_accepted_with_allow_partial(tmp_path):
    """The summary of Harbor Cooperative and embedding batches that mention Jonas Fell always
    fail: the run finishes everything else, exits 1, and names each failed item; with
    --allow-partial it exits 0 and stats.json records the same items."""
    write_docs(tmp_path, DOCS)

    def refuse(body: dict[str, Any]) -> bool:
        if "input" in body:
            return any("Jonas Fell" in t for t in body["input"])
        return _summary_request_about("Harbor Cooperative")(body)

    runner = CliRunner()
    with FaultyServer(refuse).start() as srv:
        env = _cli_env(srv)
        env["SENSEGRAPH_EMBEDDING__BATCH_SIZE"] = "2"
        failed = runner.invoke(cli_main, ["index", "--root", str(tmp_path)], env=env)
        assert failed.exit_code == 1, failed.output
        assert srv.refused > 0
        stats = json.loads((tmp_path / "output" / "stats.json").read_text())
        partial = runner.invoke(cli_main, ["index", "--root", str(tmp_path), "--allow-partial"], env=env)
    assert partial.exit_code == 0, partial.output
    assert "partial index" in partial.output

    out = tmp_path / "output"
    failures = stats["failures"]
    assert set(failures) == {"summarize", "embed"}, failures
    assert failures["summarize"] == [entity_id("Harbor Cooperative")]
    for step, ids in failures.items():
        for item in ids[:20]:  # the message lists up to 20 per step, stats.json all of them
            assert item in failed.output.replace("\n", ""), (step, item)
    assert stats["partial"] is True
    assert json.loads((out / "stats.json").read_text())["failures"] == failures  # the rerun records the same

    # The entity whose summary failed is kept, with its descriptions joined, not dropped.
    entities = read_table(out, "entities").set_index("id")
    kept = entities.loc[entity_id("Harbor Cooperative"), "description"]
    assert "Bluewater Foods" in kept and "Harbor Cooperative" in kept
    # Every row is either embedded or named as failed: nothing is missing silently.
    for name in ("text_units", "entities", "community_reports"):
        ids = set(read_table(out, name)["id"])
        embedded = set(pq.read_table(out / "embeddings" / f"{name}.parquet").column("id").to_pylist())
        named = {f.split(":", 1)[1] for f in failures["embed"] if f.startswith(name + ":")}
        assert embedded | named == ids and not embedded & named, name
    assert any(f.startswith("text_units:") for f in failures["embed"])
