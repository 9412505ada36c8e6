"""Scale-out over several endpoints of one model: achieved requests/s against the ideal.

Starts 4 mock servers (tests/mock_llm.py, each in its own process), each answering at most 8
requests at once with 300 ms latency and queueing the rest, like a GPU server at its batch
limit: one endpoint can give at most 8 / 0.3 = 26.7 requests/s, four 106.7. Then sends N
extraction-sized structured calls (cache off) through one ChatClient configured with 1, 2 and
4 of them as `chat.endpoints`, with `concurrency` in flight per endpoint, and prints the
achieved rate as a share of the ideal for that many endpoints, and how the calls spread.

    python bench/scale_out.py                 # 400 calls per configuration
    python bench/scale_out.py --calls 800 --concurrency 12
"""
from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import ExitStack

from pydantic import BaseModel

from mock_process import mock_server_process
from sensegraph.config import ChatSettings
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


async def run(urls: list[str], calls: int, concurrency: int) -> tuple[float, dict]:
    settings = ChatSettings(provider="openai", model="mock", api_key="k", max_retries=3, retry_base_seconds=0.1,
                            endpoints=[{"base_url": u, "concurrency": concurrency} for u in urls])
    client = ChatClient(settings, cache=None)
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(client.structured([{"role": "user", "content": f"{PROMPT}\nunit {i}"}], Extraction,
                                                 step="extract", item=str(i), max_tokens=500)
                               for i in range(calls)))
    finally:
        await client.aclose()
    seconds = time.perf_counter() - t0
    assert not client.usage.total().failures
    return calls / seconds, client.endpoints.report()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=BATCH_LIMIT, help="requests in flight per endpoint")
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


if __name__ == "__main__":
    main()
