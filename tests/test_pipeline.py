"""The whole indexing pipeline against the mock OpenAI-compatible server (tests/mock_llm.py).

No real model: the mock answers every structured request with a schema-valid instance built from
the capitalised phrases of the input, so extraction finds real names, summaries and reports come
back, and embeddings are served too. Each test gets its own server, so its request counts are the
requests of that test alone.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from mock_llm import MockServer, start_mock_server
from scripted import SchemaNames
from sensegraph.cli import main as cli_main
from sensegraph.config import SettingsError, load_settings
from sensegraph.index import community_reports, report_checks
from sensegraph.index.pipeline import IndexFailed, run_index
from sensegraph.prompts import load_prompt
from sensegraph.store.tables import TABLES, read_table

MTIME = 1_700_000_000  # fixed file times: documents.creation_date comes from the mtime

DOCS = {
    "harbor.txt": (
        "The Harbor Cooperative of Port Ellison was founded in 1998 by Maria Okafor and Daniel Reyes. "
        "Maria Okafor had worked for twenty years at the Northern Shipping Company before she left to "
        "organise the fishing families of Port Ellison. Daniel Reyes, a former union negotiator, wrote "
        "the first charter of the cooperative and chaired its board until 2010. The cooperative buys "
        "fuel and ice in bulk, runs a cold store on Pier Nine, and sells the catch directly to the "
        "Ellison Fish Market every morning. In 2004 the Harbor Cooperative signed a supply agreement "
        "with Bluewater Foods, a processor based in Halden. The agreement doubled the income of the "
        "member boats within three years. Critics at the Port Ellison Town Council argued that the "
        "cooperative had become too dependent on Bluewater Foods. Maria Okafor answered that the "
        "agreement could be ended with six months of notice, and that the Ellison Fish Market still "
        "took a third of the catch. When the Great Storm of 2012 destroyed Pier Nine, the cooperative "
        "rebuilt the cold store with a loan from the Coastal Development Bank. Daniel Reyes negotiated "
        "the loan, and the Coastal Development Bank later praised the cooperative as a model for other "
        "fishing towns along the coast."
    ),
    "council.txt": (
        "The Island Council of Maren governs the three islands of the Maren Archipelago. Its chair, "
        "Elena Voss, was elected in 2015 after a campaign about the ferry service. The ferry between "
        "Maren Harbour and the mainland port of Halden is run by the Halden Ferry Line, a private "
        "company owned by Tomas Brandt. Elena Voss accused the Halden Ferry Line of cutting winter "
        "sailings to save money, and the Island Council of Maren opened an inquiry in 2016. The "
        "inquiry was led by Judge Ingrid Sol, who found that the ferry contract allowed the cuts. "
        "Tomas Brandt agreed to restore two winter sailings in exchange for a longer contract. The "
        "Island Council of Maren also funds the Maren Fisheries School, which trains young people "
        "from the islands for work on the boats of the Harbor Cooperative in Port Ellison. Elena Voss "
        "visited Port Ellison in 2017 and met Maria Okafor to discuss a shared fish auction. The "
        "shared auction opened in 2019 at Maren Harbour and is managed jointly by the Island Council "
        "of Maren and the Harbor Cooperative."
    ),
    "observatory.txt": (
        "The Halden Observatory stands on Mount Kell above the town of Halden. It was built in 1921 "
        "by the astronomer Jonas Fell with money from the Halden Science Society. Jonas Fell "
        "discovered the comet that carries his name in 1930 and trained a generation of observers, "
        "among them Clara Hesse, who later directed the Northern Institute of Astronomy. In 1978 the "
        "Halden Science Society sold the observatory to the University of Halden, which installed a "
        "new telescope built by Kessler Optics. Clara Hesse returned to Halden for the opening of the "
        "new telescope and gave a lecture about Jonas Fell. Today the University of Halden runs "
        "public evenings at the Halden Observatory every Friday, and the Halden Ferry Line offers "
        "special sailings from Maren Harbour for visitors from the islands. The Northern Institute "
        "of Astronomy and the University of Halden share the telescope time equally."
    ),
}
# One short document (a single text unit) whose extraction the faulty server always refuses.
MARKER = "QUARANTINE-MARKER-7731"
FAILING_DOC = (f"The Lighthouse Trust of Cape Arlo keeps the old lamp burning. {MARKER} "
               "Its keeper, Oskar Lind, writes the monthly bulletin.")
CHINESE_DOC = (
    "海港合作社成立于一九九八年，创始人是王丽华和陈国强。王丽华曾在北方航运公司工作二十年，后来离开公司，"
    "组织港口的渔民家庭。陈国强曾是工会谈判代表，他起草了合作社的第一份章程，并担任理事会主席直到二零一零年。"
    "合作社统一采购燃油和冰块，在九号码头经营冷库，每天早上把渔获直接卖给埃利森鱼市。二零零四年，海港合作社"
    "与蓝水食品公司签订了供货协议。蓝水食品公司总部位于哈尔登。协议使会员渔船的收入在三年内翻了一番。"
    "港口镇议会的批评者认为合作社过于依赖蓝水食品公司。王丽华回应说，协议可以提前六个月通知终止。"
    "二零一二年的大风暴摧毁了九号码头，合作社向沿海发展银行贷款重建了冷库。陈国强负责谈判这笔贷款，"
    "沿海发展银行后来称赞合作社是沿海其他渔镇的榜样。"
)


# -- helpers ---------------------------------------------------------------------------------------
class FaultyServer(MockServer):
    """The mock server, answering 500 to every request for which `fail_when(body)` is true."""

    def __init__(self, fail_when: Callable[[dict[str, Any]], bool], **kwargs: Any):
        super().__init__(**kwargs)
        self.fail_when = fail_when
        self.refused = 0
        self._names = SchemaNames()  # a request of that kind fails in JSON mode too

    async def _respond(self, method, path, raw, reader, writer):  # type: ignore[override]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict) and self.fail_when(self._names.named(body)):
            with self._lock:
                self._by_kind["refused"] += 1
                self.refused += 1
            self._send(writer, 500, {"error": {"message": "refused by test", "type": "server_error",
                                               "param": None, "code": "server_error"}})
            return True
        return await super()._respond(method, path, raw, reader, writer)


def schema_name(body: dict[str, Any]) -> str:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("name") or ""


def contains(marker: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: any(marker in (m.get("content") or "") for m in body.get("messages") or []
                            if isinstance(m.get("content"), str))


def is_report(body: dict[str, Any]) -> bool:
    return schema_name(body) == "Report"


def write_docs(root: Path, docs: dict[str, str]) -> None:
    (root / "input").mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        p = root / "input" / name
        p.write_text(text, encoding="utf-8")
        os.utime(p, (MTIME, MTIME))


def endpoint(server: MockServer, **extra: Any) -> dict[str, Any]:
    return {"provider": "openai", "base_url": server.base_url, "model": "mock", "api_key": "x",
            "retry_base_seconds": 0.01, **extra}


def settings_for(root: Path, server: MockServer, *, max_retries: int = 6, concurrency: int = 8,
                 outage_timeout: float | None = None, **sections: Any):
    # outage_timeout: for a server that fails every call of one kind, which the client takes for
    # an outage and waits out (180 s by default) before those calls fail.
    chat = endpoint(server, max_retries=max_retries, concurrency=concurrency,
                    **({"outage_timeout": outage_timeout} if outage_timeout else {}))
    overrides = {"chat": chat,
                 "embedding": endpoint(server, max_retries=max_retries),
                 "chunks": {"size": 120, "overlap": 20}, **sections}
    return load_settings(root, overrides=overrides, env={})  # env={}: no SENSEGRAPH_* leaking in


def index(settings, **kwargs: Any):
    return asyncio.run(run_index(settings, log=lambda m: None, **kwargs))


def read_all(output: Path) -> dict[str, pd.DataFrame]:
    return {name: read_table(output, name) for name in TABLES}


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, float) and np.isnan(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def snapshot(output: Path) -> dict[str, list[dict[str, Any]]]:
    """Every table as plain rows (arrays -> lists), comparable with ==."""
    return {name: [{k: _plain(v) for k, v in row.items()} for row in df.to_dict("records")]
            for name, df in read_all(output).items()}


def stats_json(root: Path) -> dict[str, Any]:
    return json.loads((root / "output" / "stats.json").read_text())


@pytest.fixture
def server():
    with start_mock_server() as s:
        yield s


# -- tests -----------------------------------------------------------------------------------------
def test_full_index_tables_and_invariants(tmp_path, server):
    write_docs(tmp_path, DOCS)
    result = index(settings_for(tmp_path, server))
    out = tmp_path / "output"
    assert result.failures == {} and result.stats["partial"] is False

    tables = read_all(out)
    for name, columns in TABLES.items():
        assert (out / f"{name}.parquet").is_file()
        missing = [c for c in columns if c not in tables[name].columns]
        assert not missing, f"{name} lacks {missing}"
    docs, units, ents, rels = (tables[n] for n in ("documents", "text_units", "entities", "relationships"))
    comms, reports = tables["communities"], tables["community_reports"]
    assert len(docs) == 3 and len(units) >= 6  # 120-token units: several per document
    assert len(ents) > 10 and len(rels) > 5 and len(comms) > 0

    titles = set(ents["title"])
    assert {"Maria Okafor", "Harbor Cooperative", "Elena Voss"} <= titles  # names really from the text
    for r in rels.itertuples():
        assert r.source in titles and r.target in titles, (r.source, r.target)

    # every level of the hierarchy is a complete, exclusive partition of the entities
    all_ids = sorted(ents["id"])
    assert len(set(all_ids)) == len(all_ids)
    for level, group in comms.groupby("level"):
        members = [e for ids in group["entity_ids"] for e in ids]
        assert sorted(members) == all_ids, f"level {level} is not a partition of the entities"
    # every community (carried ones included) has exactly one report
    assert sorted(reports["community"]) == sorted(comms["community"])
    assert reports["full_content"].str.len().min() > 0

    # links between tables point to existing rows
    ent_ids, rel_ids, unit_ids = set(ents["id"]), set(rels["id"]), set(units["id"])
    for u in units.itertuples():
        assert set(u.entity_ids) <= ent_ids and set(u.relationship_ids) <= rel_ids
    assert sum(len(u) for u in units["entity_ids"]) > 0
    for e in ents.itertuples():
        assert set(e.text_unit_ids) <= unit_ids and len(e.text_unit_ids) > 0
    covered = [t for ids in docs["text_unit_ids"] for t in ids]
    assert sorted(covered) == sorted(unit_ids)
    assert set(units["document_id"]) == set(docs["id"])
    assert sorted(units["human_readable_id"]) == list(range(len(units)))

    stats = stats_json(tmp_path)
    assert stats["language"] == "en" and stats["partial"] is False and stats["failures"] == {}
    for step in ("documents", "text_units", "extract", "summarize", "communities", "community_reports", "embed"):
        assert "seconds" in stats["steps"][step] and stats["steps"][step]["failures"] == []
    for step in ("extract", "summarize", "community_reports", "embed"):
        entry = stats["steps"][step]
        for key in ("calls", "cache_hits", "prompt_tokens", "retries"):
            assert key in entry, (step, key)
        assert entry["calls"] > 0 and entry["prompt_tokens"] > 0
    assert stats["steps"]["extract"]["calls"] >= len(units)  # one call per unit at least (+ gleaning)
    # what the checks of the report answers dropped, and why (report_checks.py)
    checks = stats["steps"]["community_reports"]["checks"]
    assert set(checks) == set(report_checks.COUNTS) and checks["reports_checked"] > 0
    assert checks["findings_written"] == sum(checks[k] for k in (
        "findings_kept", "findings_bookkeeping", "findings_uncited", "findings_unsupported"))
    written = reports[~reports["carried"] & ~reports["rating_explanation"].isin(
        [community_reports.SINGLE_ENTITY_EXPLANATION["en"], community_reports.ELEMENTARY_EXPLANATION["en"]])]
    assert checks["reports_checked"] == len(written)
    assert checks["findings_kept"] == written["findings"].map(len).sum()
    # the server saw exactly the requests the stats count
    assert server.stats["requests"] == stats["llm"]["total"]["requests"]


def test_an_index_run_puts_the_interpreter_settings_back(tmp_path, server, monkeypatch):
    import gc
    import sys

    from sensegraph.index import pipeline

    before = sys.getswitchinterval()
    seen: list[tuple[float, int]] = []
    real = pipeline._summarize

    async def summarize(**kw):  # what the run sets while it runs
        seen.append((sys.getswitchinterval(), gc.get_freeze_count()))
        return await real(**kw)
    monkeypatch.setattr(pipeline, "_summarize", summarize)
    write_docs(tmp_path, DOCS)
    index(settings_for(tmp_path, server))
    assert seen and seen[0][0] == min(before, pipeline.SWITCH_INTERVAL) and seen[0][1] > 0
    assert sys.getswitchinterval() == before and gc.get_freeze_count() == 0


def test_rerun_costs_no_calls_and_gives_identical_tables(tmp_path, server):
    write_docs(tmp_path, DOCS)
    settings = settings_for(tmp_path, server)
    index(settings)
    first = snapshot(tmp_path / "output")
    before = server.stats["requests"]
    assert before > 0

    second = index(settings)
    assert server.stats["requests"] == before, "a rerun made requests"
    assert second.stats["llm"]["total"]["calls"] == 0
    assert all(second.stats["steps"][s].get("skipped") for s in ("extract", "summarize", "community_reports"))
    assert snapshot(tmp_path / "output") == first


def test_resume_after_report_step_failed(tmp_path):
    """Run 1 dies in the community-report step; run 2 (healthy server) makes only the missing calls."""
    write_docs(tmp_path, DOCS)
    fresh = tmp_path / "fresh"
    project = tmp_path / "project"
    write_docs(fresh, DOCS)
    write_docs(project, DOCS)

    with start_mock_server() as healthy:
        reference = index(settings_for(fresh, healthy))
    ref_extract_calls = reference.stats["steps"]["extract"]["calls"]
    ref_reports = reference.stats["steps"]["community_reports"]["calls"]  # reports written from rows cost none
    assert 0 < ref_reports

    with FaultyServer(is_report).start() as broken:
        with pytest.raises(IndexFailed) as exc:
            index(settings_for(project, broken, max_retries=1, outage_timeout=3.0))
        assert broken.refused > 0
        first_stats = stats_json(project)
    assert "community_reports" in str(exc.value)
    assert first_stats["steps"]["extract"]["calls"] == ref_extract_calls  # extraction had finished
    assert len(first_stats["failures"]["community_reports"]) > 0

    with start_mock_server() as healthy:
        second = index(settings_for(project, healthy))
        chat_requests = [b for b in healthy.requests if "messages" in b]
        assert len(chat_requests) == ref_reports  # only the reports: no extraction, no summaries
        assert all(schema_name(b) == "Report" for b in chat_requests)
    assert second.stats["steps"]["extract"].get("skipped") and second.stats["steps"]["extract"]["calls"] == 0
    assert second.stats["steps"]["summarize"]["calls"] == 0
    assert second.failures == {}
    assert snapshot(project / "output") == snapshot(fresh / "output")


def test_resume_after_cancel_during_extraction(tmp_path):
    """Cancel the run after some extraction answers arrived; the rerun repeats none of them."""
    fresh, project = tmp_path / "fresh", tmp_path / "project"
    write_docs(fresh, DOCS)
    write_docs(project, DOCS)
    with start_mock_server() as healthy:
        reference = index(settings_for(fresh, healthy))
    ref_extract = reference.stats["steps"]["extract"]["calls"]

    with start_mock_server(latency=0.02) as slow:
        # Two requests at a time: once 6 have reached the server, at least 4 answers are back.
        settings = settings_for(project, slow, concurrency=2)

        async def run_then_cancel() -> int:
            task = asyncio.create_task(run_index(settings, log=lambda m: None))
            while slow.stats["by_kind"].get("chat", 0) < 6 and not task.done():
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return slow.stats["by_kind"].get("chat", 0)

        seen_before_cancel = asyncio.run(run_then_cancel())
    assert 6 <= seen_before_cancel < ref_extract  # really interrupted inside extraction

    with start_mock_server() as healthy:
        second = index(settings_for(project, healthy))
    ex = second.stats["steps"]["extract"]
    assert ex["cache_hits"] > 0, "answers received before the interruption were not kept"
    assert ex["calls"] + ex["cache_hits"] == ref_extract
    assert ex["calls"] < ref_extract
    assert snapshot(project / "output") == snapshot(fresh / "output")


def _failing_unit_id(root: Path) -> str:
    units = read_table(root / "output", "text_units")
    ids = [u.id for u in units.itertuples() if MARKER in u.text]
    assert len(ids) == 1
    return ids[0]


def test_failed_unit_is_reported_not_dropped(tmp_path):
    write_docs(tmp_path, {**DOCS, "lighthouse.txt": FAILING_DOC})
    with FaultyServer(contains(MARKER)).start() as srv:
        settings = settings_for(tmp_path, srv, max_retries=1)
        with pytest.raises(IndexFailed) as exc:
            index(settings)
        bad = _failing_unit_id(tmp_path)
        assert bad in str(exc.value)
        assert exc.value.failures["extract"] == [bad]
        stats = stats_json(tmp_path)
        assert stats["failures"]["extract"] == [bad] and stats["partial"] is True
        assert stats["steps"]["extract"]["failures"] == [bad]
        entities = read_table(tmp_path / "output", "entities")
        assert {"Maria Okafor", "Elena Voss", "Jonas Fell"} <= set(entities["title"])  # the others are there
        assert "Oskar Lind" not in set(entities["title"])

        partial = index(settings, allow_partial=True)
        assert partial.stats["partial"] is True
        assert partial.failures["extract"] == [bad]
        assert stats_json(tmp_path)["failures"]["extract"] == [bad]


def _cli_env(server: MockServer, *, chunks: bool = True) -> dict[str, str]:
    env = {}
    for section in ("CHAT", "EMBEDDING"):
        env.update({f"SENSEGRAPH_{section}__PROVIDER": "openai", f"SENSEGRAPH_{section}__BASE_URL": server.base_url,
                    f"SENSEGRAPH_{section}__MODEL": "mock", f"SENSEGRAPH_{section}__API_KEY": "x",
                    f"SENSEGRAPH_{section}__RETRY_BASE_SECONDS": "0.01",
                    f"SENSEGRAPH_{section}__MAX_RETRIES": "1"})
    if chunks:
        env.update({"SENSEGRAPH_CHUNKS__SIZE": "120", "SENSEGRAPH_CHUNKS__OVERLAP": "20"})
    return env


def test_cli_init_dry_run_and_failing_index(tmp_path):
    runner = CliRunner()
    root = tmp_path / "proj"
    first = runner.invoke(cli_main, ["init", "--root", str(root)])
    assert first.exit_code == 0, first.output
    assert (root / "settings.yaml").is_file()
    (root / "settings.yaml").write_text("# edited by the user\n", encoding="utf-8")
    again = runner.invoke(cli_main, ["init", "--root", str(root)])
    assert again.exit_code != 0
    assert (root / "settings.yaml").read_text(encoding="utf-8") == "# edited by the user\n"
    forced = runner.invoke(cli_main, ["init", "--root", str(root), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "edited by the user" not in (root / "settings.yaml").read_text(encoding="utf-8")

    write_docs(root, {**DOCS, "lighthouse.txt": FAILING_DOC})
    with FaultyServer(contains(MARKER)).start() as srv:
        env = _cli_env(srv)
        dry = runner.invoke(cli_main, ["index", "--root", str(root), "--dry-run"], env=env)
        assert dry.exit_code == 0, dry.output
        assert "calls" in dry.output.lower() and "extract" in dry.output.lower()
        assert srv.stats["requests"] == 0, "--dry-run called the server"
        assert not (root / "output" / "entities.parquet").exists()

        failed = runner.invoke(cli_main, ["index", "--root", str(root)], env=env)
        assert failed.exit_code == 1, failed.output
        bad = _failing_unit_id(root)
        assert bad in failed.output
        assert srv.stats["requests"] > 0

        partial = runner.invoke(cli_main, ["index", "--root", str(root), "--allow-partial"], env=env)
        assert partial.exit_code == 0, partial.output


@pytest.mark.parametrize("yaml_text, key", [
    ("chunks:\n  size: 100\n  overlap: 100\n", "chunks"),
    ("chunks:\n  sise: 300\n", "sise"),
    ("extraction:\n  max_gleanings: -1\n", "extraction.max_gleanings"),
])
def test_bad_setting_fails_before_any_request(tmp_path, server, yaml_text, key):
    write_docs(tmp_path, DOCS)
    (tmp_path / "settings.yaml").write_text(yaml_text, encoding="utf-8")
    with pytest.raises(SettingsError) as exc:
        load_settings(tmp_path, overrides={"chat": endpoint(server), "embedding": endpoint(server)}, env={})
    assert key in str(exc.value)

    result = CliRunner().invoke(cli_main, ["index", "--root", str(tmp_path)],
                                env=_cli_env(server, chunks=False))
    assert result.exit_code == 2
    assert key in result.output
    assert server.stats["requests"] == 0


def test_chinese_document_uses_chinese_prompts(tmp_path, server):
    write_docs(tmp_path, {"harbor-zh.txt": CHINESE_DOC})
    result = index(settings_for(tmp_path, server))
    assert result.stats["language"] == "zh"
    assert stats_json(tmp_path)["language"] == "zh"
    opening = load_prompt("extract_graph", "zh", tmp_path).strip().splitlines()[0][:12]
    english = load_prompt("extract_graph", "en", tmp_path).strip().splitlines()[0][:30]
    chat = [b for b in server.requests if "messages" in b]
    texts = ["\n".join(m.get("content") or "" for m in b["messages"]) for b in chat]
    assert any(opening in t for t in texts), "no request used the Chinese extraction prompt"
    assert not any(english in t for t in texts)
    entities = read_table(tmp_path / "output", "entities")
    assert len(entities) > 0
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in entities["title"])
    reports = read_table(tmp_path / "output", "community_reports")
    assert len(reports) == len(read_table(tmp_path / "output", "communities"))


def test_text_units_are_embedded_while_extraction_runs(tmp_path):
    # The text-unit vectors do not wait for the embed step: they are made (into the cache)
    # while the LLM extracts, and the embed step then finds them there.
    with start_mock_server(latency=0.05) as server:
        write_docs(tmp_path, DOCS)
        result = index(settings_for(tmp_path, server, concurrency=2))
        bodies = list(server.requests)
    assert result.failures == {}
    unit_texts = set(read_table(tmp_path / "output", "text_units")["text"])
    kinds = ["embed-unit" if "input" in b and set(b["input"]) & unit_texts else
             "extract" if schema_name(b) == "ExtractedGraph" else "other" for b in bodies]
    first_embed, last_extract = kinds.index("embed-unit"), len(kinds) - 1 - kinds[::-1].index("extract")
    assert first_embed < last_extract
    # every text unit was embedded exactly once in the whole run
    embedded = [t for b in bodies if "input" in b for t in b["input"] if t in unit_texts]
    assert sorted(embedded) == sorted(unit_texts)


def test_an_index_written_to_a_log_file_shows_its_progress_as_it_goes(tmp_path, server, monkeypatch):
    """Where the output is not a terminal (a log file, CI, nohup) rich drew the bars only at the
    end, so a 55-minute index of the embedded model said nothing for 55 minutes. Each step now
    prints a line when its first item is done, every cli.common.PLAIN_EVERY seconds and when it
    is done; a rerun that skips the step prints none for it."""
    from sensegraph.cli import common

    monkeypatch.setattr(common, "PLAIN_EVERY", 0.0)  # every advance: the lines are then countable
    write_docs(tmp_path, DOCS)
    result = CliRunner().invoke(cli_main, ["index", "--root", str(tmp_path)], env=_cli_env(server))
    assert result.exit_code == 0, result.output
    units = len(read_table(tmp_path / "output", "text_units"))
    lines = [line for line in result.output.splitlines() if line.startswith("extract: ")]
    assert lines[0].startswith(f"extract: 1 of {units} ")
    assert lines[-1].startswith(f"extract: {units} of {units} (100%), ")
    assert len(lines) == units  # one line per unit, each saying what is left until the last
    assert all(" left" in line for line in lines[:-1]) and " left" not in lines[-1]
    assert any(line.startswith("community reports: ") for line in result.output.splitlines())
    again = CliRunner().invoke(cli_main, ["index", "--root", str(tmp_path)], env=_cli_env(server))
    assert again.exit_code == 0 and "extract: " not in again.output  # nothing changed: skipped


def test_the_index_summary_names_the_retries_and_where_to_read_the_rejected_answers(tmp_path, server):
    write_docs(tmp_path, DOCS)
    server.script.extend(["invalid", "length"])  # the first two chat answers cannot be used
    result = CliRunner().invoke(cli_main, ["index", "--root", str(tmp_path)], env=_cli_env(server))
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "retries" in line)
    assert "2 (server faults" in row and "sensegraph doctor --rejected" in result.output
    shown = CliRunner().invoke(cli_main, ["doctor", "--root", str(tmp_path), "--rejected", "5"])
    assert "2 rejected answer(s) shown" in shown.output
