"""Request and token rate limits over a sliding 60-second window, and retry back-off."""
from __future__ import annotations

import asyncio
import random
import time
from collections import deque


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


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None
