"""How much the one chat client costs: throughput against a slow server, and CPU per call.

The mock LLM server (tests/mock_llm.py) runs in its own process, so the client process's CPU
time is the client's alone. Each run is a fresh `--worker` subprocess; its CPU measured from the
parent with getrusage(RUSAGE_CHILDREN) includes interpreter start-up and imports.

    python bench/llm_client.py                 # 800 calls, concurrency 16, 200 ms latency
    python bench/llm_client.py --n 2000 --concurrency 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from mock_process import mock_server_process

ROOT = Path(__file__).resolve().parents[1]


def worker(url: str, n: int, concurrency: int) -> None:
    """Run n structured calls and print {wall, cpu} as JSON (imports excluded from both)."""
    from pydantic import BaseModel, Field

    from sensegraph.config import ChatSettings
    from sensegraph.llm import ChatClient

    class Entity(BaseModel):
        name: str
        type: str
        description: str

    class Extraction(BaseModel):
        entities: list[Entity]
        importance: int = Field(ge=1, le=10)

    settings = ChatSettings(provider="openai", model="bench", base_url=url, api_key="k",
                            concurrency=concurrency, retry_base_seconds=0.01, timeout=30)

    async def run() -> tuple[float, float, int]:
        client = ChatClient(settings, cache=None)
        try:
            # One warm-up call opens the client outside the measurement.
            await client.structured([{"role": "user", "content": "Warm Up"}], Extraction, step="bench",
                                    max_tokens=300)
            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(
                client.structured(
                    [{"role": "system", "content": "Extract the entities of the text."},
                     {"role": "user", "content": f"Report {i}: Acme Corp and Globex met Jane Doe in Berlin "
                                                 f"to discuss the Zenith Project."}],
                    Extraction, step="bench", item=str(i), max_tokens=300)
                for i in range(n)))
            return time.perf_counter() - t0, time.process_time() - c0, client.usage.step("bench").requests
        finally:
            await client.aclose()

    wall, cpu, requests = asyncio.run(run())
    print(json.dumps({"wall": wall, "cpu": cpu, "requests": requests}))


def measure(latency: float, n: int, concurrency: int) -> dict[str, float]:
    with mock_server_process(latency) as server:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu0 = server.cpu()
        out = subprocess.run([sys.executable, __file__, "--worker", server.base_url,
                              "--n", str(n), "--concurrency", str(concurrency)],
                             check=True, capture_output=True, text=True)
        server_cpu = server.cpu() - server_cpu0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"latency": latency, "calls": n, "wall": r["wall"], "rate": n / r["wall"],
            "cpu_ms": 1000 * r["cpu"] / n, "cpu_startup_ms": 1000 * total / n,
            "server_ms": 1000 * server_cpu / n, "requests": r["requests"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=800, help="structured calls per run")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.2, help="mock server latency, seconds")
    ap.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.n, args.concurrency)
        return

    slow = measure(args.latency, args.n, args.concurrency)
    fast = measure(0.0, args.n, args.concurrency)
    ideal = args.concurrency / args.latency
    print(f"ChatClient.structured, concurrency {args.concurrency}, cache off, mock server in its own process\n")
    print(f"{'run':<16}{'calls':>7}{'wall s':>9}{'calls/s':>9}{'ideal/s':>9}{'ratio':>7}"
          f"{'CPU ms/call':>13}{'incl. startup':>15}{'server ms/call':>16}")
    for name, r, ideal_rate in ((f"latency {args.latency * 1000:.0f} ms", slow, ideal), ("latency 0", fast, None)):
        ratio = f"{r['rate'] / ideal_rate:.2f}" if ideal_rate else "-"
        ideal_s = f"{ideal_rate:.0f}" if ideal_rate else "-"
        print(f"{name:<16}{r['calls']:>7}{r['wall']:>9.2f}{r['rate']:>9.0f}{ideal_s:>9}{ratio:>7}"
              f"{r['cpu_ms']:>13.2f}{r['cpu_startup_ms']:>15.2f}{r['server_ms']:>16.2f}")
    print("\nCPU ms/call: client process CPU during the calls; incl. startup: the whole client process "
          "(interpreter, imports, warm-up) divided by the calls.")


if __name__ == "__main__":
    main()
