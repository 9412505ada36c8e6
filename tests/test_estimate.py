"""`index --dry-run`: the estimator, fed the ratios measured on an index, predicts that index's calls.

The ratios in estimate.MEASURED come from real runs through `measured_ratios`; this checks the
two ends meet (what is measured is what the estimator multiplies), against the mock server.
"""
from __future__ import annotations

from click.testing import CliRunner

from mock_llm import start_mock_server
from sensegraph.cli import main as cli_main
from sensegraph.config import load_settings
from sensegraph.index.estimate import MEASURED, RATIOS, estimate_index, measured_ratios
from test_pipeline import DOCS, _cli_env, stats_json, write_docs


def test_ratios_measured_on_an_index_predict_its_calls(tmp_path):
    write_docs(tmp_path, DOCS)
    with start_mock_server() as srv:
        env = _cli_env(srv)
        res = CliRunner().invoke(cli_main, ["index", "--root", str(tmp_path)], env=env)
        assert res.exit_code == 0, res.output
        chat_requests = srv.stats["by_kind"].get("chat", 0)
    steps = stats_json(tmp_path)["steps"]
    ratios = measured_ratios(tmp_path)
    assert set(ratios) == set(RATIOS["local"]) == set(RATIOS["hosted"])
    est = estimate_index(load_settings(tmp_path, env=env), ratios)
    actual = {k: steps[k]["calls"] for k in ("extract", "summarize", "community_reports")}
    assert {k: est.steps[k].calls for k in actual} == actual
    assert est.total().calls == sum(actual.values()) == chat_requests
    # completion tokens of extraction follow from the measured per-token ratio (5 per check aside)
    assert abs(est.steps["extract"].completion_tokens - steps["extract"]["completion_tokens"]) \
        <= 0.05 * steps["extract"]["completion_tokens"]


def test_dry_run_gives_the_mean_and_the_spread_of_the_measured_indexes(tmp_path):
    write_docs(tmp_path, DOCS)
    local = load_settings(tmp_path, env={"SENSEGRAPH_CHAT__PROVIDER": "local"})
    est = estimate_index(local)
    lo, hi = est.spread
    totals = [estimate_index(local, r).total() for r in MEASURED["local"].values()]
    assert lo.calls == min(t.calls for t in totals) and hi.calls == max(t.calls for t in totals)
    assert lo.calls <= est.total().calls <= hi.calls
    assert lo.calls < hi.calls, "the measured local indexes differ, so the spread is not a point"
    for key, value in RATIOS["local"].items():
        runs = [r[key] for r in MEASURED["local"].values()]
        assert min(runs) <= value <= max(runs)
    hosted = estimate_index(load_settings(tmp_path, env={"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__MODEL": "gpt-4o",
                                                               "SENSEGRAPH_CHAT__API_KEY": "k"}))
    assert hosted.spread is None  # one measured hosted index: no spread to show
