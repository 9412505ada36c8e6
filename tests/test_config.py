"""load_settings: defaults, YAML, ${VAR}, .env, SENSEGRAPH_* overrides and the error messages."""
from __future__ import annotations

from pathlib import Path

import pytest

from sensegraph.config import SettingsError, load_settings


def project(tmp_path: Path, yaml_text: str | None = None, dot_env: str | None = None) -> Path:
    if yaml_text is not None:
        (tmp_path / "settings.yaml").write_text(yaml_text, encoding="utf-8")
    if dot_env is not None:
        (tmp_path / ".env").write_text(dot_env, encoding="utf-8")
    return tmp_path


def error(tmp_path: Path, yaml_text: str | None = None, env: dict[str, str] | None = None,
          dot_env: str | None = None) -> str:
    with pytest.raises(SettingsError) as err:
        load_settings(project(tmp_path, yaml_text, dot_env), env=env or {})
    return str(err.value)


def test_defaults_without_settings_file(tmp_path):
    s = load_settings(tmp_path, env={})
    assert s.chat.provider == "local" and s.chat.concurrency == 4 and s.chat.max_retries == 6
    assert s.chunks.size == 600 and s.chunks.overlap == 100
    assert s.cache.enabled and s.language == "auto"
    assert Path(s.root) == tmp_path.resolve()
    assert s.path("cache") == tmp_path.resolve() / "cache"


def test_yaml_values(tmp_path):
    s = load_settings(project(tmp_path, """
chat:
  provider: openai
  model: gpt-4o-mini
  api_key: sk-test
  concurrency: 12
  temperature: 0.2
chunks: {size: 300, overlap: 50}
extraction:
  entity_types: [person, place]
language: zh
"""), env={})
    assert (s.chat.provider, s.chat.model, s.chat.api_key, s.chat.concurrency) == ("openai", "gpt-4o-mini", "sk-test", 12)
    assert s.chat.temperature == 0.2 and s.chunks.size == 300 and s.chunks.overlap == 50
    assert s.extraction.entity_types == ["person", "place"] and s.language == "zh"


def test_empty_settings_file_and_empty_section_mean_defaults(tmp_path):
    assert load_settings(project(tmp_path, ""), env={}).chat.concurrency == 4
    s = load_settings(project(tmp_path, "chat:\n  # everything commented out\ncache:\n  enabled: false\n"), env={})
    assert s.chat.concurrency == 4 and not s.cache.enabled


YAML_WITH_VARS = """
chat:
  provider: openai
  model: ${CHAT_MODEL:-gpt-4o-mini}
  api_key: ${OPENAI_API_KEY}
  base_url: ${BASE_URL:-}
"""


def test_variables_from_environment(tmp_path):
    s = load_settings(project(tmp_path, YAML_WITH_VARS), env={"OPENAI_API_KEY": "sk-env", "CHAT_MODEL": "m2"})
    assert s.chat.api_key == "sk-env" and s.chat.model == "m2"


def test_variables_from_dot_env_and_environment_wins(tmp_path):
    root = project(tmp_path, YAML_WITH_VARS, "OPENAI_API_KEY=sk-dotenv\nCHAT_MODEL=from-dotenv\n")
    s = load_settings(root, env={})
    assert s.chat.api_key == "sk-dotenv" and s.chat.model == "from-dotenv"
    s = load_settings(root, env={"OPENAI_API_KEY": "sk-env"})
    assert s.chat.api_key == "sk-env" and s.chat.model == "from-dotenv"


def test_variable_default(tmp_path):
    s = load_settings(project(tmp_path, YAML_WITH_VARS), env={"OPENAI_API_KEY": "k"})
    assert s.chat.model == "gpt-4o-mini"
    assert not s.chat.base_url  # ${BASE_URL:-} is an empty default


def test_missing_variable_names_key_and_variable(tmp_path):
    msg = error(tmp_path, YAML_WITH_VARS)
    assert "chat.api_key" in msg and "OPENAI_API_KEY" in msg and ".env" in msg


def test_numbers_from_variables_are_converted(tmp_path):
    s = load_settings(project(tmp_path, "chat:\n  concurrency: ${CONC:-7}\ncache:\n  enabled: ${CACHE:-true}\n"),
                      env={})
    assert s.chat.concurrency == 7 and s.cache.enabled is True


def test_environment_overrides(tmp_path):
    root = project(tmp_path, "chat:\n  provider: openai\n  model: m\n  base_url: http://yaml/v1\n  concurrency: 2\n")
    s = load_settings(root, env={
        "SENSEGRAPH_CHAT__BASE_URL": "http://127.0.0.1:9/v1",
        "SENSEGRAPH_CHAT__CONCURRENCY": "8",
        "SENSEGRAPH_EXTRACTION__ENTITY_TYPES": "[person, company]",
        "SENSEGRAPH_CACHE__ENABLED": "false",
        "SENSEGRAPH_LANGUAGE": "en",
        "SENSEGRAPH_CHAT__MODEL": "123",  # stays a string
    })
    assert s.chat.base_url == "http://127.0.0.1:9/v1" and s.chat.concurrency == 8
    assert s.extraction.entity_types == ["person", "company"]
    assert s.cache.enabled is False and s.language == "en" and s.chat.model == "123"


def test_comma_separated_list_override(tmp_path):
    s = load_settings(tmp_path, env={"SENSEGRAPH_INPUT__FILE_TYPES": "txt,md"})
    assert s.input.file_types == ["txt", "md"]


def test_overrides_from_dot_env(tmp_path):
    s = load_settings(project(tmp_path, dot_env="SENSEGRAPH_CHAT__CONCURRENCY=5\n"), env={})
    assert s.chat.concurrency == 5
    s = load_settings(tmp_path, env={"SENSEGRAPH_CHAT__CONCURRENCY": "6"})
    assert s.chat.concurrency == 6


def test_overrides_argument_is_applied_last(tmp_path):
    s = load_settings(project(tmp_path, "cache:\n  enabled: true\n"), overrides={"cache": {"enabled": False}},
                      env={})
    assert s.cache.enabled is False


def test_unknown_yaml_key_names_it_and_lists_allowed(tmp_path):
    msg = error(tmp_path, "chat:\n  concurency: 8\n")
    assert "chat.concurency" in msg and "concurrency" in msg.split("chat.concurency", 1)[1]
    assert "base_url" in msg  # the allowed keys are listed


def test_unknown_top_level_yaml_key(tmp_path):
    msg = error(tmp_path, "chunking:\n  size: 3\n")
    assert "chunking" in msg and "chunks" in msg


def test_unknown_env_key_names_variable_and_lists_allowed(tmp_path):
    msg = error(tmp_path, env={"SENSEGRAPH_CHAT__CONCURENCY": "8"})
    assert "SENSEGRAPH_CHAT__CONCURENCY" in msg and "concurency" in msg and "concurrency" in msg
    msg = error(tmp_path, env={"SENSEGRAPH_CHATS__MODEL": "x"})
    assert "chats" in msg and "chat" in msg and "embedding" in msg
    msg = error(tmp_path, env={"SENSEGRAPH_LANGUAGE__X": "x"})
    assert "language" in msg and "sub-keys" in msg


@pytest.mark.parametrize("yaml_text, key, allowed", [
    ("chat:\n  concurrency: lots\n", "chat.concurrency", "integer"),
    ("chat:\n  concurrency: 0\n", "chat.concurrency", "greater than or equal to 1"),
    ("chat:\n  temperature: 3\n", "chat.temperature", "less than or equal to 2"),
    ("chat:\n  provider: anthropic\n", "chat.provider", "'local' or 'openai'"),
    ("chat:\n  structured_output: xml\n", "chat.structured_output", "json_schema"),
    ("language: fr\n", "language", "'en'"),
    ("chunks:\n  size: 100\n  overlap: 100\n", "chunks", "smaller than size"),
    ("extraction:\n  entity_types: []\n", "extraction.entity_types", "at least 1"),
])
def test_invalid_value_names_key_and_what_is_allowed(tmp_path, yaml_text, key, allowed):
    msg = error(tmp_path, yaml_text)
    assert key in msg and allowed in msg


def test_invalid_env_value_names_the_key(tmp_path):
    msg = error(tmp_path, env={"SENSEGRAPH_CHAT__CONCURRENCY": "many"})
    assert "chat.concurrency" in msg and "SENSEGRAPH_" in msg


def test_provider_openai_needs_model(tmp_path):
    msg = error(tmp_path, "chat:\n  provider: openai\n  api_key: k\n")
    assert "chat.model" in msg and "openai" in msg


def test_provider_openai_needs_key_or_base_url(tmp_path):
    msg = error(tmp_path, "chat:\n  provider: openai\n  model: gpt-4o-mini\n")
    assert "chat.api_key" in msg and "OPENAI_API_KEY" in msg and "base_url" in msg
    # A local OpenAI-compatible server needs no key.
    s = load_settings(tmp_path, env={"SENSEGRAPH_CHAT__BASE_URL": "http://127.0.0.1:8000/v1"})
    assert s.chat.api_key is None


def test_embedding_endpoint_is_checked_too(tmp_path):
    msg = error(tmp_path, "embedding:\n  provider: openai\n")
    assert "embedding.model" in msg


def test_azure_needs_base_url(tmp_path):
    msg = error(tmp_path, "chat:\n  provider: openai\n  model: dep\n  api_key: k\n  api_version: '2024-06-01'\n")
    assert "chat.base_url" in msg and "azure" in msg.lower()


def test_yaml_that_is_not_a_mapping(tmp_path):
    assert "mapping" in error(tmp_path, "- just\n- a list\n")


def test_a_tab_that_indents_is_one_line_naming_file_line_and_column(tmp_path):
    msg = error(tmp_path, "chat:\n  model: m\nextraction:\n\tentity_types: [a]\n")
    assert msg == f"{tmp_path.resolve() / 'settings.yaml'} line 4, column 1: a tab indents this line; " \
                  "YAML indents with spaces"
    # a tab after spaces points at the tab
    assert "line 2, column 3: a tab indents this line" in error(tmp_path, "chat:\n  \tmodel: m\n")


def test_a_tab_between_a_key_and_its_value_says_so(tmp_path):
    msg = error(tmp_path, "chat:\n  model:\tm\n")
    assert "settings.yaml line 2, column 9: a tab" in msg and "use a space" in msg and "\n" not in msg


@pytest.mark.parametrize("yaml_text, where, what", [
    # the list opened on line 1 never closes: the message says where it opened
    ("chat: [unclosed\n", "line 2, column 1", "the flow sequence that starts at line 1, column 7"),
    ("chat:\n  model: a: b\n", "line 2, column 11", "mapping values are not allowed here; quote a value"),
    ("chat:\n  model: 'm\n", "line 3, column 1", "the quoted scalar that starts at line 2, column 10"),
    ("chat:\n  model: m\n  - x\n", "line 3, column 3", "expected <block end>, but found '-'"),
    ("chat:\n  model: *nowhere\n", "line 2, column 10", "found undefined alias 'nowhere'"),
    ("chat:\n  model: m\x07\n", "line 2, column 11", "unacceptable character #x0007"),
])
def test_any_yaml_error_is_one_line_with_file_line_and_column(tmp_path, yaml_text, where, what):
    msg = error(tmp_path, yaml_text)
    assert "\n" not in msg
    assert msg.startswith(f"{tmp_path.resolve() / 'settings.yaml'} {where}: "), msg
    assert what in msg, msg


def test_report_and_summary_budgets_fit_the_embedded_slot():
    # A prompt longer than the llama.cpp slot is refused outright (HTTP 400), so on the
    # embedded server the budgets shrink to leave room for instructions and the answer.
    from sensegraph.config import Settings

    local = Settings(chat={"provider": "local"}, local={"context_per_slot": 4096})
    assert local.report_input_tokens() + 600 + local.reports.max_tokens <= 4096
    assert local.summary_input_tokens() + 250 + local.summarize.max_tokens <= 4096
    roomy = Settings(chat={"provider": "local"}, local={"context_per_slot": 16384})
    assert roomy.report_input_tokens() == roomy.reports.max_input_tokens
    hosted = Settings(chat={"provider": "openai", "model": "m", "base_url": "http://x/v1"})
    assert hosted.report_input_tokens() == hosted.reports.max_input_tokens == 6000


def test_a_query_context_larger_than_the_embedded_slot_is_bounded_by_it(tmp_path):
    # query.context_tokens 8000 with the embedded 4096-token slot made lazy search's answer call
    # fail with "request (5032 tokens) exceeds the available context size (4096 tokens)"
    local = load_settings(tmp_path, overrides={"query": {"context_tokens": 8000}}, env={})
    room = local.local.context_per_slot - 700 - local.query.answer_max_tokens
    assert local.query_context_tokens() == room < 8000
    small = load_settings(tmp_path, overrides={"query": {"context_tokens": 1500}}, env={})
    assert small.query_context_tokens() == 1500  # a smaller one is kept
    hosted = load_settings(tmp_path, overrides={"query": {"context_tokens": 20000},
                                                "chat": {"provider": "openai", "model": "m", "api_key": "k"}}, env={})
    assert hosted.query_context_tokens() == 20000
