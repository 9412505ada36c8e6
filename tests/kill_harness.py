"""Kill `sensegraph index` with SIGKILL at seeded random moments, rerun it, count what was lost.

Used by tests/test_reliability_crash.py (asserts) and bench/kill_index.py (prints figures).
The index runs as a real subprocess (`python -m sensegraph.cli index`); the mock server runs in a
thread of the calling process, so its request log is read directly. "LLM requests" are chat and
embedding requests that reached the server (the free GET /models of the preflight is not one).

Kill moments: "once the server has seen request N of the uninterrupted run's sequence, plus a
random fraction of one request's latency", with N sampled (seeded) so that every step that
calls a model gets kills, landing before, during and after answers; a few kills also fire at a
random moment of the first second (start-up, documents, text units), before any request.

Accounting is exact, from the answer cache: every request is mapped to its cache key(s), so
after each kill we know which of the run's requests were *lost* (their answer never reached the
cache: in flight at the kill) and which were *wasted* (asked although the answer was already
stored: work the pipeline failed to reuse).
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from sensegraph.llm.cache import cache_key

# Small text units, claims on and small embedding batches: ~130 requests from the three short
# documents of test_pipeline.py, so every step makes several and 1% is at least one request.
SETTINGS = {"chunks__size": "40", "chunks__overlap": "5", "chat__concurrency": "4",
            "embedding__batch_size": "4", "extraction__claims": "true"}
STEP_OF_SCHEMA = {"ExtractedGraph": "extract", "GleanCheck": "extract", "ExtractedClaims": "extract",
                  "ClaimGleanCheck": "extract", "Report": "community_reports"}


@dataclass
class Kill:
    run: int
    requests_before: int  # LLM requests the server had seen (all runs) when the kill fired
    in_flight: int        # server's view: being answered at the kill, or arriving after it
    lost: int             # requests of this run whose answer is not in the cache after the kill
    step: str             # step of the last request the server saw ("start" if none in this run)
    files_checked: int    # parquet/json/sqlite files read back intact after the kill


@dataclass
class KillReport:
    reference_requests: int
    interrupted_requests: int = 0
    runs: int = 0
    kills: list[Kill] = field(default_factory=list)
    wasted: int = 0  # requests (all runs) whose answer was already in the cache: must be 0
    exit_codes: list[int] = field(default_factory=list)  # of runs that ended by themselves

    @property
    def lost(self) -> int:
        return sum(k.lost for k in self.kills)

    @property
    def extra_requests(self) -> int:
        """Requests beyond the uninterrupted run's."""
        return self.interrupted_requests - self.reference_requests

    def as_dict(self) -> dict[str, Any]:
        ref = max(1, self.reference_requests)
        return {"reference_requests": self.reference_requests, "interrupted_requests": self.interrupted_requests,
                "runs": self.runs, "kills": len(self.kills), "extra_requests": self.extra_requests,
                "extra_percent": round(100 * self.extra_requests / ref, 2),
                "in_flight_at_kills": sum(k.in_flight for k in self.kills), "lost_at_kills": self.lost,
                "wasted": self.wasted, "beyond_in_flight": self.extra_requests - self.lost,
                "kills_per_step": _count(k.step for k in self.kills), "exit_codes": self.exit_codes}


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def llm_requests(server: Any) -> int:
    by_kind = server.stats["by_kind"]
    return by_kind.get("chat", 0) + by_kind.get("embeddings", 0)


def step_of(body: dict[str, Any]) -> str:
    if "input" in body:
        return "embed"
    name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
    return STEP_OF_SCHEMA.get(name, "summarize" if name is None else name)


def answer_keys(body: dict[str, Any]) -> list[str]:
    """The answer-cache keys a request's answer is stored under (as sensegraph.llm computes them
    for an `openai` provider without extra_body; an embedding request stores one per text)."""
    if "input" in body:
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return [cache_key("embed", {"model": body["model"], "dimensions": body.get("dimensions"), "text": t})
                for t in texts]
    rf = body.get("response_format") or {}
    schema = (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
    return [cache_key("chat", {"model": body["model"], "messages": body["messages"], "max_tokens": body["max_tokens"],
                               "temperature": body["temperature"], "schema": schema})]


def cached_keys(root: Path) -> set[str]:
    path = root / "cache" / "llm.sqlite"
    if not path.exists():
        return set()
    db = sqlite3.connect(path)
    try:
        return {k for (k,) in db.execute("SELECT key FROM answers")}
    finally:
        db.close()


def cli_env(base_url: str, *, api_key: str = "sk-test-kill", **settings: str) -> dict[str, str]:
    """The environment of an index subprocess: every model setting points at the mock server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSEGRAPH_")}
    for section in ("CHAT", "EMBEDDING"):
        env.update({f"SENSEGRAPH_{section}__PROVIDER": "openai", f"SENSEGRAPH_{section}__BASE_URL": base_url,
                    f"SENSEGRAPH_{section}__MODEL": "mock", f"SENSEGRAPH_{section}__API_KEY": api_key,
                    f"SENSEGRAPH_{section}__RETRY_BASE_SECONDS": "0.01"})
    env.update({f"SENSEGRAPH_{k.upper()}": v for k, v in settings.items()})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      env.get("PYTHONPATH", "")]))
    return env


def start_index(root: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:  # the child keeps its own handle
        return subprocess.Popen([sys.executable, "-m", "sensegraph.cli", "index", "--root", str(root)],
                                env=env, stdout=fh, stderr=subprocess.STDOUT)


def check_outputs(root: Path) -> int:
    """Read back every table, JSON file and the answer cache; raise if any is corrupt."""
    checked = 0
    out = root / "output"
    for path in sorted(out.rglob("*.parquet")) if out.exists() else []:
        pq.read_table(path)  # raises on a torn or truncated file
        checked += 1
    for path in sorted(out.glob("*.json")) if out.exists() else []:
        json.loads(path.read_text(encoding="utf-8"))
        checked += 1
    cache = root / "cache" / "llm.sqlite"
    if cache.exists():
        db = sqlite3.connect(cache)
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"{cache} is corrupt"
        finally:
            db.close()
        checked += 1
    return checked


def _bodies(server: Any, since: int) -> list[dict[str, Any]]:
    """Request bodies the server received after it had seen `since` LLM requests."""
    made = llm_requests(server) - since
    if made > len(server.requests):
        raise RuntimeError("more requests than the mock server keeps; use a smaller corpus")
    return list(server.requests)[len(server.requests) - made:] if made else []


def reference_run(root: Path, server: Any, env: dict[str, str]) -> list[str]:
    """An uninterrupted index of `root`; returns the step of each LLM request it made, in order.
    Also checks that every answer it received is in the cache under the key `answer_keys` gives."""
    before = llm_requests(server)
    proc = start_index(root, env, root / "index.log")
    code = proc.wait(timeout=300)
    if code != 0:
        raise RuntimeError(f"reference run failed ({code}): {(root / 'index.log').read_text()[-2000:]}")
    bodies = _bodies(server, before)
    stored = cached_keys(root)
    unmatched = [b for b in bodies if not set(answer_keys(b)) <= stored]
    if unmatched:
        raise RuntimeError(f"{len(unmatched)} answers are not in the cache under the expected key: "
                           "answer_keys() no longer matches sensegraph.llm's cache keys")
    return [step_of(b) for b in bodies]


def plan_kills(steps: list[str], kills: int, rng: random.Random, per_step: int = 2) -> list[int]:
    """Kill targets (1-based request counts): `per_step` inside each step's stretch of requests,
    the rest anywhere, all distinct and sorted."""
    targets: set[int] = set()
    for step in dict.fromkeys(steps):
        where = [i + 1 for i, s in enumerate(steps) if s == step]
        targets.update(rng.sample(where, min(per_step, len(where))))
    rest = [i for i in range(1, len(steps) + 1) if i not in targets]
    targets.update(rng.sample(rest, max(0, min(len(rest), kills - len(targets)))))
    return sorted(targets)


def _wait_for(server: Any, target: int, proc: subprocess.Popen) -> None:
    while llm_requests(server) < target and proc.poll() is None:
        time.sleep(0.002)


def _kill(proc: subprocess.Popen, server: Any, latency: float) -> int:
    """SIGKILL the run; returns the requests in flight at the kill as the server saw them: being
    answered when the kill was decided, or arriving after (bytes already in a socket)."""
    before = server.stats
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(latency + 0.1)  # let the orphaned requests finish and late bytes arrive
    late = llm_requests(server) - (before["by_kind"].get("chat", 0) + before["by_kind"].get("embeddings", 0))
    return before["in_flight"] + late


def _audit(bodies: list[dict[str, Any]], stored_before: set[str], stored_after: set[str]) -> tuple[int, int]:
    """(lost, wasted) among one run's requests: answer not stored / answer stored before the run."""
    keys = [set(answer_keys(b)) for b in bodies]
    lost = sum(1 for k in keys if not k <= stored_after)
    wasted = sum(1 for k in keys if k <= stored_before)
    return lost, wasted


def run_with_kills(root: Path, server: Any, env: dict[str, str], *, reference: list[str], kills: int = 10,
                   startup_kills: int = 2, seed: int = 0, latency: float = 0.05) -> KillReport:
    """Index `root` (a fresh project) with at least `kills` SIGKILLs at seeded moments spread over
    the steps of the `reference` run's requests, plus `startup_kills` in the first second, then
    let a last run finish. Checks every output file after each kill (raises if one is corrupt)."""
    rng = random.Random(seed)
    report = KillReport(reference_requests=len(reference))
    start = llm_requests(server)
    plan: list[int | None] = [None] * startup_kills + plan_kills(reference, kills, rng)
    log = root / "index.log"
    for target in plan:
        stored_before = cached_keys(root)
        run_start = llm_requests(server)
        proc = start_index(root, env, log)
        report.runs += 1
        if target is None:
            time.sleep(rng.uniform(0.1, 1.0))
        else:
            # Requests lost at earlier kills are asked again first: shift the target by them, so
            # the kill lands at the intended point of the work. Never at a count already passed.
            _wait_for(server, max(start + target + report.lost, llm_requests(server) + 1), proc)
            time.sleep(rng.uniform(0, latency))
        if proc.poll() is not None:  # finished before the kill moment
            report.exit_codes.append(proc.returncode)
            report.wasted += _audit(_bodies(server, run_start), stored_before, cached_keys(root))[1]
            continue
        last = server.requests[-1] if llm_requests(server) > run_start else None
        before = llm_requests(server)
        in_flight = _kill(proc, server, latency)
        files = check_outputs(root)
        lost, wasted = _audit(_bodies(server, run_start), stored_before, cached_keys(root))
        report.wasted += wasted
        report.kills.append(Kill(report.runs, before - start, in_flight, lost,
                                 step_of(last) if last is not None else "start", files))
    stored_before, run_start = cached_keys(root), llm_requests(server)
    proc = start_index(root, env, log)  # the last run, left to finish
    report.runs += 1
    report.exit_codes.append(proc.wait(timeout=300))
    report.wasted += _audit(_bodies(server, run_start), stored_before, cached_keys(root))[1]
    check_outputs(root)
    report.interrupted_requests = llm_requests(server) - start
    return report
