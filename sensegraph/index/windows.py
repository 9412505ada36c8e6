"""Bounded windows over a step's items: at most `window` items in progress at once.

A step that started every item at once (one task per text unit, per element, per batch) held
every item's prompt, coroutine and half-built result for the whole step: memory that grew
with the corpus, and one waiter per item at the endpoints' slot queue, which every freed slot
wakes. A window of a few items per request slot keeps the servers just as busy (an item
waiting for its next call always finds another item ready to send one) with memory and
bookkeeping that stay the same at any corpus size.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Items in progress per request the servers admit at once. An item makes its calls one after
# another (a unit's gleaning, a summary folded batch by batch), so more than one item per
# slot is needed to have a request ready whenever a slot frees; four leave room for the items
# that stop early (a "nothing missed" check) and for the client's own CPU time.
WINDOW_PER_SLOT = 4
MIN_WINDOW = 16


def window_of(client: Any) -> int:
    """Items to keep in progress for a chat client or an embedder: WINDOW_PER_SLOT per
    request its servers take at once (the sum of their `concurrency`), at least MIN_WINDOW."""
    endpoints = getattr(getattr(client, "endpoints", None), "all", None) or []
    slots = sum(max(1, int(getattr(e, "concurrency", 1) or 1)) for e in endpoints)
    return max(MIN_WINDOW, WINDOW_PER_SLOT * slots)


async def run_windowed(items: Iterable[T], work: Callable[[T], Awaitable[R]], *, window: int,
                       done: Callable[[int, R], None]) -> None:
    """`work(item)` for every item, at most `window` at once, started in the items' order;
    `done(position, result)` as each finishes (in any order). `items` is read lazily, one item
    when a place in the window frees, so it may be a generator that builds each item on
    demand. An exception stops the other items and is raised."""
    source = enumerate(items)

    async def lane() -> None:
        for position, item in source:  # one shared iterator: the lanes take items in turn
            done(position, await work(item))

    lanes = [asyncio.ensure_future(lane()) for _ in range(max(1, window))]
    try:
        await asyncio.gather(*lanes)
    except BaseException:
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        raise
