"""The step runner: every indexing step runs through `Steps.run`, which derives its checkpoint.

A step is a function called with keyword inputs (tables, the chat client, the language ...) plus
`settings`. Its fingerprint is derived from what it really reads, never listed beside it:
- every input argument (tables by content, row order included; clients by the model they ask);
- every setting it reads: `settings` is a recorder that notes each field the step (and the
  Settings methods it calls) looks at, so a step that starts reading a new field has it in its
  fingerprint from the next run on, with nobody having to remember;
- every prompt it loads (prompts.record_prompt_reads notes the names, the text is hashed);
- the code that builds an index.
After a successful run, state.json keeps the fingerprint and the list of settings and prompts
read. The next run recomputes the fingerprint over the same list with today's values and skips
the step only when nothing changed and its tables exist. A step that lost items is not marked,
so the rerun does it again (finished calls come from the cache), and because every later step
fingerprints its input tables by content, whatever depended on the lost items is redone too.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import BaseModel

from ..config import Settings
from ..prompts import load_prompt, record_prompt_reads
from ..store.tables import read_table, write_json_atomic, write_table

STATE_FILE = "state.json"
# `root` says where the project lies, not what is in it (the files read are inputs already):
# moving a project must not rerun its steps.
UNRECORDED = {"root"}
_MISSING = "<missing>"
TABLE = "table:"


@dataclass
class Output:
    """What a step made: its tables (written by the runner), the items it lost after every
    retry, how many items it had (for a budget report) and figures for stats.json."""
    tables: dict[str, pd.DataFrame]
    failed: list[str] = field(default_factory=list)
    items: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


# -- fingerprints -----------------------------------------------------------------------------------

def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _cell(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [_cell(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    return v


# Rows hashed at a time: a table's text is turned into Python objects to hash it, a slice at a
# time, so fingerprinting a large corpus's text units holds one slice of them, not them all.
FINGERPRINT_ROWS = 4096


def _slices(s: pd.Series) -> list[pd.Series]:
    return [s.iloc[start:start + FINGERPRINT_ROWS] for start in range(0, len(s), FINGERPRINT_ROWS)]


def _column_hash(s: pd.Series) -> list[bytes]:
    if pd.api.types.is_string_dtype(s) or s.dtype == object:
        # Text as Python objects: a table read back from parquet has pandas' string dtype
        # where the one a step made may have object, and the two must hash alike.
        as_objects: Any = lambda part: part.astype(object)  # noqa: E731
    else:
        as_objects = lambda part: part  # noqa: E731
    try:
        return [pd.util.hash_pandas_object(as_objects(part), index=False).to_numpy().tobytes()
                for part in _slices(s)]
    except TypeError:  # list or dict cells: the whole column as JSON, as a column with one would be
        return [pd.util.hash_pandas_object(
            part.map(lambda v: json.dumps(_cell(v), sort_keys=True, default=str)), index=False).to_numpy().tobytes()
            for part in _slices(s)]


def table_fingerprint(df: pd.DataFrame) -> str:
    """The content of a table: columns and every cell, in row order (steps resolve ties by
    first seen, so order is part of what they read). Each cell's hash depends on the cell
    alone, so hashing a column slice by slice gives the bytes of hashing it whole."""
    h = hashlib.sha256(json.dumps([str(c) for c in df.columns]).encode())
    for col in df.columns:
        for part in _column_hash(df[col]):
            h.update(part)
    return h.hexdigest()[:32]


def _model_identity(client: Any, settings: Settings) -> dict[str, Any]:
    """What decides a client's answers: provider, model and sampling, as in the answer cache's
    key; not the endpoint's address (a local server's port changes between runs), concurrency,
    timeouts, retries, key or budget. The embedded model is named by its size."""
    s = client.settings
    # From settings only, never from what a call resolved: with `provider: local` the model's
    # name is known once the server has started, and an identity read from it made an unchanged
    # project rerun summarize on its second run and the reports on its third.
    ident = {"provider": s.provider, "model": getattr(client, "configured_model", getattr(client, "model", s.model)),
             "api_version": s.api_version, "extra_body": getattr(client, "extra_body", None)}
    if models := [e.model for e in (s.endpoints or []) if e.model]:
        ident["endpoint_models"] = models  # an endpoint's own model decides its answers
    for name in ("temperature", "structured_output", "dimensions"):
        if hasattr(s, name):
            ident[name] = getattr(s, name)
    if s.provider == "local":
        ident["local"] = settings.local.size
    return ident


def _input_fingerprint(value: Any, settings: Settings) -> Any:
    if isinstance(value, pd.DataFrame):
        return table_fingerprint(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_input_fingerprint(v, settings) for v in value]
    if hasattr(value, "fingerprint"):
        return value.fingerprint()
    if hasattr(value, "settings") and hasattr(value.settings, "provider"):  # chat client, embedder
        return _model_identity(value, settings)
    raise TypeError(f"a step input of type {type(value).__name__} has no fingerprint: give it a "
                    "fingerprint() method, or pass what the step reads from it instead")


def library_versions(names: tuple[str, ...]) -> dict[str, str]:
    """The installed version of each distribution ("absent" when it is not installed)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The code that builds an index: a changed step function reruns its step (from the cache)."""
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for folder in ("index", "llm", "store"):
        for path in sorted((package / folder).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    for name in ("config.py", "tokens.py", "language.py", "prompts/__init__.py"):
        h.update((package / name).read_bytes())
    return h.hexdigest()[:32]


# -- what a step reads of the settings ------------------------------------------------------------

def read_path(settings: Any, path: str) -> Any:
    """The value at a dotted path of the settings ("" is the whole model), JSON-ready."""
    value = settings
    for part in path.split(".") if path else ():
        if not hasattr(value, part):
            return _MISSING
        value = getattr(value, part)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


class SettingsRecorder:
    """Settings as a step sees them, noting each field read (`reads`, dotted paths). Sections are
    recorders too; methods of our own models run against the recorder so their reads count;
    pydantic's own methods (model_dump ...) count as reading the whole section."""

    def __init__(self, model: BaseModel, prefix: str = "", reads: set[str] | None = None):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "reads", set() if reads is None else reads)

    def __getattr__(self, name: str) -> Any:
        model, path = self._model, f"{self._prefix}{name}"
        value = getattr(model, name)
        own = getattr(type(model), name, None)
        if callable(own) and not isinstance(value, BaseModel):
            if name in BaseModel.__dict__ or not inspect.isfunction(own):
                self.reads.add(self._prefix.rstrip("."))
                return value
            return functools.partial(own, self)
        if isinstance(value, BaseModel):
            return SettingsRecorder(value, f"{path}.", self.reads)
        if path not in UNRECORDED:
            self.reads.add(path)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a step must not change the settings")


def memory_mb() -> dict[str, float]:
    """The process's resident memory now (`rss_mb`) and its peak so far (`peak_rss_mb`), in MB,
    from /proc (Linux); elsewhere only the peak, from getrusage. Recorded after each step: the
    step during which the peak grew is the one that needed the memory."""
    try:
        status = Path("/proc/self/status").read_text()
        kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in status.splitlines())
               if k in ("VmRSS", "VmHWM")}
        return {"rss_mb": round(kib["VmRSS"] / 1024, 1), "peak_rss_mb": round(kib["VmHWM"] / 1024, 1)}
    except (OSError, KeyError, ValueError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return {"peak_rss_mb": round(peak / (2**20 if sys.platform == "darwin" else 1024), 1)}


# -- the runner -----------------------------------------------------------------------------------

class Steps:
    """Runs steps for one index folder; keeps state.json and the per-step stats."""

    def __init__(self, settings: Settings, out: Path, stats: dict[str, Any],
                 before_write: Callable[[str, Output], None] = lambda name, output: None):
        self.settings = settings
        self.out = out
        self.path = out / STATE_FILE
        self.state: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.stats = stats
        # Called after a step computed and before its tables are written (the spending budget
        # stops the run there); work tables under output/_work are written first in any case.
        self.before_write = before_write

    def _fingerprints(self, reads: dict[str, Any], fps: dict[str, Any]) -> tuple[str, str]:
        """(config, full) from what a run read and the fingerprints of its inputs: config covers
        settings, prompts, code and the non-table inputs (what decides how each item is done);
        full adds the input tables."""
        s = self.settings
        values = {p: read_path(s, p) for p in sorted(reads.get("settings", []))}
        prompts = []
        for name, language in reads.get("prompts", []):
            try:
                prompts.append([name, language, _digest(load_prompt(name, language, s.root))])
            except FileNotFoundError:
                prompts.append([name, language, _MISSING])
        config = _digest([values, prompts, code_fingerprint(),
                          {k: v for k, v in fps.items() if not k.startswith(TABLE)}])
        return config, _digest([config, fps])

    def _input_fingerprints(self, inputs: dict[str, Any]) -> dict[str, Any]:
        # Table inputs are marked so the config fingerprint can leave them out.
        return {(TABLE + k if isinstance(v, pd.DataFrame) else k): _input_fingerprint(v, self.settings)
                for k, v in sorted(inputs.items())}

    def _paths(self, writes: dict[str, str]) -> dict[str, Path]:
        return {name: self.out / folder / f"{name}.parquet" for name, folder in writes.items()}

    def _previous(self, name: str, paths: dict[str, Path], fps: dict[str, Any]) -> dict[str, pd.DataFrame] | None:
        """The tables of the step's last complete run if it ran with the same settings, prompts,
        code and model (only its input tables differ), else None."""
        entry = self._entry(name)
        if not entry or not all(p.exists() for p in paths.values()):
            return None
        if self._fingerprints(entry["reads"], fps)[0] != entry["config"]:
            return None
        return {n: read_table(p.parent, n) for n, p in paths.items()}

    async def run(self, name: str, fn: Callable[..., Awaitable[Output] | Output], *,
                  writes: dict[str, str] | None = None, checkpoint: bool = True, reuse: bool = False,
                  libraries: tuple[str, ...] = (), extra: dict[str, Any] | None = None, **inputs: Any) -> Output:
        """Run step `name`: `fn(**inputs, settings=recorder, **extra)`. `writes` maps each table
        it returns to a folder under output/ ("" or "_work"); `extra` holds what is not read
        (progress bars, a log). `checkpoint=False` for steps that read files or write their own
        (documents, embeddings): always run, only timed and reported. `reuse=True` also passes
        `previous`: the step's tables of its last complete run when that ran with the same
        settings, prompts, code and model, else None, so items whose input is unchanged can be
        taken from them (extraction keeps the instances of unchanged text units). `libraries`
        names the installed distributions whose code computes the tables (spaCy, the Leiden
        implementation): their versions are part of the fingerprint, as this package's code is."""
        writes = writes or {}
        t0 = time.perf_counter()
        entry_stats: dict[str, Any] = {}
        self.stats["steps"][name] = entry_stats
        paths = self._paths(writes)
        entry = self._entry(name)
        # Which function computes the step is part of what decides its tables.
        fps = {**self._input_fingerprints(inputs), "function": f"{fn.__module__}.{fn.__qualname__}",
               **({"libraries": library_versions(libraries)} if libraries else {})} if checkpoint else {}
        if checkpoint and entry and all(p.exists() for p in paths.values()) \
                and self._fingerprints(entry["reads"], fps)[1] == entry["fingerprint"]:
            output = Output({n: read_table(p.parent, n) for n, p in paths.items()}, stats={"skipped": True})
        else:
            recorder = SettingsRecorder(self.settings)
            extra = {**(extra or {}), **({"previous": self._previous(name, paths, fps)} if reuse else {})}
            with record_prompt_reads() as prompts:
                output = fn(**inputs, settings=recorder, **extra)
                if inspect.isawaitable(output):
                    output = await output
            self._invalidate(name, paths)
            work = {n for n, f in writes.items() if f}
            for n in work:  # intermediate tables: kept even when the run stops here
                write_table(output.tables[n], paths[n].parent, n)
            self.before_write(name, output)
            for n in set(writes) - work:
                write_table(output.tables[n], self.out, n)
            if checkpoint:
                self._mark(name, output, {"settings": sorted(recorder.reads), "prompts": sorted(prompts)}, fps, paths)
        entry_stats.update(output.stats)
        entry_stats["seconds"] = round(time.perf_counter() - t0, 3)
        # Arrow's allocator keeps what a step's tables and parquet files freed; give it back so
        # the next step starts from what is really in use.
        pa.default_memory_pool().release_unused()
        entry_stats.update(memory_mb())
        return output

    def _entry(self, name: str) -> dict[str, Any] | None:
        entry = self.state.get(name)
        # A state.json of an older version held bare fingerprints: such a step simply reruns.
        return entry if isinstance(entry, dict) and {"fingerprint", "config", "reads"} <= entry.keys() else None

    def _invalidate(self, name: str, paths: dict[str, Path]) -> None:
        """Drop the marks of this step and of every step whose tables these are (a lazy and a
        standard index write entities through different steps): once the tables change, no
        later run may take them for those of that step's last complete run."""
        written = {self._relative(p) for p in paths.values()}
        gone = [n for n, e in self.state.items()
                if n == name or not isinstance(e, dict) or written & set(e.get("writes", []))]
        for n in gone:
            del self.state[n]
        if gone:
            write_json_atomic(self.path, self.state)

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.out).as_posix()

    def _mark(self, name: str, output: Output, reads: dict[str, Any], fps: dict[str, Any],
              paths: dict[str, Path]) -> None:
        if output.failed:
            return  # incomplete: the rerun does it again
        config, full = self._fingerprints(reads, fps)
        self.state[name] = {"fingerprint": full, "config": config, "reads": reads,
                            "writes": sorted(self._relative(p) for p in paths.values())}
        write_json_atomic(self.path, self.state)
