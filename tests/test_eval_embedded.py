"""Integration: the whole evaluation over a tiny index with the real embedded 0.5B model:
K×N×M = 2×2×2 questions, then 2 questions × 2 conditions (C0, SS) × 1 repeat, every artefact
written, and a rerun of the finished evaluation makes no LLM call."""
import json

import pytest
import yaml
from click.testing import CliRunner

from sensegraph.cli import main

pytestmark = pytest.mark.embedded

TEXT = """Ada Lovelace worked with Charles Babbage in London on the Analytical Engine.
Babbage designed the engine; Lovelace wrote the first program for it and published her notes
in 1843 in a journal of the Royal Society. The Royal Society later honoured Babbage."""


def test_eval_run_with_embedded_model(tmp_path):
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "ada.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump({
        "local": {"size": "0.5b", "parallel": 2},
        "extraction": {"max_gleanings": 0, "max_tokens": 700},
        "reports": {"max_tokens": 900},
        "chunks": {"size": 200, "overlap": 20},
        "query": {"answer_max_tokens": 300, "map_max_tokens": 300},
    }))
    runner = CliRunner()
    res = runner.invoke(main, ["index", "-r", str(tmp_path), "--allow-partial"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    args = ["eval", "run", "-r", str(tmp_path), "-c", "C0,SS", "-d", "Notes on early computing history.",
            "-K", "2", "-N", "2", "-M", "2", "--limit", "2", "--repeats", "1"]
    res = runner.invoke(main, args, catch_exceptions=False)
    folder = tmp_path / "evaluation" / "default"
    questions = [json.loads(x) for x in (folder / "questions.jsonl").read_text().splitlines()]
    assert 2 <= len(questions) <= 8 and all(q["question"] for q in questions)
    answers = [json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()]
    assert {(a["question_id"], a["condition"]) for a in answers} == \
        {(q["id"], c) for q in questions[:2] for c in ("C0", "SS")}
    judgements = [json.loads(x) for x in (folder / "judgements.jsonl").read_text().splitlines()]
    assert len(judgements) == 2 * 1 * 4 * 1  # questions × pairs × criteria × repeats
    assert sum(1 for j in judgements if not j.get("error")) >= 6
    assert (folder / "claims.jsonl").exists()
    report = (folder / "report.md").read_text()
    assert "## Win rates" in report and "## Claim-based metrics" in report
    assert (folder / "figures" / "winrates.png").stat().st_size > 1000
    results = json.loads((folder / "results.json").read_text())
    assert set(results["win_rates"]) == {"comprehensiveness", "diversity", "empowerment", "directness"}

    # The finished evaluation again: zero LLM calls, nothing new stored.
    n_runs = len((folder / "runs.jsonl").read_text().splitlines())
    res = runner.invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    again = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines()][n_runs:]
    assert again and all(r["calls"] == 0 for r in again)
