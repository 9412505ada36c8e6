"""Scale-out over several endpoints of one model: achieved requests/s against the ideal.

Starts 4 mock servers (tests/mock_llm.py, each in its own process), each answering at most 8
requests at once with 300 ms latency and queueing the rest, like a GPU server at its batch
limit: one endpoint can give at most 8 / 0.3 = 26.7 requests/s, four 106.7. Then sends N
extraction-sized structured calls (cache off) through one ChatClient configured with 1, 2 and
4 of them as `chat.endpoints`, with `concurrency` in flight per endpoint, and prints the
achieved rate as a share of the ideal for that many endpoints, and how the calls spread.

With --ray, it also starts a local Ray cluster (a head node and three worker nodes, one CPU
each, with `ray start`) and sends the same calls over all 4 endpoints through 1, 2 and 4 Ray
workers (sensegraph/llm/ray_workers.py), the way `sensegraph index --ray` makes them.

With --ray-data, extraction itself runs as `sensegraph index --ray ADDRESS --ray-data` runs it
(sensegraph/index/ray_data.py): --units text units in partitions extracted by 1, 2 and 4 Ray
Data actors on the same local cluster, against extract_graph in this process. Printed: requests
per second, the driver's CPU per call (this process's CPU time over the step: with Ray Data it
only sends partitions and merges tables) and its peak RSS; then a projection for 100M and 1B
tokens from the measured per-call and per-unit figures.

    python bench/scale_out.py                 # 400 calls per configuration
    python bench/scale_out.py --calls 800 --concurrency 12 --ray
    python bench/scale_out.py --ray-data --units 400
    python bench/scale_out.py --ray-data --units 1600 --latency 0.05   # a higher rate: the driver's cost per call
    python bench/scale_out.py --memory --units 1600 --latency 0.05     # the driver's memory at 1x, 2x, 4x units
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from typing import Any

from pydantic import BaseModel

from index_overhead import MemorySampler
from mock_process import free_port, mock_server_process
from sensegraph.config import ChatSettings, EmbeddingSettings, Settings
from sensegraph.llm import ChatClient

LATENCY = 0.3
BATCH_LIMIT = 8
PARTITION_UNITS = 0  # 0: the setting's default (--partition-units)
PROMPT = ("-Goal-\nIdentify all entities and relationships in the text.\n-Text-\n"
          + "Acme Corp hired Jane Doe in Berlin; Jane Doe met John Smith of Globex in Paris. " * 20)


class Entity(BaseModel):
    name: str
    type: str
    description: str


class Extraction(BaseModel):
    entities: list[Entity]


def chat_settings(urls: list[str], concurrency: int) -> ChatSettings:
    return ChatSettings(provider="openai", model="mock", api_key="k", max_retries=3, retry_base_seconds=0.1,
                        endpoints=[{"base_url": u, "concurrency": concurrency} for u in urls])


async def run(urls: list[str], calls: int, concurrency: int, ray_address: str | None = None,
              workers: int = 0) -> tuple[float, dict]:
    settings = chat_settings(urls, concurrency)
    client = ChatClient(settings, cache=None)
    pool = None
    if ray_address:
        from sensegraph.llm.ray_workers import RayWorkers

        whole = Settings(chat=settings, embedding=EmbeddingSettings(provider="openai", model="mock", api_key="k",
                                                                    base_url=urls[0]))
        pool = client.workers = RayWorkers(whole, ray_address, workers)
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(client.structured([{"role": "user", "content": f"{PROMPT}\nunit {i}"}], Extraction,
                                                 step="extract", item=str(i), max_tokens=500)
                               for i in range(calls)))
    finally:
        await client.aclose()
    seconds = time.perf_counter() - t0
    assert not client.usage.total().failures
    report = pool.pool("chat").report() if pool else client.endpoints.report()
    if pool:
        await pool.aclose()
    return calls / seconds, report


def extraction_settings(urls: list[str], concurrency: int, root: str, address: str | None,
                        workers: int) -> Settings:
    chat = chat_settings(urls, concurrency)
    return Settings(root=root, chat=chat, cache={"enabled": False},
                    embedding=EmbeddingSettings(provider="openai", model="mock", api_key="k", base_url=urls[0]),
                    ray={"address": address, "data": bool(address), "workers": workers,
                         "data_path": os.path.join(root, f"ray-data-{workers}"),
                         **({"partition_units": PARTITION_UNITS} if PARTITION_UNITS else {})})


def extract_once(urls: list[str], units: int, concurrency: int, address: str | None = None,
                 workers: int = 0) -> dict[str, float]:
    """One extraction of `units` text units: requests/s, driver CPU ms per call, the driver's
    resident memory at its peak and how much of it the run added, and the merged tables' size."""
    import tempfile

    import pandas as pd

    from sensegraph.index import extract, ray_data
    from sensegraph.llm import Usage

    table = pd.DataFrame({"id": [f"u{i}" for i in range(units)], "text": [f"{PROMPT}\nunit {i}" for i in range(units)]})
    with tempfile.TemporaryDirectory(prefix="sensegraph-scale-") as root:
        settings = extraction_settings(urls, concurrency, root, address, workers)
        usage = Usage()
        async def alone(advance: Any) -> extract.ExtractionResult:
            client = ChatClient(settings.chat, cache=None, usage=usage)
            try:
                return await extract.extract_graph(table, client, settings=settings, language="en", advance=advance)
            finally:
                await client.aclose()
        # The run's own peak above its start (ru_maxrss is the peak of the process's whole life,
        # so a second run in one process would only repeat the first's).
        memory = MemorySampler()
        start = memory.rss_mb()
        threads = thread_cpu()
        finished: list[tuple[float, int]] = []  # (when, units) as units finish: the start-up apart

        def advance(n: int) -> None:
            finished.append((time.perf_counter(), n))
        with memory:
            cpu, t0 = time.process_time(), time.perf_counter()
            if address:
                result, _ = ray_data.extract_on_ray(table, settings=settings, language="en", usage=usage,
                                                    advance=advance)
            else:
                result = asyncio.run(alone(advance))
            seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu
        threads = {name: ticks - threads.get(name, 0) for name, ticks in thread_cpu().items()}
        peak = max(memory.peaks.get(memory.step, start), memory.rss_mb())
    assert not result.failed, result.failed[:5]
    calls = usage.total().calls
    # The rate after the first items finished (Ray Data: the first partition), which leaves out
    # starting the actors; Ray Data reports whole partitions, so this is coarse.
    first = finished[0][0] - t0 if finished else seconds
    rest = sum(n for _, n in finished[1:])
    steady = calls * rest / units / max(seconds - first, 1e-9) if rest else float("nan")
    merged = sum(t.memory_usage(deep=True).sum() for t in (result.entities, result.relationships, result.claims))
    return {"calls": calls, "rate": calls / seconds, "first_s": first, "steady": steady, "cpu_ms": 1000 * cpu / max(calls, 1), "cores": cpu / seconds,
            "rss_mb": peak, "added_mb": peak - start, "tables_mb": merged / 2**20,
            "seconds": seconds, "threads_ms_per_call": {name: round(1000 * t / max(calls, 1), 4)
                                                         for name, t in sorted(threads.items(), key=lambda x: -x[1])
                                                         if t > 0}}


def thread_cpu() -> dict[str, float]:
    """This process's CPU seconds so far per thread, summed by name (Linux /proc): Python threads
    by their threading name, the others (Ray's C++ threads) by their kernel name. Threads that
    ended before the call are not counted, so the sum can be below process_time()."""
    import threading

    python = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = python.get(int(tid), comm)
        # Numbered pools (ThreadPoolExecutor-0_3, ...) as one name.
        name = name.rstrip("0123456789_-") or name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


@contextmanager
def local_cluster(nodes: int):
    """A head node and nodes-1 worker nodes on this machine, one CPU each, stopped at the end."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throw-away local cluster, this driver included
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    port = free_port()
    quiet = dict(check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([*ray, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                    "--disable-usage-stats"], **quiet)
    try:
        for _ in range(nodes - 1):
            subprocess.run([*ray, "start", f"--address=127.0.0.1:{port}", "--num-cpus=1"], **quiet)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*ray, "stop", "--force"], **quiet)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=BATCH_LIMIT, help="requests in flight per endpoint")
    ap.add_argument("--ray", action="store_true", help="also through 1, 2 and 4 Ray workers on a local cluster")
    ap.add_argument("--ray-data", action="store_true",
                    help="extraction as a Ray Data pipeline with 1, 2 and 4 actors, against one process")
    ap.add_argument("--units", type=int, default=400, help="text units extracted per configuration (--ray-data)")
    ap.add_argument("--latency", type=float, default=LATENCY,
                    help="seconds per mock answer (--ray-data; lower it to see the driver's CPU at a higher rate)")
    ap.add_argument("--memory", action="store_true",
                    help="the driver's memory as the corpus grows: --units x1, x2, x4 in one process and with "
                         "Ray Data (2 actors), against the size of the merged tables")
    ap.add_argument("--partition-units", type=int, default=0,
                    help="ray.partition_units for the Ray Data runs (default: the setting's default)")
    ap.add_argument("--actors", default="1,2,4", help="Ray Data actor counts to run (--ray-data)")
    ap.add_argument("--measure-one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global PARTITION_UNITS
    PARTITION_UNITS = args.partition_units
    if args.measure_one:
        return measure_one(args.measure_one, args.urls.split(","), args.concurrency, args.address)
    if args.memory:
        return memory_table(args.units, args.concurrency, args.latency)
    if args.ray_data:
        return ray_data_table(args.units, args.concurrency, args.latency,
                              [int(n) for n in args.actors.split(",")])
    with ExitStack() as stack:
        servers = [stack.enter_context(mock_server_process(LATENCY, "--batch-limit", str(BATCH_LIMIT)))
                   for _ in range(4)]
        urls = [s.base_url for s in servers]
        print(f"{len(urls)} mock endpoints, each at most {BATCH_LIMIT} requests at once, {LATENCY * 1000:.0f} ms; "
              f"{args.calls} calls per configuration, {args.concurrency} in flight per endpoint")
        print(f"{'endpoints':>10}{'requests/s':>12}{'ideal':>8}{'share':>8}   requests per endpoint")
        for n in (1, 2, 4):
            rate, report = asyncio.run(run(urls[:n], args.calls, args.concurrency))
            ideal = n * BATCH_LIMIT / LATENCY
            spread = ", ".join(str(e["requests"]) for e in report.values())
            print(f"{n:>10}{rate:>12.1f}{ideal:>8.1f}{rate / ideal:>8.2f}   {spread}")
        if args.ray:
            ideal = len(urls) * BATCH_LIMIT / LATENCY
            print(f"\n4 endpoints through Ray workers (local cluster: head + 3 worker nodes)")
            print(f"{'workers':>10}{'requests/s':>12}{'ideal':>8}{'share':>8}   requests per worker and endpoint")
            with local_cluster(4) as address:
                for n in (1, 2, 4):
                    rate, report = asyncio.run(run(urls, args.calls, args.concurrency, address, n))
                    spread = ", ".join(str(e["requests"]) for e in report.values())
                    print(f"{n:>10}{rate:>12.1f}{ideal:>8.1f}{rate / ideal:>8.2f}   {spread}")


def memory_table(units: int, concurrency: int, latency: float) -> None:
    """What the driver's memory grows with: the run's peak above its start, against the merged
    instance tables it returns, for 1, 2 and 4 times `units`; each run in a fresh process (in one
    process the allocator keeps the first run's memory and lends it to the next)."""
    import json

    def measured(n: int, address: str | None) -> dict[str, float]:
        args = [sys.executable, __file__, "--measure-one", str(n), "--urls", ",".join(urls),
                "--concurrency", str(concurrency), *(["--address", address] if address else [])]
        done = subprocess.run(args, check=True, capture_output=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    with ExitStack() as stack:
        urls = [stack.enter_context(mock_server_process(latency, "--batch-limit", str(BATCH_LIMIT))).base_url
                for _ in range(4)]
        print(f"extraction over {len(urls)} mock endpoints ({BATCH_LIMIT} at once, {latency * 1000:.0f} ms): the "
              f"driver's resident memory, sampled every 20 ms, each run in a fresh process")
        print(f"{'mode':>22}{'units':>8}{'calls':>8}{'run added MB':>14}{'merged tables MB':>18}"
              f"{'added - tables':>16}")
        rows = [("one process", units * n, measured(units * n, None)) for n in (1, 2, 4)]
        with local_cluster(3) as address:
            rows += [("Ray Data, 2 actors", units * n, measured(units * n, address)) for n in (1, 2, 4)]
        for name, u, r in rows:
            print(f"{name:>22}{u:>8}{r['calls']:>8}{r['added_mb']:>14.1f}{r['tables_mb']:>18.1f}"
                  f"{r['added_mb'] - r['tables_mb']:>16.1f}")
        for name in ("one process", "Ray Data, 2 actors"):
            mine = [(u, r) for n, u, r in rows if n == name]
            (u0, a), (u1, b) = mine[0], mine[-1]
            slope = ((b["added_mb"] - b["tables_mb"]) - (a["added_mb"] - a["tables_mb"])) / (u1 - u0) * 1000
            print(f"{name}: beyond the merged tables, {slope:+.2f} MB per 1,000 more units")


def measure_one(units: int, urls: list[str], concurrency: int, address: str | None) -> None:
    """One run for memory_table, in this fresh process: its figures as one JSON line."""
    import json

    if address:
        import ray

        from sensegraph.llm.ray_workers import _connect
        _connect(ray, address)
        extract_once(urls, max(1, units // 8), concurrency, address, 2)  # Ray Data's own start-up, not counted
    print(json.dumps(extract_once(urls, units, concurrency, address, 2 if address else 0)))


def ray_data_table(units: int, concurrency: int, latency: float = LATENCY, actors: tuple[int, ...] | list[int] = (1, 2, 4)) -> None:
    with ExitStack() as stack:
        servers = [stack.enter_context(mock_server_process(latency, "--batch-limit", str(BATCH_LIMIT)))
                   for _ in range(4)]
        urls = [s.base_url for s in servers]
        ideal = len(urls) * BATCH_LIMIT / latency
        print(f"extraction of {units} text units over {len(urls)} mock endpoints ({BATCH_LIMIT} at once, "
              f"{latency * 1000:.0f} ms; ideal {ideal:.1f} requests/s)")
        print(f"{'mode':>22}{'calls':>7}{'requests/s':>12}{'share':>7}{'first s':>9}{'after first':>13}"
              f"{'driver CPU ms/call':>20}{'driver cores':>14}{'peak RSS MB':>13}{'run added MB':>14}")
        rows = [("one process", extract_once(urls, units, concurrency))]
        with local_cluster(4) as address:
            import ray

            from sensegraph.llm.ray_workers import _connect
            _connect(ray, address)
            for n in actors:
                rows.append((f"Ray Data, {n} actor{'s' * (n > 1)}", extract_once(urls, units, concurrency, address, n)))
            ray.shutdown()
        for name, r in rows:
            print(f"{name:>22}{r['calls']:>7}{r['rate']:>12.1f}{r['rate'] / ideal:>7.2f}{r['first_s']:>9.1f}"
                  f"{r['steady']:>13.1f}{r['cpu_ms']:>20.3f}"
                  f"{r['cores']:>14.3f}{r['rss_mb']:>13.0f}{r['added_mb']:>14.1f}")
        print("\ndriver CPU by thread, ms per call (the five largest; Ray's C++ threads by their kernel names)")
        for name, r in rows:
            top = list(r["threads_ms_per_call"].items())[:5]
            print(f"{name:>22}  " + ", ".join(f"{t} {ms:.3f}" for t, ms in top))
        label, best = rows[-1]
        # With Ray Data the driver's CPU goes to the streaming executor's loop and Ray's own
        # threads, which run for the step's time whatever the rate: at a cluster's rate the
        # same cores spread over more calls.
        print(f"\nRay Data's driver used {best['cores']:.3f} of a core; at 3,000 calls/s that would be "
              f"{1000 * best['cores'] / 3000:.3f} ms per call")
        tokens_per_unit = 600  # a default text unit
        print(f"\nprojection (calls as measured per unit; driver CPU per call as measured for {label}, an "
              "upper bound since it goes with time, not calls):")
        for total in (100e6, 1e9):
            n_units = total / tokens_per_unit
            calls = n_units * best["calls"] / units
            print(f"  {total / 1e6:>6.0f}M tokens: {n_units:,.0f} units, {calls:,.0f} calls, driver CPU "
                  f"{calls * best['cpu_ms'] / 1000 / 3600:.2f} h; one driver could feed "
                  f"{1000 / max(best['cpu_ms'], 1e-6):,.0f} calls/s")


if __name__ == "__main__":
    main()
