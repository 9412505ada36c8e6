"""Kill `sensegraph index` with SIGKILL at seeded random moments, rerun it, count what was lost.

Used by tests/test_reliability_crash.py (asserts) and bench/kill_index.py (prints figures).
The index runs as a real subprocess (`python -m sensegraph.cli index`); the mock server runs in a
thread of the calling process, so its request log is read directly. "LLM requests" are chat and
embedding requests that reached the server (the free GET /models of the preflight is not one).

Kill moments are aimed by step, from the run's own progress: "once this run has sent its k-th
request of step S, plus a random fraction of one request's latency", with S and k sampled
(seeded) among the requests of S that the cache does not hold yet. So every step that calls a
model gets kills on any machine's timing: a rerun skips what is cached, and steps overlap (text
units are embedded during extraction), so a position in the uninterrupted run's sequence of
requests says little about which step a killed run is in. A few kills also fire at a random
moment of the first second (start-up, documents, text units), before any request.

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


@dataclass(frozen=True)
class Request:
    """One request of the uninterrupted run: its step, and the cache keys of its answer."""
    step: str
    keys: frozenset[str]


@dataclass
class Kill:
    run: int
    requests_before: int  # LLM requests the server had seen (all runs) when the kill fired
    in_flight: int        # server's view: being answered at the kill, or arriving after it
    lost: int             # requests of this run whose answer is not in the cache after the kill
    step: str             # the step the kill was aimed at, under way then ("start": before any request)
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


def reference_run(root: Path, server: Any, env: dict[str, str]) -> list[Request]:
    """An uninterrupted index of `root`: each LLM request it made, in order. Also checks that
    every answer it received is in the cache under the key `answer_keys` gives."""
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
    return [Request(step_of(b), frozenset(answer_keys(b))) for b in bodies]


def plan_kills(reference: list[Request], kills: int, rng: random.Random, per_step: int = 2) -> list[str]:
    """The step each kill aims at: `per_step` for every step that calls a model, the rest drawn
    in proportion to the steps' requests; in the order the steps run (by their requests' median
    position: embedding requests are spread over the run), since a kill aimed at a step that an
    earlier run has finished has nothing left to hit."""
    steps = [r.step for r in reference]
    plan = [step for step in dict.fromkeys(steps) for _ in range(per_step)]
    plan += rng.choices(steps, k=max(0, kills - len(plan)))
    where = {step: [i for i, s in enumerate(steps) if s == step] for step in set(steps)}
    return sorted(plan, key=lambda step: where[step][len(where[step]) // 2])


def _left(reference: list[Request], step: str | None, stored: set[str]) -> int:
    """What a run still has to ask of `step`, given the answers `stored`: a kill aimed at the
    step lands at one of those requests."""
    return sum(1 for r in reference if r.step == step and not r.keys <= stored)


def _wait_for(server: Any, run_start: int, step: str, count: int, proc: subprocess.Popen) -> None:
    """Until this run (whose first request was the server's request run_start + 1) has sent
    `count` requests of `step`, or has ended."""
    while proc.poll() is None and sum(1 for b in _bodies(server, run_start) if step_of(b) == step) < count:
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


def run_with_kills(root: Path, server: Any, env: dict[str, str], *, reference: list[Request], kills: int = 10,
                   startup_kills: int = 2, seed: int = 0, latency: float = 0.05) -> KillReport:
    """Index `root` (a fresh project, same input and settings as the `reference` run) with at
    least `kills` SIGKILLs aimed at the steps of the reference run's requests, plus
    `startup_kills` in the first second, then let a last run finish. Checks every output file
    after each kill (raises if one is corrupt)."""
    rng = random.Random(seed)
    report = KillReport(reference_requests=len(reference))
    start = llm_requests(server)
    plan: list[str | None] = [None] * startup_kills + plan_kills(reference, kills, rng)
    order = list(dict.fromkeys(step for step in plan if step is not None))  # the steps in the order they run
    log = root / "index.log"
    for n, aim in enumerate(plan):
        stored_before = cached_keys(root)
        left_of = {step: _left(reference, step, stored_before) for step in order}
        if aim is not None and left_of[aim] == 0:
            # An earlier run got further than planned (a kill lands a little after its aim, and a
            # step with few requests may finish meanwhile): aim at the next step with work left,
            # or an earlier one, so every planned kill lands (CI once got 9 of 10).
            at = order.index(aim)
            ahead = [step for step in order[at + 1:] + order[:at] if left_of[step]]
            if not ahead:
                continue  # every step is done: nothing to aim at
            aim = ahead[0]
        left = left_of.get(aim, 0)
        run_start = llm_requests(server)
        proc = start_index(root, env, log)
        report.runs += 1
        if aim is None:
            time.sleep(rng.uniform(0.1, 1.0))
        else:
            # Within the first share of what is left, so the step's later kills find work too.
            share = max(1, left // max(1, plan[n:].count(aim)))
            _wait_for(server, run_start, aim, rng.randint(1, share), proc)
            time.sleep(rng.uniform(0, latency))
        if proc.poll() is not None:  # finished before the kill moment
            report.exit_codes.append(proc.returncode)
            report.wasted += _audit(_bodies(server, run_start), stored_before, cached_keys(root))[1]
            continue
        before = llm_requests(server)
        in_flight = _kill(proc, server, latency)
        files = check_outputs(root)
        lost, wasted = _audit(_bodies(server, run_start), stored_before, cached_keys(root))
        report.wasted += wasted
        report.kills.append(Kill(report.runs, before - start, in_flight, lost, aim or "start", files))
    stored_before, run_start = cached_keys(root), llm_requests(server)
    proc = start_index(root, env, log)  # the last run, left to finish
    report.runs += 1
    report.exit_codes.append(proc.wait(timeout=300))
    report.wasted += _audit(_bodies(server, run_start), stored_before, cached_keys(root))[1]
    check_outputs(root)
    report.interrupted_requests = llm_requests(server) - start
    return report
