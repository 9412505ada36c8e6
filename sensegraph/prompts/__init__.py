"""Prompt templates as editable text files, English (en/) and Chinese (zh/). A language without
prompts of its own (Japanese, for now) gets the English ones (`prompt_language`), which ask the
model to write in the language of the text.

A project's own `prompts/<lang>/<name>.txt` (written by `sensegraph init`) wins over the copy
shipped in this package, so users tune prompts without touching code. Placeholders are
`{name}`; only the names passed to `render` are replaced, so JSON examples with braces in a
prompt need no escaping. A line `=== user ===` splits a prompt into a system message (the
instructions and examples, identical across calls, so servers can reuse their prompt cache)
and a user message (the data of this call).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
LANGUAGES = ("en", "zh")  # the languages with prompts of their own
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
# The prompts loaded while an indexing step runs (index/steps.py fingerprints their text).
# A context variable, so the tasks a step starts report to it and other steps' tasks do not.
_READS: ContextVar[set[tuple[str, str]] | None] = ContextVar("prompt_reads", default=None)


@contextmanager
def record_prompt_reads() -> Iterator[set[tuple[str, str]]]:
    """Collect (name, language) of every prompt loaded inside the block."""
    reads: set[tuple[str, str]] = set()
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def prompt_names() -> list[str]:
    return sorted(p.stem for p in (PACKAGE_DIR / "en").glob("*.txt"))


def prompt_language(language: str) -> str:
    """The prompt folder a corpus language uses: its own, or en/ (a project's prompts/en/ too)."""
    return language if language in LANGUAGES else "en"


def load_prompt(name: str, language: str = "en", root: str | Path | None = None) -> str:
    language = prompt_language(language)
    if (reads := _READS.get()) is not None:
        reads.add((name, language))
    candidates = []
    if root is not None:
        candidates.append(Path(root) / "prompts" / language / f"{name}.txt")
    candidates.append(PACKAGE_DIR / language / f"{name}.txt")
    candidates.append(PACKAGE_DIR / "en" / f"{name}.txt")
    for path in candidates:
        if path.exists():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError(f"no prompt named {name!r} (looked in {', '.join(map(str, candidates))})")


def render(template: str, **values: object) -> str:
    # One pass, so a value that itself contains "{name}" (a document, a question) is never expanded.
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


USER_MARKER = "=== user ==="


def to_messages(prompt: str) -> list[dict[str, str]]:
    """A rendered prompt as chat messages: system part before `=== user ===`, user part after."""
    if USER_MARKER not in prompt:
        return [{"role": "user", "content": prompt.strip()}]
    system, user = prompt.split(USER_MARKER, 1)
    return [{"role": "system", "content": system.strip()}, {"role": "user", "content": user.strip()}]
