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

    python bench/scale_out.py                 # 400 calls per configuration
    python bench/scale_out.py --calls 800 --concurrency 12 --ray
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager

from pydantic import BaseModel

from mock_process import free_port, mock_server_process
from sensegraph.config import ChatSettings, EmbeddingSettings, Settings
from sensegraph.llm import ChatClient

LATENCY = 0.3
BATCH_LIMIT = 8
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
