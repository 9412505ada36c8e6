"""CPU per request slot with many requests waiting (sensegraph/llm/endpoints.py, no HTTP).

N requests at once for one server of concurrency 25; each takes a slot, yields once and gives
it back. With a queue that wakes one waiter per freed slot the CPU per slot stays flat as N
grows; waking every waiter made it grow with N.

    python bench/slot_queue.py               # N = 500, 2000, 5000
    python bench/slot_queue.py 100 10000
"""
from __future__ import annotations

import asyncio
import sys
import time

from sensegraph.config import ChatSettings
from sensegraph.llm.endpoints import Endpoints


def cpu_per_slot(n: int, concurrency: int = 25) -> float:
    """Microseconds of CPU per slot taken, for n requests started at once."""
    endpoints = Endpoints(ChatSettings(provider="openai", model="m", api_key="k", concurrency=concurrency,
                                       base_url="http://mock/v1"))

    async def one() -> None:
        async with endpoints.slot():
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(n)))

    start = time.process_time()
    asyncio.run(main())
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [500, 2000, 5000]
    for n in sizes:
        print(f"{n:>7,} requests waiting for 25 slots: {cpu_per_slot(n):7.1f} µs CPU per slot")


if __name__ == "__main__":
    main()
