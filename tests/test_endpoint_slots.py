"""The queue of requests waiting for a slot (sensegraph/llm/endpoints.py, no HTTP): a freed slot
wakes one waiter, not all of them; waiters are served in order; a cancelled waiter never takes
a slot with it; a pause that ends wakes the waiters without any slot being freed."""
from __future__ import annotations

import asyncio
import time

from sensegraph.config import ChatSettings
from sensegraph.llm import endpoints as endpoints_module
from sensegraph.llm.endpoints import Endpoints

HANG = 10.0  # a guard against a hang, not a timing assertion


def servers(*concurrency: int) -> Endpoints:
    return Endpoints(ChatSettings(provider="openai", model="m", api_key="k",
                                  endpoints=[{"base_url": f"http://s{i}/v1", "concurrency": c}
                                             for i, c in enumerate(concurrency)]))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def queued_behind_a_held_slot(eps: Endpoints, n: int, order: list[int]):
    """(the held slot, n requests queued behind it); each request appends its number to
    `order` once it has a slot."""
    async def request(i: int) -> None:
        async with eps.slot():
            order.append(i)
            await asyncio.sleep(0)

    holder = eps.slot()
    await holder.__aenter__()
    tasks = [asyncio.ensure_future(request(i)) for i in range(n)]
    await settle()  # all of them queued behind the held slot
    return holder, tasks


def count_checks(monkeypatch) -> list[int]:
    """How many times anyone asked a server whether it has a free slot."""
    calls = [0]
    real = endpoints_module.Endpoint.ready

    def ready(self, now):
        calls[0] += 1
        return real(self, now)
    monkeypatch.setattr(endpoints_module.Endpoint, "ready", ready)
    return calls


def test_each_freed_slot_wakes_one_waiter_and_waiters_are_served_in_order(monkeypatch):
    checks = count_checks(monkeypatch)
    eps = servers(1)
    n = 60
    order: list[int] = []

    async def scenario() -> None:
        holder, tasks = await queued_behind_a_held_slot(eps, n, order)
        checks[0] = 0
        await holder.__aexit__(None, None, None)
        await asyncio.wait_for(asyncio.gather(*tasks), HANG)

    asyncio.run(scenario())
    assert order == list(range(n))
    # n releases, each one waiter woken: a few checks per release. Waking every waiter on each
    # release asks n + (n-1) + ... + 1 = 1,830 times.
    assert checks[0] <= 4 * n
    assert eps.all[0].in_flight == 0


def test_per_server_limits_and_least_loaded_choice_hold_with_the_queue():
    eps = servers(3, 1)
    peak = [0, 0]
    served = [0, 0]

    async def request() -> None:
        async with eps.slot() as e:
            i = eps.all.index(e)
            served[i] += 1
            peak[i] = max(peak[i], e.in_flight)
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    async def scenario() -> None:
        await asyncio.wait_for(asyncio.gather(*(request() for _ in range(80))), HANG)

    asyncio.run(scenario())
    assert peak == [3, 1] and sum(served) == 80 and served[1] >= 10
    assert [e.in_flight for e in eps.all] == [0, 0]


def test_a_cancelled_waiter_passes_its_slot_on_and_never_loses_one():
    eps = servers(2)
    got: list[int] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def request(i: int) -> None:
            async with eps.slot():
                got.append(i)
                await release.wait()

        a, b = eps.slot(), eps.slot()
        await a.__aenter__()
        await b.__aenter__()
        tasks = [asyncio.ensure_future(request(i)) for i in range(5)]
        await settle()
        tasks[1].cancel()  # cancelled while queued, never woken
        await settle()
        await a.__aexit__(None, None, None)  # wakes the first in line, tasks[0] ...
        tasks[0].cancel()  # ... which is cancelled before it runs: its slot goes on to tasks[2]
        await settle()
        assert got == [2]
        await b.__aexit__(None, None, None)
        await settle()
        assert got == [2, 3]
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), HANG)
        assert got == [2, 3, 4] and tasks[0].cancelled() and tasks[1].cancelled()
        assert eps.all[0].in_flight == 0
        # both slots are free again: two requests get them at once
        c, d = eps.slot(), eps.slot()
        await asyncio.wait_for(asyncio.gather(c.__aenter__(), d.__aenter__()), HANG)
        assert eps.all[0].in_flight == 2
        await c.__aexit__(None, None, None)
        await d.__aexit__(None, None, None)

    asyncio.run(scenario())


def test_waiters_behind_a_paused_server_run_when_its_pause_ends(monkeypatch):
    checks = count_checks(monkeypatch)
    eps = servers(1)
    order: list[int] = []

    async def scenario() -> None:
        holder, tasks = await queued_behind_a_held_slot(eps, 20, order)
        await holder.__aexit__(None, None, None)  # wakes tasks[0] ...
        eps.all[0].paused_until = time.monotonic() + 0.05  # ... but a 429 pauses the server first
        checks[0] = 0
        await asyncio.wait_for(asyncio.gather(*tasks), HANG)

    asyncio.run(scenario())
    assert order == list(range(20))  # the woken one kept its place at the front
    assert checks[0] <= 4 * 20 + 20  # the pause's end is one wake-up, not one per waiter
