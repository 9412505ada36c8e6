"""Outages against mock servers: does every fault either heal or fail clearly within a bound?

Each scenario sends the same batch of structured chat calls (default 200, like the extraction
calls of a small corpus) through the real ChatClient to two mock OpenAI-compatible servers
(tests/mock_llm.py, real HTTP on 127.0.0.1; 50 ms per answer, concurrency 4 each) with one kind
of fault injected, and prints per scenario the wall time, the HTTP requests each server got,
the calls answered and failed, and a note (what the client logged, how soon a flapping server
was back). `outage_timeout` is 10 s here (default 180 s) so the all-dead scenario ends quickly.

With --ray it also starts a local Ray cluster (a head and a worker node, one CPU each, with
`ray start`; stopped at the end) and sends the same calls through 2 Ray workers
(sensegraph/llm/ray_workers.py): one of the two servers dead (with each server's concurrency 4
split over both workers, and with concurrency 1, i.e. one server per worker, whose worker must
hand its calls back), one hanging, one flapping (how soon the driver has its worker back),
both dead, garbage 200s on one (one server per worker), one worker SIGKILLed mid-run, and a
head that cannot be reached.

    python bench/outages.py
    python bench/outages.py --calls 400 --outage-timeout 20
    python bench/outages.py --ray --only Ray
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from mock_llm import start_mock_server  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from sensegraph.config import ChatSettings, EmbeddingSettings, Settings  # noqa: E402
from sensegraph.llm import ChatClient, LLMError  # noqa: E402

LATENCY = 0.05


class Answer(BaseModel):
    answer: str


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def flap(server: Any, client: ChatClient, period: float, lags: list[float], stop: asyncio.Event,
               workers: Any = None) -> None:
    """Down for `period` s, up for `period` s, ...; records how long after each recovery the
    client had the server back in rotation (on Ray: the driver had its worker back)."""

    class Driver:  # (one server per worker: the driver's view of server 0's worker)
        @property
        def out_since(self) -> Any:
            return workers._out["chat"][0]

    endpoint = client.endpoints.all[0] if workers is None else Driver()
    while not stop.is_set():
        server.down = "503"
        await _sleep_or_stop(period, stop)
        server.down = None
        up = time.monotonic()
        while endpoint.out_since is not None and not stop.is_set() and time.monotonic() - up < period:
            await asyncio.sleep(0.01)
        if endpoint.out_since is None and not stop.is_set():
            lags.append(time.monotonic() - up)
        await _sleep_or_stop(period - (time.monotonic() - up), stop)


async def _sleep_or_stop(seconds: float, stop: asyncio.Event) -> None:
    try:
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    except asyncio.TimeoutError:
        pass


def run(name: str, setup: dict[str, Any], calls: int, outage_timeout: float,
        ray_address: str | None = None) -> dict[str, Any]:
    if setup.get("ray") == "unreachable":
        return unreachable_head(name)
    servers = []
    urls = []
    for spec in setup["servers"]:
        if spec == "dead":
            urls.append(closed_port())
            servers.append(None)
        else:
            server = start_mock_server(latency=LATENCY, **spec.get("mock", {}))
            for key, value in spec.get("attrs", {}).items():
                setattr(server, key, value)
            servers.append(server)
            urls.append(server.base_url)
    settings = ChatSettings(provider="openai", model="mock", api_key="k", retry_base_seconds=0.2,
                            timeout=setup.get("timeout", 30), outage_timeout=outage_timeout,
                            endpoints=[{"base_url": u, "concurrency": setup.get("concurrency", 4)} for u in urls])
    client = ChatClient(settings, cache=None)
    lines: list[str] = []
    client.endpoints.log = lines.append
    lags: list[float] = []
    workers = None
    if setup.get("ray"):
        from sensegraph.llm.ray_workers import RayWorkers

        assert ray_address, f"{name}: needs --ray"
        embedding = EmbeddingSettings(provider="openai", model="mock", api_key="k", base_url=urls[-1])
        workers = client.workers = RayWorkers(Settings(chat=settings, embedding=embedding), ray_address, 2)

    async def scenario() -> tuple[int, int]:
        stop = asyncio.Event()
        flapper = (asyncio.ensure_future(flap(servers[0], client, setup["flap"], lags, stop, workers))
                   if "flap" in setup else None)
        killer = asyncio.ensure_future(kill_worker(workers, servers)) if setup.get("kill") else None
        if "then" in setup:  # after a while every server changes fault (503, then hanging)
            async def change() -> None:
                await _sleep_or_stop(setup["then"][0], stop)
                for server in servers:
                    server.down = setup["then"][1]
            changer = asyncio.ensure_future(change())
        # Items arrive in a window, as the pipeline's steps send them (index/windows.py).
        queue = iter(range(calls))
        ok = failed = 0

        async def lane() -> None:
            nonlocal ok, failed
            for i in queue:
                try:
                    await client.structured([{"role": "user", "content": f"Item {i}: Acme Corp hired Jane Doe."}],
                                            Answer, step="extract", item=f"u{i}", max_tokens=50)
                    ok += 1
                except LLMError:
                    failed += 1
        await asyncio.gather(*(lane() for _ in range(32)))
        stop.set()
        if "then" in setup:
            await changer
        if flapper is not None:
            await flapper
        if killer is not None:
            await killer
        await client.aclose()
        if workers is not None:
            await workers.aclose()
        return ok, failed

    start = time.monotonic()
    ok, failed = asyncio.run(scenario())
    wall = time.monotonic() - start
    requests = [s.stats["requests"] if s is not None else "-" for s in servers]
    for s in servers:
        if s is not None:
            s.stop()
    note = setup.get("note", "")
    if workers is not None and getattr(workers, "crashes", 0):
        note = f"a worker SIGKILLed after 20 requests: {workers.crashes} calls sent again"
    if lags:
        note = f"back {min(lags):.2f}-{max(lags):.2f} s after each of {len(lags)} recoveries"
    elif lines:
        first = lines[0] if "waiting" not in lines[0] or len(lines) == 1 else next(
            (x for x in lines if "failing" in x), lines[0])
        note = first[:90] + ("…" if len(first) > 90 else "")
    return {"scenario": name, "wall": wall, "requests": requests, "ok": ok, "failed": failed, "note": note}


async def kill_worker(workers: Any, servers: list[Any]) -> None:
    """SIGKILL Ray worker 0's process once the servers have had 20 requests (Ray restarts it)."""
    while sum(s.stats["requests"] for s in servers if s is not None) < 20:
        await asyncio.sleep(0.01)
    os.kill(workers._pids[0], signal.SIGKILL)


def unreachable_head(name: str) -> dict[str, Any]:
    from sensegraph.llm.ray_workers import RayUnavailable, RayWorkers

    chat = ChatSettings(provider="openai", model="mock", api_key="k", base_url=closed_port())
    embedding = EmbeddingSettings(provider="openai", model="mock", api_key="k", base_url=closed_port())
    start = time.monotonic()
    try:
        RayWorkers(Settings(chat=chat, embedding=embedding), "127.0.0.1:1")
        note = "connected?"
    except RayUnavailable as exc:
        note = str(exc)
    wall = time.monotonic() - start
    return {"scenario": name, "wall": wall, "requests": ["-"], "ok": 0, "failed": "-",
            "note": note[:90] + ("…" if len(note) > 90 else "")}


SCENARIOS: dict[str, dict[str, Any]] = {
    "healthy (2 servers)": {"servers": [{}, {}]},
    "one of 2 dead (refused)": {"servers": ["dead", {}]},
    "one of 2 hangs (timeout 2 s)": {"servers": [{"attrs": {"down": "hang"}}, {}], "timeout": 2},
    "all dead": {"servers": ["dead", "dead"]},
    "all hang (timeout 2 s)": {"servers": [{"attrs": {"down": "hang"}}, {"attrs": {"down": "hang"}}], "timeout": 2},
    # out on 503s, then hanging: only probes reach them, each bounded by the deadline
    "all 503, then all hang after 1 s (timeout 60 s)": {
        "servers": [{"attrs": {"down": "503"}}, {"attrs": {"down": "503"}}], "timeout": 60, "then": (1.0, "hang")},
    # more calls, so the run spans a few flaps
    "flapping (3 s down / 3 s up)": {"servers": [{}, {}], "flap": 3.0, "calls": 5},
    "429 storm, Retry-After 1 (both, 40%)": {"servers": [{"mock": {"faults": {"429": 0.4}, "seed": 1},
                                                          "attrs": {"retry_after_headers": {"Retry-After": "1"}}},
                                                         {"mock": {"faults": {"429": 0.4}, "seed": 2},
                                                          "attrs": {"retry_after_headers": {"Retry-After": "1"}}}]},
    "429 on one, Retry-After 3600": {"servers": [{"attrs": {"down": "429",
                                                            "retry_after_headers": {"Retry-After": "3600"}}}, {}]},
    "401 on one": {"servers": [{"mock": {"api_key": "other"}}, {}]},
    "garbage 200s on one": {"servers": [{"mock": {"faults": {"invalid": 1.0}}}, {}]},
    # a server whose structured decoding breaks: 500 to every json_schema request, plain ones served
    "500 to json_schema on both": {"servers": [{"mock": {"reject_formats": ("json_schema",), "reject_status": 500}},
                                               {"mock": {"reject_formats": ("json_schema",), "reject_status": 500}}]},
    "500 to json_schema on one": {"servers": [{"mock": {"reject_formats": ("json_schema",), "reject_status": 500}},
                                              {}]},
    # --ray: through 2 workers on a local cluster
    "Ray: healthy (2 servers, 2 workers)": {"servers": [{}, {}], "ray": True},
    "Ray: one of 2 servers dead (each worker both)": {"servers": ["dead", {}], "ray": True},
    "Ray: one of 2 servers dead (one per worker, concurrency 1)": {"servers": ["dead", {}], "ray": True,
                                                                   "concurrency": 1},
    "Ray: one of 2 hangs (timeout 2 s, one per worker, concurrency 1)": {
        "servers": [{"attrs": {"down": "hang"}}, {}], "timeout": 2, "ray": True, "concurrency": 1},
    "Ray: flapping (3 s down / 3 s up, one per worker, concurrency 1)": {
        "servers": [{}, {}], "flap": 3.0, "calls": 2, "ray": True, "concurrency": 1},
    "Ray: all dead": {"servers": ["dead", "dead"], "ray": True},
    "Ray: garbage 200s on one (one per worker, concurrency 1)": {
        "servers": [{"mock": {"faults": {"invalid": 1.0}}}, {}], "ray": True, "concurrency": 1},
    "Ray: worker killed": {"servers": [{}, {}], "ray": True, "kill": True},
    "Ray: head unreachable (127.0.0.1:1)": {"servers": [], "ray": "unreachable"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--outage-timeout", type=float, default=10.0)
    ap.add_argument("--only", default="", help="run the scenarios whose name contains this")
    ap.add_argument("--ray", action="store_true", help="also the Ray scenarios, on a local cluster")
    args = ap.parse_args()
    print(f"{args.calls} structured calls, 2 servers x concurrency 4, {LATENCY * 1000:.0f} ms per answer, "
          f"outage_timeout {args.outage_timeout:g} s\n")
    print("| scenario | wall s | requests (server 0, 1) | answered | failed | note |")  # (flapping: 5x the calls)
    print("|---|---:|---|---:|---:|---|")
    chosen = {name: setup for name, setup in SCENARIOS.items()
              if (not args.only or args.only in name) and (args.ray or not setup.get("ray"))}
    with contextlib.ExitStack() as stack:
        address = None
        if any(setup.get("ray") is True for setup in chosen.values()):
            from scale_out import local_cluster

            address = stack.enter_context(local_cluster(2))
        for name, setup in chosen.items():
            r = run(name, setup, args.calls * setup.get("calls", 1), args.outage_timeout, address)
            print(f"| {r['scenario']} | {r['wall']:.1f} | {', '.join(map(str, r['requests']))} | {r['ok']} | "
                  f"{r['failed']} | {r['note']} |", flush=True)


if __name__ == "__main__":
    main()
