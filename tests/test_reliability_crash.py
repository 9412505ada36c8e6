"""SIGKILL `sensegraph index` (a real subprocess) at seeded random moments inside each step that
calls a model (aimed by the run's own requests, so on any machine's timing), rerun it each time.

The mock server runs in a thread of the test process with some latency, so kills land while
requests are in flight. After every kill all tables, JSON files and the answer cache must read
back; every run that ends by itself must succeed, the last with the same tables as an
uninterrupted run; no run may ask for an answer that is already in the cache; and the
interrupted runs together may ask for at most 1% more than the uninterrupted run beyond the
requests in flight at the kills (those whose answer never reached the cache; tests/kill_harness.py).
"""
from __future__ import annotations

from kill_harness import SETTINGS, cli_env, reference_run, run_with_kills
from mock_llm import start_mock_server
from test_pipeline import DOCS, snapshot, write_docs

LATENCY = 0.02
LLM_STEPS = {"extract", "summarize", "community_reports", "embed"}


def test_sigkill_at_random_moments_loses_no_finished_work(tmp_path):
    ref, project = tmp_path / "ref", tmp_path / "killed"
    write_docs(ref, DOCS)
    write_docs(project, DOCS)
    with start_mock_server(latency=LATENCY) as server:
        # 60-token units (~80 requests) keep the dozen runs short; bench/kill_index.py uses 40.
        env = cli_env(server.base_url, **{**SETTINGS, "chunks__size": "60", "chunks__overlap": "10"})
        steps = reference_run(ref, server, env)
        report = run_with_kills(project, server, env, reference=steps, kills=10, startup_kills=1, seed=11,
                                latency=LATENCY)
    summary = report.as_dict()
    assert len(report.kills) >= 10, summary
    assert LLM_STEPS <= set(summary["kills_per_step"]), summary  # killed inside every step that calls a model
    assert report.exit_codes and all(code == 0 for code in report.exit_codes), summary
    # Later kills found the finished tables on disk and read every one back (check_outputs raises otherwise).
    assert max(k.files_checked for k in report.kills) >= 8, summary
    assert report.lost > 0, summary  # kills really hit requests in flight
    assert report.wasted == 0, summary  # no stored answer was ever asked for again
    assert report.extra_requests <= report.lost + 0.01 * report.reference_requests, summary
    assert snapshot(project / "output") == snapshot(ref / "output")
