"""Wrong setups stop `sensegraph index` before any work with one actionable sentence, and the
API key never leaks into files, stats or messages."""
from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mock_llm import MockServer, start_mock_server
from sensegraph.cli import main as cli_main
from test_pipeline import DOCS, FaultyServer, _cli_env, contains, write_docs

SECRET = "sk-TEST-7f3a9c1e5b2d4-do-not-leak"


def invoke(root: Path, env: dict[str, str], *args: str, command: str = "index"):
    result = CliRunner().invoke(cli_main, [command, "--root", str(root), *args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def one_line(output: str) -> str:
    return re.sub(r"\s+", " ", output)


def no_work(server: MockServer) -> bool:
    """No extraction (or any structured) request reached the server: indexing never started."""
    return not any(b.get("response_format") for b in server.requests) and not (server.requests and any(
        "input" in b and b["input"] != ["ping"] for b in server.requests))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the with-block ends: nothing listens there


@pytest.fixture
def project(tmp_path) -> Path:
    write_docs(tmp_path, {"harbor.txt": DOCS["harbor.txt"]})
    return tmp_path


# -- setup errors -------------------------------------------------------------------------------
def test_key_referenced_in_settings_but_not_set(project):
    (project / "settings.yaml").write_text(
        "chat:\n  provider: openai\n  model: gpt-4o-mini\n  api_key: ${OPENAI_API_KEY}\n", encoding="utf-8")
    result = invoke(project, {"OPENAI_API_KEY": ""})
    assert result.exit_code == 2
    assert "chat.api_key: ${OPENAI_API_KEY} is not set; put OPENAI_API_KEY=... in .env" in one_line(result.output)


def test_openai_without_key_or_url(project):
    result = invoke(project, {"SENSEGRAPH_CHAT__PROVIDER": "openai", "SENSEGRAPH_CHAT__MODEL": "gpt-4o-mini",
                              "OPENAI_API_KEY": ""})
    assert result.exit_code == 2
    assert "chat.api_key: provider 'openai' without base_url talks to api.openai.com and needs a key" \
        in one_line(result.output)


@pytest.mark.parametrize("key, expected", [
    ("", "needs an API key, and none is set (401); set OPENAI_API_KEY in .env or chat.api_key"),
    ("sk-wrong", "refused the API key (401); set OPENAI_API_KEY in .env or chat.api_key"),
])
def test_missing_or_wrong_key_for_a_server_that_wants_one(project, key, expected):
    with start_mock_server(api_key=SECRET) as server:
        env = {**_cli_env(server), "SENSEGRAPH_CHAT__API_KEY": key, "SENSEGRAPH_EMBEDDING__API_KEY": SECRET}
        result = invoke(project, env)
        assert no_work(server)
    assert result.exit_code == 2
    assert f"error: the server at {server.base_url} {expected}" in one_line(result.output)
    assert "embedding" not in result.output  # the embedding endpoint is fine: only the real problem is named


def test_unreachable_endpoint(project):
    with start_mock_server() as server:
        url = f"http://127.0.0.1:{closed_port()}/v1"
        result = invoke(project, {**_cli_env(server), "SENSEGRAPH_CHAT__BASE_URL": url})
        assert no_work(server)
    assert result.exit_code == 2
    assert one_line(result.output).strip() == f"error: nothing answers at {url}; start the server or fix chat.base_url"


@pytest.mark.parametrize("section", ["chat", "embedding"])
def test_wrong_model_name(project, section):
    with start_mock_server(models=("mock",)) as server:
        env = {**_cli_env(server), f"SENSEGRAPH_{section.upper()}__MODEL": "gpt-4o-mnii"}
        result = invoke(project, env)
        assert no_work(server)
    assert result.exit_code == 2
    assert one_line(result.output).strip() == (
        f"error: {server.base_url} does not know the model 'gpt-4o-mnii' (404); fix {section}.model "
        f"(for Azure, the deployment name) or {section}.base_url (the server lists: mock)")


class NoModelList(MockServer):
    """A server without GET /models (some proxies): the preflight asks the model once instead."""

    async def _respond(self, method, path, raw, reader, writer):  # type: ignore[override]
        if path.rstrip("/").endswith("/models"):
            self._send(writer, 404, {"error": {"message": "no such route", "type": "not_found"}})
            return True
        return await super()._respond(method, path, raw, reader, writer)


def test_wrong_model_name_on_a_server_without_a_model_list(project):
    with NoModelList(models=("mock",)).start() as server:
        result = invoke(project, {**_cli_env(server), "SENSEGRAPH_CHAT__MODEL": "llama-9"})
        assert no_work(server)
    assert result.exit_code == 2
    assert "does not know the model 'llama-9' (404); fix chat.model" in one_line(result.output)
    with NoModelList(models=("mock",)).start() as server:  # the right name passes the check and indexes
        assert invoke(project, _cli_env(server)).exit_code == 0


# -- secrets ------------------------------------------------------------------------------------
class EchoingServer(FaultyServer):
    """A careless server: its error bodies quote the request's Authorization header."""

    def _send(self, writer, status, obj: Any, headers=None):  # type: ignore[override]
        if status >= 400:
            obj = {"error": {"message": f"refused; you sent {self.last_headers.get('authorization')}",
                             "type": "server_error", "param": None, "code": None}}
        super()._send(writer, status, obj, headers)


def test_api_key_never_leaks(tmp_path):
    """A key from .env, an index with an item that fails every retry (its error bodies echo the
    key), a rerun with --allow-partial and `doctor` against a refusing server: the key appears
    in no file of the project except .env, and in no output."""
    write_docs(tmp_path, {**DOCS, "lighthouse.txt": "The Lighthouse Trust of Cape Arlo. LEAK-MARKER-1 Oskar Lind."})
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n", encoding="utf-8")
    (tmp_path / "settings.yaml").write_text(
        "chat:\n  api_key: ${OPENAI_API_KEY}\nembedding:\n  api_key: ${OPENAI_API_KEY}\n", encoding="utf-8")
    outputs = []
    with EchoingServer(contains("LEAK-MARKER-1"), api_key=SECRET).start() as server:
        env = {k: v for k, v in _cli_env(server).items() if not k.endswith("__API_KEY")}
        outputs.append(invoke(tmp_path, env))
        assert outputs[-1].exit_code == 1 and server.refused > 0
        outputs.append(invoke(tmp_path, env, "--allow-partial"))
        assert outputs[-1].exit_code == 0
        outputs.append(invoke(tmp_path, env, command="doctor"))
    with EchoingServer(lambda body: True, api_key=SECRET).start() as refusing:
        env = {k: v for k, v in _cli_env(refusing).items() if not k.endswith("__API_KEY")}
        outputs.append(invoke(tmp_path, env, command="doctor"))
        assert outputs[-1].exit_code == 1
        assert refusing.last_headers.get("authorization") == f"Bearer {SECRET}"  # the key was really used

    needle = SECRET.encode()
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".env"]
    assert any(p.suffix == ".sqlite" for p in files) and any(p.name == "stats.json" for p in files)
    leaked = [str(p) for p in files if needle in p.read_bytes()]
    assert leaked == []
    for result in outputs:
        assert SECRET not in result.output and SECRET[:12] not in result.output
