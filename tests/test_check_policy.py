"""Which checks of extracted names apply to which model (Settings.check_policy), and where a
user sees it: stats.json, `sensegraph doctor`, and the error for the settings it replaced."""
import asyncio

import pytest
from test_pipeline import DOCS, index, server, settings_for, stats_json, write_docs  # noqa: F401

from sensegraph.config import Settings, SettingsError, load_settings, model_billions
from sensegraph.llm.doctor import run_doctor


@pytest.mark.parametrize("name,billions", [("Qwen2.5-1.5B-Instruct", 1.5), ("qwen2.5:7b", 7.0),
                                           ("llama3.2:3b", 3.0), ("Qwen/Qwen2.5-72B-Instruct", 72.0),
                                           ("mixtral-8x7b", 7.0), ("gpt-4o-mini", None), ("phi-3.5-mini", None),
                                           ("text-embedding-3-small", None)])
def test_a_models_size_is_read_from_its_name(name, billions):
    assert model_billions(name) == billions


def hosted(model, **extraction):
    return Settings(chat={"provider": "openai", "model": model, "base_url": "http://x/v1"}, extraction=extraction)


def test_auto_is_strict_for_small_models_and_lenient_for_the_rest():
    assert Settings().check_policy()[0] == "strict"  # the embedded model
    assert hosted("qwen2.5:3b").check_policy()[0] == "strict"
    for model in ("gpt-4o-mini", "qwen2.5:7b", "Qwen/Qwen2.5-72B-Instruct", "claude-sonnet"):
        assert hosted(model).check_policy()[0] == "lenient", model
    # by hand, whatever the model
    assert hosted("gpt-4o-mini", checks="strict").check_policy() == ("strict", "extraction.checks")
    assert Settings(extraction={"checks": "off"}).check_policy()[0] == "off"
    assert "small" in Settings().check_policy()[1] or "embedded" in Settings().check_policy()[1]


def test_the_replaced_settings_say_what_took_their_place(tmp_path):
    (tmp_path / "settings.yaml").write_text("extraction:\n  grounding: false\n  drop_generic: false\n")
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    assert "extraction.grounding: was replaced by extraction.checks" in str(err.value)
    assert "extraction.drop_generic: was replaced by extraction.checks" in str(err.value)


def test_stats_and_doctor_say_which_checks_applied(tmp_path, server):  # noqa: F811
    write_docs(tmp_path, DOCS)
    settings = settings_for(tmp_path, server)  # provider openai, model "mock": no size, so lenient
    assert index(settings).failures == {}
    applied = stats_json(tmp_path)["extraction_checks"]
    assert applied["policy"] == "lenient" and "states no size" in applied["why"] and applied["ner"] is False
    row = next(c for c in asyncio.run(run_doctor(settings)) if c.name == "extraction checks")
    assert row.ok and row.detail.startswith("lenient") and "extraction.checks" in row.detail
