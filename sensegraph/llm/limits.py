"""Request and token rate limits over a sliding 60-second window, and retry back-off."""
from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from typing import Any


class RateLimiter:
    """Waits until a request of `tokens` fits under requests/minute and tokens/minute (0 = off)."""

    def __init__(self, requests_per_minute: int = 0, tokens_per_minute: int = 0, window: float = 60.0):
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        self.window = window
        self._events: deque[tuple[float, int]] = deque()
        self._tokens = 0
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.rpm or self.tpm)

    async def acquire(self, tokens: int) -> None:
        if not self.enabled:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                while self._events and self._events[0][0] <= now - self.window:
                    self._tokens -= self._events.popleft()[1]
                fits_rpm = not self.rpm or len(self._events) < self.rpm
                # A single request larger than the whole budget still goes, alone in its window.
                fits_tpm = not self.tpm or self._tokens + tokens <= self.tpm or not self._events
                if fits_rpm and fits_tpm:
                    self._events.append((now, tokens))
                    self._tokens += tokens
                    return
                await asyncio.sleep(max(0.01, self._events[0][0] + self.window - now))


def backoff_delay(attempt: int, base: float, cap: float = 60.0, retry_after: float | None = None) -> float:
    """Exponential back-off with full jitter; a server's Retry-After is a floor, never ignored."""
    delay = min(cap, base * (2**attempt)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


# The longest Retry-After obeyed. A server asking for an hour (or "inf") would otherwise stall
# the run on it; past this the outage rules (endpoints.py) decide, and other servers are tried.
RETRY_AFTER_CAP = 60.0


def parse_retry_after(value: str | None, *, milliseconds: bool = False) -> float | None:
    """Seconds from a Retry-After value (seconds or an HTTP date; with `milliseconds`, the
    `retry-after-ms` header's number), capped at RETRY_AFTER_CAP; None when absent or garbage
    ("inf" and "nan" are garbage, never an infinite pause)."""
    if not value:
        return None
    try:
        seconds = float(value) / (1000.0 if milliseconds else 1.0)
    except ValueError:
        if milliseconds:
            return None
        from email.utils import parsedate_to_datetime

        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(RETRY_AFTER_CAP, max(0.0, seconds))


def retry_after_of(headers: Any) -> float | None:
    """The pause a 429's headers ask for: `retry-after-ms` (OpenAI, Azure) wins over
    `retry-after`, as the more precise of the two."""
    if headers is None:
        return None
    ms = parse_retry_after(headers.get("retry-after-ms"), milliseconds=True)
    return ms if ms is not None else parse_retry_after(headers.get("retry-after"))
