"""Checkpoints are derived from what a step reads (index/steps.py), so a rerun after a failed call
gives exactly the tables of a clean run, and a change to anything a step reads reruns it."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pandas as pd
import pytest

from mock_llm import start_mock_server
from sensegraph.config import load_settings
from sensegraph.index import steps
from sensegraph.index.pipeline import IndexFailed
from test_pipeline import DOCS, FaultyServer, index, schema_name, settings_for, snapshot, stats_json, write_docs


# Two documents that state the same relationship in different words, so its descriptions are
# summarised by the LLM (the mock's relationships join a unit's first capitalised phrases).
ECHO = {"echo.txt": "The Harbor Cooperative of Port Ellison, founded by Maria Okafor and Daniel Reyes, "
                    "held its annual meeting."}


def _claims_call(body: dict[str, Any]) -> bool:
    return schema_name(body) == "ExtractedClaims"


def _relationship_summary(body: dict[str, Any]) -> bool:
    text = " ".join(m.get("content") or "" for m in body.get("messages") or [] if isinstance(m.get("content"), str))
    return "Entity or relationship:" in text and " -> " in text.split("Entity or relationship:", 1)[1].split("\n", 2)[0]


@pytest.mark.parametrize("fails", [_claims_call, _relationship_summary], ids=["claims", "relationship-summary"])
def test_fail_then_rerun_gives_the_tables_of_a_clean_run(tmp_path, fails):
    """Run 1 loses some calls (claims, or relationship summaries that fall back to joined text);
    run 2 against a healthy server must reach every table that depends on them: covariates,
    relationship descriptions, and the community reports built from them."""
    fresh, project = tmp_path / "fresh", tmp_path / "project"
    sections = {"extraction": {"claims": True}}
    for root in (fresh, project):
        write_docs(root, {**DOCS, **ECHO})
    with start_mock_server() as healthy:
        index(settings_for(fresh, healthy, **sections))

    with FaultyServer(fails).start() as broken:
        # The only server answers 500 to every such call, so after three in a row it is out and
        # those calls wait for it as for an outage (180 s by default) before they fail. What this
        # test checks is the rerun, not that wait.
        with pytest.raises(IndexFailed):
            index(settings_for(project, broken, max_retries=1, outage_timeout=3.0, **sections))
        assert broken.refused > 0
    with start_mock_server() as healthy:
        second = index(settings_for(project, healthy, **sections))
    assert second.failures == {}
    assert stats_json(project)["partial"] is False
    got, want = snapshot(project / "output"), snapshot(fresh / "output")
    for name in want:
        assert got[name] == want[name], f"{name} differs from a clean run after fail-then-rerun"
    assert want["covariates"], "the test corpus should yield claims"


def test_a_change_to_a_setting_a_step_reads_reruns_it_and_only_what_depends_on_it(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        index(settings_for(tmp_path, server))
        before = snapshot(tmp_path / "output")["communities"]
        # communities.max_cluster_size is read by clustering only: extraction and summaries are
        # skipped, clustering reruns; reports rerun only if the communities changed.
        again = index(settings_for(tmp_path, server, communities={"max_cluster_size": 3}))
    st = again.stats["steps"]
    assert st["extract"].get("skipped") and st["summarize"].get("skipped")
    assert not st["communities"].get("skipped")
    assert snapshot(tmp_path / "output")["communities"] != before
    state = json.loads((tmp_path / "output" / steps.STATE_FILE).read_text())
    # what each step read was recorded by observation, not listed by hand
    assert "communities.max_cluster_size" in state["communities"]["reads"]["settings"]
    assert "communities.max_cluster_size" not in state["extract"]["reads"]["settings"]
    assert any(p[0] == "extract_graph" for p in state["extract"]["reads"]["prompts"])


def test_editing_a_prompt_reruns_the_step_that_loads_it(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server)
        index(settings)
        from sensegraph.prompts import load_prompt
        custom = tmp_path / "prompts" / "en" / "community_report.txt"
        custom.parent.mkdir(parents=True, exist_ok=True)
        custom.write_text(load_prompt("community_report", "en") + "\nBe brief.\n", encoding="utf-8")
        again = index(settings)
    st = again.stats["steps"]
    assert st["extract"].get("skipped") and st["summarize"].get("skipped") and st["communities"].get("skipped")
    assert not st["community_reports"].get("skipped") and st["community_reports"]["calls"] > 0


def test_recorder_sees_reads_through_methods_and_sections(tmp_path):
    settings = load_settings(tmp_path, env={})
    rec = steps.SettingsRecorder(settings)
    assert rec.extraction.max_gleanings == settings.extraction.max_gleanings
    rec.summary_input_tokens()  # a Settings method: its own reads are recorded too
    assert "extraction.max_gleanings" in rec.reads
    assert any(r.startswith("summarize.") for r in rec.reads)
    # a value read back through the recorded path is the value the step saw
    assert steps.read_path(settings, "extraction.max_gleanings") == settings.extraction.max_gleanings


def test_table_fingerprint_sees_content_order_and_list_cells():
    a = pd.DataFrame({"id": ["x", "y"], "ids": [["1"], ["2", "3"]]})
    b = a.copy()
    b.at[1, "ids"] = ["2"]
    assert steps.table_fingerprint(a) == steps.table_fingerprint(a.copy())
    assert steps.table_fingerprint(a) != steps.table_fingerprint(b)
    assert steps.table_fingerprint(a) != steps.table_fingerprint(a.iloc[::-1].reset_index(drop=True))


def test_index_after_an_update_keeps_its_numbers_and_costs_nothing(tmp_path):
    """An updated index has stable numbers (numbering.py); a later `index` run keeps them, so it
    neither renumbers rows nor rewrites the reports whose context quotes those numbers."""
    from sensegraph.index.update import run_update

    first = dict(list(DOCS.items())[:2])
    write_docs(tmp_path, first)
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server)
        index(settings)
        write_docs(tmp_path, DOCS)  # one document more
        asyncio.run(run_update(settings, log=lambda m: None))
        updated = snapshot(tmp_path / "output")
        before = server.stats["requests"]
        again = index(settings)
        assert server.stats["requests"] == before, "index after update made requests"
    assert again.stats["steps"]["community_reports"].get("skipped")
    assert snapshot(tmp_path / "output") == updated


def test_a_run_stopped_by_its_budget_leaves_no_checkpoint_over_its_partial_tables(tmp_path):
    """Extraction writes its work tables even when the budget stops the run; from then on they
    are not those of the last complete run, so going back to that run's input must not skip
    the step with them."""
    from sensegraph.index.pipeline import BudgetStopped

    first = dict(list(DOCS.items())[:2])
    write_docs(tmp_path, first)
    with start_mock_server() as server:
        index(settings_for(tmp_path, server))
        complete = snapshot(tmp_path / "output")
        write_docs(tmp_path, {"extra.txt": DOCS["observatory.txt"]})
        with pytest.raises(BudgetStopped):
            index(settings_for(tmp_path, server, concurrency=1, chat={**settings_for(
                tmp_path, server).chat.model_dump(), "concurrency": 1, "budget_tokens": 1}))
        (tmp_path / "input" / "extra.txt").unlink()
        index(settings_for(tmp_path, server))
    assert snapshot(tmp_path / "output") == complete


def test_a_state_file_of_an_older_version_reruns_the_steps_instead_of_failing(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server)
        index(settings)
        expected = snapshot(tmp_path / "output")
        # bare fingerprints, as state.json held them before the step runner
        (tmp_path / "output" / steps.STATE_FILE).write_text(json.dumps({"extract": "0" * 32, "summarize": "1" * 32}))
        before = server.stats["requests"]
        again = index(settings)
        assert server.stats["requests"] == before  # rerun from the cache
    assert not again.stats["steps"]["extract"].get("skipped")
    assert snapshot(tmp_path / "output") == expected


def test_table_fingerprint_is_the_same_for_a_table_read_back_from_parquet(tmp_path):
    from sensegraph.store.tables import read_table, write_table

    made = pd.DataFrame({"title": ["a", "b"], "n": [1, 2], "ids": [["x"], []]}).astype({"title": object})
    write_table(made, tmp_path, "t")
    assert steps.table_fingerprint(read_table(tmp_path, "t")) == steps.table_fingerprint(made)


def test_a_failed_update_tells_to_rerun_the_update(tmp_path):
    from sensegraph.index.update import run_update
    from test_pipeline import FAILING_DOC, MARKER, contains

    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        index(settings_for(tmp_path, server))
    write_docs(tmp_path, {"lighthouse.txt": FAILING_DOC})
    with FaultyServer(contains(MARKER)).start() as broken:
        with pytest.raises(IndexFailed) as exc:
            asyncio.run(run_update(settings_for(tmp_path, broken, max_retries=1), log=lambda m: None))
    assert "Rerun `sensegraph update`" in str(exc.value)


def test_an_unchanged_index_after_an_update_skips_every_step(tmp_path):
    """After `sensegraph update`, the next `index` of the same input reads nothing new: every
    checkpointed step is skipped, not rerun from the cache (summarize and communities were)."""
    from sensegraph.index.update import run_update

    write_docs(tmp_path, dict(list(DOCS.items())[:2]))
    with start_mock_server() as server:
        settings = settings_for(tmp_path, server)
        index(settings)
        write_docs(tmp_path, DOCS)
        asyncio.run(run_update(settings, log=lambda m: None))
        again = index(settings)
        third = index(settings)
    for run in (again, third):
        ran = [name for name, st in run.stats["steps"].items()
               if name in ("extract", "summarize", "communities", "community_reports") and not st.get("skipped")]
        assert ran == [], f"an unchanged index after an update reran {ran}"


def test_changing_only_the_embedding_model_reruns_no_llm_step_that_does_not_embed(tmp_path):
    """Without entity resolution, summarize never embeds: a new embedding model must not rerun it
    (nor anything after it); only the vectors are redone."""
    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        index(settings_for(tmp_path, server))
        s = settings_for(tmp_path, server)
        other = s.model_copy(update={"embedding": s.embedding.model_copy(update={"model": "other-embedder"})})
        again = index(other)
    st = again.stats["steps"]
    for name in ("extract", "summarize", "communities", "community_reports"):
        assert st[name].get("skipped"), f"{name} reran for a change of embedding.model only"


def test_a_local_chat_model_is_identified_by_its_settings_before_and_after_its_first_call(tmp_path):
    """With `provider: local` the model name is known once the embedded server has started; a
    step's fingerprint must not depend on whether a call happened before it was taken, or an
    unchanged project reruns summarize on its second run and the reports on its third."""
    from sensegraph.llm.client import ChatClient

    s = load_settings(tmp_path, env={})
    assert s.chat.provider == "local"
    client = ChatClient(s.chat, cache=None)
    before = steps._input_fingerprint(client, s)
    client.model = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"  # what the first call resolves it to
    assert steps._input_fingerprint(client, s) == before
    other = load_settings(tmp_path, overrides={"local": {"size": "0.5b"}}, env={})
    assert steps._input_fingerprint(ChatClient(other.chat, cache=None), other) != before


def test_a_new_version_of_the_leiden_library_reruns_clustering_only(tmp_path, monkeypatch):
    """The code that computes a step's tables includes the libraries it calls: another
    graspologic-native may cluster differently, so clustering reruns (extraction does not)."""
    import importlib.metadata

    write_docs(tmp_path, DOCS)
    with start_mock_server() as server:
        index(settings_for(tmp_path, server))
        real = importlib.metadata.version
        monkeypatch.setattr(importlib.metadata, "version",
                            lambda name: "99.0" if name == "graspologic-native" else real(name))
        again = index(settings_for(tmp_path, server))
    st = again.stats["steps"]
    assert not st["communities"].get("skipped")
    assert st["extract"].get("skipped") and st["summarize"].get("skipped")
