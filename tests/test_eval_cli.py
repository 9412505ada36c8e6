"""`sensegraph eval` end to end against the mock OpenAI-compatible server: index a tiny corpus,
then questions -> answer -> judge -> claims -> report; a rerun makes no LLM call, --dry-run
makes none, --limit slices, and the report is rebuilt from stored results alone."""
import asyncio
import json

import pytest
import yaml
from click.testing import CliRunner

from mock_llm import start_mock_server
from sensegraph.cli import main
from sensegraph.config import load_settings
from sensegraph.evaluate.answers import parse_condition, resolve_labels
from sensegraph.index.pipeline import run_index

TEXT = ("The Harbor Cooperative of Port Ellison was founded by Maria Okafor and Daniel Reyes. "
        "Maria Okafor worked at the Northern Shipping Company. The Harbor Cooperative sells fish to the "
        "Ellison Fish Market and signed an agreement with Bluewater Foods in Halden. Critics at the Port "
        "Ellison Town Council said the Harbor Cooperative depended on Bluewater Foods. ") * 3


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalproj")
    with start_mock_server() as server:
        ep = {"provider": "openai", "base_url": server.base_url, "model": "mock", "api_key": "x",
              "retry_base_seconds": 0.01}
        (root / "settings.yaml").write_text(yaml.safe_dump({
            "chat": {**ep, "concurrency": 8}, "embedding": ep, "chunks": {"size": 120, "overlap": 20},
            "extraction": {"max_gleanings": 0}}))
        (root / "input").mkdir()
        (root / "input" / "harbor.txt").write_text(TEXT)
        asyncio.run(run_index(load_settings(root, env={}), log=lambda m: None))
        yield root, server


def cli(*args):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def test_parse_conditions():
    assert parse_condition("C2").method == "global" and parse_condition("C2").level == 2
    assert parse_condition("Cmax").level is None
    assert parse_condition("C1+dyn").dynamic
    assert parse_condition("ts").method == "text" and parse_condition("SS").method == "basic"
    other = parse_condition("big=C2@../other")
    assert (other.label, other.root, other.level) == ("big", "../other", 2)
    with pytest.raises(ValueError):
        parse_condition("C2@../other")  # another project's condition needs a name
    with pytest.raises(ValueError):
        parse_condition("best")
    resolved = resolve_labels([parse_condition(c) for c in ("C0", "Cmax", "C1+dyn", "TS")], {None: 0})
    assert [c.label for c in resolved] == ["C0", "C1+dyn", "TS"]  # Cmax is C0 on a one-level index
    with pytest.raises(ValueError):
        resolve_labels([parse_condition("C1"), parse_condition("C1=C2")], {None: 3})


def test_eval_commands_end_to_end(project):
    root, server = project
    r = str(root)
    res = cli("eval", "questions", "-r", r, "-d", "Reports about the Harbor Cooperative.", "-K", "2", "-N", "2",
              "-M", "2", "--dry-run")
    assert res.exit_code == 0 and "llm calls: 7" in res.output
    assert not (root / "evaluation" / "default" / "questions.jsonl").exists()

    res = cli("eval", "questions", "-r", r, "-d", "Reports about the Harbor Cooperative.", "-K", "2", "-N", "2", "-M", "2")
    folder = root / "evaluation" / "default"
    questions = [json.loads(x) for x in (folder / "questions.jsonl").read_text().splitlines()]
    assert res.exit_code in (0, 1) and questions  # the mock may repeat itself; shortfalls exit 1

    res = cli("eval", "answer", "-r", r, "-c", "C0,Cmax", "-c", "TS,SS", "--limit", "2", "--dry-run")
    # the mock index has one level, so Cmax is C0 and is answered once
    assert res.exit_code == 0 and "answers to do: 6" in res.output, res.output
    assert not (folder / "answers.jsonl").exists()

    res = cli("eval", "answer", "-r", r, "-c", "C0,Cmax", "-c", "TS,SS", "--limit", "2")
    assert res.exit_code == 0, res.output
    answers = [json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 6 and all(a["answer"] and a["context_tokens"] > 0 for a in answers)
    labels = list(dict.fromkeys(a["condition"] for a in answers))
    assert labels == ["C0", "TS", "SS"]

    res = cli("eval", "judge", "-r", r, "--repeats", "2", "--limit", "2", "--dry-run")
    assert "comparisons total: 48" in res.output  # 2 questions x 3 pairs x 4 criteria x 2 repeats
    res = cli("eval", "judge", "-r", r, "--repeats", "2", "--limit", "2")
    assert res.exit_code == 0, res.output
    assert len((folder / "judgements.jsonl").read_text().splitlines()) == 48
    res = cli("eval", "judge", "-r", r, "-c", "C0", "--aa", "--repeats", "1", "--limit", "2")
    assert res.exit_code == 0
    res = cli("eval", "claims", "-r", r, "--limit", "2")
    assert res.exit_code == 0, res.output

    res = cli("eval", "report", "-r", r)
    assert res.exit_code == 0, res.output
    report = (folder / "report.md").read_text()
    for heading in ("## Win rates", "### Comprehensiveness", "### Directness", "## Position bias",
                    "mean number of distinct claims", "mean number of claim clusters", "Agreement", "## Cost"):
        assert heading in report
    for png in ("winrates.png", "winrate_comprehensiveness.png", "winrate_directness.png", "claims.png"):
        assert (folder / "figures" / png).read_bytes()[:4] == b"\x89PNG"
    results = json.loads((folder / "results.json").read_text())
    rate = results["win_rates"]["diversity"]["rate"]
    assert rate["C0"]["TS"] + rate["TS"]["C0"] == pytest.approx(1.0)

    # Rerunning every finished step makes no LLM call at all.
    runs_before = len((folder / "runs.jsonl").read_text().splitlines())
    for args in (["answer", "-c", "C0,Cmax,TS,SS", "--limit", "2"], ["judge", "--repeats", "2", "--limit", "2"],
                 ["claims", "--limit", "2"]):
        assert cli("eval", *args, "-r", r).exit_code == 0
    runs = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines()][runs_before:]
    assert [x["step"] for x in runs] == ["answers", "judge", "claims"]
    assert all(x["calls"] == 0 and x["cache_hits"] == 0 and x["items"] == 0 for x in runs)


def test_run_dry_run_and_questions_from_file(project, tmp_path):
    root, _ = project
    r = str(root)
    res = cli("eval", "run", "-r", r, "--name", "dry", "-c", "C0,TS,SS", "-K", "2", "-N", "2", "-M", "2",
              "--repeats", "3", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "judge calls: 8 questions × 3 pairs × 4 criteria × 3 repeats = 288" in res.output
    assert "question calls: 7" in res.output and "claim calls: 24" in res.output
    assert not (root / "evaluation" / "dry").exists()

    src = tmp_path / "qs.csv"
    src.write_text("question_text,question_id\nWhat are the main themes?,a1\nWho matters most?,a2\n")
    res = cli("eval", "questions", "-r", r, "--name", "file", "--from", str(src))
    assert res.exit_code == 0 and "loaded 2 questions" in res.output
    res = cli("eval", "answer", "-r", r, "--name", "file", "-c", "C0,SS", "--context-tokens", "600")
    assert res.exit_code == 0, res.output
    folder = root / "evaluation" / "file"
    answers = [json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()]
    assert {a["question_id"] for a in answers} == {"a1", "a2"}
    assert all(a["context_budget"] == 600 for a in answers)  # one budget for every condition
    res = cli("eval", "judge", "-r", r, "--name", "file", "--criteria", "novelty")
    assert res.exit_code == 2 and "unknown criteria" in res.output
