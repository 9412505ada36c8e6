"""What indexing costs besides the LLM: the whole pipeline against a zero-latency mock server.

Indexes the podcast corpus (../shared/data/podcast/transcripts.zip, 1,669 transcript parts,
~1M tokens) against tests/mock_llm.py running in its own process, so the measured process's
CPU time is sensegraph's alone (pipeline + client + parquet + graph work). Embeddings also go
to the mock (embedding.provider: openai): the local embedder would otherwise spend most of the
CPU on matrix products, which is the model's cost, not the pipeline's overhead.

The measured run is a fresh `--worker` subprocess with the cache off, so every call is made.
It reports wall time, CPU (user+sys), peak RSS, LLM calls (from stats.json), CPU ms per call,
and the time outside LLM waits (wall - calls x latency / concurrency). With zero latency there
are no LLM waits to subtract, so the client CPU time is the overhead figure: on two cores the
mock server competes for the same CPU, and wall time includes its share.

    python bench/index_overhead.py                    # the whole corpus
    python bench/index_overhead.py --limit 200        # first 200 transcripts
    python bench/index_overhead.py --limit 200 --profile   # + cProfile top functions
    python bench/index_overhead.py --latency 0.2 --concurrency 25
    python bench/index_overhead.py --latency 0.3 --concurrency 25 --answer-scale 3   # a verbose model
    python bench/index_overhead.py --copies 8          # the corpus 8 times, entities renamed per copy

Memory: `--copies K` indexes the corpus K times over, each copy's proper nouns renamed (a
per-copy suffix: "Kevin Scott" -> "Kevinar Scottar"), so the copies' entities do not merge and the
graph grows with the corpus as a K times larger corpus's would. The worker samples its resident
memory every 20 ms and reports the peak of each step beside stats.json's high-water marks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

from mock_process import mock_server_process

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "podcast" / "transcripts.zip"
GOAL_OVERHEAD_S = 120.0
GOAL_RSS_MB = 2048.0


_WORD = re.compile(r"\b[A-Za-z][a-z]*\b|\b[A-Z]+\b")
_SYLLABLES = ("ar", "en", "is", "ov", "ul", "ek", "im", "os", "an", "et", "ir", "uz")


def copy_suffix(copy: int) -> str:
    """The suffix of copy `copy` (1, 2, ...): "ar", "en", ..., then two syllables ("enar" ...)."""
    out, n = "", copy
    while n > 0:
        n, r = divmod(n - 1, len(_SYLLABLES))
        out = _SYLLABLES[r] + out
    return out


def proper_nouns(texts: list[str]) -> set[str]:
    """Capitalised words never written in lower case in the corpus: its names. Renaming these
    (and only these) keeps every copy's common words and sentence openings ("The", "So") as
    they are, so a copy differs from the original only in whom and what it names."""
    capitalised, lower = set(), set()
    for t in texts:
        for w in _WORD.findall(t):
            (lower if w.islower() else capitalised).add(w)
    return {w for w in capitalised if len(w) > 1 and w.lower() not in lower}


def rename(text: str, names: set[str], copy: int) -> str:
    if copy == 0:
        return text
    suffix = copy_suffix(copy)

    def sub(m: re.Match) -> str:
        w = m.group(0)
        if w not in names:
            return w
        return w + (suffix.upper() if w.isupper() else suffix)
    return _WORD.sub(sub, text)


def extract_corpus(dest: Path, limit: int | None, copies: int = 1) -> int:
    """Unzip the first `limit` transcripts (sorted by name, so --limit is stable) into dest;
    `copies` > 1 writes the corpus that many times, copy k's names renamed (`rename`)."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(CORPUS) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".txt"))
        if limit:
            names = names[:limit]
        texts = [z.read(n).decode("utf-8") for n in names]
    nouns = proper_nouns(texts) if copies > 1 else set()
    for k in range(copies):
        for n, text in zip(names, texts):
            name = Path(n).name if k == 0 else f"copy{k}_{rename(Path(n).name, nouns, k)}"
            (dest / name).write_text(rename(text, nouns, k), encoding="utf-8")
    return len(names) * copies


class MemorySampler:
    """Resident memory every `interval` s in a thread, peak per pipeline step (the step running
    is set by a wrapper around Steps.run). Reading /proc/self/statm costs a few microseconds."""

    def __init__(self, interval: float = 0.02):
        import os

        self.interval = interval
        self.page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
        self.step = "start"
        self.starts: list[tuple[str, float]] = []  # (step, perf_counter when it started)
        self.cpu: dict[str, float] = {}  # CPU seconds of the process (all threads) per step
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_mb(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page_mb

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = self.rss_mb()
            if rss > self.peaks.get(self.step, 0.0):
                self.peaks[self.step] = rss

    def watch_steps(self) -> None:
        from sensegraph.index.steps import Steps

        run = Steps.run
        sampler = self

        async def watched(self, name, fn, **kw):  # noqa: ANN001 - same signature as Steps.run
            sampler.step = name
            sampler.starts.append((name, time.perf_counter()))
            cpu0 = time.process_time()
            try:
                return await run(self, name, fn, **kw)
            finally:
                sampler.cpu[name] = time.process_time() - cpu0
                sampler.step = f"after {name}"  # the pipeline's work between steps
                sampler.starts.append((sampler.step, time.perf_counter()))
        Steps.run = watched

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class SlotTimeline:
    """When each request slot was taken and given back, by model (chat / embedding) and by the
    pipeline step running then: where the slots stood empty (the busy share's losses)."""

    def __init__(self, sampler: "MemorySampler"):
        self.sampler = sampler
        self.spans: list[tuple[str, str, float, float]] = []  # (model, step, taken, freed)

    def watch(self) -> None:
        import contextlib

        from sensegraph.llm.endpoints import Endpoints

        slot = Endpoints.slot
        timeline = self

        @contextlib.asynccontextmanager
        async def watched(self, avoid=None):  # noqa: ANN001 - same signature as Endpoints.slot
            async with slot(self, avoid) as endpoint:
                taken = time.perf_counter()
                try:
                    yield endpoint
                finally:
                    timeline.spans.append((timeline.kind(self), timeline.sampler.step, taken,
                                           time.perf_counter()))
        Endpoints.slot = watched

    @staticmethod
    def kind(endpoints: object) -> str:
        from sensegraph.config import EmbeddingSettings

        return "embedding" if isinstance(getattr(endpoints, "settings", None), EmbeddingSettings) else "chat"

    def losses(self, concurrency: int, t_end: float) -> dict[str, dict[str, float]]:
        """Per step: wall seconds, and the chat slots' empty time in seconds of all slots
        (empty slot-seconds / concurrency), split into before the first request, the tail after
        the slots were last all full, and the gaps between."""
        import numpy as np

        out: dict[str, dict[str, float]] = {}
        bounds = self.sampler.starts + [("end", t_end)]
        for (step, t0), (_, t1) in zip(bounds, bounds[1:]):
            spans = [(a, b) for m, s, a, b in self.spans if m == "chat" and a < t1 and b > t0]
            if t1 - t0 < 0.05:
                continue
            grid = np.arange(t0, t1, 0.01)
            busy = np.zeros(len(grid))
            for a, b in spans:
                busy[(grid >= a) & (grid < b)] += 1
            idle = np.clip(concurrency - busy, 0, None) * 0.01 / concurrency
            full = np.nonzero(busy >= concurrency)[0]
            first = np.nonzero(busy > 0)[0]
            start = first[0] if len(first) else len(grid)
            last_full = full[-1] if len(full) else start
            out[step] = {"wall": t1 - t0, "chat_requests": len(spans),
                         "mean_slot_s": float(np.mean([b - a for a, b in spans])) if spans else 0.0,
                         "empty_s": float(idle.sum()), "before_first": float(idle[:start].sum()),
                         "tail": float(idle[last_full + 1:].sum()),
                         "gaps": float(idle[start:last_full + 1].sum())}
        return out


def worker(root: str, profile: str | None, timeline_on: bool = False) -> None:
    """Index `root` in this process; print measured figures as JSON (imports excluded)."""
    import asyncio

    from sensegraph.config import load_settings
    from sensegraph.index.pipeline import run_index

    settings = load_settings(root, env={})
    sampler = MemorySampler()
    sampler.watch_steps()
    timeline = SlotTimeline(sampler)
    if timeline_on:
        timeline.watch()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    start_rss = sampler.rss_mb()
    t0 = time.perf_counter()
    lags: list[tuple[str, float]] = []  # (step, how late the event loop woke a 5 ms sleep)
    gc_pauses: list[tuple[str, int, float]] = []  # (step, generation, seconds)
    if timeline_on:
        import gc

        gc_start: list[float] = [0.0]

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                gc_start[0] = time.perf_counter()
            else:
                gc_pauses.append((sampler.step, info["generation"], time.perf_counter() - gc_start[0]))
        gc.callbacks.append(on_gc)

    async def indexed():
        # The event loop's lag: a sleep that wakes late means the loop ran something else that
        # long without a pause, and every answer that arrived meanwhile waited as long.
        async def watch_lag() -> None:
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append((sampler.step, time.perf_counter() - t - 0.005))
        lag_task = asyncio.ensure_future(watch_lag()) if timeline_on else None
        try:
            return await run_index(settings, cache=False, allow_partial=True, log=lambda m: None)
        finally:
            if lag_task is not None:
                lag_task.cancel()
    coro = indexed()
    with sampler:
        if profile:
            import cProfile

            prof = cProfile.Profile()
            result = prof.runcall(asyncio.run, coro)
            prof.dump_stats(profile)
        else:
            result = asyncio.run(coro)
    t_end = time.perf_counter()
    wall = t_end - t0
    if timeline_on and os.environ.get("SG_SPANS"):  # for a closer look: every slot and step start
        Path(os.environ["SG_SPANS"]).write_text(json.dumps({"spans": timeline.spans, "starts": sampler.starts}))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    total = result.stats["llm"]["total"]
    print(json.dumps({
        "wall": wall,
        "cpu": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
        "user": ru1.ru_utime - ru0.ru_utime,
        "sys": ru1.ru_stime - ru0.ru_stime,
        "peak_rss_mb": ru1.ru_maxrss / 1024,  # Linux reports KiB
        "start_rss_mb": start_rss,  # after imports, before the index
        "step_peak_rss_mb": {k: round(v) for k, v in sampler.peaks.items()},
        "calls": total["calls"],
        "requests": total.get("requests", total["calls"]),
        "failures": sum(len(v) for v in result.stats["failures"].values()),
        "slot_losses": timeline.losses(settings.chat.concurrency, t_end) if timeline_on else {},
        "gc": {step: {"seconds": round(sum(x for s, _, x in gc_pauses if s == step), 2),
                      "gen2": sum(1 for s, g, _ in gc_pauses if s == step and g == 2),
                      "max_ms": round(1000 * max(x for s, _, x in gc_pauses if s == step), 1)}
               for step in dict.fromkeys(s for s, _, _ in gc_pauses)},
        "loop_lag": {step: {"late_s": round(sum(x for s, x in lags if s == step and x > 0.002), 2),
                            "max_ms": round(1000 * max(x for s, x in lags if s == step), 1)}
                     for step in dict.fromkeys(s for s, _ in lags)},
        "steps": {k: {"seconds": v.get("seconds"), "calls": v.get("calls"), "retries": v.get("retries"),
                      "cpu": sampler.cpu.get(k)}
                  for k, v in result.stats["steps"].items()},
        "documents": len(result.tables["documents"]),
        "tokens": result.stats["steps"]["text_units"].get("tokens", 0),
        "text_units": len(result.tables["text_units"]),
        "entities": len(result.tables["entities"]),
        "relationships": len(result.tables["relationships"]),
        "communities": len(result.tables["communities"]),
    }), flush=True)


def write_settings(root: Path, base_url: str, concurrency: int) -> None:
    """Chat and embeddings against the mock, cache off."""
    endpoint = (f"  provider: openai\n  model: mock\n  base_url: {base_url}\n  api_key: x\n"
                f"  concurrency: {concurrency}\n  retry_base_seconds: 0.01\n")
    (root / "settings.yaml").write_text(
        "chat:\n" + endpoint + "embedding:\n" + endpoint + "  batch_size: 64\n"
        "cache:\n  enabled: false\n" + os.environ.get("SG_EXTRA_SETTINGS", ""))


def print_profile(path: str, top: int = 25) -> None:
    import pstats

    print(f"\ncProfile of the worker, top {top} by cumulative and by own time:")
    st = pstats.Stats(path)
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N transcripts")
    ap.add_argument("--concurrency", type=int, default=25)
    ap.add_argument("--latency", type=float, default=0.0, help="mock server seconds per answer")
    ap.add_argument("--copies", type=int, default=1,
                    help="index the corpus this many times over, each copy's names renamed (memory at scale)")
    ap.add_argument("--answer-scale", type=float, default=1.0,
                    help="the mock's answers this many times longer (more sentences and list items)")
    ap.add_argument("--profile", action="store_true", help="run the worker under cProfile and print top costs")
    ap.add_argument("--timeline", action="store_true",
                    help="record when each request slot was taken and freed, and the event loop's lag, "
                         "and print where the slots stood empty per step (costs some client CPU)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary project folder")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.profile_out, args.timeline)
        return
    if not CORPUS.exists():
        sys.exit(f"corpus not found: {CORPUS}")

    tmp = Path(tempfile.mkdtemp(prefix="sg-bench-"))
    try:
        # --fast-vectors: the mock's embeddings must not stall its own chat answers (mock_llm.py)
        with mock_server_process(args.latency, "--fast-vectors", answer_scale=args.answer_scale) as server:
            n_docs = extract_corpus(tmp / "input", args.limit, args.copies)
            write_settings(tmp, server.base_url, args.concurrency)
            prof_path = str(tmp / "profile.out") if args.profile else None
            cmd = [sys.executable, __file__, "--worker", str(tmp)] + (["--profile-out", prof_path] if prof_path else []) \
                + (["--timeline"] if args.timeline else [])
            server_cpu0 = server.cpu()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            outer_wall = time.perf_counter() - t0
            server_cpu = server.cpu() - server_cpu0
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-5000:])
            sys.exit(f"worker failed with exit code {proc.returncode}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        report(r, args, n_docs, outer_wall, server_cpu)
        if prof_path and Path(prof_path).exists():
            print_profile(prof_path)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"project kept in {tmp}")


def report(r: dict, args: argparse.Namespace, n_docs: int, outer_wall: float, server_cpu: float) -> None:
    llm_wait = r["calls"] * args.latency / args.concurrency
    outside = r["wall"] - llm_wait
    rows = [
        ("transcripts / corpus tokens", f"{n_docs} / {r['tokens']:,}"
         + (f"  ({args.copies} renamed copies)" if args.copies > 1 else "")),
        ("text units / entities / relationships / communities",
         f"{r['text_units']} / {r['entities']} / {r['relationships']} / {r['communities']}"),
        ("concurrency / mock latency", f"{args.concurrency} / {args.latency * 1000:.0f} ms"
         + (f", answers x{args.answer_scale:g}" if args.answer_scale != 1.0 else "")),
        ("LLM calls (chat + embedding batches)", f"{r['calls']:,}" + (f"  ({r['failures']} failed)" if r["failures"] else "")),
        ("wall time", f"{r['wall']:.1f} s   (subprocess incl. imports: {outer_wall:.1f} s)"),
        ("client CPU user+sys", f"{r['cpu']:.1f} s   (user {r['user']:.1f}, sys {r['sys']:.1f})"),
        ("CPU ms per LLM call", f"{1000 * r['cpu'] / max(1, r['calls']):.2f}"),
        ("mock server CPU (other process)", f"{server_cpu:.1f} s"),
        ("time outside LLM waits", f"{outside:.1f} s   (wall - calls x latency / concurrency)"),
        ("peak RSS", f"{r['peak_rss_mb']:.0f} MB   (after imports: {r['start_rss_mb']:.0f} MB)"),
    ]
    if args.latency > 0:
        # The best any client can do: every one of `concurrency` connections always busy.
        ideal = args.concurrency / args.latency
        achieved = r["requests"] / r["wall"]
        rows.append(("achieved / ideal requests per s",
                     f"{achieved:.1f} / {ideal:.1f} = {achieved / ideal:.2f} of ideal"))
    w = max(len(k) for k, _ in rows)
    corpus = ('first ' + str(args.limit) if args.limit else 'whole') + " podcast corpus" + \
        (f" x{args.copies}" if args.copies > 1 else "")
    print(f"\nsensegraph index overhead ({corpus})")
    print("-" * (w + 40))
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("-" * (w + 40))
    print("per step (s, calls): " + ", ".join(f"{k} {v['seconds']:.1f}s/{v['calls'] or 0}"
                                               for k, v in r["steps"].items()))
    print("client CPU per step (s, and ms per request): " + ", ".join(
        f"{k} {v['cpu']:.1f}" + (f"/{1000 * v['cpu'] / v['calls']:.1f}" if v["calls"] else "")
        for k, v in r["steps"].items() if v.get("cpu") is not None))
    if args.latency > 0:
        # Each LLM step's own rate: its requests (answers + retries) over its wall time.
        ideal = args.concurrency / args.latency
        print("requests per s by step (share of ideal): " + ", ".join(
            f"{k} {rate:.0f} ({rate / ideal:.2f})" for k, v in r["steps"].items() if v["calls"] and v["seconds"]
            for rate in [((v["calls"] or 0) + (v.get("retries") or 0)) / v["seconds"]]))
    if r["slot_losses"]:
        print("chat slots standing empty, in seconds of all slots (before the first request / "
              "gaps / tail after the slots were last all full):")
        for step, v in r["slot_losses"].items():
            print(f"  {step:<28} wall {v['wall']:6.1f} s  {v['chat_requests']:5d} requests of {v['mean_slot_s'] * 1000:3.0f} ms  empty "
                  f"{v['empty_s']:5.1f} s = {v['before_first']:.1f} / {v['gaps']:.1f} / {v['tail']:.1f}")
    if r.get("gc"):
        print("garbage collection (s / full collections / worst ms): " + ", ".join(
            f"{k} {v['seconds']}/{v['gen2']}/{v['max_ms']}" for k, v in r["gc"].items()))
    if r["loop_lag"]:
        print("event loop late (sum of wake-ups >2 ms late, s / worst ms): " + ", ".join(
        f"{k} {v['late_s']}/{v['max_ms']}" for k, v in r["loop_lag"].items()))
    print("peak RSS per step (MB, sampled every 20 ms): " + ", ".join(
        f"{k} {v}" for k, v in r["step_peak_rss_mb"].items()))
    overhead = r["cpu"] if args.latency == 0 else outside
    print(f"overhead figure: {overhead:.1f} s (goal < {GOAL_OVERHEAD_S:.0f} s for the whole corpus); "
          f"peak RSS {r['peak_rss_mb']:.0f} MB (goal < {GOAL_RSS_MB:.0f} MB)")
    if args.latency == 0:
        print("note: with zero latency there is no LLM wait to subtract, so client CPU time is the overhead; "
              "wall time also includes waiting for the mock server, which shares the same cores.")
    print("note: embeddings go to the mock (embedding.provider: openai); the local embedder would add "
          "its own model CPU, which is the model's cost rather than the pipeline's.")


if __name__ == "__main__":
    main()
